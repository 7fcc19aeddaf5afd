package sft

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/run"
)

func TestParseRecipeErrors(t *testing.T) {
	base := "out: x\nmodel:\n  preset: tiny-moe\ndata:\n  generate: {tasks: [linear], n: 10}\ntrain:\n  steps: 10\n"
	if _, err := ParseRecipe([]byte(base)); err != nil {
		t.Fatalf("valid recipe: %v", err)
	}
	for _, c := range []struct{ yaml, want string }{
		{base + "trian:\n  steps: 3\n", "line 8: field trian not found"},
		{strings.Replace(base, "steps: 10", "steps: ten", 1), "line 7"},
		{strings.Replace(base, "out: x\n", "", 1), "out:"},
		{strings.Replace(base, "preset: tiny-moe", "path: a\n  preset: tiny-moe", 1), "not both"},
		{strings.Replace(base, "  generate: {tasks: [linear], n: 10}\n", "  file: f.jsonl\n  generate: {tasks: [linear], n: 10}\n", 1), "not both"},
		{strings.Replace(base, "steps: 10", "steps: 0", 1), "steps"},
		{"", "empty recipe"},
	} {
		if _, err := ParseRecipe([]byte(c.yaml)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.yaml, err, c.want)
		}
	}
}

// cancelAfter is a progress writer that cancels its context at the n-th
// status line.
type cancelAfter struct {
	n      int
	cancel context.CancelFunc
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	if strings.HasPrefix(string(p), "\rstep") {
		c.n--
		if c.n == 0 {
			c.cancel()
		}
	}
	return len(p), nil
}

// A run interrupted and resumed ends with the bits of an uninterrupted run,
// and its metrics log has each step once.
func TestRunInterruptResume(t *testing.T) {
	dir := t.TempDir()
	recipe := func(out string) *Recipe {
		r, err := ParseRecipe([]byte("out: " + out + `
model: {preset: tiny-dense, vocab: 128, seed: 2, max_len: 128}
data:
  generate: {tasks: [arithmetic, linear], n: 50, difficulty: "1-2", style: mixed, seed: 3}
train: {steps: 6, batch_tokens: 1024, lr: 0.003, warmup: 2, seed: 4}
log: {every: 1, checkpoint_every: 2}
`))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := recipe(filepath.Join(dir, "a"))
	if _, err := Run(context.Background(), a, nil); err != nil {
		t.Fatal(err)
	}
	b := recipe(filepath.Join(dir, "b"))
	ctx, cancel := context.WithCancel(context.Background())
	res, err := Run(ctx, b, &cancelAfter{n: 3, cancel: cancel})
	if err != nil || !res.Stopped || res.Steps != 3 {
		t.Fatalf("interrupted run: %+v, %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(b.Out, "model")); !os.IsNotExist(err) {
		t.Fatal("an interrupted run wrote its final model")
	}
	if res, err = Run(context.Background(), recipe(b.Out), nil); err != nil || res.Steps != 6 {
		t.Fatalf("resumed run: %+v, %v", res, err)
	}
	ma, err := model.Load(filepath.Join(a.Out, "model"))
	if err != nil {
		t.Fatal(err)
	}
	mb, err := model.Load(filepath.Join(b.Out, "model"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ma.Arena {
		if ma.Arena[i] != mb.Arena[i] {
			t.Fatalf("weight %d differs between the straight and the resumed run", i)
		}
	}
	recs, _ := run.ReadMetrics(filepath.Join(b.Out, "metrics.jsonl"))
	for i, r := range recs {
		if r["step"] != float64(i+1) {
			t.Fatalf("metrics record %d has step %v (log %v)", i, r["step"], recs)
		}
	}
	if _, err := os.Stat(filepath.Join(b.Out, "model", "tokenizer.json")); err != nil {
		t.Fatal("no tokenizer.json in the model directory")
	}
}

// Two runs on one directory would interleave their checkpoints and logs:
// the second refuses to start and names the holder.
func TestRunRefusesALockedDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "busy")
	l, err := run.Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	r, err := ParseRecipe([]byte("out: " + dir + "\nmodel: {preset: tiny-dense}\ndata:\n  generate: {tasks: [linear], n: 10}\ntrain: {steps: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), r, nil); !errors.Is(err, run.ErrLocked) || !strings.Contains(err.Error(), "process") {
		t.Fatalf("run on a locked directory: %v", err)
	}
}
