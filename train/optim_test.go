package train

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

func optimCloseRel(got, want, tol float64) bool {
	return math.Abs(got-want) <= tol*math.Max(1e-30, math.Abs(want)) || (want == 0 && got == 0)
}

// Two AdamW steps on a 3-element vector, values worked out by hand (see the
// comments) with β1 = 0.9, β2 = 0.999, eps = 1e-8, λ = 0.1, lr = 0.1.
func TestAdamWTwoStepsByHand(t *testing.T) {
	cfg := AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1}
	o := &AdamW{Config: cfg, M: make([]float32, 3), V: make([]float32, 3), chunks: []adamChunk{{off: 0, n: 3, decay: true}}}
	p := []float32{1, -2, 0.5}
	// Step 1: p ← 0.99·p = (0.99, −1.98, 0.495); m = 0.1·g; v = 0.001·g²;
	// m̂ = g, v̂ = g², so the update is lr·g/(|g|+eps):
	// 0.1·0.1/0.10000001 = 0.09999999 and 0.1·0.2/0.20000001 = 0.099999995;
	// the third gradient is 0: no Adam step, only decay.
	if err := o.Update(p, []float32{0.1, -0.2, 0}, 0.1); err != nil {
		t.Fatal(err)
	}
	want1 := []float64{0.89000001, -1.880000005, 0.495}
	for i := range p {
		if !optimCloseRel(float64(p[i]), want1[i], 1e-6) {
			t.Errorf("step 1: p[%d] = %.9g, want %.9g", i, p[i], want1[i])
		}
	}
	wantM1 := []float64{0.01, -0.02, 0}
	wantV1 := []float64{1e-5, 4e-5, 0}
	for i := range p {
		if !optimCloseRel(float64(o.M[i]), wantM1[i], 1e-6) || !optimCloseRel(float64(o.V[i]), wantV1[i], 1e-6) {
			t.Errorf("step 1: m[%d], v[%d] = %g, %g, want %g, %g", i, i, o.M[i], o.V[i], wantM1[i], wantV1[i])
		}
	}
	// Step 2, g = (0.3, 0.1, −0.4): p ← 0.99·p = (0.8811000099,
	// −1.86120000495, 0.49005); m = 0.9·m + 0.1·g = (0.039, −0.008, −0.04);
	// v = 0.999·v + 0.001·g² = (9.999e-5, 4.996e-5, 1.6e-4); bias corrections
	// 1−0.81 = 0.19 and 1−0.998001 = 0.001999, so for element 0
	// m̂ = 0.205263158, sqrt(v̂) = 0.223651537 and
	// p = 0.8811000099 − 0.1·0.205263158/0.22365154 = 0.789321902.
	if err := o.Update(p, []float32{0.3, 0.1, -0.4}, 0.1); err != nil {
		t.Fatal(err)
	}
	want2 := []float64{0.789321902106, -1.83456630267, 0.564463679726}
	for i := range p {
		if !optimCloseRel(float64(p[i]), want2[i], 1e-6) {
			t.Errorf("step 2: p[%d] = %.9g, want %.9g", i, p[i], want2[i])
		}
	}
	if o.Step != 2 {
		t.Errorf("Step = %d, want 2", o.Step)
	}
}

func optimTinyModel() *model.Model {
	cfg := model.Config{VocabSize: 5, HiddenSize: 4, IntermediateSize: 6, NumHiddenLayers: 1,
		NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 2, RMSNormEps: 1e-6, RopeTheta: 10000}
	m := model.New(cfg)
	for i := range m.Arena {
		m.Arena[i] = 1
	}
	return m
}

// With zero gradients only the decoupled decay moves the weights: 2-D
// parameters shrink by (1 − lr·λ), 1-D ones (norms) stay unless DecayVectors.
func TestAdamWNoDecayOnVectors(t *testing.T) {
	for _, vec := range []bool{false, true} {
		m := optimTinyModel()
		cfg := DefaultAdamWConfig()
		cfg.WeightDecay = 0.5
		cfg.DecayVectors = vec
		o, err := NewAdamW(m, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Update(m.Arena, make([]float32, len(m.Arena)), 0.1); err != nil {
			t.Fatal(err)
		}
		for _, p := range m.Params() {
			want := float32(0.95)
			if len(p.Shape) == 1 && !vec {
				want = 1
			}
			for i, v := range p.Data {
				if v != want {
					t.Fatalf("DecayVectors=%v: %s[%d] = %g, want %g", vec, p.Name, i, v, want)
				}
			}
		}
	}
}

func TestAdamWErrors(t *testing.T) {
	m := optimTinyModel()
	if _, err := NewAdamW(m, AdamWConfig{Beta1: 1, Beta2: 0.9, Eps: 1e-8}); err == nil || !strings.Contains(err.Error(), "beta1") {
		t.Errorf("beta1 = 1 accepted: %v", err)
	}
	o, err := NewAdamW(m, DefaultAdamWConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Update(m.Arena[:3], make([]float32, 3), 0.1); err == nil {
		t.Error("short parameter slice accepted")
	}
	if err := o.Update(m.Arena, make([]float32, len(m.Arena)), math.NaN()); err == nil {
		t.Error("NaN learning rate accepted")
	}
	o.V = o.V[:5] // a bad restore
	if err := o.Update(m.Arena, make([]float32, len(m.Arena)), 0.1); err == nil || !strings.Contains(err.Error(), "second moments") {
		t.Errorf("mismatched optimiser state accepted: %v", err)
	}
}

func TestClipGradNorm(t *testing.T) {
	g := []float32{3, 4, 0, 12} // norm 13
	if n := ClipGradNorm(g, 20); n != 13 || g[0] != 3 || g[3] != 12 {
		t.Errorf("below max: norm %g, g %v; want 13, unchanged", n, g)
	}
	if n := ClipGradNorm(g, 6.5); n != 13 {
		t.Errorf("pre-clip norm = %g, want 13", n)
	}
	want := []float64{1.5, 2, 0, 6} // times 6.5/(13+1e-6)
	for i := range g {
		if !optimCloseRel(float64(g[i]), want[i], 1e-6) {
			t.Errorf("clipped g[%d] = %g, want %g", i, g[i], want[i])
		}
	}
	if n := ClipGradNorm(g, 0); !optimCloseRel(n, 6.5, 1e-6) {
		t.Errorf("norm after clipping = %g, want 6.5", n)
	}
	inf := []float32{float32(math.Inf(1)), 1}
	if n := ClipGradNorm(inf, 1); !math.IsInf(n, 1) || inf[1] != 1 {
		t.Errorf("infinite gradient: norm %g, g %v", n, inf)
	}
}

// The norm must not depend on GOMAXPROCS, bit for bit.
func TestGradNormDeterministic(t *testing.T) {
	g := make([]float32, 100003)
	var ref float64
	for i := range g {
		g[i] = float32(math.Sin(float64(i))) * 1e-3
		ref += float64(g[i]) * float64(g[i])
	}
	prev := runtime.GOMAXPROCS(1)
	a := GradNorm(g)
	runtime.GOMAXPROCS(2)
	b := GradNorm(g)
	runtime.GOMAXPROCS(7)
	c := GradNorm(g)
	runtime.GOMAXPROCS(prev)
	if a != b || a != c {
		t.Errorf("GradNorm depends on GOMAXPROCS: %v %v %v", a, b, c)
	}
	if !optimCloseRel(a, math.Sqrt(ref), 1e-12) {
		t.Errorf("GradNorm = %.17g, want %.17g", a, math.Sqrt(ref))
	}
}

func TestSchedules(t *testing.T) {
	c := Schedule{Kind: ScheduleConstant, PeakLR: 1e-3, WarmupSteps: 10}
	cos := Schedule{Kind: ScheduleCosine, PeakLR: 1e-3, WarmupSteps: 10, TotalSteps: 110, MinLR: 1e-5}
	for _, tc := range []struct {
		s    Schedule
		step int
		want float64
	}{
		{c, 0, 1e-4}, {c, 1, 1e-4}, {c, 5, 5e-4}, {c, 10, 1e-3}, {c, 11, 1e-3}, {c, 1000000, 1e-3},
		{Schedule{PeakLR: 2e-3}, 1, 2e-3}, // no warm-up, kind "" = constant
		{cos, 1, 1e-4}, {cos, 10, 1e-3},
		{cos, 60, 1e-5 + (1e-3-1e-5)*0.5},                  // halfway: cos(π/2) = 0
		{cos, 35, 1e-5 + (1e-3-1e-5)*(1+math.Sqrt(2)/2)/2}, // quarter: cos(π/4)
		{cos, 110, 1e-5}, {cos, 111, 1e-5}, {cos, 5000, 1e-5},
	} {
		if err := tc.s.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := tc.s.LR(tc.step); !optimCloseRel(got, tc.want, 1e-12) {
			t.Errorf("%+v LR(%d) = %.15g, want %.15g", tc.s, tc.step, got, tc.want)
		}
	}
	for _, bad := range []Schedule{
		{Kind: "linear", PeakLR: 1},
		{PeakLR: -1},
		{PeakLR: 1, WarmupSteps: -1},
		{Kind: ScheduleCosine, PeakLR: 1, WarmupSteps: 10, TotalSteps: 10},
		{Kind: ScheduleCosine, PeakLR: 1, TotalSteps: 10, MinLR: 2},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// UpdateScaled with ClipCoef must equal ClipGradNorm then Update, bit for
// bit, and leave the gradients untouched.
func TestUpdateScaledEqualsClipThenUpdate(t *testing.T) {
	m := optimTinyModel()
	g := make([]float32, len(m.Arena))
	for i := range g {
		g[i] = float32(math.Sin(float64(3*i+1))) * 2
	}
	a, b := m.Clone(), m.Clone()
	oa, _ := NewAdamW(a, DefaultAdamWConfig())
	ob, _ := NewAdamW(b, DefaultAdamWConfig())
	ga := append([]float32(nil), g...)
	norm := GradNorm(ga)
	if err := oa.UpdateScaled(a.Arena, ga, 0.01, ClipCoef(norm, 0.5)); err != nil {
		t.Fatal(err)
	}
	for i := range g {
		if ga[i] != g[i] {
			t.Fatalf("UpdateScaled modified gradient %d", i)
		}
	}
	gb := append([]float32(nil), g...)
	if n := ClipGradNorm(gb, 0.5); n != norm {
		t.Fatalf("norms differ: %v %v", n, norm)
	}
	if err := ob.Update(b.Arena, gb, 0.01); err != nil {
		t.Fatal(err)
	}
	for i := range a.Arena {
		if a.Arena[i] != b.Arena[i] || oa.M[i] != ob.M[i] || oa.V[i] != ob.V[i] {
			t.Fatalf("element %d differs: %v vs %v", i, a.Arena[i], b.Arena[i])
		}
	}
	if c := ClipCoef(norm, 0.5); !(c < 1) {
		t.Fatalf("test gradient was not clipped (coef %v)", c)
	}
	if ClipCoef(math.Inf(1), 1) != 1 || ClipCoef(1, 0) != 1 || ClipCoef(0.5, 1) != 1 {
		t.Error("ClipCoef: want 1 for infinite norm, disabled clipping and small norm")
	}
}

// ClippedStep skips a non-finite gradient without touching weights or
// state, and otherwise is AdamW on the clipped gradient.
func TestClippedStep(t *testing.T) {
	cfg := DefaultAdamWConfig()
	params := []float32{1, -2, 3}
	grads := []float32{3, 4, 0} // norm 5
	o1 := &AdamW{Config: cfg, M: make([]float32, 3), V: make([]float32, 3), chunks: []adamChunk{{off: 0, n: 3, decay: true}}}
	o2 := &AdamW{Config: cfg, M: make([]float32, 3), V: make([]float32, 3), chunks: []adamChunk{{off: 0, n: 3, decay: true}}}
	p1, p2 := append([]float32(nil), params...), append([]float32(nil), params...)
	norm, err := o1.ClippedStep(p1, grads, 0.1, 1)
	if err != nil || norm != 5 {
		t.Fatalf("norm %v, err %v", norm, err)
	}
	if err := o2.UpdateScaled(p2, grads, 0.1, ClipCoef(5, 1)); err != nil {
		t.Fatal(err)
	}
	for i := range p1 {
		if p1[i] != p2[i] || o1.M[i] != o2.M[i] || o1.V[i] != o2.V[i] {
			t.Fatalf("ClippedStep %v, UpdateScaled with ClipCoef %v", p1, p2)
		}
	}
	before := append([]float32(nil), p1...)
	if _, err := o1.ClippedStep(p1, []float32{1, float32(math.NaN()), 0}, 0.1, 1); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("NaN gradient: %v", err)
	}
	if o1.Step != 1 {
		t.Fatalf("a skipped step advanced the optimiser to step %d", o1.Step)
	}
	for i := range p1 {
		if p1[i] != before[i] {
			t.Fatal("a skipped step changed the weights")
		}
	}
}
