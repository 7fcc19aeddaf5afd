package rl

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// lagged is the synchronous loop's sampler made k versions stale by hand:
// pushed version v, it samples from the weights of version max(0, v-k)
// (kept as copies), labelling its samples v as the synchronous loop wants.
type lagged struct {
	eng  *rollout.Engine
	k    int64
	hist []*model.Model
}

func (s *lagged) UpdateWeights(ctx context.Context, m *model.Model, v int64) error {
	c := m.ZeroLike()
	copy(c.Arena, m.Arena)
	s.hist = append(s.hist[:v], c)
	return s.eng.UpdateWeights(ctx, s.hist[max(0, v-s.k)], v)
}

func (s *lagged) Generate(p [][]int32, n int, sp rollout.Sampling) ([]rollout.Sample, error) {
	return s.eng.Generate(p, n, sp)
}

func (s *lagged) Version() int64 { return s.eng.Version() }

// dropLag removes the asynchronous loop's own measures.
func dropLag(ms []map[string]float64) {
	for _, m := range ms {
		for k := range m {
			if strings.HasPrefix(k, "rollout/lag_") || strings.HasPrefix(k, "rollout/tokens_lag") || k == "rollout/switched_frac" {
				delete(m, k)
			}
		}
	}
}

// With rollout.staleness k the loop trains exactly as the synchronous loop
// does over a sampler that lags k versions behind: the same samples, the
// same weights bit for bit, step after step; and its lag measures say k
// (fewer in the first steps, which sample the starting weights).
func TestStalenessIsALaggedSampler(t *testing.T) {
	for _, k := range []int{1, 2} {
		steps := 5
		sets := []string{"train.steps=5", "train.mini_batches=2"}
		async := testLoop(t, testRecipe(t, append(sets, "rollout.staleness="+itoa(k))...), true)
		t.Cleanup(async.Close)
		sync := testLoop(t, testRecipe(t, sets...), true)
		start := cpu(sync).Model.ZeroLike()
		copy(start.Arena, cpu(sync).Model.Arena)
		sync.Sampler = &lagged{eng: sync.Sampler.(*rollout.Engine), k: int64(k), hist: []*model.Model{start}}

		w1, m1 := runSteps(t, async, steps)
		for s, m := range m1 {
			if want := float64(min(k, s)); m["rollout/lag_max"] != want || m["rollout/lag_mean"] != want {
				t.Fatalf("k = %d, step %d: lag mean %v max %v, want %v", k, s+1, m["rollout/lag_mean"], m["rollout/lag_max"], want)
			}
		}
		dropLag(m1)
		w2, m2 := runSteps(t, sync, steps)
		sameRun(t, "staleness "+itoa(k)+" vs a sampler lagging "+itoa(k)+" versions", w1, w2, m1, m2)
	}
}

// A run with staleness 1 or 2 stopped after step 3 and resumed gives the
// weights and metrics of one that never stopped: the checkpoint holds the
// batches already sampled for the steps after it.
func TestStalenessResumeIsBitwise(t *testing.T) {
	for _, k := range []string{"1", "2"} {
		tmp := t.TempDir()
		straight := filepath.Join(tmp, "straight")
		sets := []string{"rollout.staleness=" + k, "eval.every=0"}
		if _, err := Run(context.Background(), runRecipe(t, straight, sets...), false, Progress{}); err != nil {
			t.Fatal(err)
		}
		stopped := filepath.Join(tmp, "stopped")
		ctx, cancel := context.WithCancel(context.Background())
		res, err := Run(ctx, runRecipe(t, stopped, sets...), false, Progress{Step: func(step, _ int, _ map[string]float64, _ time.Duration) {
			if step == 3 {
				cancel()
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Stopped || res.Steps != 3 {
			t.Fatalf("stopped run: %+v", res)
		}
		b, err := os.ReadFile(filepath.Join(stopped, "checkpoints", "step-00000003", "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			State loopState `json:"state"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"1": 1, "2": 2}[k]; len(st.State.Pending) != want || st.State.Pending[0].Step != 4 {
			t.Fatalf("staleness %s: the checkpoint of step 3 holds %d batches (first %+v), want %d from step 4", k, len(st.State.Pending), st.State.Pending, want)
		}
		r, err := ReadRecipe(filepath.Join(stopped, RecipeFile), nil)
		if err != nil {
			t.Fatal(err)
		}
		// Stopped again before its first step (Ctrl-C while it loads), the
		// resumed run keeps the batches sampled ahead in its checkpoint.
		done, stop := context.WithCancel(context.Background())
		stop()
		if res, err := Run(done, r, true, Progress{}); err != nil || res.Steps != 3 {
			t.Fatalf("resumed and stopped at once: %+v, %v", res, err)
		}
		if _, err := Run(context.Background(), r, true, Progress{}); err != nil {
			t.Fatal(err)
		}
		w1, m1 := readRun(t, straight)
		w2, m2 := readRun(t, stopped)
		sameFiles(t, "staleness "+k+" stopped at 3 and resumed", w1, w2, m1, m2)
	}
}

// Staleness 0 keeps the synchronous loop (no worker), and the recipe
// refuses a negative or huge staleness.
func TestStalenessSetting(t *testing.T) {
	l := testLoop(t, testRecipe(t), true)
	runSteps(t, l, 1)
	if l.pipe != nil {
		t.Fatal("staleness 0 started a rollout worker")
	}
	for _, v := range []string{"-1", "65"} {
		if _, err := ParseRecipe([]byte(testRecipeYAML), []string{"rollout.staleness=" + v}); err == nil || !strings.Contains(err.Error(), "rollout.staleness") {
			t.Errorf("staleness %s: err = %v", v, err)
		}
	}
	// The resolved recipe of a synchronous run does not mention it.
	if strings.Contains(string(testRecipe(t).YAML()), "staleness") {
		t.Error("a staleness-0 recipe writes rollout.staleness")
	}
}

// gatedSampler is a rollout slower than the trainer, whatever the
// machine: from its second batch on, a batch waits (a second at most) for
// the trainer to publish weights newer than the sampler's before it
// starts.
type gatedSampler struct {
	Sampler
	l     *Loop
	calls int
}

func (s *gatedSampler) Generate(p [][]int32, n int, sp rollout.Sampling) ([]rollout.Sample, error) {
	if s.calls++; s.calls > 1 {
		waitFresh(s.l)
	}
	return s.Sampler.Generate(p, n, sp)
}

// waitFresh waits (a second at most) until the trainer has published
// weights newer than the sampler's; it runs on the rollout worker, which
// owns p.held.
func waitFresh(l *Loop) {
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		p := l.pipe
		p.mu.Lock()
		ok := p.fresh != nil && p.fresh.v > p.held
		p.mu.Unlock()
		if ok {
			return
		}
	}
}

// With max_staleness k every step's samples are at most k versions behind
// (and never ahead of) the weights it starts from; when the rollout is the
// slower side its batches take newer weights than staleness k would give
// them. The run also stops and resumes from a checkpoint holding its
// batches sampled ahead.
func TestMaxStaleness(t *testing.T) {
	const k, steps = 2, 8
	l := testLoop(t, testRecipe(t, "train.steps=8", "rollout.max_staleness=2"), true)
	t.Cleanup(l.Close)
	l.Sampler = &gatedSampler{Sampler: l.Sampler, l: l}
	_, ms := runSteps(t, l, steps)
	fresher := 0
	var lags []float64
	for s, m := range ms {
		lags = append(lags, m["rollout/lag_max"])
		if m["rollout/lag_max"] > float64(min(k, s)) || m["rollout/lag_mean"] < 0 {
			t.Fatalf("step %d: lag mean %v max %v, want within [0, %d]", s+1, m["rollout/lag_mean"], m["rollout/lag_max"], min(k, s))
		}
		if s >= k && m["rollout/lag_max"] < k {
			fresher++
		}
	}
	if fresher == 0 {
		t.Fatalf("a rollout slower than the trainer never sampled weights newer than %d steps behind: lags by step %v", k, lags)
	}

	tmp := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	dir := filepath.Join(tmp, "run")
	res, err := Run(ctx, runRecipe(t, dir, "rollout.max_staleness=2", "eval.every=0"), false, Progress{Step: func(step, _ int, _ map[string]float64, _ time.Duration) {
		if step == 2 {
			cancel()
		}
	}})
	if err != nil || !res.Stopped {
		t.Fatalf("stopped run: %+v, %v", res, err)
	}
	r, err := ReadRecipe(filepath.Join(dir, RecipeFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res, err = Run(context.Background(), r, true, Progress{}); err != nil || res.Steps != 5 {
		t.Fatalf("resumed run: %+v, %v", res, err)
	}
	// staleness and max_staleness together are refused.
	if _, err := ParseRecipe([]byte(testRecipeYAML), []string{"rollout.staleness=1", "rollout.max_staleness=2"}); err == nil || !strings.Contains(err.Error(), "max_staleness") {
		t.Errorf("both set: err = %v", err)
	}
}

// slowSwitching is the in-process engine waiting, at the 5th forward step
// of each generation after the first, until the trainer has published
// newer weights (a second at most), so that weights change while
// sequences are in progress whatever the machine's speed.
type slowSwitching struct {
	*rollout.Engine
	l     *Loop
	calls int
}

func (s *slowSwitching) GenerateSwitching(p [][]int32, n int, sp rollout.Sampling, next func() *rollout.Switch) ([]rollout.Sample, error) {
	s.calls++
	steps := 0
	return s.Engine.GenerateSwitching(p, n, sp, func() *rollout.Switch {
		if steps++; steps == 5 && s.calls > 1 {
			waitFresh(s.l)
		}
		return next()
	})
}

// With rollout.partial: switch, sequences in progress take the trainer's
// new weights: some samples carry several versions, every token's lag is
// within [0, k], the token shares by lag add up to 1, and training goes on.
func TestPartialRolloutsSwitch(t *testing.T) {
	const k, steps = 2, 8
	l := testLoop(t, testRecipe(t, "train.steps=8", "rollout.max_staleness=2", "rollout.partial=switch"), true)
	t.Cleanup(l.Close)
	l.Sampler = &slowSwitching{Engine: l.Sampler.(*rollout.Engine), l: l}
	_, ms := runSteps(t, l, steps)
	switched := 0.0
	for s, m := range ms {
		var share float64
		for d := 0; d <= k; d++ {
			share += m["rollout/tokens_lag"+itoa(d)]
		}
		if math.Abs(share-1) > 1e-9 || m["rollout/lag_max"] > float64(min(k, s)) {
			t.Fatalf("step %d: token shares by lag add up to %v, lag max %v", s+1, share, m["rollout/lag_max"])
		}
		switched += m["rollout/switched_frac"]
	}
	if switched == 0 {
		t.Fatal("no sample took new weights in the middle")
	}
	if _, err := ParseRecipe([]byte(testRecipeYAML), []string{"rollout.staleness=1", "rollout.partial=switch"}); err == nil || !strings.Contains(err.Error(), "rollout.partial") {
		t.Errorf("switch without max_staleness: err = %v", err)
	}
	// On remote servers: keel serve's, which say each token's version.
	remoteSwitch := []string{"rollout.max_staleness=2", "rollout.partial=switch", "rollout.precision=", `rollout.servers=["http://127.0.0.1:1"]`}
	if _, err := ParseRecipe([]byte(testRecipeYAML), remoteSwitch); err != nil {
		t.Errorf("switch on keel servers: %v", err)
	}
	if _, err := ParseRecipe([]byte(testRecipeYAML), append(remoteSwitch, "rollout.server_kind=sglang")); err == nil || !strings.HasPrefix(err.Error(), "rollout.partial") {
		t.Errorf("switch on SGLang servers: err = %v", err)
	}
	if _, err := ParseRecipe([]byte(testRecipeYAML), append(remoteSwitch, "env.name=guess")); err == nil || !strings.HasPrefix(err.Error(), "rollout.partial") {
		t.Errorf("switch on servers with an environment: err = %v", err)
	}
}

// The exact encoding of batches sampled ahead: log mu's bits and the
// rewards survive a JSON round trip, NaN included; a checkpoint whose
// batches are not those of the steps right after it, or more than the
// rollout runs ahead, is refused.
func TestSavedBatchRoundTrip(t *testing.T) {
	l := testLoop(t, testRecipe(t, "rollout.staleness=2"), true)
	t.Cleanup(l.Close)
	p := &l.Loader.prompts[3]
	b := &batch{step: 1, metrics: map[string]float64{"reward/mean": math.NaN()}, groups: [][]*Sample{{{
		Prompt: p, Response: []int32{4, 5}, LogMu: []float32{float32(math.NaN()), -1.0000001}, Version: 0, Versions: []int64{0, 0},
		Reward: math.Inf(-1), Correct: 0.1, Advantage: -1.0 / 3}}}}
	js, err := json.Marshal([]SavedBatch{saveBatch(b), saveBatch(&batch{step: 2, metrics: map[string]float64{}})})
	if err != nil {
		t.Fatal(err)
	}
	var saved []SavedBatch
	if err := json.Unmarshal(js, &saved); err != nil {
		t.Fatal(err)
	}
	if err := l.Restore(saved); err != nil {
		t.Fatal(err)
	}
	got := l.restored[0].groups[0][0]
	want := b.groups[0][0]
	if got.Prompt != p || math.Float32bits(got.LogMu[0]) != math.Float32bits(want.LogMu[0]) || got.LogMu[1] != want.LogMu[1] ||
		!math.IsInf(got.Reward, -1) || got.Correct != 0.1 || got.Advantage != want.Advantage || !math.IsNaN(l.restored[0].metrics["reward/mean"]) {
		t.Fatalf("round trip: %+v, want %+v", got, want)
	}
	l.restored = nil
	for _, tc := range [][]SavedBatch{
		{{Step: 2}},                       // not the step after the checkpoint's (0)
		{{Step: 1}, {Step: 2}, {Step: 3}}, // more than 2 ahead
	} {
		if err := l.Restore(tc); err == nil {
			t.Errorf("restored %d batches from step %d", len(tc), tc[0].Step)
		}
		l.restored = nil
	}
}
