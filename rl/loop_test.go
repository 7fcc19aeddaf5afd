package rl

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/train"
)

// The loop tests run a tiny random MoE model on fixed random prompts with a
// synthetic reward (1 when the response's first token is even), so that
// groups have mixed rewards and every step moves the weights.

func tinyConfig(moe bool) model.Config {
	c := model.Config{Architecture: model.ArchQwen3, VocabSize: 32, HiddenSize: 32, IntermediateSize: 48,
		NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 16, RMSNormEps: 1e-6,
		RopeTheta: 10000, MaxPositionEmbeddings: 64}
	if moe {
		c.Architecture = model.ArchQwen3MoE
		c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize, c.NormTopKProb, c.DecoderSparseStep = 6, 2, 16, true, 1
	}
	return c
}

const testRecipeYAML = `
name: test
model: {path: unused}
data: {tasks: [arithmetic]}
rollout: {precision: exact, max_new_tokens: 10, slots: 32}
train: {steps: 3, prompts_per_step: 4, group_size: 4, lr: 3.0e-2, micro_batch_tokens: 100000}
eval: {skip: true}
`

func testRecipe(t *testing.T, sets ...string) *Recipe {
	t.Helper()
	r, err := ParseRecipe([]byte(testRecipeYAML), sets)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func evenFirst(_ *Prompt, resp []int32) (float64, float64) {
	if resp[0]%2 == 0 {
		return 1, 1
	}
	return 0, 0
}

// testLoop builds a loop over a fresh copy of a seeded model.
func testLoop(t *testing.T, r *Recipe, moe bool) *Loop {
	t.Helper()
	m := model.New(tinyConfig(moe))
	model.Init(m, 7)
	rng := rand.New(rand.NewPCG(3, 4))
	prompts := make([]Prompt, 12)
	for i := range prompts {
		ids := make([]int32, 3+rng.IntN(4))
		for j := range ids {
			ids[j] = int32(2 + rng.IntN(30))
		}
		prompts[i] = Prompt{Row: i, IDs: ids}
		prompts[i].Example.Task = "t" + itoa(i%2)
	}
	prec, err := rollout.ParsePrecision(r.Rollout.Precision)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := rollout.New(m, rollout.Options{Precision: prec, Slots: r.Rollout.Slots, MaxLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	tr, err := train.NewTrainer(m, r.AdamW(), nil)
	if err != nil {
		t.Fatal(err)
	}
	l := &Loop{R: r, Trainer: tr, Sampler: eng, Loader: NewLoader(prompts, r.Seed), Score: evenFirst, Stop: []int32{1}}
	if err := l.Init(); err != nil {
		t.Fatal(err)
	}
	return l
}

// runSteps runs n steps and returns the weights and each step's metrics
// without the timings.
func runSteps(t *testing.T, l *Loop, n int) ([]float32, []map[string]float64) {
	t.Helper()
	var ms []map[string]float64
	for range n {
		res, err := l.RunStep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for k, v := range res.Metrics {
			if !strings.HasPrefix(k, "time/") && !strings.HasPrefix(k, "tokens_per_s/") {
				m[k] = v
			}
		}
		ms = append(ms, m)
	}
	return slices.Clone(cpu(l).Model.Arena), ms
}

// cpu returns the loop's training engine, the CPU one in these tests.
func cpu(l *Loop) *train.Engine { return l.Trainer.(*train.Engine) }

func sameRun(t *testing.T, what string, w1, w2 []float32, m1, m2 []map[string]float64) {
	t.Helper()
	for i := range w1 {
		if math.Float32bits(w1[i]) != math.Float32bits(w2[i]) {
			t.Fatalf("%s: weight %d differs: %v vs %v", what, i, w1[i], w2[i])
		}
	}
	for s := range m1 {
		if len(m1[s]) != len(m2[s]) {
			t.Fatalf("%s: step %d logs %d metrics vs %d", what, s+1, len(m1[s]), len(m2[s]))
		}
		for k, v := range m1[s] {
			if u, ok := m2[s][k]; !ok || math.Float64bits(u) != math.Float64bits(v) {
				t.Fatalf("%s: step %d metric %s: %v vs %v", what, s+1, k, v, u)
			}
		}
	}
}

func TestLoopLearnsTheReward(t *testing.T) {
	l := testLoop(t, testRecipe(t, "train.steps=12"), true)
	_, ms := runSteps(t, l, 12)
	first := (ms[0]["reward/mean"] + ms[1]["reward/mean"] + ms[2]["reward/mean"]) / 3
	last := (ms[9]["reward/mean"] + ms[10]["reward/mean"] + ms[11]["reward/mean"]) / 3
	if !(last > first+0.2) {
		t.Fatalf("reward %.3f over the first 3 steps, %.3f over the last 3: MiniRL did not learn a trivial reward", first, last)
	}
	for _, k := range []string{"entropy", "is/ess", "grad_norm", "routing/infer_vs_old/l0", "staleness/mb0", "surrogate/gap", "accuracy/t0"} {
		if _, ok := ms[0][k]; !ok {
			t.Errorf("metric %s not logged", k)
		}
	}
}

// R2 with one mini-batch replays the routes pi_old chose with the same
// weights: the same run as no replay, bit for bit.
func TestR2OnPolicyIsNoReplay(t *testing.T) {
	w1, m1 := runSteps(t, testLoop(t, testRecipe(t), true), 3)
	w2, m2 := runSteps(t, testLoop(t, testRecipe(t, "algorithm.replay=r2"), true), 3)
	sameRun(t, "r2 vs none", w1, w2, m1, m2)
}

// In exact precision the rollout engine routes as the training engine, so
// R3 (replay the rollout's routes) is R2 bit for bit, with several
// mini-batches too; in fp8 the rollout's routes differ and so does the run.
func TestR3ExactIsR2(t *testing.T) {
	w2, m2 := runSteps(t, testLoop(t, testRecipe(t, "algorithm.replay=r2", "train.mini_batches=2"), true), 2)
	w3, m3 := runSteps(t, testLoop(t, testRecipe(t, "algorithm.replay=r3", "train.mini_batches=2"), true), 2)
	for _, m := range m3 { // R3 logs no rollout-vs-pi_old disagreement (zero by construction)
		for k := range m2[0] {
			if strings.HasPrefix(k, "routing/infer_vs_old") {
				m[k] = m2[0][k]
			}
		}
	}
	for s := range m2 {
		for k, v := range m2[s] {
			if strings.HasPrefix(k, "routing/infer_vs_old") {
				m3[s][k] = v
				if v != 0 {
					t.Fatalf("exact rollout: routing/infer_vs_old %s = %v, want 0", k, v)
				}
			}
		}
	}
	sameRun(t, "r3 vs r2 (exact)", w2, w3, m2, m3)

	w8, m8 := runSteps(t, testLoop(t, testRecipe(t, "algorithm.replay=r2", "train.mini_batches=2", "rollout.precision=fp8"), true), 1)
	w9, _ := runSteps(t, testLoop(t, testRecipe(t, "algorithm.replay=r3", "train.mini_batches=2", "rollout.precision=fp8"), true), 1)
	if m8[0]["routing/infer_vs_old"] == 0 {
		t.Fatal("fp8 rollout routed exactly as the training engine: the test cannot tell R3 from R2")
	}
	if slices.Equal(w8, w9) {
		t.Fatal("fp8: R3 gave the weights of R2")
	}
}

// The first mini-batch's pi_old is taken from its first training forward;
// recomputing it separately gives the same bits.
func TestFirstMiniBatchReusesPiOld(t *testing.T) {
	for _, replay := range []string{"none", "r2", "r3"} {
		r := testRecipe(t, "train.mini_batches=2", "algorithm.replay="+replay, "rollout.precision=bf16")
		a := testLoop(t, r, true)
		b := testLoop(t, r, true)
		b.separatePiOld = true
		w1, m1 := runSteps(t, a, 2)
		w2, m2 := runSteps(t, b, 2)
		sameRun(t, "reused vs recomputed pi_old, replay "+replay, w1, w2, m1, m2)
	}
}

// Cutting a mini-batch into micro-batches changes only the float32
// summation order of its gradient; GOMAXPROCS changes nothing.
func TestMicroBatchesAndThreads(t *testing.T) {
	a := testLoop(t, testRecipe(t), true)
	b := testLoop(t, testRecipe(t, "train.micro_batch_tokens=20"), true)
	runSteps(t, a, 1)
	runSteps(t, b, 1)
	ga, gb := cpu(a).Grad.Arena, cpu(b).Grad.Arena
	var maxDiff, maxG float64
	for i := range ga {
		maxDiff = max(maxDiff, math.Abs(float64(ga[i]-gb[i])))
		maxG = max(maxG, math.Abs(float64(ga[i])))
	}
	if !(maxG > 0) || maxDiff > 1e-5*maxG {
		t.Fatalf("gradient of one mini-batch vs micro-batches of 20 tokens: max |diff| %.3g, max |g| %.3g", maxDiff, maxG)
	}

	prev := runtime.GOMAXPROCS(1)
	one, m1 := runSteps(t, testLoop(t, testRecipe(t, "train.mini_batches=2"), true), 2)
	runtime.GOMAXPROCS(max(prev, 2))
	two, m2 := runSteps(t, testLoop(t, testRecipe(t, "train.mini_batches=2"), true), 2)
	runtime.GOMAXPROCS(prev)
	sameRun(t, "GOMAXPROCS 1 vs 2", one, two, m1, m2)
}

// In exact precision log mu_old is log pi_old bit for bit at any
// temperature (the training engine tempers its logits as the rollout
// engine does); fp32 shows a small discrepancy.
func TestTemperatureMatchesRollout(t *testing.T) {
	for _, temp := range []string{"1", "0.7"} {
		_, m := runSteps(t, testLoop(t, testRecipe(t, "rollout.temperature="+temp), true), 1)
		if m[0]["train_infer/abs_diff_max"] != 0 || m[0]["train_infer/k3"] != 0 {
			t.Fatalf("exact rollout at T = %s: max |Δ log p| %v, k3 %v, want 0", temp, m[0]["train_infer/abs_diff_max"], m[0]["train_infer/k3"])
		}
	}
	_, m := runSteps(t, testLoop(t, testRecipe(t, "rollout.temperature=0.7", "rollout.precision=fp32"), true), 1)
	if !(m[0]["train_infer/abs_diff_max"] > 0) {
		t.Fatal("fp32 rollout matched the training engine bit for bit: the exact check cannot fail")
	}
}

// badSampler wraps a rollout engine and spoils its samples.
type badSampler struct {
	Sampler
	spoil func(s []rollout.Sample)
}

func (b badSampler) Generate(p [][]int32, n int, sp rollout.Sampling) ([]rollout.Sample, error) {
	out, err := b.Sampler.Generate(p, n, sp)
	if err == nil {
		b.spoil(out)
	}
	return out, err
}

func TestRolloutOutputChecked(t *testing.T) {
	cases := []struct {
		name, want string
		spoil      func(s []rollout.Sample)
	}{
		{"stale version", "weight version 3", func(s []rollout.Sample) { s[5].Version = 3 }},
		{"expert out of range", "out of range", func(s []rollout.Sample) { s[0].Routes.IDs8[0] = 9 }},
		{"routes too short", "routes for", func(s []rollout.Sample) {
			r := s[1].Routes
			r.Tokens--
			r.IDs8 = r.IDs8[:r.Tokens*r.Layers*r.K]
		}},
		{"log-probs too short", "log-probs", func(s []rollout.Sample) { s[2].LogProbs = s[2].LogProbs[1:] }},
		{"groups of the wrong size", "samples for prompt 0", func(s []rollout.Sample) { s[0].Prompt = 1 }},
	}
	for _, tc := range cases {
		l := testLoop(t, testRecipe(t), true)
		l.Sampler = badSampler{l.Sampler, tc.spoil}
		_, err := l.RunStep(context.Background())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestReplayNeedsMoE(t *testing.T) {
	l := &Loop{R: testRecipe(t, "algorithm.replay=r3"), Trainer: train.New(model.New(tinyConfig(false)))}
	if err := l.Init(); err == nil || !strings.Contains(err.Error(), "algorithm.replay") {
		t.Fatalf("replay on a dense model: %v", err)
	}
}

// noPush keeps the rollout engine on its first weights, labelling its
// samples with the version last pushed.
type noPush struct {
	Sampler
	v int64
}

func (n *noPush) UpdateWeights(_ context.Context, _ *model.Model, v int64) error {
	n.v = v
	return nil
}

func (n *noPush) Generate(p [][]int32, k int, sp rollout.Sampling) ([]rollout.Sample, error) {
	out, err := n.Sampler.Generate(p, k, sp)
	for i := range out {
		out[i].Version = n.v
	}
	return out, err
}

// A NaN in the policy makes every update non-finite: each is skipped and
// logged, and the run stops after guards.max_nonfinite in a row.
func TestNonFiniteStepsSkippedThenStop(t *testing.T) {
	// Micro-batches of 20 tokens: the first mini-batch's pi_old comes from
	// several forwards, and those after the NaN must still run.
	l := testLoop(t, testRecipe(t, "guards.max_nonfinite=2", "train.micro_batch_tokens=20"), true)
	l.Sampler = &noPush{Sampler: l.Sampler}
	policy := cpu(l).Model
	policy.Norm.Data[0] = float32(math.NaN())
	before := slices.Clone(policy.Arena)
	res, err := l.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped != 1 || res.Metrics["train/skipped_steps"] != 1 {
		t.Fatalf("skipped %d (metric %v), want 1", res.Skipped, res.Metrics["train/skipped_steps"])
	}
	for i, w := range policy.Arena {
		if math.Float32bits(w) != math.Float32bits(before[i]) && !math.IsNaN(float64(w)) {
			t.Fatalf("a skipped step changed weight %d", i)
		}
	}
	if _, err := l.RunStep(context.Background()); !errors.Is(err, ErrTooManyNonFinite) {
		t.Fatalf("second non-finite step in a row: %v, want ErrTooManyNonFinite", err)
	}
}

// All rewards equal: zero advantages, a logged zero-gradient step, no NaN.
func TestEqualRewardsGiveZeroGradient(t *testing.T) {
	l := testLoop(t, testRecipe(t), true)
	l.Score = func(*Prompt, []int32) (float64, float64) { return 1, 1 }
	res, err := l.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := res.Metrics
	if m["grad_norm"] != 0 || m["groups/zero_variance_frac"] != 1 || m["reward/std"] != 0 {
		t.Fatalf("grad_norm %v, zero-variance fraction %v, reward std %v", m["grad_norm"], m["groups/zero_variance_frac"], m["reward/std"])
	}
	for k, v := range m {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("metric %s = %v", k, v)
		}
	}
}

// Dynamic sampling drops groups whose rewards are all equal and samples
// more prompts to refill the step.
func TestDynamicSampling(t *testing.T) {
	l := testLoop(t, testRecipe(t, "algorithm.dynamic_sampling=true", "algorithm.max_rounds=4"), true)
	// Even rows always score 1 (a zero-variance group); odd rows score
	// by the first token.
	l.Score = func(p *Prompt, r []int32) (float64, float64) {
		if p.Row%2 == 0 {
			return 1, 1
		}
		return evenFirst(p, r)
	}
	res, err := l.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Metrics["rollout/rounds"] < 2 {
		t.Fatalf("%v rounds: half the groups were dropped, more should have been sampled", res.Metrics["rollout/rounds"])
	}
	for _, s := range res.Samples {
		if s.Prompt.Row%2 == 0 {
			t.Fatalf("a zero-variance group (row %d) was trained on", s.Prompt.Row)
		}
	}
}

// The route of position p is computed with token p as input: replaying a
// different expert set at position p changes log p(y_{p+1}) (LogProbs[p])
// and every later prediction, never an earlier one.
func TestRouteAlignment(t *testing.T) {
	m := model.New(tinyConfig(true))
	model.Init(m, 11)
	eng := train.New(m)
	seq := []int32{3, 9, 4, 17, 6, 2}
	res, err := eng.Forward([][]int32{seq}, train.ForwardOptions{Record: true, NoEntropy: true})
	if err != nil {
		t.Fatal(err)
	}
	base := slices.Clone(res.LogProbs[0])
	const p = 2
	live := res.Routes[0]
	rt := model.NewRoutes(live.Tokens, live.Layers, live.K, live.Experts)
	for t := 0; t < live.Tokens; t++ {
		for l := 0; l < live.Layers; l++ {
			for s := 0; s < live.K; s++ {
				rt.Set(t, l, s, live.At(t, l, s))
			}
		}
	}
	for e := 0; e < 6; e++ { // replace slot 0 by an expert the live router did not pick
		if e != rt.At(p, 0, 0) && e != rt.At(p, 0, 1) {
			rt.Set(p, 0, 0, e)
			break
		}
	}
	res2, err := eng.Forward([][]int32{seq}, train.ForwardOptions{Replay: []*model.Routes{rt}, NoEntropy: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range res2.LogProbs[0] {
		changed := v != base[i]
		if i < p && changed {
			t.Fatalf("a route at position %d changed log p(y_%d)", p, i+1)
		}
		if i == p && !changed {
			t.Fatalf("a route at position %d left log p(y_%d) unchanged", p, p+1)
		}
	}
}

// The MoE auxiliary loss does not grow with the number of micro-batches:
// each micro-batch's is weighed by its share of the tokens. (Its value
// per micro-batch is a product of means, so the two gradients are close,
// not equal.)
func TestAuxLossIndependentOfMicroBatches(t *testing.T) {
	flat := func(*Prompt, []int32) (float64, float64) { return 1, 1 } // only the auxiliary term trains
	a := testLoop(t, testRecipe(t, "train.aux_loss=0.01"), true)
	b := testLoop(t, testRecipe(t, "train.aux_loss=0.01", "train.micro_batch_tokens=20"), true)
	a.Score, b.Score = flat, flat
	ma, err := a.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	mb, err := b.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ga, gb := ma.Metrics["grad_norm"], mb.Metrics["grad_norm"]
	if !(ga > 0) || gb > 1.5*ga || gb < ga/1.5 {
		t.Fatalf("auxiliary-loss gradient norm %.3g in one micro-batch, %.3g in micro-batches of 20 tokens", ga, gb)
	}
}

// Fewer surviving groups than mini-batches take no empty optimiser steps.
func TestNoEmptyMiniBatches(t *testing.T) {
	l := testLoop(t, testRecipe(t, "algorithm.dynamic_sampling=true", "algorithm.max_rounds=1", "train.mini_batches=4"), true)
	var first *Prompt
	n := 0
	l.Score = func(p *Prompt, r []int32) (float64, float64) {
		if first == nil {
			first = p
		}
		if p != first {
			return 1, 1 // every group but the first prompt's has equal rewards
		}
		n++
		return float64(n % 2), 0 // the first prompt's alternate
	}
	res, err := l.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if trained := res.Metrics["groups/trained"]; trained != 1 {
		t.Fatalf("%v groups survived, want the first prompt's alone", trained)
	}
	if got := int(l.Trainer.Steps()); got != int(res.Metrics["groups/trained"]) {
		t.Fatalf("%d optimiser steps for %v groups in 4 mini-batches", got, res.Metrics["groups/trained"])
	}
}

// A dense model runs the same loop (no routes, no routing metrics).
func TestDenseModelLoop(t *testing.T) {
	_, ms := runSteps(t, testLoop(t, testRecipe(t, "train.mini_batches=2", "rollout.precision=bf16"), false), 2)
	for k := range ms[1] {
		if strings.HasPrefix(k, "routing/") {
			t.Fatalf("a dense model logged %s", k)
		}
	}
	if !(ms[1]["train_infer/abs_diff_max"] > 0) || ms[1]["grad_norm"] == 0 {
		t.Fatalf("bf16 rollout on a dense model: max |Δ| %v, grad norm %v", ms[1]["train_infer/abs_diff_max"], ms[1]["grad_norm"])
	}
}

// The KL penalty runs through the reference Trainer: at the first step the
// policy is the reference, so k3 is exactly 0; later it is positive, and
// the penalty changes the update.
func TestKLToTheReference(t *testing.T) {
	r := testRecipe(t, "algorithm.kl_coef=0.5")
	l := testLoop(t, r, true)
	ref := cpu(l).Model.ZeroLike()
	copy(ref.Arena, cpu(l).Model.Arena)
	l.Reference = train.New(ref) // scores only
	w1, ms := runSteps(t, l, 3)
	if ms[0]["kl_ref/k3"] != 0 || !(ms[2]["kl_ref/k3"] > 0) {
		t.Fatalf("kl_ref/k3 %v at step 1 (want 0), %v at step 3 (want > 0)", ms[0]["kl_ref/k3"], ms[2]["kl_ref/k3"])
	}
	w2, _ := runSteps(t, testLoop(t, testRecipe(t), true), 3)
	if slices.Equal(w1, w2) {
		t.Fatal("the KL penalty left the weights as they are without it")
	}
}
