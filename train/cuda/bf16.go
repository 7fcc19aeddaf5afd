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
	// product), as mixed-precision training does; everything else stays
	// float32. Not batch invariant: cuBLASLt chooses its algorithm by
	// shape.
	BF16 = "bf16"
)

// bf16State is the bf16 mode's storage: the weights' bf16 copy and two
// operand buffers, grown as products need.
type bf16State struct {
	blas   *kc.Blas
	w16    Buffer // the arena in bf16
	fresh  bool   // w16 holds the current weights
	a, b   Buffer
	aN, bN int // bf16 elements a and b hold
}

// SetPrecision chooses the products' precision (FP32, the default, or
// BF16).
func (e *Engine) SetPrecision(p string) error {
	e.freeBF16()
	switch p {
	case FP32, "":
		return nil
	case BF16:
	default:
		return errorf("precision %q: want fp32 or bf16", p)
	}
	blas, err := e.dev.Blas()
	if err != nil {
		return err
	}
	st := &bf16State{blas: blas}
	if st.w16, err = e.alloc((len(e.host.Arena) + 1) / 2); err != nil {
		return err
	}
	e.bf = st
	return nil
}

// weights16 refreshes the bf16 copy of the weights if a step changed them.
func (e *Engine) weights16() error {
	if e.bf.fresh {
		return nil
	}
	if err := e.ops.ToBF16(e.bf.w16, e.w, len(e.host.Arena)); err != nil {
		return err
	}
	e.bf.fresh = true
	return nil
}

// w16 is the bf16 span of a weight span of the float32 arena.
func (e *Engine) w16(w Buffer) Buffer {
	off := (w.Ptr - e.w.Ptr) / 4
	return Buffer{Ptr: e.bf.w16.Ptr + off*2, Size: w.Size / 2}
}

// operand rounds rows × cols floats of src (rows ld apart) into scratch
// slot which (0 or 1) as contiguous bf16, growing it as needed.
func (e *Engine) operand(which int, src Buffer, rows, cols, ld int) (Buffer, error) {
	buf, have := &e.bf.a, &e.bf.aN
	if which == 1 {
		buf, have = &e.bf.b, &e.bf.bN
	}
	n := rows * cols
	if n > *have {
		if buf.Ptr != 0 {
			e.dev.Free(*buf)
		}
		var err error
		if *buf, err = e.alloc((n + 1) / 2); err != nil {
			*have = 0
			return Buffer{}, err
		}
		*have = n
	}
	return *buf, e.ops.ToBF16Rows(*buf, src, rows, cols, ld)
}

func (e *Engine) freeBF16() {
	if e.bf == nil {
		return
	}
	for _, b := range []Buffer{e.bf.w16, e.bf.a, e.bf.b} {
		if b.Ptr != 0 {
			e.dev.Free(b)
		}
	}
	e.bf = nil
}

// The bf16 products, in cuBLASLt's column-major terms (a row-major [r, c]
// matrix with ld is a column-major c × r one).

// linear16: y[r, 0:out] = x[r, 0:in] · Wᵀ; column-major yᶜ = (Wᶜ)ᵀ · xᶜ.
func (e *Engine) linear16(y, x, w Buffer, rows, in, out, ldy, ldx int) error {
	if err := e.weights16(); err != nil {
		return err
	}
	x16, err := e.operand(0, x, rows, in, ldx)
	if err != nil {
		return err
	}
	return e.bf.blas.GemmBF16(true, false, out, rows, in, e.w16(w), in, x16, in, y, ldy, false)
}

// linearBackX16: dx[r, 0:in] (+)= dy[r, 0:out] · W; dxᶜ = Wᶜ · dyᶜ.
func (e *Engine) linearBackX16(dx, dy, w Buffer, rows, in, out, lddx, lddy int, acc bool) error {
	if err := e.weights16(); err != nil {
		return err
	}
	dy16, err := e.operand(0, dy, rows, out, lddy)
	if err != nil {
		return err
	}
	return e.bf.blas.GemmBF16(false, false, in, rows, out, e.w16(w), in, dy16, out, dx, lddx, acc)
}

// linearBackW16: dW[out, in] += dyᵀ · x; dWᶜ = xᶜ · (dyᶜ)ᵀ.
func (e *Engine) linearBackW16(dw, dy, x Buffer, rows, in, out, lddy, ldx int) error {
	x16, err := e.operand(0, x, rows, in, ldx)
	if err != nil {
		return err
	}
	dy16, err := e.operand(1, dy, rows, out, lddy)
	if err != nil {
		return err
	}
	return e.bf.blas.GemmBF16(false, true, in, out, rows, x16, in, dy16, out, dw, in, true)
}
