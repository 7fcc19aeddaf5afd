//go:build amd64 && !purego

package rollout

import (
	"golang.org/x/sys/cpu"

	"github.com/keel-rl/keel/kernels"
)

// useBF16Asm selects the AVX-512 attention kernels of the bf16 KV cache
// (attn_bf16_amd64.s). Tests switch it off to compare with the Go loops.
var useBF16Asm = cpu.X86.HasAVX512F

//go:noescape
func dotRowsBF16AVX512(s, q *float32, k *kernels.BF16, n, d, ld int, scale float32)

//go:noescape
func axpyRowsBF16AVX512(out, p *float32, v *kernels.BF16, n, d, ld int)
