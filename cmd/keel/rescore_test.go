package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The rescored comparison by hand: A - B per seed over the seeds both
// arms have, their mean and Student-t interval (t = 4.303 for two degrees
// of freedom), and the evaluator's spread as a sample standard deviation.
func TestRescoredTable(t *testing.T) {
	scores := map[string]map[int]float64{
		"a": {1: 0.40, 2: 0.42, 3: 0.41, 9: 0.5},
		"b": {1: 0.38, 2: 0.41, 3: 0.37},
	}
	got := rescoredTable("a", "b", scores, 32, 7)
	// d = 2, 1, 4 points: mean 2.33, sd 1.528, half-width 4.303 x 1.528 / sqrt(3) = 3.80.
	for _, want := range []string{"avg@32", "| a | b | 3 | s1 +2.00, s2 +1.00, s3 +4.00 | +2.33 | [-1.46, +6.13] | 3 / 0 / 0 | not established |"} {
		if !strings.Contains(got, want) {
			t.Fatalf("missing %q in\n%s", want, got)
		}
	}
	line := evaluatorLine("m", 8, []float64{0.30, 0.32, 0.31})
	if !strings.Contains(line, "mean 0.310, standard deviation 1.00 points") {
		t.Fatalf("%s", line)
	}
}

// keel rescore on a directory of runs: every final model of the two arms
// scored at factor x eval.k on one seed, the evaluator's five seeds, the
// paired table (the four models are one file, so every difference is 0),
// and a second call that only reads what the first one wrote.
func TestRescoreCommand(t *testing.T) {
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	if err := os.Chdir("../.."); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	_, runs := fakeRuns(t, out, []string{"a-s1", "a-s2", "b-s1", "b-s2", "c-s1"}, 3, "rollout:\n  max_new_tokens: 8\n", 1)
	grid := filepath.Dir(runs[0].Dir)
	for _, bad := range [][]string{
		{grid},
		{grid, "--compare", "a,z"},
		{grid, "--compare", "a,b", "--factor", "0"},
	} {
		if err := runRescore(bad); err == nil {
			t.Errorf("keel rescore %q: no error", bad)
		}
	}
	if err := runRescore([]string{grid, "--compare", "a,b", "--factor", "2", "--seed", "5"}); err != nil {
		t.Fatal(err)
	}
	dir := grid + "-rescored"
	for _, f := range []string{"a-s1", "a-s2", "b-s1", "b-s2", "evaluator-seed11", "evaluator-seed15"} {
		if _, err := os.Stat(filepath.Join(dir, f+".json")); err != nil {
			t.Errorf("missing evaluation: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "c-s1.json")); err == nil {
		t.Error("arm c was scored")
	}
	table, err := os.ReadFile(filepath.Join(dir, "table.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"avg@2, sampling seed 5", "| a | b | 2 | s1 +0.00, s2 +0.00 | +0.00 |", "0 / 0 / 2"} {
		if !strings.Contains(string(table), want) {
			t.Errorf("missing %q in\n%s", want, table)
		}
	}
	// The second call reuses every evaluation: plant scores, make the
	// models unreadable, and the table must be the planted scores'.
	for name, avg := range map[string]float64{"a-s1": 0.5, "a-s2": 0.4, "b-s1": 0.45, "b-s2": 0.42} {
		f := filepath.Join(dir, name+".json")
		r := readCross(t, f)
		r.Scores[0].AvgAtK = avg
		b, _ := json.Marshal(r)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(grid, name, "model", "tokenizer.json")); err != nil {
			t.Fatal(err)
		}
	}
	if err := runRescore([]string{grid, "--compare", "a,b", "--factor", "2", "--seed", "5"}); err != nil {
		t.Fatalf("cached rescore: %v", err)
	}
	table, err = os.ReadFile(filepath.Join(dir, "table.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "| a | b | 2 | s1 +5.00, s2 -2.00 | +1.50 |"; !strings.Contains(string(table), want) {
		t.Errorf("missing %q in\n%s", want, table)
	}
}

// A run directory that is no arm's seed is refused by name.
func TestSeededRunsRefusesUnseeded(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plain")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "metrics.jsonl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := seededRuns([]string{dir}); err == nil || !strings.Contains(err.Error(), "plain") {
		t.Fatalf("got %v", err)
	}
}
