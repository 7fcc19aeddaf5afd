package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/evaluate"
)

// keel data gen --style tool writes demonstrations that read back with
// their observations; keel eval --env plays episodes of the built-in
// environments with the built-in model (which never learnt the game: the
// point is the plumbing) and reports per task.
func TestDataGenToolAndEvalEnv(t *testing.T) {
	dir := t.TempDir()
	demos := filepath.Join(dir, "demos.jsonl")
	if err := runData([]string{"gen", "--task", "arithmetic,guess", "--style", "tool", "--n", "10", "--difficulty", "2-3", "--out", demos}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	ex, err := data.Read(demos)
	if err != nil || len(ex) < 9 {
		t.Fatalf("%d demonstrations, %v", len(ex), err)
	}
	for i, e := range ex {
		if e.Style != "tool" || e.Response == "" || (e.Task == "guess" && !strings.Contains(e.Response, "<|im_start|>user\n")) {
			t.Fatalf("row %d: %+v", i, e)
		}
	}
	games := filepath.Join(dir, "games.jsonl")
	if err := runData([]string{"gen", "--task", "guess", "--style", "none", "--n", "4", "--difficulty", "1", "--out", games}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	js := filepath.Join(dir, "eval.json")
	if err := runEval([]string{"--model", "../../models/tiny-moe-base", "--data", games, "--k", "2", "--max-new-tokens", "8",
		"--env", "guess", "--max-turns", "3", "--json", js}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep evaluate.Report
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Scores) == 0 || rep.Scores[0].Problems != 4 {
		t.Fatalf("report %s, %v", b, err)
	}
	if err := runEval([]string{"--model", "../../models/tiny-moe-base", "--data", games, "--env", "chess"}); err == nil || !strings.Contains(err.Error(), "env.name") {
		t.Fatalf("unknown environment: %v", err)
	}
}
