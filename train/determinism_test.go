package train_test

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

func detConfig() model.Config {
	return model.Config{VocabSize: 37, HiddenSize: 32, IntermediateSize: 48, NumHiddenLayers: 2,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 8, RMSNormEps: 1e-6, RopeTheta: 10000,
		MaxPositionEmbeddings: 128, NumExperts: 6, NumExpertsPerTok: 2, MoeIntermediateSize: 16,
		NormTopKProb: true}
}

// detTrain runs two full training steps (forward, backward, clip, AdamW; the
// second step replays the first step's routes, as R2 does) from a fixed
// model under the given GOMAXPROCS and returns the final parameters, the
// moments and the two pre-clip gradient norms.
func detTrain(t *testing.T, procs int) (params, moments []float32, norms [2]float64) {
	t.Helper()
	prev := runtime.GOMAXPROCS(procs)
	defer runtime.GOMAXPROCS(prev)
	m := gcRandomModel(detConfig(), 42)
	r := rand.New(rand.NewPCG(42, 1))
	seqs := gcSeqs(r, m.Config.VocabSize, []int{17, 9, 23, 12, 30})
	c32, _ := gcRandomCoeffs(r, seqs, 1)
	e32, _ := gcRandomCoeffs(r, seqs, 0.1)
	eng := train.New(m)
	opt, err := train.NewAdamW(m, train.DefaultAdamWConfig())
	if err != nil {
		t.Fatal(err)
	}
	var routes []*model.Routes
	for step := range 2 {
		res, err := eng.Forward(seqs, train.ForwardOptions{Replay: routes, Record: true})
		if err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			routes = res.Routes
		}
		eng.ZeroGrad()
		if err := eng.Backward(train.Loss{LogProb: c32, Entropy: e32, Aux: 0.01}); err != nil {
			t.Fatal(err)
		}
		norms[step] = train.ClipGradNorm(eng.Grad.Arena, 0.5)
		if err := opt.Update(m.Arena, eng.Grad.Arena, 1e-2); err != nil {
			t.Fatal(err)
		}
	}
	return m.Arena, append(append([]float32(nil), opt.M...), opt.V...), norms
}

func detFirstDiff(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// A training step must give bitwise identical weights whatever GOMAXPROCS
// is, and when repeated.
func TestTrainingStepDeterministic(t *testing.T) {
	p1, m1, n1 := detTrain(t, 1)
	if n1[0] <= 0.5 {
		t.Fatalf("gradient norm %g does not exceed the clip threshold: clipping untested", n1[0])
	}
	for _, procs := range []int{2, 2, 3} {
		p, mo, n := detTrain(t, procs)
		if i := detFirstDiff(p1, p); i >= 0 {
			t.Errorf("GOMAXPROCS %d: parameter %d = %v, with GOMAXPROCS 1 %v", procs, i, p[i], p1[i])
		}
		if i := detFirstDiff(m1, mo); i >= 0 {
			t.Errorf("GOMAXPROCS %d: optimiser moment %d = %v, with GOMAXPROCS 1 %v", procs, i, mo[i], m1[i])
		}
		if n != n1 {
			t.Errorf("GOMAXPROCS %d: gradient norms %v, with GOMAXPROCS 1 %v", procs, n, n1)
		}
	}
}

// TestBatchInvarianceAcrossBatches: a sequence's log-probabilities,
// entropies and routes must not depend on which other sequences share the
// batch, nor on its place in it, bit for bit.
func TestBatchInvarianceAcrossBatches(t *testing.T) {
	m := gcRandomModel(detConfig(), 7)
	r := rand.New(rand.NewPCG(7, 1))
	seqs := gcSeqs(r, m.Config.VocabSize, []int{11, 25, 4, 16})
	eng := train.New(m)
	all, err := eng.Forward(seqs, train.ForwardOptions{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	for s, seq := range seqs {
		for _, batch := range [][][]int32{{seq}, {seqs[(s+1)%len(seqs)], seq}} {
			res, err := eng.Forward(batch, train.ForwardOptions{Record: true})
			if err != nil {
				t.Fatal(err)
			}
			got := len(batch) - 1
			for i := range seq[1:] {
				if math.Float32bits(res.LogProbs[got][i]) != math.Float32bits(all.LogProbs[s][i]) ||
					math.Float32bits(res.Entropy[got][i]) != math.Float32bits(all.Entropy[s][i]) {
					t.Errorf("sequence %d position %d in a batch of %d: log-prob %v entropy %v, in the full batch %v %v",
						s, i, len(batch), res.LogProbs[got][i], res.Entropy[got][i], all.LogProbs[s][i], all.Entropy[s][i])
					break
				}
			}
			if !res.Routes[got].Equal(all.Routes[s]) {
				t.Errorf("sequence %d: routes differ between batches", s)
			}
		}
	}
}
