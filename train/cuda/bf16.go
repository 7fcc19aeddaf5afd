package cuda

import (
	kc "github.com/keel-rl/keel/kernels/cuda"
)

// Precision of the engine's products.
const (
	// FP32 computes every product with keel's float32 GEMM: the mode
	// checked against the CPU engine, batch invariant (the exact rollout
	// pairs with it).
	FP32 = "fp32"
	// BF16 computes the products in cuBLASLt from bf16 operands with
	// float32 accumulation and output (weights rounded from the float32
	// masters after every step, activations and gradients as they enter a
	// product: kernels/cuda.BF16Linear), as mixed-precision training does;
	// everything else stays float32.
	BF16 = "bf16"
)

// SetPrecision chooses the products' precision (FP32, the default, or
// BF16).
func (e *Engine) SetPrecision(p string) error {
	e.freeBF16()
	e.valid = false // the last Forward's activations are the other mode's
	switch p {
	case FP32, "":
		return nil
	case BF16:
	default:
		return errorf("precision %q: want fp32 or bf16", p)
	}
	l, err := kc.NewBF16Linear(e.ops, e.w, len(e.host.Arena))
	if err != nil {
		return err
	}
	e.bf = l
	return nil
}

func (e *Engine) freeBF16() {
	if e.bf != nil {
		e.bf.Free()
		e.bf = nil
	}
}

// precision returns the engine's precision, FP32 or BF16.
func (e *Engine) precision() string {
	if e.bf != nil {
		return BF16
	}
	return FP32
}

// scratchHeld returns the bytes of the bf16 products' operand scratch,
// which the memory plan counts among a step's activations and which,
// grown by an earlier step, MemInfo counts as used.
func (e *Engine) scratchHeld() int64 {
	if e.bf != nil {
		return e.bf.ScratchBytes()
	}
	return 0
}
