package kernels

import (
	"fmt"
	"math"
	"runtime"
)

// The bf16 GEMM computes C[m×n] (+)= A[m×k]·B[n×k]ᵀ, activations times
// transposed weights ([out,in], as stored in checkpoints), with bfloat16
// operands and float32 accumulation.
//
// Layout. A is row-major bfloat16; the micro-kernel reads it in place, one
// 32-bit word (a k pair) per row per step. B is packed once (weights are
// fixed during a rollout) into panels of bf16NR columns: for each k pair p,
// bf16NR words b[j][2p] | b[j][2p+1]<<16, the operand layout of
// VDPBF16PS. Edges are zero padded: B's last panel and an odd k in packing,
// A's last row tile in a zero-filled copy, so one kernel serves every tile.
//
// Arithmetic. Every output element is, on every path (AVX512_BF16,
// AVX-512F fallback, portable Go), bit for bit:
//
//	acc = 0
//	for p = 0, 1, ..., ceil(k/2)-1:
//		acc = ftz(acc + a[2p+1]·b[2p+1])   // rounded to nearest even
//		acc = ftz(acc + a[2p]·b[2p])
//	c = (acc·scaleB[j])·scaleA[i]          (+ c when accumulating)
//
// where bf16 subnormal inputs count as zero and ftz flushes float32
// subnormal results to zero: the semantics of VDPBF16PS as measured on this
// hardware (TestVDPBF16PSSemantics). Products of bf16 values are exact in
// float32, so apart from the flushing (below 2⁻¹²⁶) this is a plain float32
// dot product in a fixed order that depends only on k: results are batch
// invariant and independent of GOMAXPROCS, since K is never split.

const (
	bf16MR = 14 // rows of A per micro-kernel tile
	bf16NR = 32 // columns of B per packed panel (two zmm registers)
)

// bf16Ones supplies unit scales for unscaled operands.
var bf16Ones = func() (o [bf16NR]float32) {
	for i := range o {
		o[i] = 1
	}
	return
}()

// PackedBF16B is a weight matrix B (n×k, [out,in]) in the bf16 GEMM's
// packed layout, with optional per-output-channel scales (the fp8 mode's
// weight scales). Packing costs about as much as reading B once; pack
// weights once per weight update and reuse them for every GEMM. The zero
// value is an empty matrix ready for the Pack methods.
type PackedBF16B struct {
	n, k, kp int
	data     []uint32  // [ceil(n/32)][kp][32]
	scale    []float32 // nil, or per column, padded with ones to a panel multiple
}

// N returns the number of output channels (rows of B, columns of C).
func (p *PackedBF16B) N() int { return p.n }

// K returns the inner dimension.
func (p *PackedBF16B) K() int { return p.k }

// Scales returns the per-output-channel scales, or nil when B is unscaled.
func (p *PackedBF16B) Scales() []float32 {
	if p.scale == nil {
		return nil
	}
	return p.scale[:p.n]
}

// PackBF16B packs the n×k bfloat16 matrix b (row stride ldb).
func PackBF16B(b []BF16, n, k, ldb int) *PackedBF16B {
	p := new(PackedBF16B)
	p.Pack(b, n, k, ldb)
	return p
}

// PackBF16BFloat32 rounds the n×k float32 matrix b (row stride ldb) to
// bfloat16 and packs it: the bf16 precision mode's weights.
func PackBF16BFloat32(b []float32, n, k, ldb int) *PackedBF16B {
	p := new(PackedBF16B)
	p.PackFloat32(b, n, k, ldb)
	return p
}

// PackE4M3B quantises the n×k float32 weight matrix b (row stride ldb) to
// float8 e4m3 with one scale per output channel (QuantizeE4M3Rows) and
// packs it: the fp8 precision mode's weights.
func PackE4M3B(b []float32, n, k, ldb int) *PackedBF16B {
	p := new(PackedBF16B)
	p.PackE4M3(b, n, k, ldb)
	return p
}

// Pack replaces p's contents with the n×k bfloat16 matrix b (row stride
// ldb), unscaled, reusing p's storage when it is large enough.
func (p *PackedBF16B) Pack(b []BF16, n, k, ldb int) {
	checkMatrix("PackBF16B", "b", len(b), n, k, ldb)
	p.reset(n, k, false)
	if k == 0 {
		return
	}
	for j := range n {
		p.packRow(j, b[j*ldb:j*ldb+k])
	}
}

// PackFloat32 replaces p's contents with the n×k float32 matrix b rounded
// to bfloat16, unscaled, reusing p's storage when it is large enough.
func (p *PackedBF16B) PackFloat32(b []float32, n, k, ldb int) {
	checkMatrix("PackBF16BFloat32", "b", len(b), n, k, ldb)
	p.reset(n, k, false)
	if k == 0 {
		return
	}
	row := make([]BF16, k)
	for j := range n {
		ToBF16(row, b[j*ldb:j*ldb+k])
		p.packRow(j, row)
	}
}

// PackE4M3 replaces p's contents with the n×k float32 matrix b quantised
// to e4m3 per output channel, with its scales, reusing p's storage when it
// is large enough.
func (p *PackedBF16B) PackE4M3(b []float32, n, k, ldb int) {
	checkMatrix("PackE4M3B", "b", len(b), n, k, ldb)
	p.reset(n, k, true)
	if k == 0 {
		return
	}
	row := make([]BF16, k)
	for j := range n {
		src := b[j*ldb : j*ldb+k]
		s := e4m3RowScale(src)
		quantizeE4M3Row(row, src, s)
		p.scale[j] = s
		p.packRow(j, row)
	}
}

func (p *PackedBF16B) reset(n, k int, scaled bool) {
	p.n, p.k, p.kp = n, k, (k+1)/2
	panels := (n + bf16NR - 1) / bf16NR
	size := panels * p.kp * bf16NR
	if cap(p.data) < size {
		p.data = make([]uint32, size)
	} else {
		p.data = p.data[:size]
		clear(p.data) // padding columns must be zero
	}
	if !scaled {
		p.scale = nil
		return
	}
	ns := panels * bf16NR
	if cap(p.scale) < ns {
		p.scale = make([]float32, ns)
	}
	p.scale = p.scale[:ns]
	for i := range p.scale {
		p.scale[i] = 1
	}
}

// packRow stores row j of B (k values) into its panel column.
func (p *PackedBF16B) packRow(j int, row []BF16) {
	base := (j/bf16NR)*p.kp*bf16NR + j%bf16NR
	d := p.data[base:]
	k := len(row)
	for q := 0; q < k/2; q++ {
		d[q*bf16NR] = uint32(row[2*q]) | uint32(row[2*q+1])<<16
	}
	if k%2 == 1 {
		d[(k/2)*bf16NR] = uint32(row[k-1])
	}
}

// panel returns packed panel q.
func (p *PackedBF16B) panel(q int) []uint32 {
	sz := p.kp * bf16NR
	return p.data[q*sz : (q+1)*sz]
}

// GemmBF16 computes C = A·Bᵀ, or C += A·Bᵀ when accumulate is set, where A
// is the m×k bfloat16 matrix a (row stride lda) and B the packed n×k matrix
// b; C is m×n with row stride ldc. When scaleA is not nil, row i of the
// product is multiplied by scaleA[i] and by B's per-channel scales: the fp8
// mode's C[i][j] = scaleA[i]·scaleB[j]·acc (see the top of this file for
// the exact arithmetic). Accumulation is float32 in a fixed order, so
// results are deterministic and batch invariant. After warm-up it does not
// allocate. It panics if the slices are too short for the shapes.
func GemmBF16(m int, a []BF16, lda int, scaleA []float32, b *PackedBF16B, c []float32, ldc int, accumulate bool) {
	checkMatrix("GemmBF16", "a", len(a), m, b.k, lda)
	if scaleA != nil && len(scaleA) < m {
		panic(fmt.Sprintf("kernels: GemmBF16: scaleA has %d elements, need %d", len(scaleA), m))
	}
	bf16Gemm(m, bf16ModeBF16, a, nil, lda, scaleA, b, c, ldc, accumulate)
}

// GemmBF16F32A is GemmBF16 for float32 activations: A is rounded to
// bfloat16 (round to nearest even) on the way in, as the bf16 precision
// mode does, without a separate pass or buffer for the caller.
func GemmBF16F32A(m int, a []float32, lda int, b *PackedBF16B, c []float32, ldc int, accumulate bool) {
	checkMatrix("GemmBF16F32A", "a", len(a), m, b.k, lda)
	bf16Gemm(m, bf16ModeRound, nil, a, lda, nil, b, c, ldc, accumulate)
}

// GemmE4M3F32A is the fp8 precision mode's GEMM: A (float32 activations)
// is quantised to e4m3 with one scale per token (row) as in
// QuantizeE4M3Rows, B should come from PackE4M3B, and C = scaleA[i]·
// scaleB[j]·(quantised A · quantised Bᵀ) with float32 accumulation on the
// bf16 kernel (every e4m3 value is exact in bfloat16).
func GemmE4M3F32A(m int, a []float32, lda int, b *PackedBF16B, c []float32, ldc int, accumulate bool) {
	checkMatrix("GemmE4M3F32A", "a", len(a), m, b.k, lda)
	bf16Gemm(m, bf16ModeE4M3, nil, a, lda, nil, b, c, ldc, accumulate)
}

// checkMatrix panics unless a slice of length have holds a rows×cols
// matrix with row stride ld.
func checkMatrix(fn, name string, have, rows, cols, ld int) {
	if rows < 0 || cols < 0 || ld < cols || ld < 0 {
		panic(fmt.Sprintf("kernels: %s: bad shape for %s: %d×%d with row stride %d", fn, name, rows, cols, ld))
	}
	if rows > 0 && cols > 0 {
		if need := (rows-1)*ld + cols; have < need {
			panic(fmt.Sprintf("kernels: %s: %s has %d elements, need %d for %d×%d with row stride %d", fn, name, have, need, rows, cols, ld))
		}
	}
}

// How A reaches the kernel.
const (
	bf16ModeBF16  = iota // bfloat16, read in place
	bf16ModeRound        // float32, rounded to bf16 into a buffer
	bf16ModeE4M3         // float32, quantised per row to e4m3 into a buffer
)

// bf16Trivial handles an empty product (C = 0 when k is 0 and accumulate
// is off) and reports whether there was nothing more to do.
func bf16Trivial(m, n, k int, c []float32, ldc int, accumulate bool) bool {
	if m == 0 || n == 0 {
		return true
	}
	if k == 0 {
		if !accumulate {
			for i := range m {
				clear(c[i*ldc : i*ldc+n])
			}
		}
		return true
	}
	return false
}

func bf16Gemm(m, mode int, abf []BF16, af []float32, lda int, scaleA []float32, b *PackedBF16B, c []float32, ldc int, accumulate bool) {
	n, k := b.n, b.k
	checkMatrix("GemmBF16", "c", len(c), m, n, ldc)
	if bf16Trivial(m, n, k, c, ldc, accumulate) {
		return
	}
	j := getBF16Job()
	j.bf16Call = bf16Call{
		m: m, n: n, k: k, kp: b.kp, mode: mode,
		abf: abf, af: af, lda: lda, scaleA: scaleA,
		b: b, c: c, ldc: ldc, accumulate: accumulate,
	}
	j.plan(runtime.GOMAXPROCS(0))
	j.execute()
	j.bf16Call = bf16Call{}
	putBF16Job(j)
}

// bf16Job is one GEMM call: its operands and its split into tasks, each
// task a block of row tiles times a block of column panels. Tasks are
// claimed dynamically; the result does not depend on who computes what.
type bf16Job struct {
	bf16Call
}

// bf16Call is one GEMM call: its operands and its split into tasks, each
// task a block of row tiles times a block of column panels. Tasks are
// claimed dynamically; the result does not depend on who computes what.
type bf16Call struct {
	m, n, k, kp int
	mode        int
	abf         []BF16
	af          []float32
	lda         int
	scaleA      []float32
	b           *PackedBF16B
	c           []float32
	ldc         int
	accumulate  bool

	tilesM, panels int
	nbM, nbN       int

	// shared holds all of A prepared (padded to whole tiles) when several
	// tasks use the same rows; otherwise each task prepares its own.
	shared *bf16Scratch
	phase  int // 0: prepare shared A, 1: tiles
}

// plan chooses the task split for w workers. Row blocks of about 8 tiles
// keep a block of A in L2 while a panel of B stays in L1/L2; with too few
// row blocks to feed the workers, the columns are split too.
func (j *bf16Job) plan(w int) {
	j.tilesM = (j.m + bf16MR - 1) / bf16MR
	j.panels = (j.n + bf16NR - 1) / bf16NR
	j.nbM = max(1, (j.tilesM+4)/8)
	j.nbN = 1
	if w <= 1 || j.m*j.n*j.k < 1<<18 {
		return
	}
	if j.nbM > 1 {
		j.nbM = min(j.tilesM, (j.nbM+w-1)/w*w)
	}
	if j.nbM < 2*w {
		j.nbN = min(j.panels, (4*w+j.nbM-1)/j.nbM)
	}
}

// needsPrep reports whether A must be copied into a padded bf16 buffer for
// every tile (not only the last, partial one).
func (j *bf16Job) needsPrep() bool {
	return j.mode != bf16ModeBF16 || j.k%2 == 1
}

func (j *bf16Job) execute() {
	if j.nbN > 1 && j.needsPrep() {
		// Several column blocks share each row block: prepare A once.
		rows := j.tilesM * bf16MR
		s := getBF16Scratch()
		s.grow(rows*2*j.kp, rows)
		j.shared = s
		chunks := 1
		if j.m*j.k >= 1<<16 {
			chunks = min(j.tilesM, 4*runtime.GOMAXPROCS(0))
		}
		j.phase = 0
		j.run(chunks)
		j.phase = 1
		j.run(j.nbM * j.nbN)
		putBF16Scratch(s)
		j.shared = nil
		return
	}
	j.phase = 1
	j.run(j.nbM * j.nbN)
}

// runTask runs task t of the current phase, which has chunks tasks.
func (j *bf16Job) runTask(t, chunks int, s *bf16Scratch) {
	if j.phase == 0 {
		t0, t1 := j.tilesM*t/chunks, j.tilesM*(t+1)/chunks
		ld := 2 * j.kp
		j.prepA(j.shared.a[t0*bf16MR*ld:], j.shared.sa[t0*bf16MR:], t0*bf16MR, t1*bf16MR)
		return
	}
	mb, nb := t/j.nbN, t%j.nbN
	t0, t1 := j.tilesM*mb/j.nbM, j.tilesM*(mb+1)/j.nbM
	p0, p1 := j.panels*nb/j.nbN, j.panels*(nb+1)/j.nbN
	i0 := t0 * bf16MR
	ld := 2 * j.kp

	var a []BF16
	var lda int
	var sa []float32
	switch {
	case j.shared != nil:
		a, lda = j.shared.a[i0*ld:], ld
		sa = j.shared.sa[i0:]
	case j.needsPrep():
		rows := (t1 - t0) * bf16MR
		s.grow(rows*ld, rows)
		j.prepA(s.a, s.sa, i0, i0+rows)
		a, lda, sa = s.a, ld, s.sa
	default:
		a, lda = j.abf[i0*j.lda:], j.lda
		// The last tile may be partial: give the kernel a zero-padded copy.
		if j.m < t1*bf16MR {
			s.grow(bf16MR*ld, 0)
			last := (t1 - 1) * bf16MR
			j.prepA(s.a, nil, last, last+bf16MR)
		}
	}
	// Row scales: e4m3 mode's from preparation, the caller's, or ones.
	perRow := true
	switch {
	case j.mode == bf16ModeBF16 && j.scaleA != nil:
		sa = j.scaleA[i0:]
	case j.mode != bf16ModeE4M3:
		sa, perRow = bf16Ones[:], false
	}
	sb := bf16Ones[:]
	for q := p0; q < p1; q++ {
		panel := j.b.panel(q)
		mask := uint32(0xffffffff)
		if rem := j.n - q*bf16NR; rem < bf16NR {
			mask = 1<<rem - 1
		}
		if j.b.scale != nil {
			sb = j.b.scale[q*bf16NR:]
		}
		for ti := t0; ti < t1; ti++ {
			i := ti * bf16MR
			mr := min(bf16MR, j.m-i)
			at, ldt := a[(i-i0)*lda:], lda
			if mr < bf16MR && j.shared == nil && !j.needsPrep() {
				at, ldt = s.a, ld
			}
			sat := sa
			if perRow {
				sat = sa[i-i0:]
			}
			bf16Tile(j.kp, at, ldt, panel, j.c[i*j.ldc+q*bf16NR:], j.ldc, mr, mask, j.accumulate, sat, sb)
		}
	}
}

// prepA writes rows [r0, r1) of A, prepared for the kernel, into dst (row
// stride 2·kp, zero padded past k and past m) and their scales into sa
// (e4m3 mode; sa may be nil otherwise).
func (j *bf16Job) prepA(dst []BF16, sa []float32, r0, r1 int) {
	ld := 2 * j.kp
	for r := r0; r < r1; r++ {
		out := dst[(r-r0)*ld : (r-r0+1)*ld]
		if r >= j.m {
			clear(out)
			if sa != nil {
				sa[r-r0] = 0
			}
			continue
		}
		switch j.mode {
		case bf16ModeBF16:
			copy(out, j.abf[r*j.lda:r*j.lda+j.k])
		case bf16ModeRound:
			ToBF16(out, j.af[r*j.lda:r*j.lda+j.k])
		case bf16ModeE4M3:
			row := j.af[r*j.lda : r*j.lda+j.k]
			s := e4m3RowScale(row)
			quantizeE4M3Row(out[:j.k], row, s)
			sa[r-r0] = s
		}
		if j.k < ld {
			out[j.k] = 0
		}
	}
}

// bf16Scratch is a participant's buffer for prepared rows of A.
type bf16Scratch struct {
	a  []BF16
	sa []float32
}

func (s *bf16Scratch) grow(na, nsa int) {
	if cap(s.a) < na {
		s.a = make([]BF16, na)
	}
	s.a = s.a[:na]
	if cap(s.sa) < nsa {
		s.sa = make([]float32, nsa)
	}
	s.sa = s.sa[:nsa]
}

// bf16TileGo is the portable micro-kernel: the same tile, arithmetic and
// result bits as the assembly kernels (see the top of this file).
func bf16TileGo(kp int, a []BF16, lda int, b []uint32, c []float32, ldc, mr int, mask uint32, accumulate bool, sa, sb []float32) {
	for r := range mr {
		row := a[r*lda : r*lda+2*kp]
		for col := range bf16NR {
			if mask>>col&1 == 0 {
				continue
			}
			var acc float32
			for q := range kp {
				w := b[q*bf16NR+col]
				acc = bf16MAC(acc, row[2*q+1], BF16(w>>16))
				acc = bf16MAC(acc, row[2*q], BF16(w))
			}
			v := float32(acc*sb[col]) * sa[r]
			if accumulate {
				v = c[r*ldc+col] + v
			}
			c[r*ldc+col] = v
		}
	}
}

// bf16MAC returns acc + x·y the way one half of VDPBF16PS does: subnormal
// bf16 inputs read as zero, one rounding to nearest even, a subnormal result
// flushed to zero.
func bf16MAC(acc float32, x, y BF16) float32 {
	if x&0x7f80 == 0 {
		x &= 0x8000
	}
	if y&0x7f80 == 0 {
		y &= 0x8000
	}
	p := float32(x.Float32() * y.Float32())
	var s float32
	if ap := math.Abs(float64(p)); (ap >= 0x1p-126 && ap <= math.MaxFloat32) || p == 0 {
		s = float32(acc + p) // p is exact: one rounding
	} else {
		// The float32 product under- or overflowed: the hardware's product
		// is exact. Sum in float64 (exact product; rounding twice through
		// float64 is harmless for two operands of 24-bit precision).
		s = float32(float64(acc) + float64(x.Float32())*float64(y.Float32()))
	}
	if bits := math.Float32bits(s); bits&0x7f800000 == 0 {
		s = math.Float32frombits(bits & 0x80000000)
	}
	return s
}
