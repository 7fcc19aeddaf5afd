package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tasks"
)

func TestDataGenDeterministicAndVerifiable(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")
	args := []string{"--task", "arithmetic,countdown,linear", "--n", "60", "--difficulty", "1-5", "--style", "mixed", "--seed", "7"}
	if err := runData(append([]string{"gen", "--out", a}, args...)); err != nil {
		t.Fatal(err)
	}
	if err := runData(append([]string{"gen", "--out", b}, args...)); err != nil {
		t.Fatal(err)
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ba, bb) || len(ba) == 0 {
		t.Fatal("the same flags gave different files")
	}
	ex, err := data.Read(a)
	if err != nil || len(ex) != 60 {
		t.Fatalf("%d examples, %v", len(ex), err)
	}
	seen := map[string]bool{}
	for _, e := range ex {
		seen[e.Task+e.Style] = true
		if tasks.Score(e.Task, e.Answer, e.Response) != 1 {
			t.Fatalf("reference solution does not verify: %+v", e)
		}
	}
	if len(seen) < 6 {
		t.Fatalf("tasks and styles not mixed: %v", seen)
	}
}

func TestDataGenErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.jsonl")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"gen", "--task", "chess", "--out", out}, "unknown task"},
		{[]string{"gen", "--task", "linear", "--difficulty", "0-2", "--out", out}, "difficulty 0"},
		{[]string{"gen", "--task", "linear", "--style", "poem", "--out", out}, "unknown style"},
		{[]string{"gen", "--task", "linear", "--out", "x.csv"}, ".parquet"},
		{[]string{"frobnicate"}, "unknown subcommand"},
	} {
		if err := runData(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
}
