package rl

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
)

// lossRecorder is a Trainer that keeps the last loss it was given.
type lossRecorder struct {
	train.Trainer
	last train.Loss
}

func (r *lossRecorder) Backward(l train.Loss) error {
	r.last = train.Loss{LogProb: slices.Clone(l.LogProb), Entropy: slices.Clone(l.Entropy), Aux: l.Aux}
	return r.Trainer.Backward(l)
}

// The masks by hand. Two trajectories of one group, each a model turn, an
// observation and another model turn, with log mu set below log pi_old by
// known amounts: under MiniRL with length normalisation, at the first
// forward (pi_theta = pi_old, so no clipping) the coefficient of model
// token j is -(1/B)(1/n) exp(d_j) A with n the number of MODEL tokens and
// exp(d_j) the IS weight; every observation position's coefficient and
// entropy weight is 0; and the IS statistics run over the model tokens
// only.
func TestObservationMasksByHand(t *testing.T) {
	r := testRecipe(t, "algorithm.objective=minirl-lennorm", "algorithm.entropy_coef=0.01")
	l := testLoop(t, r, true)
	rec := &lossRecorder{Trainer: l.Trainer}
	l.Trainer = rec
	type traj struct {
		prompt, resp []int32
		obs          []rollout.Span
		adv          float64
	}
	trajs := []traj{
		{prompt: []int32{5, 6, 7}, resp: []int32{8, 9, 10, 11, 12, 13, 14, 15}, obs: []rollout.Span{{Start: 2, End: 5}}, adv: 1},
		{prompt: []int32{5, 6, 7, 9}, resp: []int32{20, 21, 22, 23, 24, 25}, obs: []rollout.Span{{Start: 1, End: 2}, {Start: 3, End: 5}}, adv: -0.5},
	}
	var samples []*Sample
	var deltas [][]float64
	for i, tr := range trajs {
		seq := append(slices.Clone(tr.prompt), tr.resp...)
		res, err := l.Trainer.Forward([][]int32{seq}, train.ForwardOptions{Temperature: 1})
		if err != nil {
			t.Fatal(err)
		}
		// The model tokens, found here by their own loop.
		var logMu []float32
		var d []float64
		for j := range tr.resp {
			inObs := false
			for _, o := range tr.obs {
				inObs = inObs || (j >= o.Start && j < o.End)
			}
			if inObs {
				continue
			}
			dj := 0.05 * float64(len(d)+1+i)
			logMu = append(logMu, res.LogProbs[0][len(tr.prompt)-1+j]-float32(dj))
			d = append(d, float64(res.LogProbs[0][len(tr.prompt)-1+j])-float64(logMu[len(logMu)-1]))
		}
		deltas = append(deltas, d)
		s := &Sample{Group: 0, Prompt: &Prompt{Row: i, IDs: tr.prompt}, Response: tr.resp, Obs: tr.obs, LogMu: logMu, Advantage: tr.adv}
		if s.Routes, err = routesOf(l, seq); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, s)
	}
	mr, err := l.update(0, samples)
	if err != nil {
		t.Fatal(err)
	}
	var wSum float64
	var wN int
	for i, tr := range trajs {
		c, ent := rec.last.LogProb[i], rec.last.Entropy[i]
		p := len(tr.prompt)
		if len(c) != p+len(tr.resp)-1 {
			t.Fatalf("trajectory %d: %d coefficients for a sequence of %d", i, len(c), p+len(tr.resp))
		}
		for pos := 0; pos < p-1; pos++ {
			if c[pos] != 0 || ent[pos] != 0 {
				t.Fatalf("trajectory %d: prompt position %d has coefficient %g, entropy weight %g", i, pos, c[pos], ent[pos])
			}
		}
		n := float64(len(deltas[i]))
		k := 0
		for j := range tr.resp {
			got, gotEnt := c[p-1+j], ent[p-1+j]
			inObs := false
			for _, o := range tr.obs {
				inObs = inObs || (j >= o.Start && j < o.End)
			}
			if inObs {
				if got != 0 || gotEnt != 0 {
					t.Fatalf("trajectory %d: observation token %d has coefficient %g, entropy weight %g", i, j, got, gotEnt)
				}
				continue
			}
			w := math.Exp(deltas[i][k])
			want := -(1.0 / 2) / n * w * tr.adv
			if math.Abs(float64(got)-want) > 1e-6*math.Abs(want) {
				t.Fatalf("trajectory %d model token %d (response token %d): coefficient %.9g, by hand %.9g", i, k, j, got, want)
			}
			if wantEnt := -0.01 * (1.0 / 2) / n; math.Abs(float64(gotEnt)-wantEnt) > 1e-6*math.Abs(wantEnt) {
				t.Fatalf("trajectory %d model token %d: entropy weight %g, by hand %g", i, k, gotEnt, wantEnt)
			}
			wSum += w
			wN++
			k++
		}
	}
	if mr.stats.Tokens != wN {
		t.Fatalf("statistics over %d tokens, the model's are %d", mr.stats.Tokens, wN)
	}
	if got, want := mr.stats.ISMean(), wSum/float64(wN); math.Abs(got-want) > 1e-6 {
		t.Fatalf("IS mean %g, by hand over the model tokens %g", got, want)
	}
}

// routesOf records the routes of a sequence (for the samples built by hand
// in the tests: the loop checks an MoE sample has them).
func routesOf(l *Loop, seq []int32) (*model.Routes, error) {
	res, err := l.Trainer.Forward([][]int32{seq}, train.ForwardOptions{Record: true, NoEntropy: true})
	if err != nil {
		return nil, err
	}
	return res.Routes[0], nil
}

// countEnv answers a model's first turn with the number of characters it
// wrote, as a tool would, and rewards the second turn by the parity of its
// length.
type countEnv struct{}

func (countEnv) Start(context.Context, *data.Example) (env.Episode, error) {
	return countEpisode{}, nil
}

type countEpisode struct{}

func (countEpisode) Step(_ context.Context, t env.Turn) (env.Reply, error) {
	if t.Index == 0 && !t.Last {
		return env.Reply{Messages: []tokenizer.Message{{Role: "tool", Content: fmt.Sprint(len(t.Text))}}, Metrics: map[string]float64{"calls": 1}}, nil
	}
	r := float64(len(t.Text) % 2)
	return env.Reply{Done: true, Reward: r, Correct: r}, nil
}

func (countEpisode) Close() error { return nil }

// envLoop is a loop of multi-turn episodes of countEnv on a random MoE model
// over keel's character tokenizer.
func envLoop(t *testing.T, r *Recipe) *Loop {
	t.Helper()
	c := tinyConfig(true)
	c.VocabSize, c.MaxPositionEmbeddings = 128, 256
	m := model.New(c)
	model.Init(m, 7)
	rng := rand.New(rand.NewPCG(3, 4))
	prompts := make([]Prompt, 8)
	for i := range prompts {
		ids := make([]int32, 3+rng.IntN(4))
		for j := range ids {
			ids[j] = int32(5 + rng.IntN(90))
		}
		prompts[i] = Prompt{Row: i, IDs: ids, Example: data.Example{Task: "t"}}
	}
	prec, err := rollout.ParsePrecision(r.Rollout.Precision)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := rollout.New(m, rollout.Options{Precision: prec, Slots: r.Rollout.Slots, MaxLen: 200})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	tr, err := train.NewTrainer(m, r.AdamW(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tok := tokenizer.NewChar()
	l := &Loop{R: r, Trainer: tr, Sampler: eng, Loader: NewLoader(prompts, r.Seed), Stop: []int32{tok.MustID(tokenizer.ImEnd)},
		Env: countEnv{}, Budgets: r.Env.budgets(), Tok: tok}
	if err := l.Init(); err != nil {
		t.Fatal(err)
	}
	return l
}

// Episodes end to end in exact precision: log mu is log pi_old bit for bit
// on every model token of every trajectory (train-infer KL exactly 0),
// the observations are where the environment's answers are, rewards are
// the environment's, and MiniRL and MiniRL without IS are one run, bit
// for bit, as in one turn.
func TestEpisodesExact(t *testing.T) {
	base := []string{"env.name=tools", "env.max_turns=3", "env.max_tokens=150", "rollout.max_new_tokens=12", "algorithm.replay=r3"}
	a := envLoop(t, testRecipe(t, base...))
	res, err := a.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	multi := 0
	for _, s := range res.Samples {
		if !slices.Equal(bitsOf(s.LogMu), bitsOf(s.LogPiOld)) {
			t.Fatalf("a sample's log mu differs from its log pi_old in exact precision")
		}
		if len(s.Obs) > 0 {
			multi++
			obs := a.Tok.DecodeLenient(s.Response[s.Obs[0].Start:s.Obs[0].End])
			if want := env.RenderObservation(nil); len(obs) < len(want) || obs[len(obs)-len(want):] != want {
				t.Fatalf("observation %q does not end with the generation prompt", obs)
			}
		}
		if s.Episode == nil || s.Reward != s.Episode.Reward {
			t.Fatalf("reward %g, episode %+v", s.Reward, s.Episode)
		}
	}
	m := res.Metrics
	if multi == 0 || m["train_infer/k3"] != 0 || m["env/turns"] <= 1 || m["env/calls"] <= 0 {
		t.Fatalf("%d multi-turn samples, train-infer k3 %g, env/turns %g, env/calls %g", multi, m["train_infer/k3"], m["env/turns"], m["env/calls"])
	}
	w1, m1 := runSteps(t, envLoop(t, testRecipe(t, base...)), 2)
	w2, m2 := runSteps(t, envLoop(t, testRecipe(t, append(base, "algorithm.objective=minirl-no-is")...)), 2)
	for _, ms := range [][]map[string]float64{m1, m2} {
		for _, m := range ms {
			for k := range m {
				if len(k) > 3 && k[:3] == "is/" {
					delete(m, k)
				}
			}
		}
	}
	sameRun(t, "MiniRL vs MiniRL without IS, episodes in exact precision", w1, w2, m1, m2)
}

// R3 replays the rollout's routes at every position of a trajectory,
// observation positions included: with a bf16 rollout (whose routes are
// its own), pi_old's recorded routes are the rollout's everywhere.
func TestEpisodesR3ReplaysObservations(t *testing.T) {
	l := envLoop(t, testRecipe(t, "env.name=tools", "env.max_turns=3", "env.max_tokens=150", "rollout.max_new_tokens=12",
		"algorithm.replay=r3", "rollout.precision=bf16"))
	res, err := l.RunStep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	multi := 0
	for _, s := range res.Samples {
		if len(s.Obs) == 0 {
			continue
		}
		multi++
		if s.Routes.Tokens != len(s.Prompt.IDs)+len(s.Response) || !s.OldRoutes.Equal(s.Routes) {
			t.Fatalf("pi_old's routes are not the rollout's over the %d positions of a trajectory", s.Routes.Tokens)
		}
	}
	if multi == 0 {
		t.Fatal("no multi-turn sample")
	}
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, x := range v {
		out[i] = math.Float32bits(x)
	}
	return out
}

// A batch of episodes sampled ahead survives a checkpoint: saved and
// restored, its samples keep their observations, per-model-token log mu
// and outcomes.
func TestEpisodeBatchSavedAndRestored(t *testing.T) {
	l := envLoop(t, testRecipe(t, "env.name=tools", "env.max_turns=3", "env.max_tokens=150", "rollout.max_new_tokens=12", "rollout.staleness=1"))
	b := l.collect(1, 0)
	if b.err != nil {
		t.Fatal(b.err)
	}
	js, err := json.Marshal(saveBatch(b))
	if err != nil {
		t.Fatal(err)
	}
	var sb SavedBatch
	if err := json.Unmarshal(js, &sb); err != nil {
		t.Fatal(err)
	}
	got, err := l.restoreBatch(sb)
	if err != nil {
		t.Fatal(err)
	}
	for gi, g := range b.groups {
		for i, s := range g {
			o := got.groups[gi][i]
			if !slices.Equal(o.Obs, s.Obs) || !slices.Equal(bitsOf(o.LogMu), bitsOf(s.LogMu)) || o.Episode == nil || o.Episode.Turns != s.Episode.Turns || o.Reward != s.Reward {
				t.Fatalf("group %d sample %d changed through the checkpoint", gi, i)
			}
		}
	}
}
