package rl

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// sweepRecipes writes two small recipes (the quickstart, and it with R2)
// and returns their directory and the overrides that shrink them.
func sweepRecipes(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), Quickstart, 0o644); err != nil {
		t.Fatal(err)
	}
	b := bytes.Replace(Quickstart, []byte("objective: minirl\n"), []byte("objective: minirl\n  replay: r2\n"), 1)
	if err := os.WriteFile(filepath.Join(dir, "b.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, []string{"model.path=../models/tiny-moe-base", "data.n=200", "rollout.max_new_tokens=32",
		"train.steps=3", "train.warmup=1", "train.prompts_per_step=4", "train.group_size=4",
		"eval.file=../recipes/heldout-d2-4.jsonl", "eval.n=4", "eval.k=2", "log.checkpoint_every=1", "log.tensorboard=false"}
}

func TestSweepRunsSkipsAndResumes(t *testing.T) {
	dir, sets := sweepRecipes(t)
	out := filepath.Join(t.TempDir(), "sweep")
	runs, err := Grid([]string{dir}, []uint64{1, 2}, out, sets)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 4 || filepath.Base(runs[0].Dir) != "a-s1" || filepath.Base(runs[3].Dir) != "b-s2" {
		t.Fatalf("grid %+v", runs)
	}
	var mu sync.Mutex
	states := map[string]int{}
	record := func(e SweepEvent) {
		mu.Lock()
		states[e.State]++
		mu.Unlock()
	}
	if err := Sweep(context.Background(), runs, 2, record); err != nil {
		t.Fatal(err)
	}
	if states["done"] != 4 || states["start"] != 4 {
		t.Fatalf("events %v", states)
	}
	states = map[string]int{}
	if err := Sweep(context.Background(), runs, 1, record); err != nil || states["skip"] != 4 || len(states) != 1 {
		t.Fatalf("second sweep: %v, events %v", err, states)
	}

	// Stopped during its first run, a sweep continues where it stopped.
	out2 := filepath.Join(t.TempDir(), "sweep")
	runs, _ = Grid([]string{filepath.Join(dir, "a.yaml")}, []uint64{1}, out2, sets)
	ctx, cancel := context.WithCancel(context.Background())
	stopAfterStart := func(e SweepEvent) {
		if e.State == "start" {
			cancel()
		}
	}
	if err := Sweep(ctx, runs, 1, stopAfterStart); err == nil {
		t.Fatal("a cancelled sweep reported success")
	}
	if finished(runs[0].Dir) {
		t.Fatal("the cancelled run finished")
	}
	var res *Result
	if err := Sweep(context.Background(), runs, 1, func(e SweepEvent) {
		if e.State == "done" {
			res = e.Result
		}
	}); err != nil {
		t.Fatal(err)
	}
	// Stopped before its first step, the run checkpointed step 0: the
	// continuation resumes from it (no second evaluation before training).
	if res == nil || res.Before != nil || res.Steps != 3 || !finished(runs[0].Dir) {
		t.Fatalf("continued sweep: %+v", res)
	}
}

func TestGridErrors(t *testing.T) {
	dir, sets := sweepRecipes(t)
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "a.yaml"), Quickstart, 0o644)
	if _, err := Grid([]string{dir, other}, nil, "out", sets); err == nil || !strings.Contains(err.Error(), "share the name") {
		t.Fatalf("two recipes named a: %v", err)
	}
	if _, err := Grid([]string{t.TempDir()}, nil, "out", sets); err == nil || !strings.Contains(err.Error(), "no *.yaml") {
		t.Fatalf("empty directory: %v", err)
	}
	if _, err := Grid([]string{dir}, nil, "out", append(sets, "train.stepz=1")); err == nil || !strings.Contains(err.Error(), "stepz") {
		t.Fatalf("bad override: %v", err)
	}
}
