package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

func bf16RandMatrix(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// bf16GemmRefNT64 is the float64 reference C[i][j] = Σ_p a[i][p]·b[j][p] with
// the operands given as float32 (already rounded by the caller), and also
// returns Σ|a||b| per element for the error bound.
func bf16GemmRefNT64(m, n, k int, a []float32, lda int, b []float32, ldb int) (ref, mag []float64) {
	ref, mag = make([]float64, m*n), make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s, g float64
			for p := range k {
				x := float64(a[i*lda+p]) * float64(b[j*ldb+p])
				s += x
				g += math.Abs(x)
			}
			ref[i*n+j], mag[i*n+j] = s, g
		}
	}
	return
}

// bf16CheckClose asserts |c - ref| <= k·2⁻²³·Σ|a||b| (float32 summation of k
// exact products, with margin) plus one float32 rounding of the result.
func bf16CheckClose(t *testing.T, what string, m, n, k int, c []float32, ldc int, ref, mag []float64) {
	t.Helper()
	for i := range m {
		for j := range n {
			got, want := float64(c[i*ldc+j]), ref[i*n+j]
			tol := float64(k+2)*0x1p-23*mag[i*n+j] + 0x1p-24*math.Abs(want) + 1e-30
			if math.Abs(got-want) > tol || got != got {
				t.Fatalf("%s: C[%d][%d] = %g, want %g ± %g (m=%d n=%d k=%d)", what, i, j, got, want, tol, m, n, k)
			}
		}
	}
}

var bf16GemmShapes = [][3]int{ // m, n, k
	{1, 1, 1}, {1, 32, 2}, {14, 32, 64}, {13, 31, 17}, {15, 33, 3},
	{29, 65, 100}, {64, 96, 255}, {100, 40, 256}, {3, 200, 5}, {57, 7, 130},
}

func TestGemmBF16AgainstFloat64(t *testing.T) {
	bf16Paths(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(11, 12))
		for _, s := range bf16GemmShapes {
			m, n, k := s[0], s[1], s[2]
			lda, ldb, ldc := k+3, k+1, n+5
			a := bf16RandMatrix(rng, m*lda)
			b := bf16RandMatrix(rng, n*ldb)
			ar, br := append([]float32(nil), a...), append([]float32(nil), b...)
			RoundBF16(ar)
			RoundBF16(br)
			ref, mag := bf16GemmRefNT64(m, n, k, ar, lda, br, ldb)
			pb := PackBF16BFloat32(b, n, k, ldb)

			c := bf16RandMatrix(rng, m*ldc)
			guard := append([]float32(nil), c...)
			GemmBF16F32A(m, a, lda, pb, c, ldc, false)
			bf16CheckClose(t, "GemmBF16F32A", m, n, k, c, ldc, ref, mag)
			for i := range m {
				for j := n; j < ldc; j++ {
					if math.Float32bits(c[i*ldc+j]) != math.Float32bits(guard[i*ldc+j]) {
						t.Fatalf("wrote C[%d][%d] outside the n=%d columns", i, j, n)
					}
				}
			}

			// BF16 A, accumulate onto C: C_old + A·Bᵀ.
			abf := make([]BF16, m*lda)
			ToBF16(abf, a)
			c2 := append([]float32(nil), guard...)
			GemmBF16(m, abf, lda, nil, pb, c2, ldc, true)
			for i := range m {
				for j := range n {
					ref[i*n+j] += float64(guard[i*ldc+j])
					mag[i*n+j] += math.Abs(float64(guard[i*ldc+j]))
				}
			}
			bf16CheckClose(t, "GemmBF16 accumulate", m, n, k, c2, ldc, ref, mag)
		}
	})
}

// TestGemmBF16Hand checks a 2×3·(3×2)ᵀ product worked out by hand, with
// scales: C[i][j] = scaleA[i]·scaleB[j]·Σ a[i][p]·b[j][p].
func TestGemmBF16Hand(t *testing.T) {
	bf16Paths(t, func(t *testing.T) {
		a := []BF16{BF16FromFloat32(1), BF16FromFloat32(2), BF16FromFloat32(3),
			BF16FromFloat32(-1), BF16FromFloat32(0.5), BF16FromFloat32(4)}
		b := []BF16{BF16FromFloat32(1), BF16FromFloat32(1), BF16FromFloat32(1),
			BF16FromFloat32(2), BF16FromFloat32(0), BF16FromFloat32(-1)}
		pb := PackBF16B(b, 2, 3, 3)
		c := make([]float32, 4)
		GemmBF16(2, a, 3, nil, pb, c, 2, false)
		want := []float32{6, -1, 3.5, -6}
		for i := range want {
			if c[i] != want[i] {
				t.Fatalf("C = %v, want %v", c, want)
			}
		}
		pb.scale = []float32{2, 0.25}
		pb.scale = append(pb.scale, make([]float32, 30)...)
		GemmBF16(2, a, 3, []float32{1, 10}, pb, c, 2, true)
		want = []float32{6 + 12, -1 - 0.25, 3.5 + 70, -6 - 15}
		for i := range want {
			if c[i] != want[i] {
				t.Fatalf("scaled accumulate: C = %v, want %v", c, want)
			}
		}
	})
}

// bf16RunAllGemms computes every GEMM variant on one problem and returns the
// outputs, for bitwise comparisons between paths and configurations.
func bf16RunAllGemms(m, n, k int, seed uint64) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 99))
	lda, ldc := k+1, n+2
	a := bf16RandMatrix(rng, m*lda)
	b := bf16RandMatrix(rng, n*k)
	// Tiny values exercise the flushing on every path: rows i%5 == 0 are
	// bf16 subnormals (read as zero, whose products with the 2⁶⁰ columns
	// would otherwise be ~2⁻⁷⁰), rows i%5 == 1 times the 2⁻⁶⁰ columns
	// j%3 == 0 give float32-subnormal partial sums (flushed).
	for i := range m {
		for p := range k {
			switch i % 5 {
			case 0:
				a[i*lda+p] *= 0x1p-130
			case 1:
				a[i*lda+p] *= 0x1p-80
			}
		}
	}
	for j := range n {
		for p := range k {
			if j%3 == 0 {
				b[j*k+p] *= 0x1p-60
			} else {
				b[j*k+p] *= 0x1p60
			}
		}
	}
	abf := make([]BF16, len(a))
	ToBF16(abf, a)
	sa := bf16RandMatrix(rng, m)
	pb := PackBF16BFloat32(b, n, k, k)
	p8 := PackE4M3B(b, n, k, k)
	cInit := bf16RandMatrix(rng, m*ldc)
	var outs [][]float32
	run := func(f func(c []float32)) {
		c := append([]float32(nil), cInit...)
		f(c)
		outs = append(outs, c)
	}
	run(func(c []float32) { GemmBF16F32A(m, a, lda, pb, c, ldc, false) })
	run(func(c []float32) { GemmBF16(m, abf, lda, nil, pb, c, ldc, true) })
	run(func(c []float32) { GemmBF16(m, abf, lda, sa, p8, c, ldc, false) })
	run(func(c []float32) { GemmE4M3F32A(m, a, lda, p8, c, ldc, true) })
	return outs
}

func bf16SameBits(x, y []float32) int {
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) && !(x[i] != x[i] && y[i] != y[i]) {
			return i
		}
	}
	return -1
}

// TestGemmBF16PathsBitwise: the AVX512_BF16 kernel, the AVX-512F fallback
// and portable Go give identical bits, flushing included.
func TestGemmBF16PathsBitwise(t *testing.T) {
	shapes := append(bf16GemmShapes, [3]int{70, 100, 300})
	var want [][][]float32
	first := true
	bf16Paths(t, func(t *testing.T) {
		for si, s := range shapes {
			got := bf16RunAllGemms(s[0], s[1], s[2], uint64(si))
			if first {
				want = append(want, got)
				continue
			}
			for v := range got {
				if i := bf16SameBits(got[v], want[si][v]); i >= 0 {
					t.Fatalf("shape %v variant %d: element %d = %g (%#08x), portable path %g (%#08x)", s, v, i,
						got[v][i], math.Float32bits(got[v][i]), want[si][v][i], math.Float32bits(want[si][v][i]))
				}
			}
		}
		first = false
	})
}

// TestGemmBF16BatchInvariance: a row computed alone equals the same row
// inside a big batch, and GOMAXPROCS does not change any bit.
func TestGemmBF16BatchInvariance(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	rng := rand.New(rand.NewPCG(13, 14))
	for _, s := range [][3]int{{300, 300, 96}, {64, 1024, 256}, {33, 70, 513}} {
		m, n, k := s[0], s[1], s[2]
		a := bf16RandMatrix(rng, m*k)
		b := bf16RandMatrix(rng, n*k)
		pb := PackBF16BFloat32(b, n, k, k)
		p8 := PackE4M3B(b, n, k, k)
		for _, mode := range []string{"bf16", "e4m3"} {
			gemm := func(rows int, a, c []float32) {
				if mode == "bf16" {
					GemmBF16F32A(rows, a, k, pb, c, n, false)
				} else {
					GemmE4M3F32A(rows, a, k, p8, c, n, false)
				}
			}
			var base []float32
			for _, procs := range []int{1, 2, 3} {
				runtime.GOMAXPROCS(procs)
				c := make([]float32, m*n)
				gemm(m, a, c)
				if base == nil {
					base = c
				} else if i := bf16SameBits(c, base); i >= 0 {
					t.Fatalf("%s %v: GOMAXPROCS=%d changes element %d", mode, s, procs, i)
				}
			}
			runtime.GOMAXPROCS(2)
			for _, i := range []int{0, 13, 14, m / 2, m - 1} {
				c := make([]float32, n)
				gemm(1, a[i*k:(i+1)*k], c)
				if j := bf16SameBits(c, base[i*n:(i+1)*n]); j >= 0 {
					t.Fatalf("%s %v: row %d alone differs at column %d", mode, s, i, j)
				}
				// And inside a differently sized batch starting at row i.
				rows := min(m-i, 17)
				c = make([]float32, rows*n)
				gemm(rows, a[i*k:(i+rows)*k], c)
				if j := bf16SameBits(c, base[i*n:(i+rows)*n]); j >= 0 {
					t.Fatalf("%s %v: rows %d..%d as a batch differ at %d", mode, s, i, i+rows, j)
				}
			}
		}
	}
}

// TestGemmE4M3AgainstFloat64: the fp8 GEMM equals the float64 product of
// the fake-quantised operands up to summation order.
func TestGemmE4M3AgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, s := range bf16GemmShapes {
		m, n, k := s[0], s[1], s[2]
		a := bf16RandMatrix(rng, m*k)
		b := bf16RandMatrix(rng, n*k)
		for i := range b { // outliers make the per-channel scales matter
			if i%13 == 0 {
				b[i] *= 50
			}
		}
		aq, bq := append([]float32(nil), a...), append([]float32(nil), b...)
		FakeQuantE4M3Rows(aq, m, k, k)
		FakeQuantE4M3Rows(bq, n, k, k)
		ref, mag := bf16GemmRefNT64(m, n, k, aq, k, bq, k)
		c := make([]float32, m*n)
		GemmE4M3F32A(m, a, k, PackE4M3B(b, n, k, k), c, n, false)
		bf16CheckClose(t, "GemmE4M3F32A", m, n, k, c, n, ref, mag)
	}
}

func TestGemmBF16Edges(t *testing.T) {
	pb := PackBF16B(nil, 3, 0, 0)
	c := []float32{1, 2, 3}
	GemmBF16F32A(1, nil, 0, pb, c, 3, true)
	if c[0] != 1 || c[2] != 3 {
		t.Errorf("k=0 accumulate changed C: %v", c)
	}
	GemmBF16F32A(1, nil, 0, pb, c, 3, false)
	if c[0] != 0 || c[2] != 0 {
		t.Errorf("k=0 did not zero C: %v", c)
	}
	GemmBF16F32A(0, nil, 4, PackBF16BFloat32(make([]float32, 8), 2, 4, 4), nil, 2, false)
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("short C did not panic")
		}
		if msg := fmt.Sprint(r); msg == "" {
			t.Fatal("empty panic message")
		}
	}()
	GemmBF16F32A(2, make([]float32, 8), 4, PackBF16BFloat32(make([]float32, 8), 2, 4, 4), make([]float32, 3), 2, false)
}

func TestGemmBF16NoAllocs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	rng := rand.New(rand.NewPCG(17, 18))
	for _, s := range [][3]int{{64, 256, 256}, {100, 64, 130}} {
		m, n, k := s[0], s[1], s[2]
		a := bf16RandMatrix(rng, m*k)
		pb := PackBF16BFloat32(bf16RandMatrix(rng, n*k), n, k, k)
		p8 := PackE4M3B(bf16RandMatrix(rng, n*k), n, k, k)
		c := make([]float32, m*n)
		for _, f := range []func(){
			func() { GemmBF16F32A(m, a, k, pb, c, n, false) },
			func() { GemmE4M3F32A(m, a, k, p8, c, n, true) },
		} {
			f()
			if allocs := testing.AllocsPerRun(20, f); allocs != 0 {
				t.Errorf("%v: %g allocations per call after warm-up", s, allocs)
			}
		}
	}
}

var bf16BenchShapes = [][3]int{ // M, K, N
	{2048, 256, 256}, {2048, 256, 1024}, {2048, 1024, 256}, {512, 512, 512}, {1024, 1024, 1024},
	{64, 256, 256}, {64, 512, 512}, {64, 1024, 1024}, {64, 256, 1024}, {64, 1024, 256},
	{256, 256, 256}, {256, 512, 512}, {256, 1024, 1024}, {256, 256, 1024}, {256, 1024, 256},
}

// BenchmarkGemmBF16 reports GFLOP/s of GemmBF16F32A (float32 activations
// rounded on the way in, packed bf16 weights) for training and decode
// shapes; BenchmarkGemmBF16Packed the same with bf16 activations;
// BenchmarkGemmE4M3 the fp8 mode.
func BenchmarkGemmBF16(b *testing.B) { bf16Bench(b, "f32a") }

func BenchmarkGemmBF16Packed(b *testing.B) { bf16Bench(b, "bf16") }

func BenchmarkGemmBF16E4M3(b *testing.B) { bf16Bench(b, "e4m3") }

func bf16Bench(b *testing.B, mode string) {
	for _, s := range bf16BenchShapes {
		m, k, n := s[0], s[1], s[2]
		b.Run(fmt.Sprintf("M%d_K%d_N%d", m, k, n), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			a := bf16RandMatrix(rng, m*k)
			w := bf16RandMatrix(rng, n*k)
			abf := make([]BF16, m*k)
			ToBF16(abf, a)
			c := make([]float32, m*n)
			var pb *PackedBF16B
			if mode == "e4m3" {
				pb = PackE4M3B(w, n, k, k)
			} else {
				pb = PackBF16BFloat32(w, n, k, k)
			}
			b.ResetTimer()
			for b.Loop() {
				switch mode {
				case "f32a":
					GemmBF16F32A(m, a, k, pb, c, n, false)
				case "bf16":
					GemmBF16(m, abf, k, nil, pb, c, n, false)
				case "e4m3":
					GemmE4M3F32A(m, a, k, pb, c, n, false)
				}
			}
			b.ReportMetric(2*float64(m)*float64(n)*float64(k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
