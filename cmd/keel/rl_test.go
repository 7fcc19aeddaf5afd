package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/rl"
)

// keel rl end to end from an empty directory: the built-in quickstart,
// shortened, takes its model and held-out set from the binary, writes its
// run directory, refuses to overwrite it and refuses flags with --resume.
func TestRLCommand(t *testing.T) {
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	dir := t.TempDir()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "cache"))
	short := []string{"--name", "short", "--quiet", "--set", "train.steps=2", "--set", "train.warmup=1",
		"--set", "train.prompts_per_step=4", "--set", "train.group_size=4", "--set", "rollout.max_new_tokens=32",
		"--set", "eval.n=6", "--set", "eval.k=2", "--set", "data.n=100"}
	if err := runRL(short); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"runs/short/model/config.json", "runs/short/model/tokenizer.json", "runs/short/recipe.yaml", "runs/short/metrics.jsonl"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := runRL(short); !errors.Is(err, rl.ErrRunExists) {
		t.Fatalf("a second run with the same name: %v", err)
	}
	if err := runRL([]string{"--resume", "runs/short", "--set", "train.steps=3"}); err == nil || !strings.Contains(err.Error(), "--resume") {
		t.Fatalf("--resume with --set: %v", err)
	}
	if err := runRL([]string{"--resume", "runs/short", "--servers", "http://127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "in-process engine") {
		t.Fatalf("--resume --servers on a local run: %v", err)
	}
	if err := runRL([]string{"--resume", "runs/nothing"}); err == nil {
		t.Fatal("--resume of a directory without a run succeeded")
	}
}
