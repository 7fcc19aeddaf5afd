// Package kernels holds keel's numeric core: float32 and bfloat16 matrix
// products, the row kernels the model needs (RMSNorm, RoPE, softmax, SiLU,
// attention pieces) and the rounding helpers of the reduced-precision modes.
//
// Every kernel here is batch invariant: the value of an output element
// depends only on its own inputs, never on how many rows share the call or on
// how goroutines split the work. The rollout engine's exact mode relies on
// this to reproduce the training engine bit for bit.
package kernels

import "golang.org/x/sys/cpu"

// Instruction-set paths, detected once at start-up. Tests may switch them
// off to exercise the slower paths.
var (
	useAVX512     = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512DQ
	useAVX2       = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	useAVX512BF16 = useAVX512 && cpu.X86.HasAVX512BF16
)

// Features reports which instruction-set paths the kernels use on this CPU,
// for `keel bench` and logs.
func Features() string {
	switch {
	case useAVX512BF16:
		return "avx512+bf16"
	case useAVX512:
		return "avx512"
	case useAVX2:
		return "avx2+fma"
	default:
		return "portable"
	}
}
