package train

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// trainerSteps runs n accumulated steps (two forward/backward pairs each)
// of random coefficients on t, drawing from r.
func trainerSteps(tb testing.TB, t Trainer, r *rand.Rand, n int) []float64 {
	tb.Helper()
	var norms []float64
	for range n {
		t.ZeroGrad()
		for range 2 {
			seqs := engRandomSeqs(r, t.Config().VocabSize, 5, 3)
			if _, err := t.Forward(seqs, ForwardOptions{NoEntropy: true}); err != nil {
				tb.Fatal(err)
			}
			if err := t.Backward(Loss{LogProb: engCoefs(r, seqs), Aux: 0.01}); err != nil {
				tb.Fatal(err)
			}
		}
		gn, err := t.Step(1e-2, 0.5)
		if err != nil {
			tb.Fatal(err)
		}
		norms = append(norms, gn)
	}
	return norms
}

// The Trainer contract on the CPU engine: Step is AdamW on the clipped
// accumulated gradient (checked against the optimiser run by hand), and a
// trainer restored from a snapshot continues bit for bit as the original.
func TestTrainerStepAndRestore(t *testing.T) {
	c := engTinyConfig(true, false, false)
	cfg := AdamWConfig{Beta1: 0.8, Beta2: 0.95, Eps: 1e-7, WeightDecay: 0.1}

	// By hand: the engine's gradient, GradNorm, ClipCoef and AdamW.
	hand := engRandomModel(c, 5)
	eng := New(hand)
	opt, err := NewAdamW(hand, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var handNorms []float64
	for range 4 {
		eng.ZeroGrad()
		for range 2 {
			seqs := engRandomSeqs(r, c.VocabSize, 5, 3)
			if _, err := eng.Forward(seqs, ForwardOptions{NoEntropy: true}); err != nil {
				t.Fatal(err)
			}
			if err := eng.Backward(Loss{LogProb: engCoefs(r, seqs), Aux: 0.01}); err != nil {
				t.Fatal(err)
			}
		}
		n := GradNorm(eng.Grad.Arena)
		handNorms = append(handNorms, n)
		if err := opt.UpdateScaled(hand.Arena, eng.Grad.Arena, 1e-2, ClipCoef(n, 0.5)); err != nil {
			t.Fatal(err)
		}
	}

	// Through the Trainer: two steps, a snapshot copied out, a new trainer
	// from the copy, two more steps.
	a, err := NewTrainer(engRandomModel(c, 5), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	r = rand.New(rand.NewPCG(1, 2))
	norms := trainerSteps(t, a, r, 2)
	w, st, err := Snapshot(a)
	if err != nil {
		t.Fatal(err)
	}
	if st.Step != 2 || a.Steps() != 2 {
		t.Fatalf("snapshot at step %d, Steps() = %d, want 2", st.Step, a.Steps())
	}
	copyModel := engRandomModel(c, 99)
	copy(copyModel.Arena, w.Arena)
	saved := &OptimState{Step: st.Step, M: slices.Clone(st.M), V: slices.Clone(st.V), Config: slices.Clone(st.Config)}
	var got AdamWConfig
	if err := json.Unmarshal(saved.Config, &got); err != nil || got != cfg {
		t.Fatalf("snapshot configuration %s (%v), want %+v", saved.Config, err, cfg)
	}
	// The snapshot's configuration wins over the one passed.
	b, err := NewTrainer(copyModel, DefaultAdamWConfig(), saved)
	if err != nil {
		t.Fatal(err)
	}
	norms = append(norms, trainerSteps(t, b, r, 2)...)
	for i := range norms {
		if norms[i] != handNorms[i] {
			t.Fatalf("step %d: gradient norm %v through the Trainer, %v by hand", i+1, norms[i], handNorms[i])
		}
	}
	for i, v := range copyModel.Arena {
		if math.Float32bits(v) != math.Float32bits(hand.Arena[i]) {
			t.Fatalf("weight %d: %v after restoring, %v by hand", i, v, hand.Arena[i])
		}
	}
	if b.Steps() != 4 {
		t.Fatalf("Steps() = %d after 2 restored and 2 new, want 4", b.Steps())
	}
}

// A non-finite gradient skips the step: ErrNonFinite, weights, moments and
// the step count as they were.
func TestTrainerNonFiniteStep(t *testing.T) {
	c := engTinyConfig(false, false, false)
	m := engRandomModel(c, 3)
	tr, err := NewTrainer(m, DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	trainerSteps(t, tr, r, 1)
	m.Norm.Data[0] = float32(math.NaN())
	before := slices.Clone(m.Arena)
	st, _ := tr.OptimState()
	moments := slices.Clone(st.M)
	tr.ZeroGrad()
	seqs := engRandomSeqs(r, c.VocabSize, 4)
	if _, err := tr.Forward(seqs, ForwardOptions{NoEntropy: true}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Backward(Loss{LogProb: engCoefs(r, seqs)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Step(1e-2, 1); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("Step with a NaN gradient: err = %v, want ErrNonFinite", err)
	}
	for i := range before {
		if math.Float32bits(m.Arena[i]) != math.Float32bits(before[i]) || math.Float32bits(st.M[i]) != math.Float32bits(moments[i]) {
			t.Fatalf("element %d changed by a skipped step", i)
		}
	}
	if tr.Steps() != 1 {
		t.Fatalf("Steps() = %d after a skipped step, want 1", tr.Steps())
	}
}

// A restored state that does not fit the model, or whose configuration is
// not AdamW's, is an error, not a panic later.
func TestTrainerRestoreRefusesMismatch(t *testing.T) {
	m := engRandomModel(engTinyConfig(false, false, false), 1)
	n := len(m.Arena)
	cfg, _ := json.Marshal(DefaultAdamWConfig())
	for _, tc := range []struct {
		name string
		st   OptimState
	}{
		{"short moments", OptimState{M: make([]float32, n-1), V: make([]float32, n), Config: cfg}},
		{"configuration not JSON", OptimState{M: make([]float32, n), V: make([]float32, n), Config: json.RawMessage("{")}},
		{"beta1 out of range", OptimState{M: make([]float32, n), V: make([]float32, n), Config: json.RawMessage(`{"Beta1":1,"Beta2":0.9,"Eps":1e-8}`)}},
		{"negative step", OptimState{Step: -1, M: make([]float32, n), V: make([]float32, n), Config: cfg}},
		{"configuration null", OptimState{M: make([]float32, n), V: make([]float32, n), Config: json.RawMessage("null")}},
		{"configuration with an unknown field", OptimState{M: make([]float32, n), V: make([]float32, n), Config: json.RawMessage(`{"Beta1":0.9,"Beta2":0.99,"Eps":1e-8,"Momentum":0.5}`)}},
	} {
		if _, err := NewTrainer(m, DefaultAdamWConfig(), &tc.st); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

// An engine built by New only scores: a Step is an error, not an
// optimiser with defaults nobody chose.
func TestScoringEngineHasNoOptimiser(t *testing.T) {
	e := New(engRandomModel(engTinyConfig(false, false, false), 1))
	if _, err := e.Step(1e-3, 1); err == nil {
		t.Fatal("Step on an engine made by New succeeded")
	}
	if _, err := e.OptimState(); err == nil {
		t.Fatal("OptimState on an engine made by New succeeded")
	}
}
