package train_test

// Whole-model checks of the training engine against the independent float64
// reference in internal/ref64: forward values within 1e-5, and every entry of
// every parameter gradient against central finite differences of the
// reference loss
//
//	L(θ) = Σ c·log π + Σ e·H + a·AuxLoss
//
// with random c, e and a. KEEL_LONG=1 adds a larger configuration.
//
// Live routing is piecewise smooth: a perturbation could flip a top-k
// choice. The finite differences are therefore taken with the unperturbed
// live routes forced (replayed), and the auxiliary loss's expert mask frozen
// to them, which is locally the same function (with replay the gates are the
// live scores restricted to the forced set, identical to the live gates).
//
// Under replay the engine counts the replayed (actually used) experts in the
// load-balancing loss (see Result.AuxLoss); the reference is run with the
// same mask. Hugging Face's load_balancing_loss_func, which knows nothing of
// replay, would recompute the top-k from the logits.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/keel-rl/keel/internal/ref64"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// gcRandomModel fills a model with reproducible random weights: N(0, 0.5²)
// for matrices, 1 + N(0, 0.2²) for norm gains.
func gcRandomModel(cfg model.Config, seed uint64) *model.Model {
	m := model.New(cfg)
	r := rand.New(rand.NewPCG(seed, 99))
	for _, p := range m.Params() {
		for i := range p.Data {
			if len(p.Shape) == 1 {
				p.Data[i] = float32(1 + 0.2*r.NormFloat64())
			} else {
				p.Data[i] = float32(0.5 * r.NormFloat64())
			}
		}
	}
	return m
}

func gcSeqs(r *rand.Rand, vocab int, lens []int) [][]int32 {
	seqs := make([][]int32, len(lens))
	for s, n := range lens {
		for range n {
			seqs[s] = append(seqs[s], int32(r.IntN(vocab)))
		}
	}
	return seqs
}

// gcRandomRoutes draws, for every token and MoE layer, k distinct experts in
// random order. If avoid is set, experts of avoid's set at the same place
// are not drawn (which needs E >= 2k).
func gcRandomRoutes(r *rand.Rand, tokens, layers, experts, k int, avoid *model.Routes) *model.Routes {
	rt := model.NewRoutes(tokens, layers, k, experts)
	for t := range tokens {
		for l := range layers {
			var pool []int32
			for e := range experts {
				if avoid != nil && gcContains(avoid.Slots(nil, t, l), int32(e)) {
					continue
				}
				pool = append(pool, int32(e))
			}
			r.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
			rt.SetSlots(t, l, pool[:k])
		}
	}
	return rt
}

// gcRouteIDs returns all of r's expert ids in its layout, (t·Layers + l)·K + s.
func gcRouteIDs(r *model.Routes) []int32 {
	var out []int32
	for t := range r.Tokens {
		for l := range r.Layers {
			out = append(out, r.Slots(nil, t, l)...)
		}
	}
	return out
}

func gcContains(ids []int32, id int32) bool {
	for _, v := range ids {
		if v == id {
			return true
		}
	}
	return false
}

func gcSameSet(a, b []int32) bool {
	for _, v := range a {
		if !gcContains(b, v) {
			return false
		}
	}
	return len(a) == len(b)
}

func gcRandomCoeffs(r *rand.Rand, seqs [][]int32, scale float64) ([][]float32, [][]float64) {
	c32 := make([][]float32, len(seqs))
	c64 := make([][]float64, len(seqs))
	for s, seq := range seqs {
		for range len(seq) - 1 {
			v := float32(scale * r.NormFloat64())
			c32[s] = append(c32[s], v)
			c64[s] = append(c64[s], float64(v))
		}
	}
	return c32, c64
}

func gcLoss(res *ref64.Result, c, e [][]float64, aux float64) float64 {
	var l float64
	for s := range c {
		for t := range c[s] {
			l += c[s][t]*res.LogProbs[s][t] + e[s][t]*res.Entropy[s][t]
		}
	}
	return l + aux*res.AuxLoss
}

// gcMultiIndex formats flat index i of a tensor of the given shape.
func gcMultiIndex(i int, shape []int) string {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		idx[d] = i % shape[d]
		i /= shape[d]
	}
	return fmt.Sprint(idx)
}

type gcCase struct {
	name string
	cfg  model.Config
	lens []int
	// replay: "" live routing, "random" random expert sets, "avoid" random
	// sets disjoint from the live top-k at every token.
	replay string
	// temp is the softmax temperature (0: none).
	temp float64
}

func gcBase() model.Config {
	return model.Config{VocabSize: 11, HiddenSize: 8, IntermediateSize: 12, NumHiddenLayers: 2,
		NumAttentionHeads: 2, NumKeyValueHeads: 2, HeadDim: 4, RMSNormEps: 1e-6, RopeTheta: 10000,
		MaxPositionEmbeddings: 64}
}

func gcCases() []gcCase {
	denseTied := gcBase()
	denseTied.TieWordEmbeddings = true

	// GQA (4 heads over 2 kv heads) and head_dim 4 != 12/4.
	denseGQA := gcBase()
	denseGQA.VocabSize, denseGQA.HiddenSize, denseGQA.NumAttentionHeads, denseGQA.NumKeyValueHeads = 13, 12, 4, 2

	moe := func(norm, tie bool) model.Config {
		c := gcBase()
		c.NumAttentionHeads, c.NumKeyValueHeads = 2, 1 // GQA 2:1
		c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize = 4, 2, 6
		c.NormTopKProb, c.TieWordEmbeddings = norm, tie
		return c
	}
	moeNorm := moe(true, false)
	moeNoNorm := moe(false, true)
	moeNoNorm.HeadDim = 6 // != 8/2
	moeNoNorm.VocabSize = 17

	// decoder_sparse_step 2: layer 0 dense, layer 1 MoE.
	sparseStep := moe(true, true)
	sparseStep.DecoderSparseStep = 2
	sparseStep.NumExperts, sparseStep.NumExpertsPerTok = 6, 2
	sparseStep.IntermediateSize = 10
	// mlp_only_layers [1]: layer 0 MoE, layer 1 dense; top-3 of 5, no renorm.
	mlpOnly := moe(false, false)
	mlpOnly.MlpOnlyLayers = []int{1}
	mlpOnly.NumExperts, mlpOnly.NumExpertsPerTok = 5, 3
	mlpOnly.HiddenSize, mlpOnly.NumAttentionHeads, mlpOnly.NumKeyValueHeads = 16, 4, 2
	mlpOnly.VocabSize = 13

	lens := []int{3, 9, 6}
	cs := []gcCase{
		{"dense-tied", denseTied, lens, "", 0},
		{"dense-untied-gqa-headdim", denseGQA, []int{5, 8, 4}, "", 0},
	}
	for _, mc := range []struct {
		name string
		cfg  model.Config
	}{
		{"moe-norm-topk", moeNorm}, {"moe-no-norm-tied-headdim", moeNoNorm},
		{"moe-sparse-step-2", sparseStep}, {"moe-mlp-only-layers", mlpOnly},
	} {
		cs = append(cs, gcCase{mc.name + "/live", mc.cfg, lens, "", 0}, gcCase{mc.name + "/replay", mc.cfg, lens, "random", 0})
	}
	cs = append(cs,
		gcCase{"moe-norm-topk/replay-never-live", moeNorm, []int{7, 4}, "avoid", 0},
		gcCase{"moe-no-norm/replay-never-live", moe(false, false), []int{7, 4}, "avoid", 0},
		gcCase{"dense-tied/temperature-0.7", denseTied, lens, "", 0.7},
		gcCase{"moe-norm-topk/replay/temperature-1.3", moeNorm, lens, "random", 1.3},
	)
	if os.Getenv("KEEL_LONG") != "" {
		// Larger: 4 layers, MoE at layers 1 and 3 (decoder_sparse_step 2),
		// 8 experts top-3, longer sequences.
		big := moe(true, false)
		big.NumHiddenLayers, big.HiddenSize, big.NumAttentionHeads, big.NumKeyValueHeads = 4, 16, 4, 2
		big.NumExperts, big.NumExpertsPerTok, big.DecoderSparseStep = 8, 3, 2
		big.VocabSize, big.IntermediateSize = 23, 20
		blens := []int{12, 7, 15}
		cs = append(cs, gcCase{"long/moe-4-layers/live", big, blens, "", 0}, gcCase{"long/moe-4-layers/replay", big, blens, "random", 0})
	}
	return cs
}

func TestGradCheck(t *testing.T) {
	for ci, tc := range gcCases() {
		t.Run(tc.name, func(t *testing.T) {
			gcRun(t, tc, uint64(ci+1))
		})
	}
}

func gcRun(t *testing.T, tc gcCase, seed uint64) {
	cfg := tc.cfg
	m := gcRandomModel(cfg, seed)
	r := rand.New(rand.NewPCG(seed, 7))
	seqs := gcSeqs(r, cfg.VocabSize, tc.lens)
	ref := ref64.FromModel(m)
	isMoE := len(cfg.MoELayers()) > 0

	live, err := ref.Forward(seqs, ref64.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var replay []*model.Routes
	if tc.replay != "" {
		differ, total := 0, 0
		for s, seq := range seqs {
			var avoid *model.Routes
			if tc.replay == "avoid" {
				avoid = live.Routes[s]
			}
			rt := gcRandomRoutes(r, len(seq), len(cfg.MoELayers()), cfg.NumExperts, cfg.NumExpertsPerTok, avoid)
			for i := range len(seq) {
				for l := range len(cfg.MoELayers()) {
					total++
					if !gcSameSet(rt.Slots(nil, i, l), live.Routes[s].Slots(nil, i, l)) {
						differ++
					}
				}
			}
			replay = append(replay, rt)
		}
		if differ*2 < total {
			t.Fatalf("replayed routes differ from the live top-k on only %d of %d token-layers", differ, total)
		}
	}

	// Forward: engine (float32) vs reference (float64).
	eng := train.New(m)
	res, err := eng.Forward(seqs, train.ForwardOptions{Replay: replay, Record: isMoE, Temperature: tc.temp})
	if err != nil {
		t.Fatal(err)
	}
	frozen := replay
	if frozen == nil && isMoE {
		frozen = live.Routes
	}
	want, err := ref.Forward(seqs, ref64.Options{Replay: frozen, AuxMask: frozen, Temperature: tc.temp})
	if err != nil {
		t.Fatal(err)
	}
	for s := range seqs {
		if len(res.LogProbs[s]) != len(want.LogProbs[s]) || len(res.Entropy[s]) != len(want.Entropy[s]) {
			t.Fatalf("sequence %d: %d log-probs and %d entropies, want %d", s, len(res.LogProbs[s]), len(res.Entropy[s]), len(want.LogProbs[s]))
		}
		for i := range want.LogProbs[s] {
			if d := math.Abs(float64(res.LogProbs[s][i]) - want.LogProbs[s][i]); !(d <= 1e-5) {
				t.Errorf("log-prob [%d][%d] = %.7g, float64 reference %.7g (|diff| %.2g > 1e-5)", s, i, res.LogProbs[s][i], want.LogProbs[s][i], d)
			}
			if d := math.Abs(float64(res.Entropy[s][i]) - want.Entropy[s][i]); !(d <= 1e-5) {
				t.Errorf("entropy [%d][%d] = %.7g, float64 reference %.7g (|diff| %.2g > 1e-5)", s, i, res.Entropy[s][i], want.Entropy[s][i], d)
			}
		}
	}
	if d := math.Abs(res.AuxLoss - want.AuxLoss); !(d <= 1e-5) {
		t.Errorf("aux loss = %.9g, float64 reference %.9g (|diff| %.2g > 1e-5)", res.AuxLoss, want.AuxLoss, d)
	}
	if isMoE {
		gcCheckRoutes(t, res.Routes, want.Routes, replay != nil)
	}

	// Backward vs finite differences of the reference.
	c32, c64 := gcRandomCoeffs(r, seqs, 1)
	e32, e64 := gcRandomCoeffs(r, seqs, 0.5)
	aux := 0.0
	if isMoE {
		aux = 0.7
	}
	if tc.replay == "avoid" {
		aux = 0 // every router gradient must then come from replayed, never-live experts
	}
	eng.ZeroGrad()
	if err := eng.Backward(train.Loss{LogProb: c32, Entropy: e32, Aux: aux}); err != nil {
		t.Fatal(err)
	}
	opt := ref64.Options{Replay: frozen, AuxMask: frozen, Temperature: tc.temp}
	loss := func() float64 {
		out, err := ref.Forward(seqs, opt)
		if err != nil {
			t.Fatal(err)
		}
		return gcLoss(out, c64, e64, aux)
	}
	const h = 1e-5
	fd := make([]float64, len(ref.Arena))
	for i := range ref.Arena {
		v := ref.Arena[i]
		ref.Arena[i] = v + h
		lp := loss()
		ref.Arena[i] = v - h
		lm := loss()
		ref.Arena[i] = v
		fd[i] = (lp - lm) / (2 * h)
	}
	gcCompare(t, m, eng.Grad.Arena, fd)

	if tc.replay == "avoid" {
		gcCheckRouterGrad(t, m, eng.Grad, replay)
	}
}

// gcCompare checks every tensor: max |analytic − FD| <= 1e-3 · max(largest
// |FD| entry of the tensor, 1e-5 · largest over the model). The floor only
// matters for tensors with (near-)zero gradient, such as experts no token
// uses. (These configurations pass at 1e-4 too; 1e-3 leaves room for
// float32 summation-order changes in the engine.)
func gcCompare(t *testing.T, m *model.Model, grad []float32, fd []float64) {
	t.Helper()
	global := 0.0
	for _, v := range fd {
		global = math.Max(global, math.Abs(v))
	}
	if global == 0 {
		t.Fatal("finite-difference gradient is identically zero: the check would prove nothing")
	}
	off := 0
	for _, p := range m.Params() {
		n := p.Size()
		scale := 1e-5 * global
		for _, v := range fd[off : off+n] {
			scale = math.Max(scale, math.Abs(v))
		}
		worst, wi := -1.0, 0
		for i := range n {
			d := math.Abs(float64(grad[off+i]) - fd[off+i])
			if math.IsNaN(d) {
				d = math.Inf(1)
			}
			if d > worst {
				worst, wi = d, i
			}
		}
		if worst > 1e-3*scale {
			t.Errorf("gradient of %s %v: worst entry %s analytic %.7g vs finite difference %.7g (|diff| %.3g > tol %.3g; tensor max |g| %.3g)",
				p.Name, p.Shape, gcMultiIndex(wi, p.Shape), grad[off+wi], fd[off+wi], worst, 1e-3*scale, scale)
		}
		off += n
	}
}

// gcCheckRoutes compares the engine's recorded routes with the reference's.
// Live routes may legitimately differ at float32 near-ties; none are
// expected with these random weights, so any difference is reported.
func gcCheckRoutes(t *testing.T, got, want []*model.Routes, replayed bool) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("engine recorded routes for %d sequences, want %d", len(got), len(want))
	}
	for s := range want {
		if got[s] == nil || got[s].Tokens != want[s].Tokens || got[s].Layers != want[s].Layers || got[s].K != want[s].K {
			t.Fatalf("sequence %d: recorded routes %v, want shape of %v", s, got[s], want[s])
		}
		gotIDs, wantIDs := gcRouteIDs(got[s]), gcRouteIDs(want[s])
		for i := range wantIDs {
			if gotIDs[i] != wantIDs[i] {
				k, nl := want[s].K, want[s].Layers
				t.Errorf("sequence %d token %d MoE layer %d: recorded experts %v, want %v (replayed: %v)",
					s, i/(k*nl), i/k%nl, got[s].Slots(nil, i/(k*nl), i/k%nl), want[s].Slots(nil, i/(k*nl), i/k%nl), replayed)
				break
			}
		}
	}
}

// gcCheckRouterGrad: with replayed experts disjoint from the live top-k and
// no aux loss, every router row of an expert that was replayed somewhere
// must receive a non-zero gradient. An engine that derives replay gates from
// probabilities already zeroed by the live top-k gives these rows exactly 0.
func gcCheckRouterGrad(t *testing.T, m *model.Model, grad *model.Model, replay []*model.Routes) {
	t.Helper()
	cfg := m.Config
	for l, li := range cfg.MoELayers() {
		used := make([]bool, cfg.NumExperts)
		for _, rt := range replay {
			for tok := range rt.Tokens {
				for _, e := range rt.Slots(nil, tok, l) {
					used[e] = true
				}
			}
		}
		g := grad.Layers[li].Router
		var maxAll float64
		for _, v := range g.Data {
			maxAll = math.Max(maxAll, math.Abs(float64(v)))
		}
		for e, u := range used {
			if !u {
				continue
			}
			var mx float64
			for _, v := range g.Data[e*cfg.HiddenSize : (e+1)*cfg.HiddenSize] {
				mx = math.Max(mx, math.Abs(float64(v)))
			}
			if !(mx > 1e-3*maxAll) || mx == 0 {
				t.Errorf("%s row %d (expert replayed only where the live router did not pick it): max |grad| %.3g, router max %.3g: the router gets no gradient through replayed experts",
					g.Name, e, mx, maxAll)
			}
		}
	}
}
