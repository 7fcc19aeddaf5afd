package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
)

// gemmPaths runs f once per instruction-set path this CPU has, with the
// feature flags switched to select it.
func gemmPaths(t *testing.T, f func(t *testing.T)) {
	save512, save2 := useAVX512, useAVX2
	defer func() { useAVX512, useAVX2 = save512, save2 }()
	type path struct {
		name      string
		avx512, a bool
	}
	var paths []path
	if save512 && gemmAVX512 != nil {
		paths = append(paths, path{"avx512", true, true})
	}
	if save2 && gemmAVX2 != nil {
		paths = append(paths, path{"avx2", false, true})
	}
	paths = append(paths, path{"portable", false, false})
	for _, p := range paths {
		useAVX512, useAVX2 = p.avx512, p.a
		if got := gemmCurrent().name; got != p.name {
			t.Fatalf("flags select %s, want %s", got, p.name)
		}
		t.Run(p.name, f)
	}
}

func randMat(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// opA returns op(A)[i][p] for the stored layout.
func opAt(trans bool, x []float32, ld, i, p int) float32 {
	if trans {
		return x[p*ld+i]
	}
	return x[i*ld+p]
}

// storeOp lays out the logical rows×cols matrix l (row-major, dense) with
// row stride ld, transposed when trans is set, padding with NaN so a read
// outside the matrix shows.
func storeOp(trans bool, l []float32, rows, cols, ld int) []float32 {
	sr, sc := rows, cols
	if trans {
		sr, sc = cols, rows
	}
	s := make([]float32, sr*ld)
	for i := range s {
		s[i] = float32(math.NaN())
	}
	for i := 0; i < sr; i++ {
		for j := 0; j < sc; j++ {
			if trans {
				s[i*ld+j] = l[j*cols+i]
			} else {
				s[i*ld+j] = l[i*cols+j]
			}
		}
	}
	return s
}

func TestGemmHandComputed(t *testing.T) {
	gemmPaths(t, func(t *testing.T) {
		// [1 2 3; 4 5 6] · [1 -1; 0 2; 3 1] = [10 6; 22 12]
		a := []float32{1, 2, 3, 4, 5, 6}
		b := []float32{1, -1, 0, 2, 3, 1}
		c := []float32{100, 200, 300, 400}
		Gemm(false, false, 2, 2, 3, a, 3, b, 2, c, 2, false)
		want := []float32{10, 6, 22, 12}
		for i := range c {
			if c[i] != want[i] {
				t.Fatalf("C = %v, want %v", c, want)
			}
		}
		Gemm(false, false, 2, 2, 3, a, 3, b, 2, c, 2, true)
		for i := range c {
			if c[i] != 2*want[i] {
				t.Fatalf("accumulated C = %v, want %v", c, want)
			}
		}
		// Aᵀ·Bᵀ with Aᵀ stored 3×2 and Bᵀ stored 2×3.
		at := []float32{1, 4, 2, 5, 3, 6}
		bt := []float32{1, 0, 3, -1, 2, 1}
		Gemm(true, true, 2, 2, 3, at, 2, bt, 3, c, 2, false)
		for i := range c {
			if c[i] != want[i] {
				t.Fatalf("AᵀBᵀ: C = %v, want %v", c, want)
			}
		}
	})
}

var gemmSizes = []int{1, 2, 7, 13, 14, 15, 17, 31, 33, 64, 100, 257}

// TestGemmReference checks every transpose combination, with and without
// accumulate and with padded strides, against a float64 reference.
func TestGemmReference(t *testing.T) {
	gemmPaths(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		shapes := [][3]int{{1, 1, 1}, {3, 5, 0}}
		for i := 0; i < 40; i++ {
			shapes = append(shapes, [3]int{
				gemmSizes[r.IntN(len(gemmSizes))],
				gemmSizes[r.IntN(len(gemmSizes))],
				gemmSizes[r.IntN(len(gemmSizes))],
			})
		}
		shapes = append(shapes, [3]int{37, 45, 600}, [3]int{5, 70, 513})
		for si, sh := range shapes {
			m, n, k := sh[0], sh[1], sh[2]
			for combo := 0; combo < 8; combo++ {
				ta, tb, acc := combo&1 != 0, combo&2 != 0, combo&4 != 0
				pad := si % 3
				la, lb := randMat(r, m*k), randMat(r, k*n)
				lda, ldb := k+pad, n+pad
				if ta {
					lda = m + pad
				}
				if tb {
					ldb = k + pad
				}
				a := storeOp(ta, la, m, k, lda)
				b := storeOp(tb, lb, k, n, ldb)
				ldc := n + 2*pad
				c := randMat(r, m*ldc)
				c0 := append([]float32(nil), c...)
				Gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc)
				for i := 0; i < m; i++ {
					for j := 0; j < ldc; j++ {
						got := c[i*ldc+j]
						if j >= n {
							if math.Float32bits(got) != math.Float32bits(c0[i*ldc+j]) {
								t.Fatalf("%v T%v%v acc=%v: wrote C[%d][%d] outside the matrix", sh, ta, tb, acc, i, j)
							}
							continue
						}
						var s, mag float64
						for p := 0; p < k; p++ {
							x := float64(la[i*k+p]) * float64(lb[p*n+j])
							s += x
							mag += math.Abs(x)
						}
						if acc {
							s += float64(c0[i*ldc+j])
							mag += math.Abs(float64(c0[i*ldc+j]))
						}
						tol := 2 * float64(k+2) * 0x1p-24 * mag
						if d := math.Abs(float64(got) - s); !(d <= tol) {
							t.Fatalf("%v transA=%v transB=%v acc=%v: C[%d][%d] = %g, want %g (tol %g)", sh, ta, tb, acc, i, j, got, s, tol)
						}
					}
				}
			}
		}
	})
}

// gemmCase is one product with concrete operands, computed by Gemm into a
// fresh C.
type gemmCase struct {
	ta, tb     bool
	m, n, k    int
	a, b       []float32
	lda, ldb   int
	accumulate bool
	c0         []float32 // initial C (m×n dense) when accumulating
}

func newGemmCase(r *rand.Rand, ta, tb bool, m, n, k int, acc bool) *gemmCase {
	g := &gemmCase{ta: ta, tb: tb, m: m, n: n, k: k, accumulate: acc}
	g.lda, g.ldb = k, n
	if ta {
		g.lda = m
	}
	if tb {
		g.ldb = k
	}
	g.a, g.b = randMat(r, m*k), randMat(r, n*k)
	g.c0 = randMat(r, m*n)
	return g
}

func (g *gemmCase) full() []float32 {
	c := append([]float32(nil), g.c0...)
	Gemm(g.ta, g.tb, g.m, g.n, g.k, g.a, g.lda, g.b, g.ldb, c, g.n, g.accumulate)
	return c
}

// rows computes rows [i0, i1) of C alone, addressing A as a sub-matrix.
func (g *gemmCase) rows(i0, i1 int) []float32 {
	c := append([]float32(nil), g.c0[i0*g.n:i1*g.n]...)
	var a []float32
	if g.ta {
		a = g.a[i0:]
	} else {
		a = g.a[i0*g.lda:]
	}
	Gemm(g.ta, g.tb, i1-i0, g.n, g.k, a, g.lda, g.b, g.ldb, c, g.n, g.accumulate)
	return c
}

// cols computes columns [j0, j1) of C alone, addressing B as a sub-matrix
// and C with a wide stride.
func (g *gemmCase) cols(j0, j1 int) []float32 {
	c := append([]float32(nil), g.c0...)
	var b []float32
	if g.tb {
		b = g.b[j0*g.ldb:]
	} else {
		b = g.b[j0:]
	}
	Gemm(g.ta, g.tb, g.m, j1-j0, g.k, g.a, g.lda, b, g.ldb, c[j0:], g.n, g.accumulate)
	return c
}

func sameBits(x, y []float32) int {
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			return i
		}
	}
	return -1
}

// TestGemmBatchInvariant checks that a row computed alone, a block of rows,
// a block of columns and the whole batch give the same bits, with one and
// two goroutines, for every transpose combination.
func TestGemmBatchInvariant(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	gemmPaths(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		bigM := 1031
		shapes := [][2]int{{257, 33}, {100, 600}, {17, 7}, {64, 1}}
		if testing.Short() || gemmCurrent() == gemmPortable {
			bigM = 300
			shapes = [][2]int{{33, 520}, {17, 7}}
		}
		for _, sh := range shapes {
			n, k := sh[0], sh[1]
			for combo := 0; combo < 8; combo++ {
				g := newGemmCase(r, combo&1 != 0, combo&2 != 0, bigM, n, k, combo&4 != 0)
				runtime.GOMAXPROCS(2)
				full := g.full()
				runtime.GOMAXPROCS(1)
				if i := sameBits(full, g.full()); i >= 0 {
					t.Fatalf("m=%d n=%d k=%d T%v%v: GOMAXPROCS 1 and 2 differ at %d", bigM, n, k, g.ta, g.tb, i)
				}
				runtime.GOMAXPROCS(2)
				for _, rr := range [][2]int{{0, 1}, {bigM - 1, bigM}, {500 % bigM, 500%bigM + 1}, {3, 20}, {bigM - 33, bigM}} {
					part := g.rows(rr[0], rr[1])
					if i := sameBits(full[rr[0]*n:rr[1]*n], part); i >= 0 {
						t.Fatalf("m=%d n=%d k=%d T%v%v acc=%v: rows %v alone differ from the batch at element %d: %g vs %g",
							bigM, n, k, g.ta, g.tb, g.accumulate, rr, i, part[i], full[rr[0]*n+i])
					}
				}
				for _, cr := range [][2]int{{0, 1}, {n - 1, n}, {n / 3, n/3 + n/2 + 1}} {
					part := g.cols(cr[0], cr[1])
					for i := 0; i < bigM; i++ {
						row := i * n
						if j := sameBits(full[row+cr[0]:row+cr[1]], part[row+cr[0]:row+cr[1]]); j >= 0 {
							t.Fatalf("m=%d n=%d k=%d T%v%v: columns %v alone differ from the batch at C[%d][%d]", bigM, n, k, g.ta, g.tb, cr, i, cr[0]+j)
						}
					}
				}
			}
		}
	})
}

// TestGemmTransposesAgree checks that the four storage layouts of the same
// operands give the same bits.
func TestGemmTransposesAgree(t *testing.T) {
	gemmPaths(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		m, n, k := 45, 70, 300
		la, lb := randMat(r, m*k), randMat(r, k*n)
		var first []float32
		for combo := 0; combo < 4; combo++ {
			ta, tb := combo&1 != 0, combo&2 != 0
			lda, ldb := k+1, n+3
			if ta {
				lda = m + 1
			}
			if tb {
				ldb = k + 3
			}
			c := make([]float32, m*n)
			Gemm(ta, tb, m, n, k, storeOp(ta, la, m, k, lda), lda, storeOp(tb, lb, k, n, ldb), ldb, c, n, false)
			if first == nil {
				first = c
			} else if i := sameBits(first, c); i >= 0 {
				t.Fatalf("transA=%v transB=%v differs from A·B at %d", ta, tb, i)
			}
		}
	})
}

// TestGemmKBlocks checks the documented reduction order: a product over k
// equals the product over the first gemmKC values followed by accumulating
// products over the next blocks.
func TestGemmKBlocks(t *testing.T) {
	gemmPaths(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 8))
		m, n, k := 20, 40, 2*gemmKC+37
		a, b := randMat(r, m*k), randMat(r, k*n)
		whole := make([]float32, m*n)
		Gemm(false, false, m, n, k, a, k, b, n, whole, n, false)
		parts := make([]float32, m*n)
		for p0 := 0; p0 < k; p0 += gemmKC {
			kc := min(gemmKC, k-p0)
			Gemm(false, false, m, n, kc, a[p0:], k, b[p0*n:], n, parts, n, p0 > 0)
		}
		if i := sameBits(whole, parts); i >= 0 {
			t.Fatalf("blocked sum differs at %d: %g vs %g", i, whole[i], parts[i])
		}
	})
}

// TestGemmPortableOrder checks the portable path bit for bit against a
// scalar model of the reduction order.
func TestGemmPortableOrder(t *testing.T) {
	save512, save2 := useAVX512, useAVX2
	defer func() { useAVX512, useAVX2 = save512, save2 }()
	useAVX512, useAVX2 = false, false
	r := rand.New(rand.NewPCG(9, 10))
	m, n, k := 9, 11, gemmKC+100
	a, b, c := randMat(r, m*k), randMat(r, k*n), randMat(r, m*n)
	want := append([]float32(nil), c...)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			for p0 := 0; p0 < k; p0 += gemmKC {
				var s float32
				for p := p0; p < min(p0+gemmKC, k); p++ {
					s = s + float32(a[i*k+p]*b[p*n+j])
				}
				want[i*n+j] += s
			}
		}
	}
	Gemm(false, false, m, n, k, a, k, b, n, c, n, true)
	if i := sameBits(want, c); i >= 0 {
		t.Fatalf("element %d: %g, want %g", i, c[i], want[i])
	}
}

func TestGemmPacked(t *testing.T) {
	gemmPaths(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		for _, sh := range [][3]int{{1, 1, 1}, {1, 100, 257}, {7, 33, 17}, {300, 70, 600}, {14, 32, 256}, {4, 5, 0}} {
			m, n, k := sh[0], sh[1], sh[2]
			for _, tb := range []bool{false, true} {
				ldb := n + 1
				if tb {
					ldb = k + 1
				}
				b := storeOp(tb, randMat(r, k*n), k, n, ldb)
				a := randMat(r, m*(k+2))
				pb := PackB(tb, n, k, b, ldb)
				if pb.N() != n || pb.K() != k {
					t.Fatalf("PackedB is %d×%d, want %d×%d", pb.K(), pb.N(), k, n)
				}
				for _, acc := range []bool{false, true} {
					want := randMat(r, m*(n+3))
					got := append([]float32(nil), want...)
					Gemm(false, tb, m, n, k, a, k+2, b, ldb, want, n+3, acc)
					GemmPacked(m, a, k+2, pb, got, n+3, acc)
					if i := sameBits(want, got); i >= 0 {
						t.Fatalf("%v transB=%v acc=%v: GemmPacked differs from Gemm at %d", sh, tb, acc, i)
					}
				}
			}
		}
	})
}

func TestGemmBadArgs(t *testing.T) {
	a := make([]float32, 12)
	for _, tc := range []struct {
		name string
		f    func()
		want string
	}{
		{"short a", func() { Gemm(false, false, 4, 3, 4, a[:15-4], 4, a, 3, a, 3, false) }, "a has 11 elements"},
		{"small lda", func() { Gemm(false, false, 2, 2, 4, a, 3, a, 2, a, 2, false) }, "lda=3"},
		{"short b", func() { Gemm(false, true, 1, 3, 4, a, 4, a[:10], 4, a, 3, false) }, "b has 10 elements"},
		{"short c", func() { Gemm(false, false, 2, 2, 2, a, 2, a, 2, a[:3], 2, false) }, "c has 3 elements"},
		{"negative", func() { Gemm(false, false, -1, 2, 2, a, 2, a, 2, a, 2, false) }, "negative"},
		{"packed short c", func() { GemmPacked(2, a, 2, PackB(false, 3, 2, a, 3), a[:4], 3, false) }, "c has 4"},
	} {
		func() {
			defer func() {
				msg := fmt.Sprint(recover())
				if !strings.Contains(msg, tc.want) {
					t.Errorf("%s: panic %q, want one mentioning %q", tc.name, msg, tc.want)
				}
			}()
			tc.f()
		}()
	}
}

func TestGemmNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(13, 14))
	for _, sh := range [][3]int{{1, 64, 64}, {8, 512, 512}, {200, 256, 256}} {
		m, n, k := sh[0], sh[1], sh[2]
		a, b, c := randMat(r, m*k), randMat(r, n*k), make([]float32, m*n)
		pb := PackB(true, n, k, b, k)
		Gemm(false, true, m, n, k, a, k, b, k, c, n, false)
		GemmPacked(m, a, k, pb, c, n, false)
		if n := testing.AllocsPerRun(20, func() { GemmPacked(m, a, k, pb, c, n, false) }); n != 0 {
			t.Errorf("GemmPacked %v: %v allocations per call", sh, n)
		}
		if n := testing.AllocsPerRun(20, func() { Gemm(false, true, m, n, k, a, k, b, k, c, n, true) }); n != 0 {
			t.Errorf("Gemm %v: %v allocations per call", sh, n)
		}
	}
}

// TestGemmLong compares large random products across GOMAXPROCS settings
// and row splits; it runs only with KEEL_LONG=1.
func TestGemmLong(t *testing.T) {
	if os.Getenv("KEEL_LONG") == "" {
		t.Skip("set KEEL_LONG=1")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	r := rand.New(rand.NewPCG(15, 16))
	for it := 0; it < 100; it++ {
		m, n, k := 1+r.IntN(2500), 1+r.IntN(1500), 1+r.IntN(1500)
		g := newGemmCase(r, r.IntN(2) == 0, r.IntN(2) == 0, m, n, k, r.IntN(2) == 0)
		runtime.GOMAXPROCS(1 + r.IntN(4))
		full := g.full()
		i0 := r.IntN(m)
		i1 := i0 + 1 + r.IntN(m-i0)
		runtime.GOMAXPROCS(1 + r.IntN(4))
		if i := sameBits(full[i0*n:i1*n], g.rows(i0, i1)); i >= 0 {
			t.Fatalf("m=%d n=%d k=%d rows %d..%d differ at %d", m, n, k, i0, i1, i)
		}
	}
}

// TestGemmConcurrent runs products from several goroutines at once (some
// find the worker pool busy and run alone) and checks each against the
// result computed in isolation.
func TestGemmConcurrent(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	const jobs = 8
	cases := make([]*gemmCase, jobs)
	want := make([][]float32, jobs)
	for i := range cases {
		cases[i] = newGemmCase(r, i%2 == 0, i%3 == 0, 100+37*i, 64+i, 200, i%4 == 0)
		want[i] = cases[i].full()
	}
	errs := make(chan string, jobs)
	for i := range cases {
		go func() {
			for rep := 0; rep < 5; rep++ {
				if j := sameBits(want[i], cases[i].full()); j >= 0 {
					errs <- fmt.Sprintf("case %d rep %d differs at %d", i, rep, j)
					return
				}
			}
			errs <- ""
		}()
	}
	for range cases {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
}
