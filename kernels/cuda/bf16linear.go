package cuda

import "fmt"

// BF16Linear computes a model's linear layers from a bf16 copy of its
// float32 weights through cuBLASLt (bf16 operands, float32 accumulation and
// output), rounding each activation operand to bf16 as it enters a
// product, or taking it in bf16 from the kernel that computed it
// (LinearManyBF16, BackFrom16, BackBF16): the products of mixed-precision
// training and of the bf16 rollout. Weight spans passed to it are spans of the float32 arena it
// mirrors. Not batch invariant: cuBLASLt chooses its algorithm by shape.
type BF16Linear struct {
	ops   *Ops
	blas  *Blas
	arena Buffer // the float32 weights
	w16   Buffer // their bf16 copy
	n     int    // floats in the arena
	fresh bool   // w16 holds the arena's current values
	a, b  Buffer // operand scratch, grown as products need
	aN    int
	bN    int
}

// NewBF16Linear mirrors the float32 arena of n floats.
func NewBF16Linear(o *Ops, arena Buffer, n int) (*BF16Linear, error) {
	blas, err := o.Dev.Blas()
	if err != nil {
		return nil, err
	}
	l := &BF16Linear{ops: o, blas: blas, arena: arena, n: n}
	if l.w16, err = o.Dev.Alloc(int64(max(n, 1)) * 2); err != nil {
		return nil, outOfMemory(o.Dev, "the bf16 copy of the weights", int64(n)*2, err)
	}
	return l, nil
}

// Stale says the float32 weights changed (a step, a load): the next
// product rounds them again.
func (l *BF16Linear) Stale() { l.fresh = false }

// Free releases the bf16 copy and the scratch.
func (l *BF16Linear) Free() {
	for _, b := range []Buffer{l.w16, l.a, l.b} {
		if b.Ptr != 0 {
			l.ops.Dev.Free(b)
		}
	}
	*l = BF16Linear{}
}

// ScratchBytes returns the bytes of operand scratch the products have
// grown so far: device memory a training step holds besides its Pool's,
// which train/memplan's plan counts.
func (l *BF16Linear) ScratchBytes() int64 {
	var n int64
	for _, b := range []Buffer{l.a, l.b} {
		n += b.Size
	}
	return n
}

// Copy16 is the bf16 copy of w, a span of the float32 arena: where an
// optimiser that writes it as it updates w (train/cuda's adamw_bf16) puts
// it, before Fresh.
func (l *BF16Linear) Copy16(w Buffer) (Buffer, error) { return l.w16span(w) }

// Fresh says the bf16 copy holds the float32 weights' current values
// (every span written since they last changed): the next product uses it
// as it is.
func (l *BF16Linear) Fresh() { l.fresh = true }

// Refresh rounds the weights again if they changed since the last
// product (Stale): before recording or replaying a graph of products
// (Ops.Capture), whose launches must not include it.
func (l *BF16Linear) Refresh() error { return l.weights() }

// Reserve grows the forward products' operand scratch (Linear's and
// LinearMany's) to rows × width now, so that no such product of at most
// that size reallocates it later: a graph keeps the address it recorded.
func (l *BF16Linear) Reserve(rows, width int) error {
	_, err := l.grow(0, rows*width)
	return err
}

func (l *BF16Linear) weights() error {
	if l.fresh {
		return nil
	}
	if err := l.ops.ToBF16(l.w16, l.arena, l.n); err != nil {
		return err
	}
	l.fresh = true
	return nil
}

// w16span is the bf16 span of a span of the float32 arena.
func (l *BF16Linear) w16span(w Buffer) (Buffer, error) {
	if w.Ptr < l.arena.Ptr || w.Ptr+uint64(w.Size) > l.arena.Ptr+uint64(l.arena.Size) {
		return Buffer{}, fmt.Errorf("cuda: a bf16 product's weight is not in the arena it mirrors")
	}
	off := (w.Ptr - l.arena.Ptr) / 4
	return Buffer{Ptr: l.w16.Ptr + off*2, Size: w.Size / 2}, nil
}

// operand rounds rows × cols floats of src (rows ld apart) into scratch
// slot which (0 or 1) as contiguous bf16, growing it as needed (a grown
// slot is freed after the work that uses it: Free synchronises).
func (l *BF16Linear) operand(which int, src Buffer, rows, cols, ld int) (Buffer, error) {
	buf, err := l.grow(which, rows*cols)
	if err != nil {
		return Buffer{}, err
	}
	return buf, l.ops.ToBF16Rows(buf, src, rows, cols, ld)
}

// grow returns scratch slot which with room for n bf16 at least.
func (l *BF16Linear) grow(which, n int) (Buffer, error) {
	buf, have := &l.a, &l.aN
	if which == 1 {
		buf, have = &l.b, &l.bN
	}
	if n > *have {
		if buf.Ptr != 0 {
			l.ops.Dev.Free(*buf)
		}
		var err error
		if *buf, err = l.ops.Dev.Alloc(int64(max(n, 1)) * 2); err != nil {
			*have = 0
			return Buffer{}, outOfMemory(l.ops.Dev, "a bf16 product's operand", int64(n)*2, err)
		}
		*have = n
	}
	return *buf, nil
}

// The products, in cuBLASLt's column-major terms (a row-major [r, c]
// matrix with ld is a column-major c × r one).

// Linear: y[r, 0:out] = x[r, 0:in] · Wᵀ; column-major yᶜ = (Wᶜ)ᵀ · xᶜ.
func (l *BF16Linear) Linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error {
	return l.LinearMany(x, rows, in, ldx, Product{Y: y, W: w, Out: out, LdY: ldy})
}

// Product is one output of LinearMany: Y[r, 0:Out] (rows LdY apart) =
// x · Wᵀ, W [Out, in] a span of the weights. Add, where set (BF16Linear's
// products only), is added to it in the product's epilogue: Add laid out
// as Y (a residual stream: Y = Add + x · Wᵀ in one pass).
type Product struct {
	Y, W     Buffer
	Out, LdY int
	Add      Buffer
	// Y16: Y holds bf16, the float32 sums rounded once as the product
	// stores them (an operand of the kernel after it, such as SwiGLU's);
	// no Add then.
	Y16 bool
}

// mergeProducts joins each run of neighbouring products whose weights lie
// back to back (W [Out, in] float32 spans of one arena, in order: each
// starting Out·in floats after the one before it) and whose
// outputs are neighbouring columns of one matrix (the same LdY, each Y
// starting where the one before it ends in a row, no addend) into one
// product: q, k and v of a layer written into one [rows, qd+2·kvd]
// matrix, or gate and up into [rows, 2·I], take one product rather than
// three or two. A decoding step's products are small (256 rows), so each
// launch is far from the card's speed and the fewer the better. adjacent,
// where not nil, must also hold for two products to join (QuantLinear's
// scales). Each output is the same sum over the same inputs; only
// cuBLASLt's choice of algorithm, made by shape, may differ.
func mergeProducts(ps []Product, in int, adjacent func(a, b Product) bool) []Product {
	if len(ps) < 2 {
		return ps
	}
	out := make([]Product, 0, len(ps))
	for _, p := range ps {
		if n := len(out); n > 0 {
			q := &out[n-1]
			elt := uint64(4)
			if q.Y16 {
				elt = 2
			}
			if q.Add.Ptr == 0 && p.Add.Ptr == 0 && q.Y16 == p.Y16 && q.LdY == p.LdY && q.Out+p.Out <= q.LdY &&
				p.W.Ptr == q.W.Ptr+uint64(q.Out)*uint64(in)*4 && p.Y.Ptr == q.Y.Ptr+uint64(q.Out)*elt &&
				(adjacent == nil || adjacent(*q, p)) {
				q.W.Size = int64(q.Out+p.Out) * int64(in) * 4
				q.Y.Size = max(q.Y.Size, int64(p.Y.Ptr-q.Y.Ptr)+p.Y.Size)
				q.Out += p.Out
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

// LinearMany computes several products of the same input x (q, k and v of
// one layer, say) from one bf16 rounding of it.
func (l *BF16Linear) LinearMany(x Buffer, rows, in, ldx int, ps ...Product) error {
	if err := l.weights(); err != nil {
		return err
	}
	x16, err := l.operand(0, x, rows, in, ldx)
	if err != nil {
		return err
	}
	return l.products(x16, rows, in, ps)
}

// LinearManyBF16 is LinearMany from an operand already in bf16: x16
// [rows, in], contiguous (a kernel that rounds its output for the
// products, such as RMSNormBF16, made it).
func (l *BF16Linear) LinearManyBF16(x16 Buffer, rows, in int, ps ...Product) error {
	if err := l.weights(); err != nil {
		return err
	}
	return l.products(x16, rows, in, ps)
}

func (l *BF16Linear) products(x16 Buffer, rows, in int, ps []Product) error {
	for _, p := range mergeProducts(ps, in, nil) {
		w16, err := l.w16span(p.W)
		if err != nil {
			return err
		}
		if err := l.ops.gemmBF16Add(l.blas, true, false, p.Out, rows, in, w16, in, x16, in, p.Y, p.LdY, false, p.Add, p.Y16); err != nil {
			return err
		}
	}
	return nil
}

// BackX: dx[r, 0:in] (+)= dy[r, 0:out] · W; dxᶜ = Wᶜ · dyᶜ.
func (l *BF16Linear) BackX(dx, dy, w Buffer, rows, in, out, lddx, lddy int, acc bool) error {
	if err := l.weights(); err != nil {
		return err
	}
	w16, err := l.w16span(w)
	if err != nil {
		return err
	}
	dy16, err := l.operand(0, dy, rows, out, lddy)
	if err != nil {
		return err
	}
	return l.ops.gemmBF16(l.blas, false, false, in, rows, out, w16, in, dy16, out, dx, lddx, acc)
}

// BackW: dW[out, in] += dyᵀ · x; dWᶜ = xᶜ · (dyᶜ)ᵀ.
func (l *BF16Linear) BackW(dw, dy, x Buffer, rows, in, out, lddy, ldx int) error {
	x16, err := l.operand(0, x, rows, in, ldx)
	if err != nil {
		return err
	}
	dy16, err := l.operand(1, dy, rows, out, lddy)
	if err != nil {
		return err
	}
	return l.ops.gemmBF16(l.blas, false, true, in, out, rows, x16, in, dy16, out, dw, in, true)
}

// Round rounds rows × cols floats of src (rows ld apart) into scratch
// slot which (0 or 1) as contiguous bf16 and returns it: one rounding of
// a whole matrix whose row blocks several products then read
// (LinearManyBF16, BackBF16), an MoE layer's rows grouped by expert. The
// slot holds it until the next use of that slot.
func (l *BF16Linear) Round(which int, src Buffer, rows, cols, ld int) (Buffer, error) {
	return l.operand(which, src, rows, cols, ld)
}

// BackBF16 is Back from operands already in bf16: dy16 [rows, out] with
// rows lddy apart and x16 [rows, in] with rows ldx apart (row blocks of
// Round's copies).
func (l *BF16Linear) BackBF16(dx, dw, dy16 Buffer, lddy int, x16 Buffer, ldx int, w Buffer, rows, in, out, lddx int, acc bool) error {
	return l.backBF16(dx, dw, dy16, lddy, x16, ldx, w, rows, in, out, lddx, acc, false)
}

// BackBF16To16 is BackBF16 with dx written in bf16 (dx16, rows lddx
// apart; each float32 sum rounded once as it is stored, the bits of
// rounding BackBF16's dx), nothing accumulated: for a gradient that only
// bf16 operands read (attention's dO, which flash.cu takes in bf16).
func (l *BF16Linear) BackBF16To16(dx16, dw, dy16 Buffer, lddy int, x16 Buffer, ldx int, w Buffer, rows, in, out, lddx int) error {
	return l.backBF16(dx16, dw, dy16, lddy, x16, ldx, w, rows, in, out, lddx, false, true)
}

func (l *BF16Linear) backBF16(dx, dw, dy16 Buffer, lddy int, x16 Buffer, ldx int, w Buffer, rows, in, out, lddx int, acc, dx16 bool) error {
	if err := l.weights(); err != nil {
		return err
	}
	w16, err := l.w16span(w)
	if err != nil {
		return err
	}
	if err := l.ops.gemmBF16Add(l.blas, false, false, in, rows, out, w16, in, dy16, lddy, dx, lddx, acc, Buffer{}, dx16); err != nil {
		return err
	}
	return l.ops.gemmBF16(l.blas, false, true, in, out, rows, x16, ldx, dy16, lddy, dw, in, true)
}

// BF16Rows is the span of n bf16 at element offset off of a bf16 buffer.
func BF16Rows(b Buffer, off, n int) Buffer {
	return Buffer{Ptr: b.Ptr + uint64(off)*2, Size: int64(n) * 2}
}

// Back is BackX and BackW of one layer from a single bf16 copy of dy:
// dx[r, 0:in] (+)= dy[r, 0:out]·W and dW[out, in] += dyᵀ·x.
func (l *BF16Linear) Back(dx, dw, dy, x, w Buffer, rows, in, out, lddx, lddy, ldx int, acc bool) error {
	x16, err := l.operand(0, x, rows, in, ldx)
	if err != nil {
		return err
	}
	return l.BackFrom16(dx, dw, dy, x16, w, rows, in, out, lddx, lddy, acc)
}

// BackFrom16 is Back from the bf16 copy of x the forward kept (x16
// [rows, in], contiguous: RMSNormBF16's or SwiGLUBF16's output, say), so
// that only dy is rounded (into slot 1).
func (l *BF16Linear) BackFrom16(dx, dw, dy, x16, w Buffer, rows, in, out, lddx, lddy int, acc bool) error {
	dy16, err := l.operand(1, dy, rows, out, lddy)
	if err != nil {
		return err
	}
	return l.BackBF16(dx, dw, dy16, out, x16, in, w, rows, in, out, lddx, acc)
}

// ExpertWeights are one MoE expert's matrices, spans of the arena.
type ExpertWeights struct{ Gate, Up, Down Buffer }

// ExpertsBF16 runs an MoE layer's experts over its rows grouped by expert
// (xg16 [n, H] in bf16; expert x's rows are off[x]..off[x+1], its weights
// w(x)), a cuBLASLt product per expert: gug [n, 2I] their gate and up
// projections side by side, ag16 [n, I] SwiGLU of them in bf16, yg [n, H]
// the down projections; gug and yg float32, or bf16 where out16 (each
// float32 sum rounded once).
func (l *BF16Linear) ExpertsBF16(xg16, gug, ag16, yg Buffer, off []int, w func(x int) ExpertWeights, H, I int, out16 bool) error {
	n := off[len(off)-1]
	each := func(f func(x, r0, m int) error) error {
		for x := 0; x+1 < len(off); x++ {
			if m := off[x+1] - off[x]; m > 0 {
				if err := f(x, off[x], m); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := each(func(x, r0, m int) error {
		if out16 {
			gu := BF16Rows(gug, r0*2*I, m*2*I)
			return l.LinearManyBF16(BF16Rows(xg16, r0*H, m*H), m, H, Product{Y: gu, W: w(x).Gate, Out: I, LdY: 2 * I, Y16: true},
				Product{Y: BF16Rows(gu, I, m*2*I-I), W: w(x).Up, Out: I, LdY: 2 * I, Y16: true})
		}
		gu := gug.Floats(r0*2*I, m*2*I)
		return l.LinearManyBF16(BF16Rows(xg16, r0*H, m*H), m, H, Product{Y: gu, W: w(x).Gate, Out: I, LdY: 2 * I},
			Product{Y: gu.Floats(I, m*2*I-I), W: w(x).Up, Out: I, LdY: 2 * I})
	}); err != nil {
		return err
	}
	swiglu := l.ops.SwiGLUBF16
	if out16 {
		swiglu = l.ops.SwiGLUBF16From16
	}
	if err := swiglu(ag16, gug, n, I); err != nil {
		return err
	}
	return each(func(x, r0, m int) error {
		y := yg.Floats(r0*H, m*H)
		if out16 {
			y = BF16Rows(yg, r0*H, m*H)
		}
		return l.LinearManyBF16(BF16Rows(ag16, r0*I, m*I), m, I, Product{Y: y, W: w(x).Down, Out: H, LdY: H, Y16: out16})
	})
}

// outOfMemory adds to an allocation's failure for want of memory what was
// asked and what the device has free.
func outOfMemory(d *Device, what string, bytes int64, err error) error {
	if !IsOutOfMemory(err) {
		return err
	}
	free, total, _ := d.MemInfo()
	return fmt.Errorf("%w: %s needs %.2f GiB, %.2f of %.2f GiB free (a smaller micro-batch, train.recompute or fewer rollout slots leave more)",
		err, what, float64(bytes)/(1<<30), float64(free)/(1<<30), float64(total)/(1<<30))
}
