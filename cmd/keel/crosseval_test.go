package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/rollout"
)

// The cross-evaluation scores the chosen arms' final models and the base
// model under the exact engine and the rollout's precision, each exactly
// as keel eval would with the fixed seed, skips the other arms, and reuses
// the reports a stopped suite left.
func TestCrossEval(t *testing.T) {
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	if err := os.Chdir("../.."); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	evalFile, runs := fakeRuns(t, out, []string{"a-s1", "a-s2", "b-s1"}, 4, "rollout:\n  precision: fp8\n  max_new_tokens: 12\n", 2)
	plan := suitePlan{grid: paperGrid{Name: "g", CrossEval: []string{"a"}}, runs: runs}
	if err := crossEval(context.Background(), plan, out); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(out, "g-crosseval")
	for _, f := range []string{"base-exact", "base-fp8", "a-s1-exact", "a-s1-fp8", "a-s2-exact", "a-s2-fp8"} {
		if _, err := os.Stat(filepath.Join(dir, f+".json")); err != nil {
			t.Errorf("missing report: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "b-s1-exact.json")); err == nil {
		t.Error("arm b is not in CrossEval but was evaluated")
	}
	// Each score is keel eval's with the fixed seed.
	for _, prec := range []string{"exact", "fp8"} {
		p, _ := rollout.ParsePrecision(prec)
		want, err := evalModel("models/tiny-moe-base", evalFile, p, 2, rollout.Sampling{Temperature: 1, MaxNewTokens: 12, Seed: crossEvalSeed})
		if err != nil {
			t.Fatal(err)
		}
		got := readCross(t, filepath.Join(dir, "a-s1-"+prec+".json"))
		if got.Scores[0] != want.Overall() {
			t.Errorf("%s: cross-eval %+v, keel eval %+v", prec, got.Scores[0], want.Overall())
		}
	}
	// A second pass reuses the reports: plant known scores and read them back.
	planted := map[string]float64{"base-exact": 0.5, "base-fp8": 0.25, "a-s1-exact": 0.5, "a-s1-fp8": 0.625, "a-s2-exact": 0.75, "a-s2-fp8": 0.625}
	for f, avg := range planted {
		r := readCross(t, filepath.Join(dir, f+".json"))
		r.Scores[0].AvgAtK = avg
		b, _ := json.Marshal(r)
		if err := os.WriteFile(filepath.Join(dir, f+".json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := crossEval(context.Background(), plan, out); err != nil {
		t.Fatal(err)
	}
	table, err := os.ReadFile(filepath.Join(dir, "table.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []string{"| base | 1 | 0.500 | 0.250 | -25.0 |", "| a | 2 | 0.625 [0.500, 0.750] | 0.625 [0.625, 0.625] | +0.0 |"} {
		if !strings.Contains(string(table), row) {
			t.Errorf("table lacks %q:\n%s", row, table)
		}
	}
	if strings.Contains(string(table), "| b |") {
		t.Errorf("table has arm b:\n%s", table)
	}
	// A report from other settings, or older than the model, is redone.
	r := readCross(t, filepath.Join(dir, "a-s2-exact.json"))
	r.Settings.K = 3
	b, _ := json.Marshal(r)
	if err := os.WriteFile(filepath.Join(dir, "a-s2-exact.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(runs[0].Dir, "model", "model.safetensors"), later, later); err != nil {
		t.Fatal(err)
	}
	if err := crossEval(context.Background(), plan, out); err != nil {
		t.Fatal(err)
	}
	// a-s1's model is newer than both its reports; a-s2's exact report has
	// another k; a-s2's fp8 report still holds.
	for _, f := range []string{"a-s1-exact", "a-s1-fp8", "a-s2-exact"} {
		if got := readCross(t, filepath.Join(dir, f+".json")); got.Scores[0].AvgAtK == planted[f] || got.Settings.K != 2 {
			t.Errorf("%s: planted score %v kept (settings %+v)", f, planted[f], got.Settings)
		}
	}
	if got := readCross(t, filepath.Join(dir, "a-s2-fp8.json")); got.Scores[0].AvgAtK != planted["a-s2-fp8"] {
		t.Errorf("a-s2-fp8: %v, want the planted %v (nothing changed)", got.Scores[0].AvgAtK, planted["a-s2-fp8"])
	}
	// Cancelled: stops before evaluating.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := crossEval(ctx, plan, t.TempDir()); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func readCross(t *testing.T, file string) crossReport {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var r crossReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// fakeRuns makes finished runs OUT/g/NAME (NAME-sSEED) whose final model
// is the built-in tiny-moe-base and whose recipe evaluates on the first
// problems of the held-out file (copied to OUT/heldout.jsonl) at k, with
// the rollout settings given (YAML). The working directory is the
// repository's root.
func fakeRuns(t *testing.T, out string, names []string, problems int, rolloutYAML string, k int) (string, []rl.SweepRun) {
	t.Helper()
	evalFile := filepath.Join(out, "heldout.jsonl")
	lines, err := os.ReadFile("recipes/heldout-d2-4.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	first := strings.SplitAfterN(string(lines), "\n", problems+1)[:problems]
	if err := os.WriteFile(evalFile, []byte(strings.Join(first, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	recipe := fmt.Sprintf("name: x\nmodel:\n  path: models/tiny-moe-base\ndata:\n  tasks: [arithmetic]\n  n: 10\n%seval:\n  file: %s\n  k: %d\n", rolloutYAML, evalFile, k)
	var runs []rl.SweepRun
	for _, name := range names {
		dir := filepath.Join(out, "g", name)
		if err := os.MkdirAll(filepath.Join(dir, "model"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
			b, err := os.ReadFile(filepath.Join("models/tiny-moe-base", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "model", f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for f, text := range map[string]string{"recipe.yaml": recipe, "metrics.jsonl": ""} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		seed, err := strconv.ParseUint(name[strings.LastIndex(name, "-s")+2:], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, rl.SweepRun{Dir: dir, Seed: seed})
	}
	return evalFile, runs
}
