package rl

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/run"
)

// Whole runs on the cold-start base model: small steps, checkpoints every
// two steps.
func runRecipe(t *testing.T, dir string, sets ...string) *Recipe {
	t.Helper()
	base := []string{"out=" + dir, "model.path=../models/tiny-moe-base", "data.n=200", "rollout.max_new_tokens=48",
		"train.steps=5", "train.warmup=1", "train.prompts_per_step=4", "train.group_size=4", "train.lr=3.0e-4",
		"eval.file=../recipes/heldout-d2-4.jsonl", "eval.n=6", "eval.k=2", "eval.every=2",
		"log.checkpoint_every=2", "log.samples_every=2", "log.tensorboard=true"}
	r, err := ParseRecipe(Quickstart, append(base, sets...))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readRun returns the run's final weights and its metrics log without the
// timings (which differ between any two runs).
func readRun(t *testing.T, dir string) ([]float32, []map[string]any) {
	t.Helper()
	m, err := model.Load(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := run.ReadMetrics(filepath.Join(dir, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		for k := range r {
			if strings.HasPrefix(k, "time/") || strings.HasPrefix(k, "tokens_per_s/") || k == "elapsed_s" {
				delete(r, k)
			}
		}
	}
	return m.Arena, recs
}

func sameFiles(t *testing.T, what string, w1, w2 []float32, m1, m2 []map[string]any) {
	t.Helper()
	for i := range w1 {
		if math.Float32bits(w1[i]) != math.Float32bits(w2[i]) {
			t.Fatalf("%s: weight %d: %v vs %v", what, i, w1[i], w2[i])
		}
	}
	if len(m1) != len(m2) {
		t.Fatalf("%s: %d metrics records vs %d", what, len(m1), len(m2))
	}
	for i := range m1 {
		if len(m1[i]) != len(m2[i]) {
			t.Fatalf("%s: record %d has %d fields vs %d", what, i, len(m1[i]), len(m2[i]))
		}
		for k, v := range m1[i] {
			if m2[i][k] != v {
				t.Fatalf("%s: record %d (step %v) field %s: %v vs %v", what, i, m1[i]["step"], k, v, m2[i][k])
			}
		}
	}
}

// A run stopped after step 3 (Ctrl-C) and resumed gives the weights and
// metrics of one that never stopped.
func TestRunResumeIsBitwise(t *testing.T) {
	tmp := t.TempDir()
	straight := filepath.Join(tmp, "straight")
	res, err := Run(context.Background(), runRecipe(t, straight), false, Progress{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Before == nil || res.After == nil || res.Steps != 5 {
		t.Fatalf("result %+v", res)
	}
	for _, f := range []string{"recipe.yaml", "samples/step-000002.jsonl", "model/tokenizer.json", "checkpoints/latest"} {
		if _, err := os.Stat(filepath.Join(straight, f)); err != nil {
			t.Fatal(err)
		}
	}
	if ev, _ := filepath.Glob(filepath.Join(straight, "tensorboard", "events.out.tfevents.*")); len(ev) != 1 {
		t.Fatalf("tensorboard event files: %v", ev)
	}

	stopped := filepath.Join(tmp, "stopped")
	ctx, cancel := context.WithCancel(context.Background())
	res, err = Run(ctx, runRecipe(t, stopped), false, Progress{Step: func(step, _ int, _ map[string]float64, _ time.Duration) {
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
	// The resumed run reads its recipe back from the directory.
	r, err := ReadRecipe(filepath.Join(stopped, RecipeFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), r, true, Progress{}); err != nil {
		t.Fatal(err)
	}
	w1, m1 := readRun(t, straight)
	w2, m2 := readRun(t, stopped)
	sameFiles(t, "stopped at 3 and resumed", w1, w2, m1, m2)

	// A fresh run on a directory holding one is refused.
	if _, err := Run(context.Background(), runRecipe(t, straight), false, Progress{}); !errors.Is(err, ErrRunExists) {
		t.Fatalf("fresh run over an existing one: %v", err)
	}
}

// A second run on a directory in use refuses to start and names the
// process holding it.
func TestRunDirectoryLocked(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "busy")
	l, err := run.Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	_, err = Run(context.Background(), runRecipe(t, dir), false, Progress{})
	if !errors.Is(err, run.ErrLocked) || !strings.Contains(err.Error(), "process") {
		t.Fatalf("run on a locked directory: %v", err)
	}
}

// Bad input is a clear error naming the setting or the row.
func TestRunBadInput(t *testing.T) {
	tmp := t.TempDir()
	noVerifier := filepath.Join(tmp, "nover.jsonl")
	os.WriteFile(noVerifier, []byte(`{"task":"arithmetic","prompt":"Compute 1+1.","answer":"2"}`+"\n"+`{"task":"poetry","prompt":"Write.","answer":"x"}`+"\n"), 0o644)
	long := filepath.Join(tmp, "long.jsonl")
	os.WriteFile(long, []byte(`{"task":"arithmetic","prompt":"Compute `+strings.Repeat("1+", 300)+`1.","answer":"301"}`+"\n"), 0o644)
	cases := []struct {
		sets []string
		want string
	}{
		{[]string{"data.tasks=null", "data.n=0", "data.difficulty=", "data.file=" + noVerifier}, "row 1"},
		{[]string{"data.tasks=null", "data.n=0", "data.difficulty=", "data.file=" + long}, "row 0"},
		{[]string{"algorithm.replay=r3", "model.path=" + denseModelDir(t)}, "algorithm.replay"},
		{[]string{"eval.file=" + noVerifier}, "eval.file"},
	}
	for i, tc := range cases {
		_, err := Run(context.Background(), runRecipe(t, filepath.Join(tmp, "run"+itoa(i)), tc.sets...), false, Progress{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%v: error %v, want one containing %q", tc.sets, err, tc.want)
		}
	}
}

// denseModelDir writes a small dense model with the base model's tokenizer.
func denseModelDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "dense")
	c := tinyConfig(false)
	c.VocabSize, c.MaxPositionEmbeddings = 128, 256
	m := model.New(c)
	model.Init(m, 1)
	if err := model.Save(dir, m, "f32"); err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile("../models/tiny-moe-base/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDecontaminate(t *testing.T) {
	ps := []Prompt{{Row: 0}, {Row: 1}, {Row: 2}}
	ps[0].Example.Prompt, ps[1].Example.Prompt, ps[2].Example.Prompt = "Compute 1+1.", "Compute 2+2.", "Compute 3+3."
	eval := []data.Example{{Prompt: "Compute 2+2."}, {Prompt: "Compute 9+9."}}
	out, n := decontaminate(ps, eval)
	if n != 1 || len(out) != 2 || out[0].Row != 0 || out[1].Row != 2 {
		t.Fatalf("kept %+v, dropped %d", out, n)
	}
}
