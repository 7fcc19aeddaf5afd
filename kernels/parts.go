package kernels

// GemmParts is one product cut into parts that any goroutines may compute,
// in any order and concurrently, each with its own GemmScratch. It is for
// callers that keep their own worker goroutines busy across many small
// products, such as the rollout engine's decode step: there, handing each
// product to this package's pool costs as much as the product, and a
// worker can run a product's parts between row operations of its own.
//
// The parts of a product write disjoint parts of C, and the result is bit
// for bit Gemm's (GemmBF16's, GemmE4M3F32A's) whatever the number of parts
// asked for and whoever runs them: the split changes which goroutine
// computes an element, never its arithmetic.
//
// A GemmParts is set up by one of its methods and then read-only until
// the next set-up; it holds references to the operands until then.
type GemmParts struct {
	n   int // parts
	f32 gemmProblem
	bf  bf16Job
	isB bool
}

// GemmScratch is one goroutine's packing space for GemmParts.Run. The
// zero value is ready; it grows on first use and is reused after.
type GemmScratch struct {
	f32 gemmBuf
	bf  bf16Scratch
}

// Packed sets up C = A·op(B) (C += with accumulate) as GemmPacked computes
// it, cut into parts for about workers goroutines (1: a single part, the
// whole product, for a caller that runs it alone).
func (g *GemmParts) Packed(m int, a []float32, lda int, pb *PackedB, c []float32, ldc int, accumulate bool, workers int) {
	gemmCheckA("GemmParts.Packed", false, m, pb.k, a, lda)
	gemmCheckC("GemmParts.Packed", m, pb.n, c, ldc)
	g.isB = false
	g.bf.bf16Call = bf16Call{}
	g.f32 = gemmProblem{
		arch: pb.arch, m: m, n: pb.n, k: pb.k, a: a, lda: lda, pb: pb,
		c: c, ldc: ldc, accumulate: accumulate,
	}
	if g.f32.trivial() {
		g.n = 0
		return
	}
	w := workers
	if w > 1 && m*pb.n*pb.k < gemmParMin {
		w = 1
	}
	g.f32.plan(max(1, w))
	g.n = g.f32.rowItems * g.f32.colItems
}

// BF16F32A sets up GemmBF16F32A's product (float32 activations rounded to
// bfloat16), cut into parts for about workers goroutines.
func (g *GemmParts) BF16F32A(m int, a []float32, lda int, b *PackedBF16B, c []float32, ldc int, accumulate bool, workers int) {
	checkMatrix("GemmParts.BF16F32A", "a", len(a), m, b.k, lda)
	g.setBF16(m, bf16ModeRound, a, lda, b, c, ldc, accumulate, workers)
}

// E4M3F32A sets up GemmE4M3F32A's product (activations quantised to e4m3
// per row, B from PackE4M3B), cut into parts for about workers goroutines.
func (g *GemmParts) E4M3F32A(m int, a []float32, lda int, b *PackedBF16B, c []float32, ldc int, accumulate bool, workers int) {
	checkMatrix("GemmParts.E4M3F32A", "a", len(a), m, b.k, lda)
	g.setBF16(m, bf16ModeE4M3, a, lda, b, c, ldc, accumulate, workers)
}

func (g *GemmParts) setBF16(m, mode int, a []float32, lda int, b *PackedBF16B, c []float32, ldc int, accumulate bool, workers int) {
	n, k := b.n, b.k
	checkMatrix("GemmParts", "c", len(c), m, n, ldc)
	g.isB = true
	g.f32 = gemmProblem{}
	g.n = 0
	g.bf.bf16Call = bf16Call{}
	if bf16Trivial(m, n, k, c, ldc, accumulate) {
		return
	}
	// Each part prepares its own rows of A (no shared preparation phase):
	// a part is then self-contained, whoever runs it and whenever.
	g.bf.bf16Call = bf16Call{
		m: m, n: n, k: k, kp: b.kp, mode: mode,
		af: a, lda: lda, b: b, c: c, ldc: ldc, accumulate: accumulate,
		phase: 1,
	}
	g.bf.plan(max(1, workers))
	g.n = g.bf.nbM * g.bf.nbN
}

// Len returns the number of parts; 0 when there is nothing to compute.
func (g *GemmParts) Len() int { return g.n }

// Run computes part i (0 ≤ i < Len) with the caller's scratch s.
func (g *GemmParts) Run(i int, s *GemmScratch) {
	if i < 0 || i >= g.n {
		panic("kernels: GemmParts.Run: part out of range")
	}
	if g.isB {
		g.bf.runTask(i, g.n, &s.bf)
		return
	}
	g.f32.runItem(i, &s.f32)
}

// RunAll computes every part, in order, on the caller.
func (g *GemmParts) RunAll(s *GemmScratch) {
	for i := 0; i < g.n; i++ {
		g.Run(i, s)
	}
}
