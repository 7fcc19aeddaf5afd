package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// adamwRef is the update in float64, the same formula without roundings.
func adamwRef(p, g, m, v float64, s AdamWStep) (float64, float64, float64) {
	g *= float64(s.GradScale)
	p *= float64(s.Decay)
	m = float64(s.Beta1)*m + float64(s.OneMinusB1)*g
	v = float64(s.Beta2)*v + float64(s.OneMinusB2)*g*g
	p -= float64(s.StepSize) * m / (math.Sqrt(v)*float64(s.InvSqrtBC2) + float64(s.Eps))
	return p, m, v
}

func testStep() AdamWStep {
	return AdamWStep{GradScale: 0.5, Decay: 0.999, Beta1: 0.9, OneMinusB1: 0.1, Beta2: 0.999, OneMinusB2: 0.001, StepSize: 1e-3 / (1 - 0.9*0.9), InvSqrtBC2: float32(1 / math.Sqrt(1-0.999*0.999)), Eps: 1e-8}
}

func randAdamState(r *rand.Rand, n int) (p, g, m, v []float32) {
	p, g, m, v = make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range p {
		p[i] = float32(r.NormFloat64())
		g[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-4)))
		m[i] = float32(r.NormFloat64() * 0.01)
		v[i] = float32(r.Float64() * 1e-4)
	}
	return
}

// TestAdamWFirstStepHand: from zero moments, with no decay and no clipping,
// the first bias-corrected step moves every parameter by lr·g/(|g|+ε),
// which is lr·sign(g) up to ε.
func TestAdamWFirstStepHand(t *testing.T) {
	const lr = 0.01
	p := []float32{1, -2, 0.5, 3}
	g := []float32{0.25, -4, 1e-3, 0}
	m, v := make([]float32, 4), make([]float32, 4)
	s := AdamWStep{GradScale: 1, Decay: 1, Beta1: 0.9, OneMinusB1: 0.1, Beta2: 0.999, OneMinusB2: 0.001, StepSize: lr / 0.1, InvSqrtBC2: float32(1 / math.Sqrt(0.001)), Eps: 1e-8}
	AdamW(p, g, m, v, s)
	want := []float32{1 - lr, -2 + lr, 0.5 - lr, 3}
	for i := range p {
		if math.Abs(float64(p[i]-want[i])) > 1e-6 {
			t.Errorf("p[%d] = %v, want %v", i, p[i], want[i])
		}
		if wm := 0.1 * float64(g[i]); math.Abs(float64(m[i])-wm) > 1e-7*math.Abs(wm)+1e-12 {
			t.Errorf("m[%d] = %v, want %v", i, m[i], wm)
		}
		if wv := 0.001 * float64(g[i]) * float64(g[i]); math.Abs(float64(v[i])-wv) > 1e-6*wv+1e-15 {
			t.Errorf("v[%d] = %v, want %v", i, v[i], wv)
		}
	}
}

func TestAdamWAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := testStep()
	for _, n := range []int{1, 15, 16, 17, 100, 1000} {
		p, g, m, v := randAdamState(r, n)
		p0, m0, v0 := append([]float32(nil), p...), append([]float32(nil), m...), append([]float32(nil), v...)
		g0 := append([]float32(nil), g...)
		AdamW(p, g, m, v, s)
		for i := range p {
			wp, wm, wv := adamwRef(float64(p0[i]), float64(g0[i]), float64(m0[i]), float64(v0[i]), s)
			if g[i] != g0[i] {
				t.Fatalf("n=%d: g[%d] modified", n, i)
			}
			// p moves by at most StepSize/(1-β1)-ish; compare the step.
			if d := math.Abs(float64(p[i]) - wp); d > 1e-6*math.Abs(wp)+1e-9 {
				t.Errorf("n=%d p[%d] = %v, want %v", n, i, p[i], wp)
			}
			// Relative to the size of the terms: β1·m and (1−β1)·g can cancel.
			mScale := math.Abs(float64(s.Beta1)*float64(m0[i])) + math.Abs(float64(s.OneMinusB1*s.GradScale)*float64(g0[i]))
			if d := math.Abs(float64(m[i]) - wm); d > 1e-6*mScale+1e-30 {
				t.Errorf("n=%d m[%d] = %v, want %v", n, i, m[i], wm)
			}
			if d := math.Abs(float64(v[i]) - wv); d > 1e-6*math.Abs(wv)+1e-30 {
				t.Errorf("n=%d v[%d] = %v, want %v", n, i, v[i], wv)
			}
		}
	}
}

func ulps(a, b float32) int64 {
	d := int64(math.Float32bits(a)) - int64(math.Float32bits(b))
	if d < 0 {
		d = -d
	}
	return d
}

// TestAdamWPathsAndSplits: the assembly and portable paths agree (within one
// unit in the last place, from the portable path's float64 FMA), and
// updating a slice in pieces gives the same bits as updating it whole.
func TestAdamWPathsAndSplits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	s := testStep()
	const n = 1000
	p, g, m, v := randAdamState(r, n)
	cp := func(x []float32) []float32 { return append([]float32(nil), x...) }
	p1, m1, v1 := cp(p), cp(m), cp(v)
	AdamW(p1, g, m1, v1, s)
	p2, m2, v2 := cp(p), cp(m), cp(v)
	for lo := 0; lo < n; {
		hi := min(n, lo+1+r.IntN(40))
		AdamW(p2[lo:hi], g[lo:hi], m2[lo:hi], v2[lo:hi], s)
		lo = hi
	}
	p3, m3, v3 := cp(p), cp(m), cp(v)
	adamwGo(p3, g, m3, v3, s)
	for i := range p {
		if p1[i] != p2[i] || m1[i] != m2[i] || v1[i] != v2[i] {
			t.Fatalf("element %d differs between a whole and a split update", i)
		}
		if ulps(p1[i], p3[i]) > 1 || ulps(m1[i], m3[i]) > 1 || ulps(v1[i], v3[i]) > 1 {
			t.Fatalf("element %d: paths differ: p %v/%v m %v/%v v %v/%v", i, p1[i], p3[i], m1[i], m3[i], v1[i], v3[i])
		}
	}
}

func TestSumSquares(t *testing.T) {
	if got := SumSquares([]float32{3, 4}); got != 25 {
		t.Errorf("SumSquares(3, 4) = %v, want 25", got)
	}
	if got := SumSquares(nil); got != 0 {
		t.Errorf("SumSquares(nil) = %v", got)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 7, 8, 9, 31, 32, 33, 100, 8192, 8195} {
		x := make([]float32, n)
		var ref float64
		for i := range x {
			x[i] = float32(r.NormFloat64())
			ref += float64(x[i]) * float64(x[i])
		}
		got, gotGo := SumSquares(x), sumSquaresGo(x)
		if got != gotGo {
			t.Errorf("n=%d: assembly %v, portable %v (must be the same bits)", n, got, gotGo)
		}
		if math.Abs(got-ref) > 1e-12*ref {
			t.Errorf("n=%d: %v, want %v", n, got, ref)
		}
	}
}

func BenchmarkAdamW(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 1))
	p, g, m, v := randAdamState(r, n)
	s := testStep()
	b.SetBytes(n * 28)
	for b.Loop() {
		AdamW(p, g, m, v, s)
	}
}
