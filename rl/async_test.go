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

// slowSampler makes every Generate take at least d: a rollout slower than
// the trainer.
type slowSampler struct {
	Sampler
	d time.Duration
}

func (s *slowSampler) Generate(p [][]int32, n int, sp rollout.Sampling) ([]rollout.Sample, error) {
	time.Sleep(s.d)
	return s.Sampler.Generate(p, n, sp)
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
	l.Sampler = &slowSampler{Sampler: l.Sampler, d: 150 * time.Millisecond}
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
// of each generation, until the trainer has published newer weights (for
// at most a second), so that weights change while sequences are in
// progress whatever the machine's speed.
type slowSwitching struct {
	*rollout.Engine
	fresh func() bool
}

func (s *slowSwitching) GenerateSwitching(p [][]int32, n int, sp rollout.Sampling, next func() *rollout.Switch) ([]rollout.Sample, error) {
	steps := 0
	return s.Engine.GenerateSwitching(p, n, sp, func() *rollout.Switch {
		if steps++; steps == 5 {
			for end := time.Now().Add(time.Second); !s.fresh() && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
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
	l.Sampler = &slowSwitching{Engine: l.Sampler.(*rollout.Engine), fresh: func() bool {
		p := l.pipe
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.fresh != nil && p.fresh.v > p.held // p.held: read on the worker, which calls this
	}}
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
}
