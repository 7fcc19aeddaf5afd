package kernels

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

//go:generate go run gemm_gen.go

// gemmKC is the depth of one K block. Each C element is accumulated in a
// register over gemmKC consecutive k values (one fused multiply-add or
// multiply-then-add per k, in increasing k), and each block's sum is then
// added to C in increasing block order. This constant is part of the
// numerical contract: changing it changes the bits of every product with
// k > gemmKC.
const gemmKC = 256

// gemmMaxCols caps the columns one work item covers, which bounds the
// per-worker packed-B buffer to gemmKC×gemmMaxCols floats (512 KiB), which
// stays in a core's L2 cache while every row panel of the item streams it.
const gemmMaxCols = 512

// gemmParMin is the work, in multiply-adds, below which a product runs on
// the calling goroutine alone (about 5 µs of work on one core): waking a
// helper goroutine costs a few microseconds, more than it saves.
const gemmParMin = 1 << 20

// gemmMicro computes one tile of C from a packed A panel and a packed B
// panel over k steps; flags == 0 stores the tile, flags != 0 adds it to C.
// The row count is fixed by the function; see gemm_gen.go.
type gemmMicro func(k int, a, b, c *float32, ldc, flags int)

// gemmWide is a micro-kernel for a few rows that spans np adjacent packed
// B panels (pstride floats apart) to keep enough FMA chains in flight. Each
// element's arithmetic is the same as in the one-panel kernels.
type gemmWide struct {
	np int
	f  func(k int, a, b *float32, pstride int, c *float32, ldc, flags int)
}

// gemmArch is one instruction-set path: its tile shape, micro-kernels (one
// per row count, all with the same per-element arithmetic) and packing.
type gemmArch struct {
	name  string
	mr    int         // rows of a full tile
	nr    int         // columns of a tile (packed B panel width)
	micro []gemmMicro // micro[r] handles r rows, 1 ≤ r ≤ mr
	wide  []gemmWide  // wide[r], where present, handles r rows × wide[r].np panels
	// strided, where present, is micro[mr] reading op(A) = Aᵀ unpacked
	// from a row-major A with row stride lda.
	strided func(k int, a *float32, lda int, b, c *float32, ldc, flags int)
	// packA writes rows [i0, i0+rows) × cols [p0, p0+kc) of op(A) to dst
	// as kc groups of rows floats.
	packA func(transA bool, a []float32, lda, i0, rows, p0, kc int, dst []float32)
	// packB writes rows [p0, p0+kc) × cols [j0, j0+cols) of op(B) to dst
	// as kc groups of nr floats, zero-filling columns cols .. nr-1.
	packB func(transB bool, b []float32, ldb, j0, cols, p0, kc int, dst []float32)
}

// gemmPortable is the pure Go path, used where no assembly path applies.
var gemmPortable = &gemmArch{
	name:  "portable",
	mr:    gemmMRGo,
	nr:    gemmNRGo,
	micro: gemmMicrosGo(),
	packA: gemmPackAGo,
	packB: func(transB bool, b []float32, ldb, j0, cols, p0, kc int, dst []float32) {
		gemmPackBGo(transB, b, ldb, j0, cols, p0, kc, gemmNRGo, dst)
	},
}

// gemmCurrent returns the path the feature flags select now. It is looked
// up on every call so tests can switch paths off.
func gemmCurrent() *gemmArch {
	switch {
	case useAVX512 && gemmAVX512 != nil:
		return gemmAVX512
	case useAVX2 && gemmAVX2 != nil:
		return gemmAVX2
	}
	return gemmPortable
}

// Gemm computes C = op(A)·op(B), or C += op(A)·op(B) when accumulate is set.
//
// All matrices are row-major. op(A) is m×k: A is stored m×k with row stride
// lda, or k×m (row stride lda) when transA is set. op(B) is k×n: B is stored
// k×n with row stride ldb, or n×k when transB is set. C is m×n with row
// stride ldc.
//
// The result is batch invariant and deterministic: each C element is the sum
// over k in a fixed order that depends only on k, whatever m, n and
// GOMAXPROCS are. The four transpose variants give the same bits for the
// same mathematical operands. Gemm panics if a slice is too short for its
// shape and stride (a programming error, never user data).
func Gemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	gemmCheckA("Gemm", transA, m, k, a, lda)
	gemmCheckB("Gemm", transB, n, k, b, ldb)
	gemmCheckC("Gemm", m, n, c, ldc)
	p := gemmProblem{
		arch: gemmCurrent(), transA: transA, transB: transB,
		m: m, n: n, k: k, a: a, lda: lda, b: b, ldb: ldb, c: c, ldc: ldc,
		accumulate: accumulate,
	}
	p.do()
}

// PackedB is a B operand packed once into the micro-kernel's panel layout,
// for weights that many products reuse. It is read-only after PackB and may
// be shared by concurrent GemmPacked calls.
type PackedB struct {
	arch *gemmArch
	n, k int
	// data holds ceil(n/nr) panels of k×nr floats (k groups of nr columns),
	// the last zero-padded to nr columns.
	data []float32
}

// N returns the columns of op(B), the n of the products it serves.
func (pb *PackedB) N() int { return pb.n }

// K returns the rows of op(B), the shared dimension k.
func (pb *PackedB) K() int { return pb.k }

// PackB packs op(B) (k×n; B stored k×n with row stride ldb, or n×k when
// transB is set) for GemmPacked. The packed copy is tied to the instruction
// set path in use now, so GemmPacked reproduces Gemm bit for bit.
func PackB(transB bool, n, k int, b []float32, ldb int) *PackedB {
	gemmCheckB("PackB", transB, n, k, b, ldb)
	ar := gemmCurrent()
	np := (n + ar.nr - 1) / ar.nr
	pb := &PackedB{arch: ar, n: n, k: k, data: gemmAlignedFloats(np * k * ar.nr)}
	for q := 0; q < np; q++ {
		j0 := q * ar.nr
		cols := min(ar.nr, n-j0)
		if k > 0 {
			ar.packB(transB, b, ldb, j0, cols, 0, k, pb.data[q*k*ar.nr:])
		}
	}
	return pb
}

// GemmPacked computes C = A·op(B), or C += A·op(B) when accumulate is set,
// with op(B) prepacked by PackB. A is m×k row-major with row stride lda; C
// is m×n with row stride ldc. The result is bitwise the same as Gemm's.
func GemmPacked(m int, a []float32, lda int, pb *PackedB, c []float32, ldc int, accumulate bool) {
	gemmCheckA("GemmPacked", false, m, pb.k, a, lda)
	gemmCheckC("GemmPacked", m, pb.n, c, ldc)
	p := gemmProblem{
		arch: pb.arch, m: m, n: pb.n, k: pb.k, a: a, lda: lda, pb: pb,
		c: c, ldc: ldc, accumulate: accumulate,
	}
	p.do()
}

// GemmTask is one product of a GemmBatch, with Gemm's arguments, or
// GemmPacked's when PB is set (then B, LDB, TransB and N are ignored, and
// TransA must be false).
type GemmTask struct {
	TransA, TransB bool
	M, N, K        int
	A              []float32
	LDA            int
	B              []float32
	LDB            int
	PB             *PackedB
	C              []float32
	LDC            int
	Accumulate     bool
}

// Run computes the task with Gemm (or GemmPacked).
func (t *GemmTask) Run() {
	if t.PB != nil {
		GemmPacked(t.M, t.A, t.LDA, t.PB, t.C, t.LDC, t.Accumulate)
		return
	}
	Gemm(t.TransA, t.TransB, t.M, t.N, t.K, t.A, t.LDA, t.B, t.LDB, t.C, t.LDC, t.Accumulate)
}

// GemmBatch computes independent products, each exactly as Gemm would
// (the same bits). It exists for mixture-of-experts layers: a few dozen
// products of a few hundred rows each split poorly across threads, so when
// there are at least two products per thread GemmBatch gives whole products
// to threads instead, largest first, each running single-threaded. The
// tasks must write disjoint parts of C and must not write what another
// task reads.
func GemmBatch(tasks []GemmTask) {
	for i := range tasks {
		t := &tasks[i]
		n := t.N
		if t.PB != nil {
			if t.TransA || t.K != t.PB.k {
				panic(fmt.Sprintf("kernels.GemmBatch: task %d: a packed B needs TransA false and K = %d", i, t.PB.k))
			}
			n = t.PB.n
		} else {
			gemmCheckB("GemmBatch", t.TransB, n, t.K, t.B, t.LDB)
		}
		gemmCheckA("GemmBatch", t.TransA, t.M, t.K, t.A, t.LDA)
		gemmCheckC("GemmBatch", t.M, n, t.C, t.LDC)
	}
	nw := runtime.GOMAXPROCS(0)
	var pool *Pool
	if len(tasks) >= 2*nw {
		pool = acquireShared()
	}
	if pool == nil {
		for i := range tasks {
			tasks[i].Run()
		}
		return
	}
	ar := gemmCurrent()
	for i := range tasks {
		t := &tasks[i]
		p := gemmProblem{
			arch: ar, transA: t.TransA, transB: t.TransB,
			m: t.M, n: t.N, k: t.K, a: t.A, lda: t.LDA, b: t.B, ldb: t.LDB, c: t.C, ldc: t.LDC,
			accumulate: t.Accumulate,
		}
		if t.PB != nil {
			p.arch, p.pb, p.b, p.n = t.PB.arch, t.PB, nil, t.PB.n
		}
		if p.m > 0 && p.n > 0 {
			shared.batch = append(shared.batch, p)
		}
	}
	// Largest first, so the last products to start are the short ones.
	b := shared.batch
	for i := 1; i < len(b); i++ {
		for j := i; j > 0 && b[j].work() > b[j-1].work(); j-- {
			b[j], b[j-1] = b[j-1], b[j]
		}
	}
	pool.RunGrain(len(b), 1, shared.fnBatch)
	releaseShared()
}

func gemmCheckA(fn string, transA bool, m, k int, a []float32, lda int) {
	if m < 0 || k < 0 {
		panic(fmt.Sprintf("kernels.%s: negative size m=%d k=%d", fn, m, k))
	}
	rows, cols := m, k
	if transA {
		rows, cols = k, m
	}
	gemmCheckMat(fn, "a", "lda", rows, cols, a, lda)
}

func gemmCheckB(fn string, transB bool, n, k int, b []float32, ldb int) {
	if n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels.%s: negative size n=%d k=%d", fn, n, k))
	}
	rows, cols := k, n
	if transB {
		rows, cols = n, k
	}
	gemmCheckMat(fn, "b", "ldb", rows, cols, b, ldb)
}

func gemmCheckC(fn string, m, n int, c []float32, ldc int) {
	gemmCheckMat(fn, "c", "ldc", m, n, c, ldc)
}

// gemmCheckMat panics unless x holds a rows×cols matrix with row stride ld.
// The assembly reads and writes without bounds checks, so this is what keeps
// a wrong call from corrupting memory.
func gemmCheckMat(fn, name, ldName string, rows, cols int, x []float32, ld int) {
	if rows == 0 || cols == 0 {
		return
	}
	if ld < cols {
		panic(fmt.Sprintf("kernels.%s: %s=%d is less than the row width %d", fn, ldName, ld, cols))
	}
	if need := (rows-1)*ld + cols; len(x) < need {
		panic(fmt.Sprintf("kernels.%s: %s has %d elements, a %d×%d matrix with %s=%d needs %d", fn, name, len(x), rows, cols, ldName, ld, need))
	}
}

// gemmProblem is one product, split into work items: a grid of row ranges
// × column ranges of C. Items are independent, so any goroutine may run any
// item and the bits do not depend on the split.

type gemmProblem struct {
	arch           *gemmArch
	transA, transB bool
	m, n, k        int
	a              []float32
	lda            int
	b              []float32
	ldb            int
	pb             *PackedB
	c              []float32
	ldc            int
	accumulate     bool

	rowStep, colStep   int
	rowItems, colItems int
}

// plan chooses the item grid for nw workers: column ranges of at most
// gemmMaxCols, then more row (or, for few rows, column) ranges until there
// are a few items per worker for load balance, keeping each item big enough
// that re-packing the shared operand stays cheap.
func (p *gemmProblem) plan(nw int) {
	mr, nr := p.arch.mr, p.arch.nr
	rowPanels := (p.m + mr - 1) / mr
	colPanels := (p.n + nr - 1) / nr
	maxPanels := gemmMaxCols / nr
	rowItems := 1
	colItems := (colPanels + maxPanels - 1) / maxPanels
	if nw > 1 {
		target := 4 * nw
		for rowItems*colItems < target {
			if rowPanels/(rowItems+1) >= 8 {
				rowItems++
			} else if colPanels/(colItems+1) >= 2 {
				colItems++
			} else {
				break
			}
		}
	}
	p.rowStep = (rowPanels + rowItems - 1) / rowItems * mr
	p.colStep = (colPanels + colItems - 1) / colItems * nr
	p.rowItems = (p.m + p.rowStep - 1) / p.rowStep
	p.colItems = (p.n + p.colStep - 1) / p.colStep
}

func (p *gemmProblem) do() {
	if p.trivial() {
		return
	}
	nw := runtime.GOMAXPROCS(0)
	if nw > 1 && p.m*p.n*p.k < gemmParMin {
		nw = 1
	}
	p.plan(nw)
	items := p.rowItems * p.colItems
	if nw > 1 && items > 1 {
		if pool := acquireShared(); pool != nil {
			shared.prob = *p
			pool.RunGrain(items, 1, shared.fnItems)
			releaseShared()
			return
		}
	}
	buf := gemmBufs.Get().(*gemmBuf)
	for it := 0; it < items; it++ {
		p.runItem(it, buf)
	}
	gemmBufs.Put(buf)
}

// trivial handles an empty product (C = 0 when k is 0 and accumulate is
// off) and reports whether there was nothing more to do.
func (p *gemmProblem) trivial() bool {
	if p.m == 0 || p.n == 0 {
		return true
	}
	if p.k == 0 {
		if !p.accumulate {
			for i := 0; i < p.m; i++ {
				clear(p.c[i*p.ldc : i*p.ldc+p.n])
			}
		}
		return true
	}
	return false
}

// work is the product's size in multiply-adds.
func (p *gemmProblem) work() int { return p.m * p.n * p.k }

// serial computes the whole product on the calling goroutine with buf.
func (p *gemmProblem) serial(buf *gemmBuf) {
	if p.trivial() {
		return
	}
	p.plan(1)
	for it := 0; it < p.rowItems*p.colItems; it++ {
		p.runItem(it, buf)
	}
}

// gemmBuf is one goroutine's packing space.
type gemmBuf struct {
	a, b, tile []float32
}

var gemmBufs = sync.Pool{New: func() any { return new(gemmBuf) }}

// gemmAlignedFloats returns n zeroed floats starting on a 64-byte boundary,
// so packed panels line up with cache lines and vector loads.
func gemmAlignedFloats(n int) []float32 {
	s := make([]float32, n+16)
	off := int(uintptr(unsafe.Pointer(&s[0]))&63) / 4
	if off != 0 {
		off = 16 - off
	}
	return s[off : off+n : off+n]
}

func gemmGrow(s []float32, n int) []float32 {
	if cap(s) >= n {
		return s[:n]
	}
	return gemmAlignedFloats(n)
}

// runItem computes one item: C[r0:r1, c0:c1] over all of k, K block by K
// block, so each element sees its blocks in increasing order.
func (p *gemmProblem) runItem(item int, buf *gemmBuf) {
	ar := p.arch
	mr, nr := ar.mr, ar.nr
	ri, ci := item/p.colItems, item%p.colItems
	r0, c0 := ri*p.rowStep, ci*p.colStep
	r1, c1 := min(r0+p.rowStep, p.m), min(c0+p.colStep, p.n)
	npan := (c1 - c0 + nr - 1) / nr
	buf.a = gemmGrow(buf.a, gemmKC*mr)
	buf.tile = gemmGrow(buf.tile, mr*nr)
	a, c := p.a, p.c
	for pc := 0; pc < p.k; pc += gemmKC {
		kc := min(gemmKC, p.k-pc)
		flags := 1
		if pc == 0 && !p.accumulate {
			flags = 0
		}
		var bs []float32
		var pstride int
		if p.pb != nil {
			pstride = p.k * nr
			bs = p.pb.data[(c0/nr)*pstride+pc*nr:]
		} else {
			pstride = kc * nr
			buf.b = gemmGrow(buf.b, npan*pstride)
			for q := 0; q < npan; q++ {
				j0 := c0 + q*nr
				ar.packB(p.transB, p.b, p.ldb, j0, min(nr, c1-j0), pc, kc, buf.b[q*pstride:])
			}
			bs = buf.b
		}
		for i0 := r0; i0 < r1; i0 += mr {
			rows := min(mr, r1-i0)
			// A full tile of a transposed A is read in place by the
			// strided kernel: its rows are already contiguous per k.
			strided := rows == mr && p.transA && ar.strided != nil
			var ap *float32
			switch {
			case strided:
				ap = &a[pc*p.lda+i0]
			case rows == 1 && !p.transA:
				// One row of a row-major A is already a packed panel.
				ap = &a[i0*p.lda+pc]
			default:
				ar.packA(p.transA, a, p.lda, i0, rows, pc, kc, buf.a)
				ap = &buf.a[0]
			}
			micro := ar.micro[rows]
			tile := func(bp, cp *float32, ldc, flags int) {
				if strided {
					ar.strided(kc, ap, p.lda, bp, cp, ldc, flags)
				} else {
					micro(kc, ap, bp, cp, ldc, flags)
				}
			}
			q := 0
			if rows < len(ar.wide) {
				w := ar.wide[rows]
				for full := (c1 - c0) / nr; q+w.np <= full; q += w.np {
					w.f(kc, ap, &bs[q*pstride], pstride, &c[i0*p.ldc+c0+q*nr], p.ldc, flags)
				}
			}
			for ; q < npan; q++ {
				j0 := c0 + q*nr
				cols := min(nr, c1-j0)
				if cols == nr {
					tile(&bs[q*pstride], &c[i0*p.ldc+j0], p.ldc, flags)
					continue
				}
				// Edge tile: same kernel into a scratch tile, then the
				// same single addition (or store) into C.
				t := buf.tile
				tile(&bs[q*pstride], &t[0], nr, 0)
				for i := 0; i < rows; i++ {
					dst := c[(i0+i)*p.ldc+j0 : (i0+i)*p.ldc+j0+cols]
					src := t[i*nr : i*nr+cols]
					if flags == 0 {
						copy(dst, src)
					} else {
						for j, v := range src {
							dst[j] += v
						}
					}
				}
			}
		}
	}
}

// gemmRef is the plain triple loop: the reference the fast paths are tested
// against.
func gemmRef(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			if accumulate {
				c[i*ldc+j] += s
			} else {
				c[i*ldc+j] = s
			}
		}
	}
}
