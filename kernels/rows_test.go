package kernels

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
)

// paths lists the instruction-set paths this CPU can run; forEachPath runs a
// test once per path with the feature flags set accordingly.
func paths() []string {
	var ps []string
	if useAVX512 {
		ps = append(ps, "avx512")
	}
	if useAVX2 {
		ps = append(ps, "avx2")
	}
	return append(ps, "portable")
}

// setPath switches the kernels to one path and returns a function restoring
// the detected flags.
func setPath(p string) func() {
	s512, s2, sbf := useAVX512, useAVX2, useAVX512BF16
	switch p {
	case "avx2":
		useAVX512, useAVX512BF16 = false, false
	case "portable":
		useAVX512, useAVX2, useAVX512BF16 = false, false, false
	}
	return func() { useAVX512, useAVX2, useAVX512BF16 = s512, s2, sbf }
}

func forEachPath(t *testing.T, f func(t *testing.T)) {
	for _, p := range paths() {
		restore := setPath(p)
		t.Run(p, f)
		restore()
	}
}

func randSlice(r *rand.Rand, n int, scale float64) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64() * scale)
	}
	return s
}

// ulp32 returns the spacing of float32 values at |v| (v a float64), the
// subnormal spacing 2^-149 at the bottom.
func ulp32(v float64) float64 {
	v = math.Abs(v)
	if v < 0x1p-126 {
		return 0x1p-149
	}
	_, e := math.Frexp(v)
	return math.Ldexp(1, e-24)
}

// atOffset copies x into a fresh buffer at element offset off, so tests can
// check that results do not depend on alignment.
func atOffset(x []float32, off int) []float32 {
	buf := make([]float32, len(x)+off+16)
	copy(buf[off:], x)
	return buf[off : off+len(x) : off+len(x)]
}

var testLens = func() []int {
	var ls []int
	for n := 0; n <= 70; n++ {
		ls = append(ls, n)
	}
	return append(ls, 127, 128, 129, 255, 1000, 4096, 4097, 4099)
}()

func TestDotHandValues(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		if got := Dot([]float32{1, 2, 3}, []float32{4, 5, 6}); got != 32 {
			t.Errorf("Dot = %v, want 32", got)
		}
		// 100 ones against 0..99: 4950, exact in float32 in any order.
		a, b := make([]float32, 100), make([]float32, 100)
		for i := range a {
			a[i], b[i] = 1, float32(i)
		}
		if got := Dot(a, b); got != 4950 {
			t.Errorf("Dot = %v, want 4950", got)
		}
		if got := Dot(nil, nil); got != 0 {
			t.Errorf("Dot(nil) = %v", got)
		}
	})
}

func TestDotAccuracyAndInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	forEachPath(t, func(t *testing.T) {
		for _, n := range testLens {
			a, b := randSlice(r, n, 1), randSlice(r, n, 1)
			var ref, mag float64
			for i := range a {
				ref += float64(a[i]) * float64(b[i])
				mag += math.Abs(float64(a[i]) * float64(b[i]))
			}
			got := Dot(a, b)
			tol := float64(n/4+8) * 0x1p-24 * mag
			if math.Abs(float64(got)-ref) > tol {
				t.Errorf("n=%d: Dot = %v, float64 %v (tol %g)", n, got, ref, tol)
			}
			for off := 1; off < 16; off += 3 {
				if g := Dot(atOffset(a, off), atOffset(b, off+5)); math.Float32bits(g) != math.Float32bits(got) {
					t.Fatalf("n=%d: Dot at offset %d = %v, at 0 = %v", n, off, g, got)
				}
			}
		}
	})
}

func TestAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	forEachPath(t, func(t *testing.T) {
		for _, n := range testLens {
			x, y0 := randSlice(r, n, 1), randSlice(r, n+3, 1)
			alpha := float32(r.NormFloat64())
			y := append([]float32(nil), y0...)
			Axpy(alpha, x, y[:n])
			for i := 0; i < n; i++ {
				ref := float64(alpha)*float64(x[i]) + float64(y0[i])
				tol := 0x1p-23 * (math.Abs(float64(alpha)*float64(x[i])) + math.Abs(float64(y0[i])))
				if math.Abs(float64(y[i])-ref) > tol {
					t.Fatalf("n=%d i=%d: got %v want %v", n, i, y[i], ref)
				}
			}
			for i := n; i < n+3; i++ {
				if y[i] != y0[i] {
					t.Fatalf("n=%d: Axpy wrote past the end at %d", n, i)
				}
			}
			y2 := atOffset(y0[:n], 7)
			Axpy(alpha, atOffset(x, 3), y2)
			for i := range y2 {
				if math.Float32bits(y2[i]) != math.Float32bits(y[i]) {
					t.Fatalf("n=%d: Axpy depends on offset at %d", n, i)
				}
			}
		}
	})
}

func TestDotRowsAxpyRowsMatchDotAxpy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	forEachPath(t, func(t *testing.T) {
		for _, d := range []int{1, 5, 8, 15, 16, 17, 31, 32, 33, 48, 64, 65, 96, 100, 128, 129, 200, 256, 300} {
			for _, n := range []int{1, 2, 3, 9} {
				stride := d + r.IntN(9)
				rows := randSlice(r, (n-1)*stride+d, 1)
				q := randSlice(r, d, 1)
				dst := make([]float32, n+1)
				dst[n] = 42
				DotRows(dst[:n], q, rows, n, stride, 0.3)
				for j := 0; j < n; j++ {
					want := 0.3 * Dot(q, rows[j*stride:j*stride+d])
					if math.Float32bits(dst[j]) != math.Float32bits(want) {
						t.Fatalf("d=%d n=%d j=%d: DotRows %v, scale·Dot %v", d, n, j, dst[j], want)
					}
				}
				if dst[n] != 42 {
					t.Fatalf("DotRows wrote past n")
				}
				p := randSlice(r, n, 1)
				out0 := randSlice(r, d+2, 1)
				out := append([]float32(nil), out0...)
				AxpyRows(out[:d], p, rows, n, stride)
				want := append([]float32(nil), out0...)
				for j := 0; j < n; j++ {
					Axpy(p[j], rows[j*stride:j*stride+d], want[:d])
				}
				for i := range want {
					if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
						t.Fatalf("d=%d n=%d i=%d: AxpyRows %v, Axpy loop %v", d, n, i, out[i], want[i])
					}
				}
			}
		}
	})
}

func TestExpSpecialValues(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct{ x, want float32 }{
		{0, 1},
		{float32(math.Copysign(0, -1)), 1},
		{-inf, 0},
		{inf, inf},
		{89, inf},
		{100, inf},
		{1e30, inf},
		{-104, 0},
		{-200, 0},
		{-1e30, 0},
		{1, float32(math.E)},
	}
	forEachPath(t, func(t *testing.T) {
		for _, c := range cases {
			// Place each value in every lane position of a short row.
			for n := 1; n <= 40; n += 13 {
				x := make([]float32, n)
				for i := range x {
					x[i] = c.x
				}
				dst := make([]float32, n)
				Exp(dst, x)
				for i, v := range dst {
					if v != c.want || math.Signbit(float64(v)) {
						t.Fatalf("exp(%v) = %v at lane %d of %d, want %v", c.x, v, i, n, c.want)
					}
				}
			}
		}
		x := []float32{float32(math.NaN()), 1, float32(math.NaN())}
		Exp(x, x)
		if !math.IsNaN(float64(x[0])) || !math.IsNaN(float64(x[2])) || x[1] != float32(math.E) {
			t.Errorf("exp(NaN, 1, NaN) = %v", x)
		}
		if v := expOne(88.72283); math.IsInf(float64(v), 0) || v < 3.4e38 {
			t.Errorf("exp(88.72283) = %v, want finite ≈ 3.40e38", v)
		}
		// Subnormal results.
		for _, x := range []float32{-87.5, -90, -95, -100, -103} {
			got, ref := float64(expOne(x)), math.Exp(float64(x))
			if math.Abs(got-ref) > 2*0x1p-149 {
				t.Errorf("exp(%v) = %g, want %g", x, got, ref)
			}
		}
	})
}

func expOne(x float32) float32 {
	d := []float32{x}
	Exp(d, d)
	return d[0]
}

// maxULPError returns the largest error, in float32 ulps of the true value,
// of Exp over xs, and the input where it happens.
func maxULPError(xs []float32) (float64, float32) {
	got := make([]float32, len(xs))
	Exp(got, xs)
	worst, at := 0.0, float32(0)
	for i, x := range xs {
		ref := math.Exp(float64(x))
		if ref > math.MaxFloat32 {
			if !math.IsInf(float64(got[i]), 1) && got[i] != math.MaxFloat32 {
				return math.Inf(1), x
			}
			continue
		}
		e := math.Abs(float64(got[i])-ref) / ulp32(ref)
		if e > worst {
			worst, at = e, x
		}
	}
	return worst, at
}

func TestExpAccuracySweep(t *testing.T) {
	// A dense even sweep over the whole finite range, every float32 in
	// [-1, 1) near the reduction boundaries ±ln2/2, and random inputs.
	const n = 1 << 21
	xs := make([]float32, 0, 3*n)
	for i := 0; i < n; i++ {
		xs = append(xs, float32(-104+float64(i)*(89+104)/n))
	}
	for _, c := range []float32{0, 0.34657359, -0.34657359, 88.72, -87.33} {
		b := math.Float32bits(c)
		for i := -n / 4; i < n/4; i++ {
			xs = append(xs, math.Float32frombits(uint32(int64(b)+int64(i))))
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < n/2; i++ {
		xs = append(xs, float32(r.Float64()*193-104))
	}
	forEachPath(t, func(t *testing.T) {
		worst, at := maxULPError(xs)
		t.Logf("max error %.3f ulp at x=%v", worst, at)
		if worst > 2 {
			t.Errorf("exp error %.3f ulp at x=%v, want ≤ 2", worst, at)
		}
	})
}

// TestExpSamePolynomialOnAVX2AndAVX512 checks a property of the two
// assembly paths: they run the same operations lane by lane, so their exp
// results agree bit for bit.
func TestExpSamePolynomialOnAVX2AndAVX512(t *testing.T) {
	if !useAVX512 || !useAVX2 {
		t.Skip("needs both AVX-512 and AVX2")
	}
	r := rand.New(rand.NewPCG(9, 10))
	xs := make([]float32, 100003)
	for i := range xs {
		xs[i] = float32(r.Float64()*220 - 120)
	}
	a, b := make([]float32, len(xs)), make([]float32, len(xs))
	Exp(a, xs)
	restore := setPath("avx2")
	Exp(b, xs)
	restore()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("exp(%v): avx512 %v, avx2 %v", xs[i], a[i], b[i])
		}
	}
}

func logSumExp64(x []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - mx)
	}
	return mx + math.Log(s)
}

func TestLogSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	lens := append([]int{1, 2, 3}, testLens[4:]...)
	lens = append(lens, 151936)
	forEachPath(t, func(t *testing.T) {
		for _, n := range lens {
			x := randSlice(r, n, 4)
			if n > 10 {
				x[3] = float32(math.Inf(-1)) // a masked logit
				x[n-1] += 30                 // a dominant one
			}
			dst := make([]float32, n)
			lse := LogSoftmax(dst, x)
			ref := logSumExp64(x)
			if math.Abs(float64(lse)-ref) > ulp32(ref)+3e-7 {
				t.Fatalf("n=%d: lse %v, float64 %v", n, lse, ref)
			}
			var total float64
			for i, v := range dst {
				want := float64(x[i]) - ref
				if math.IsInf(float64(x[i]), -1) {
					if !math.IsInf(float64(v), -1) {
						t.Fatalf("n=%d: logsoftmax(-Inf) = %v", n, v)
					}
					continue
				}
				tol := 0x1p-23*(math.Abs(float64(x[i]))+math.Abs(ref)) + 4e-7
				if math.Abs(float64(v)-want) > tol {
					t.Fatalf("n=%d i=%d: got %v want %v", n, i, v, want)
				}
				total += math.Exp(float64(v))
			}
			if math.Abs(total-1) > 1e-6 {
				t.Errorf("n=%d: Σ exp(logsoftmax) = %.9f", n, total)
			}
			// In place, and at another offset: the same bits.
			y := atOffset(x, 5)
			if lse2 := LogSoftmax(y, y); math.Float32bits(lse2) != math.Float32bits(lse) {
				t.Fatalf("n=%d: in-place lse %v vs %v", n, lse2, lse)
			}
			for i := range y {
				if math.Float32bits(y[i]) != math.Float32bits(dst[i]) {
					t.Fatalf("n=%d: in-place result differs at %d", n, i)
				}
			}
		}
	})
}

func TestSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	lens := append([]int{1, 2, 3}, testLens[4:]...)
	lens = append(lens, 151936)
	forEachPath(t, func(t *testing.T) {
		for _, n := range lens {
			x := randSlice(r, n, 3)
			if n > 10 {
				x[4] = float32(math.Inf(-1))
			}
			dst := make([]float32, n)
			Softmax(dst, x)
			lse := logSumExp64(x)
			mx := float64(Max(x))
			for i, v := range dst {
				want := math.Exp(float64(x[i]) - lse)
				// 5 ulp for exp, scaling and the sum, plus the rounding of
				// x[i]-max in float32, which exp turns into a relative error.
				tol := 5*ulp32(want) + want*math.Abs(float64(x[i])-mx)*0x1p-24
				if math.Abs(float64(v)-want) > tol {
					t.Fatalf("n=%d i=%d: got %g want %g", n, i, v, want)
				}
			}
			y := atOffset(x, 9)
			Softmax(y, y)
			for i := range y {
				if math.Float32bits(y[i]) != math.Float32bits(dst[i]) {
					t.Fatalf("n=%d: in-place/offset result differs at %d", n, i)
				}
			}
		}
	})
}

func TestSoftmaxHandValues(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		x := []float32{0, 0, 0, 0}
		Softmax(x, x)
		for _, v := range x {
			if v != 0.25 {
				t.Fatalf("softmax of zeros = %v", x)
			}
		}
		// log(1/4) for four equal logits.
		y := []float32{7, 7, 7, 7}
		lse := LogSoftmax(y, y)
		if math.Abs(float64(lse)-(7+math.Log(4))) > 1e-6 || math.Abs(float64(y[0])+math.Log(4)) > 1e-6 {
			t.Fatalf("lse %v, logp %v", lse, y)
		}
	})
}

func TestRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	forEachPath(t, func(t *testing.T) {
		for _, n := range testLens[1:] {
			x, w := randSlice(r, n, 2), randSlice(r, n, 1)
			const eps = 1e-6
			var ss float64
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			inv64 := 1 / math.Sqrt(ss/float64(n)+eps)
			dst := make([]float32, n)
			inv := RMSNorm(dst, x, w, eps)
			if math.Abs(float64(inv)-inv64) > 1e-6*inv64 {
				t.Fatalf("n=%d: inv %v want %v", n, inv, inv64)
			}
			for i := range x {
				want := float64(x[i]) * inv64 * float64(w[i])
				if math.Abs(float64(dst[i])-want) > 1e-6*math.Abs(want)+1e-30 {
					t.Fatalf("n=%d i=%d: got %v want %v", n, i, dst[i], want)
				}
			}
			y := atOffset(x, 3)
			inv2 := RMSNorm(y, y, atOffset(w, 11), eps)
			if inv2 != inv {
				t.Fatalf("n=%d: inv depends on offset", n)
			}
			for i := range y {
				if math.Float32bits(y[i]) != math.Float32bits(dst[i]) {
					t.Fatalf("n=%d: in-place/offset result differs at %d", n, i)
				}
			}
		}
		// Hand value: x = (3, 4), w = 1, eps = 0: rms = sqrt(12.5).
		d := make([]float32, 2)
		inv := RMSNorm(d, []float32{3, 4}, []float32{1, 1}, 0)
		if math.Abs(float64(inv)-1/math.Sqrt(12.5)) > 1e-7 || math.Abs(float64(d[1])-4/math.Sqrt(12.5)) > 1e-6 {
			t.Fatalf("RMSNorm(3,4) = %v, inv %v", d, inv)
		}
	})
}

func TestSwiGLU(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	forEachPath(t, func(t *testing.T) {
		for _, n := range testLens {
			g, u := randSlice(r, n, 4), randSlice(r, n, 1)
			if n > 3 {
				g[0], g[1], g[2] = 100, -100, 0
			}
			dst := make([]float32, n)
			SwiGLU(dst, g, u)
			for i := range dst {
				gg := float64(g[i])
				want := gg / (1 + math.Exp(-gg)) * float64(u[i])
				// exp(-g) overflows for g < -88.7: silu flushes to ±0 there.
				if math.Abs(float64(dst[i])-want) > 4*ulp32(want)+1e-37 {
					t.Fatalf("n=%d i=%d: swiglu(%v, %v) = %v want %v", n, i, g[i], u[i], dst[i], want)
				}
			}
			d2 := atOffset(make([]float32, n), 1)
			SwiGLU(d2, atOffset(g, 2), atOffset(u, 3))
			for i := range d2 {
				if math.Float32bits(d2[i]) != math.Float32bits(dst[i]) {
					t.Fatalf("n=%d: SwiGLU depends on offset at %d", n, i)
				}
			}
		}
	})
}

func TestRoPE(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		x := []float32{1, 2, 3, 4}
		RoPE(x, []float32{0, 1}, []float32{1, 0})
		// pair (1,3) rotated by 90°: (-3, 1); pair (2,4) by 0°: unchanged.
		want := []float32{-3, 2, 1, 4}
		for i := range x {
			if x[i] != want[i] {
				t.Fatalf("RoPE = %v want %v", x, want)
			}
		}
	})
}

func TestScaleMax(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	forEachPath(t, func(t *testing.T) {
		for _, n := range testLens[1:] {
			x := randSlice(r, n, 1)
			want := x[0]
			for _, v := range x {
				want = max(want, v)
			}
			// put the max at every possible position class
			if got := Max(atOffset(x, n%7)); got != want {
				t.Fatalf("n=%d: Max %v want %v", n, got, want)
			}
			neg := make([]float32, n)
			for i := range neg {
				neg[i] = -1 - float32(i)
			}
			if got := Max(neg); got != -1 {
				t.Fatalf("n=%d: Max of negatives %v", n, got)
			}
			y := make([]float32, n)
			Scale(y, x, 3)
			for i := range y {
				if y[i] != x[i]*3 {
					t.Fatalf("n=%d: Scale %v want %v", n, y[i], x[i]*3)
				}
			}
		}
	})
}

func TestSoftmaxNaNRow(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		for _, n := range []int{1, 5, 37} {
			for pos := 0; pos < n; pos += 3 {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(i % 5)
				}
				x[pos] = float32(math.NaN())
				y := make([]float32, n)
				if lse := LogSoftmax(y, x); !math.IsNaN(float64(lse)) {
					t.Fatalf("n=%d NaN at %d: lse = %v, want NaN", n, pos, lse)
				}
				Softmax(y, x)
				for i, v := range y {
					if !math.IsNaN(float64(v)) {
						t.Fatalf("n=%d NaN at %d: softmax[%d] = %v, want NaN", n, pos, i, v)
					}
				}
			}
		}
	})
}

// TestExpExhaustive checks every float32 input in [-104, 89] (about 2·10⁹
// values) against math.Exp. Run with KEEL_LONG=1.
func TestExpExhaustive(t *testing.T) {
	if os.Getenv("KEEL_LONG") == "" {
		t.Skip("set KEEL_LONG=1 for the exhaustive exp check")
	}
	for _, p := range paths()[:1] {
		restore := setPath(p)
		worst, at := 0.0, float32(0)
		xs := make([]float32, 1<<20)
		check := func(lo, hi uint32, step int) { // bit patterns, step ±1
			for b := lo; ; {
				k := 0
				for ; k < len(xs) && b != hi; k++ {
					xs[k] = math.Float32frombits(b)
					b = uint32(int64(b) + int64(step))
				}
				if w, a := maxULPError(xs[:k]); w > worst {
					worst, at = w, a
				}
				if b == hi {
					return
				}
			}
		}
		check(0, math.Float32bits(89)+1, 1)            // +0 .. 89
		check(0x80000000, math.Float32bits(-104)+1, 1) // -0 .. -104
		restore()
		t.Logf("%s: max error %.3f ulp at x=%v", p, worst, at)
		if worst > 2 {
			t.Errorf("%s: exp error %.3f ulp at x=%v", p, worst, at)
		}
	}
}

// NormRopeHeads gives the bits of RMSNorm per head then RoPEHeads, and the
// same inverse RMS values, for several head sizes and counts.
func TestNormRopeHeadsMatchesCalls(t *testing.T) { forEachPath(t, testNormRopeHeads) }

func testNormRopeHeads(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, hd := range []int{2, 8, 32, 64, 128, 34} {
		for _, heads := range []int{1, 2, 5} {
			raw := randSlice(r, heads*hd, 3)
			w := randSlice(r, hd, 1)
			cos, sin := randSlice(r, hd/2, 1), randSlice(r, hd/2, 1)
			want, wantInv := make([]float32, heads*hd), make([]float32, heads)
			for h := 0; h < heads; h++ {
				wantInv[h] = RMSNorm(want[h*hd:(h+1)*hd], raw[h*hd:(h+1)*hd], w, 1e-6)
			}
			RoPEHeads(want, heads, cos, sin)
			got, inv := make([]float32, heads*hd), make([]float32, heads)
			NormRopeHeads(got, raw, heads, w, cos, sin, 1e-6, inv)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("hd=%d heads=%d: element %d = %v, want %v", hd, heads, i, got[i], want[i])
				}
			}
			for h := range inv {
				if inv[h] != wantInv[h] {
					t.Fatalf("hd=%d heads=%d: inv[%d] = %v, want %v", hd, heads, h, inv[h], wantInv[h])
				}
			}
			got2 := make([]float32, heads*hd)
			NormRopeHeads(got2, raw, heads, w, cos, sin, 1e-6, nil)
			for i := range got {
				if got2[i] != got[i] {
					t.Fatalf("hd=%d heads=%d: nil inv changes element %d", hd, heads, i)
				}
			}
		}
	}
}
