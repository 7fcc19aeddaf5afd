package cuda

import (
	"errors"
	"fmt"
	"os"
)

// Matrix is a weight matrix in a float32 arena: element offset, rows
// (output channels) and columns (inputs).
type Matrix struct{ Off, Rows, Cols int }

// Weight formats of QuantLinear.
const (
	// FormatFP8: e4m3 values with one scale per output channel
	// (kernels.QuantizeE4M3Rows), the fp8 rollout's weights.
	FormatFP8 = "quant_e4m3_rows"
	// FormatFP4: NVFP4-style, e2m1 values with an e4m3 scale per block
	// of 16 inputs and a power-of-two scale per output channel
	// (kernels.PackNVFP4), the fp4 rollout's weights.
	FormatFP4 = "quant_nvfp4_rows"
)

// QuantLinear computes a model's linear layers as the CPU rollout's fp8
// and fp4 precisions define them: weights quantised in the format given
// (the CPU's rules, the same bits), activations to float8 e4m3 with one
// scale per token, the product of the quantised values (exact in bf16) in
// cuBLASLt's bf16 GEMM with float32 accumulation, then the channel and
// token scales. It emulates fp8 and fp4 tensor-core products' numbers on
// any GPU cuBLASLt's bf16 runs on, at bf16 speed.
//
// With KEEL_FP8_GEMM=1, on a card with float8 tensor cores (sm_89 on), the
// fp8 format's LinearMany runs cuBLASLt's float8 product itself: the same
// quantised operands as e4m3 bytes (each matrix's made the first time a
// product reads it, in slabs), the same scales after. The tensor cores add
// float8 products in an accumulator of some 14 bits, moved into float32
// every so often, so its numbers differ from the emulation's by about
// 1e-4 relative. A shape cuBLASLt has no float8 product for (ErrNoFP8) is
// emulated from then on, the others not, and stderr says which.
type QuantLinear struct {
	ops     *Ops
	blas    *Blas
	format  string // the weights' quantisation kernel
	arena   Buffer
	n       int
	mats    map[uint64]Matrix // by the matrix's address in the arena
	soff    map[uint64]int    // its first row's index in wscale
	w8      Buffer            // the quantised weights, bf16, arena layout
	ws      Buffer            // per-row weight scales
	fresh   bool
	x8      Buffer // an activation operand, bf16
	sx      Buffer // its per-row scales
	xN      int
	sN      int
	scales  map[groupedLayout][2]int // Grouped's layouts checked, and their scales (groupedScales)
	fp8     bool                     // LinearMany through cuBLASLt's float8 product (KEEL_FP8_GEMM)
	w8b     map[uint64]Buffer        // the float8 products' weights, e4m3 bytes, by matrix
	slabs   []Buffer                 // where w8b lies (Float8Slab each, or one matrix's)
	used    int                      // bytes of the last slab taken
	x8b     Buffer                   // their activation operand, e4m3 bytes
	xbN     int
	fp8Ran  bool              // a float8 product has run (said once on stderr)
	refused map[fp8Shape]bool // shapes cuBLASLt has no float8 product for
}

// fp8Shape is what decides whether cuBLASLt has a float8 product for one
// of LinearMany's products: the output's width and row stride, the
// input's width.
type fp8Shape struct{ out, in, ldy int }

// Float8Slab is the size of the allocations the float8 weights are placed
// in (a matrix larger than it gets its own): a model's few hundred
// matrices, or an MoE model's experts grouped on the host, in a few
// allocations rather than one each.
const Float8Slab = 64 << 20

// FP8GEMM reports whether l's products run on cuBLASLt's float8 product
// (KEEL_FP8_GEMM=1 on a card that has one), the shapes it refuses
// (Refused) aside.
func (l *QuantLinear) FP8GEMM() bool { return l.fp8 }

// Refused reports how many product shapes cuBLASLt had no float8 product
// for (emulated instead).
func (l *QuantLinear) Refused() int { return len(l.refused) }

// NewQuantLinear mirrors the float32 arena of n floats whose product
// weights are mats, quantised in format (FormatFP8 or FormatFP4).
func NewQuantLinear(o *Ops, arena Buffer, n int, mats []Matrix, format string) (*QuantLinear, error) {
	if format != FormatFP8 && format != FormatFP4 {
		return nil, fmt.Errorf("cuda: unknown weight format %q", format)
	}
	blas, err := o.Dev.Blas()
	if err != nil {
		return nil, err
	}
	l := &QuantLinear{ops: o, blas: blas, format: format, arena: arena, n: n, mats: map[uint64]Matrix{}, soff: map[uint64]int{},
		fp8: format == FormatFP8 && os.Getenv("KEEL_FP8_GEMM") == "1" && o.Dev.Arch >= 89,
		w8b: map[uint64]Buffer{}, refused: map[fp8Shape]bool{}}
	rows := 0
	for _, m := range mats {
		if m.Off < 0 || m.Rows < 1 || m.Cols < 1 || m.Off+m.Rows*m.Cols > n {
			return nil, fmt.Errorf("cuda: fp8 weight at %d [%d, %d] outside an arena of %d", m.Off, m.Rows, m.Cols, n)
		}
		p := arena.Ptr + uint64(m.Off)*4
		l.mats[p], l.soff[p] = m, rows
		rows += m.Rows
	}
	if l.w8, err = o.Dev.Alloc(int64(max(n, 1)) * 2); err != nil {
		return nil, outOfMemory(o.Dev, "the quantised copy of the weights", int64(n)*2, err)
	}
	if l.ws, err = o.Dev.Alloc(int64(max(rows, 1)) * 4); err != nil {
		o.Dev.Free(l.w8)
		return nil, err
	}
	return l, nil
}

// Stale says the float32 weights changed: the next product quantises
// them again.
func (l *QuantLinear) Stale() { l.fresh = false }

// Free releases the device memory.
func (l *QuantLinear) Free() {
	for _, b := range l.slabs {
		l.ops.Dev.Free(b)
	}
	for _, b := range []Buffer{l.w8, l.ws, l.x8, l.sx, l.x8b} {
		if b.Ptr != 0 {
			l.ops.Dev.Free(b)
		}
	}
	*l = QuantLinear{}
}

// QuantE4M3Rows quantises rows of src (ld apart, cols wide) into dst
// (bf16, contiguous) with one scale per row into scale.
func (o *Ops) QuantE4M3Rows(dst, scale, src Buffer, rows, cols, ld int) error {
	return o.Launch("convert.cu", "quant_e4m3_rows", Dim3{X: rows}, block256, dst, scale, src, cols, int64(ld))
}

// Refresh quantises the weights again if they changed since the last
// product (Stale), as BF16Linear.Refresh.
func (l *QuantLinear) Refresh() error { return l.weights() }

// Reserve grows the activation operand's scratch to rows × width now, as
// BF16Linear.Reserve (the float8 products' too: a decoding graph records
// the operands' addresses, so they must not move after).
func (l *QuantLinear) Reserve(rows, width int) error {
	if err := l.grow(rows, width); err != nil {
		return err
	}
	if l.fp8 {
		return l.growBytes(rows * width)
	}
	return nil
}

// growBytes makes room for a float8 product's operand of n bytes.
func (l *QuantLinear) growBytes(n int) error {
	if n <= l.xbN {
		return nil
	}
	if l.x8b.Ptr != 0 {
		l.ops.Dev.Free(l.x8b)
	}
	var err error
	if l.x8b, err = l.ops.Dev.Alloc(int64(n)); err != nil {
		l.xbN = 0
		return outOfMemory(l.ops.Dev, "a float8 product's operand", int64(n), err)
	}
	l.xbN = n
	return nil
}

// grow makes room for an activation operand of rows × in.
func (l *QuantLinear) grow(rows, in int) error {
	if n := rows * in; n > l.xN {
		if l.x8.Ptr != 0 {
			l.ops.Dev.Free(l.x8)
		}
		var err error
		if l.x8, err = l.ops.Dev.Alloc(int64(n) * 2); err != nil {
			l.xN = 0
			return outOfMemory(l.ops.Dev, "a quantised product's operand", int64(n)*2, err)
		}
		l.xN = n
	}
	if rows > l.sN {
		if l.sx.Ptr != 0 {
			l.ops.Dev.Free(l.sx)
		}
		var err error
		if l.sx, err = l.ops.Dev.Alloc(int64(rows) * 4); err != nil {
			l.sN = 0
			return err
		}
		l.sN = rows
	}
	return nil
}

func (l *QuantLinear) weights() error {
	if l.fresh {
		return nil
	}
	for p, m := range l.mats {
		dst := Buffer{Ptr: l.w8.Ptr + uint64(m.Off)*2, Size: int64(m.Rows*m.Cols) * 2}
		sc := l.ws.Floats(l.soff[p], m.Rows)
		src := Buffer{Ptr: p, Size: int64(m.Rows*m.Cols) * 4}
		if err := l.ops.Launch("convert.cu", l.format, Dim3{X: m.Rows}, block256, dst, sc, src, m.Cols, int64(m.Cols)); err != nil {
			return err
		}
		if b, ok := l.w8b[p]; ok {
			if err := l.ops.Launch("convert.cu", "bf16_e4m3", elemGrid(m.Rows*m.Cols), block256, b, dst, int64(m.Rows*m.Cols)); err != nil {
				return err
			}
		}
	}
	l.fresh = true
	return nil
}

// bytes returns matrix p's e4m3 bytes, made from its bf16 copy (current:
// weights ran) the first time a float8 product reads it: at a 256-byte
// boundary of a slab (cuBLASLt's float8 operands are 16-byte aligned).
func (l *QuantLinear) bytes(p uint64) (Buffer, error) {
	if b, ok := l.w8b[p]; ok {
		return b, nil
	}
	m := l.mats[p]
	n := m.Rows * m.Cols
	at := (l.used + 255) &^ 255
	if n > Float8Slab || len(l.slabs) == 0 || at+n > int(l.slabs[len(l.slabs)-1].Size) {
		size := max(n, Float8Slab)
		s, err := l.ops.Dev.Alloc(int64(size))
		if err != nil {
			return Buffer{}, outOfMemory(l.ops.Dev, "the float8 products' weights", int64(size), err)
		}
		l.slabs = append(l.slabs, s)
		at = 0
	}
	b := Buffer{Ptr: l.slabs[len(l.slabs)-1].Ptr + uint64(at), Size: int64(n)}
	l.used = at + n
	src := Buffer{Ptr: l.w8.Ptr + uint64(m.Off)*2, Size: int64(n) * 2}
	if err := l.ops.Launch("convert.cu", "bf16_e4m3", elemGrid(n), block256, b, src, int64(n)); err != nil {
		return Buffer{}, err
	}
	l.w8b[p] = b
	return b, nil
}

// linearFP8 is LinearMany through cuBLASLt's float8 product (checked
// products, weights current), returning the products whose shapes it
// refuses (ErrNoFP8: remembered, said once on stderr) for the caller to
// emulate.
func (l *QuantLinear) linearFP8(x Buffer, rows, in, ldx int, ps []Product) ([]Product, error) {
	var rest []Product
	quantised := false
	for _, p := range ps {
		shape := fp8Shape{p.Out, in, p.LdY}
		if l.refused[shape] {
			rest = append(rest, p)
			continue
		}
		if !quantised {
			if err := l.growBytes(rows * in); err != nil {
				return nil, err
			}
			if err := l.ops.Launch("convert.cu", "quant_e4m3_rows8", Dim3{X: rows}, block256, l.x8b, l.sx, x, in, int64(ldx)); err != nil {
				return nil, err
			}
			quantised = true
		}
		w, err := l.bytes(p.W.Ptr)
		if err != nil {
			return nil, err
		}
		if err := l.ops.gemmFP8(l.blas, p.Out, rows, in, w, in, l.x8b, in, p.Y, p.LdY); errors.Is(err, ErrNoFP8) {
			l.refused[shape] = true
			fmt.Fprintf(os.Stderr, "keel: %v: the fp8 products of %d outputs from %d inputs are emulated in bf16\n", err, p.Out, in)
			rest = append(rest, p)
			continue
		} else if err != nil {
			return nil, err
		}
		if !l.fp8Ran {
			l.fp8Ran = true
			fmt.Fprintln(os.Stderr, "keel: the fp8 products run on cuBLASLt's float8 product (KEEL_FP8_GEMM=1)")
		}
		if err := l.ops.Launch("convert.cu", "scale_rows_cols", Dim3{X: rows}, block256, p.Y, l.sx, l.ws.Floats(l.soff[p.W.Ptr], p.Out), p.Out, int64(p.LdY)); err != nil {
			return nil, err
		}
	}
	return rest, nil
}

// Linear: y[r, 0:out] = x[r, 0:in] · Wᵀ as described above; w is one of
// the matrices given to NewQuantLinear.
func (l *QuantLinear) Linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error {
	return l.LinearMany(x, rows, in, ldx, Product{Y: y, W: w, Out: out, LdY: ldy})
}

// LinearMany computes several products of the same input x from one
// quantisation of it; each W is one of the matrices given to
// NewQuantLinear.
func (l *QuantLinear) LinearMany(x Buffer, rows, in, ldx int, ps ...Product) error {
	if err := noAddend(ps); err != nil {
		return err
	}
	if err := l.weights(); err != nil {
		return err
	}
	for _, p := range ps {
		if m, ok := l.mats[p.W.Ptr]; !ok || m.Rows != p.Out || m.Cols != in {
			return fmt.Errorf("cuda: a quantised product's weight [%d, %d] is not one of the quantised matrices", p.Out, in)
		}
	}
	if err := l.grow(rows, in); err != nil {
		return err
	}
	if l.fp8 {
		var err error
		if ps, err = l.linearFP8(x, rows, in, ldx, ps); err != nil || len(ps) == 0 {
			return err
		}
	}
	if err := l.ops.QuantE4M3Rows(l.x8, l.sx, x, rows, in, ldx); err != nil {
		return err
	}
	// Matrices back to back in the arena whose scales are too take one
	// product and one scaling (mergeProducts).
	scalesFollow := func(a, b Product) bool { return l.soff[b.W.Ptr] == l.soff[a.W.Ptr]+a.Out }
	for _, p := range mergeProducts(ps, in, scalesFollow) {
		m := l.mats[p.W.Ptr]
		w8 := Buffer{Ptr: l.w8.Ptr + uint64(m.Off)*2, Size: int64(p.Out*in) * 2}
		if err := l.ops.gemmBF16(l.blas, true, false, p.Out, rows, in, w8, in, l.x8, in, p.Y, p.LdY, false); err != nil {
			return err
		}
		if err := l.ops.Launch("convert.cu", "scale_rows_cols", Dim3{X: rows}, block256, p.Y, l.sx, l.ws.Floats(l.soff[p.W.Ptr], p.Out), p.Out, int64(p.LdY)); err != nil {
			return err
		}
	}
	return nil
}

// Grouped is every MoE expert's quantised product over its grouped rows
// (MoEGroup's grouping): y[r, 0:N] = x[r, 0:K] · W_eᵀ for the rows r of
// expert e, as LinearMany computes it per expert (the rows quantised one
// scale a row, the quantised values' product, then the channel and row
// scales), in three launches for all experts. w is expert 0's matrix of
// the ones given to NewQuantLinear ([N, K]; or its first of several
// adjacent ones, an expert's gate and up projections), expert e's
// wstride floats after it.
func (l *QuantLinear) Grouped(g *MoEGroups, pairs int, y, x, w Buffer, N, K, ldx, ldy, wstride int) error {
	if err := l.weights(); err != nil {
		return err
	}
	m0, ok := l.mats[w.Ptr]
	if !ok || m0.Cols != K {
		return fmt.Errorf("cuda: a grouped quantised product's weights [%d, %d] are not one of the quantised matrices", N, K)
	}
	s0, sstride, err := l.groupedScales(w.Ptr, g.Experts, N, K, wstride)
	if err != nil {
		return err
	}
	if err := l.grow(pairs, K); err != nil {
		return err
	}
	if err := l.ops.QuantE4M3Rows(l.x8, l.sx, x, pairs, K, ldx); err != nil {
		return err
	}
	w8 := Buffer{Ptr: l.w8.Ptr + uint64(m0.Off)*2, Size: int64((g.Experts-1)*wstride+N*K) * 2}
	if err := l.ops.GemmGroupedBF16(g, pairs, y, l.x8, w8, N, K, K, ldy, wstride, false); err != nil {
		return err
	}
	return l.ops.Launch("convert.cu", "scale_rows_cols_grouped", Dim3{X: pairs}, block256,
		y, l.sx, l.ws.Floats(s0, (g.Experts-1)*sstride+N), g.Off, g.Experts, N, int64(ldy), int64(sstride))
}

// groupedLayout is a grouped product's weights as Grouped is given them.
type groupedLayout struct {
	w                      uint64
	experts, n, k, wstride int
}

// groupedScales finds the channel scales of a grouped product over the
// experts' weights at w: the first's index in ws and the experts'
// distance. The scales of an expert's N rows must follow one another (its
// adjacent matrices' do: they are numbered in arena order), and the
// experts' be equally far apart. Checked once per layout (a decoding step
// asks for every MoE layer's twice).
func (l *QuantLinear) groupedScales(w uint64, experts, N, K, wstride int) (s0, sstride int, err error) {
	key := groupedLayout{w, experts, N, K, wstride}
	if v, ok := l.scales[key]; ok {
		return v[0], v[1], nil
	}
	s0 = l.soff[w]
	for rows, p := 0, w; rows < N; {
		m, ok := l.mats[p]
		if !ok || l.soff[p] != s0+rows || m.Cols != K || rows+m.Rows > N {
			return 0, 0, fmt.Errorf("cuda: a grouped quantised product's %d rows are not adjacent quantised matrices", N)
		}
		rows += m.Rows
		p += uint64(m.Rows*m.Cols) * 4
	}
	for e := 1; e < experts; e++ {
		p := w + uint64(e*wstride)*4
		s, ok := l.soff[p]
		if e == 1 {
			sstride = s - s0
		}
		if !ok || s != s0+e*sstride || l.mats[p].Cols != K {
			return 0, 0, fmt.Errorf("cuda: a grouped quantised product's experts are not laid out alike")
		}
	}
	if l.scales == nil {
		l.scales = map[groupedLayout][2]int{}
	}
	l.scales[key] = [2]int{s0, sstride}
	return s0, sstride, nil
}
