package rl

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DAPO's soft overlong penalty, by hand: budget 100, buffer 20.
func TestOverlongPenaltyHand(t *testing.T) {
	for _, c := range []struct {
		n    int
		want float64
	}{{50, 0}, {80, 0}, {85, -0.25}, {90, -0.5}, {100, -1}, {120, -1}} {
		if got := OverlongPenalty(c.n, 100, 20, 1); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%d tokens: penalty %v, want %v", c.n, got, c.want)
		}
	}
	if got := OverlongPenalty(99, 100, 0, 1); got != 0 {
		t.Errorf("buffer 0 (off): penalty %v", got)
	}
}

func TestGuardMessage(t *testing.T) {
	r := testRecipe(t, "guards.kl_max=0.01", "guards.is_max=10")
	if msg := guardMessage(r, map[string]float64{"train_infer/k3": 0.001, "is/max": 5}); msg != "" {
		t.Fatalf("below both thresholds: %q", msg)
	}
	if msg := guardMessage(r, map[string]float64{"train_infer/k3": 0.02, "is/max": 5}); !strings.Contains(msg, "guards.kl_max") {
		t.Fatalf("KL above its threshold: %q", msg)
	}
	if msg := guardMessage(r, map[string]float64{"train_infer/k3": 0, "is/max": 11}); !strings.Contains(msg, "guards.is_max") {
		t.Fatalf("IS weight above its threshold: %q", msg)
	}
}

// guards.action = stop ends the run at the first step past a threshold,
// with a checkpoint to resume from; warn reports and goes on.
func TestGuardActions(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "stop")
	// fp8 rollout: the train-infer k3 is positive at every step.
	_, err := Run(context.Background(), runRecipe(t, dir, "guards.kl_max=1e-12", "guards.action=stop", "eval.skip=true"), false, Progress{})
	if err == nil || !strings.Contains(err.Error(), "guards.kl_max") || !strings.Contains(err.Error(), "step 1") {
		t.Fatalf("stop guard: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoints", "step-00000001")); err != nil {
		t.Fatalf("no checkpoint at the guarded step: %v", err)
	}
	var warnings []string
	res, err := Run(context.Background(), runRecipe(t, filepath.Join(tmp, "warn"), "guards.kl_max=1e-12", "eval.skip=true", "train.steps=2"), false,
		Progress{Warn: func(m string) { warnings = append(warnings, m) }})
	if err != nil || res.Steps != 2 || len(warnings) != 2 {
		t.Fatalf("warn guard: %v, %d steps, warnings %q", err, res.Steps, warnings)
	}
}

// A tokenizer larger than the model's vocabulary is refused, naming the
// setting.
func TestTokenizerMustFitTheModel(t *testing.T) {
	dir := denseModelDir(t)
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	small := strings.Replace(string(cfg), `"vocab_size": 128`, `"vocab_size": 64`, 1)
	if small == string(cfg) {
		t.Fatal("config.json has no vocab_size 128 to shrink")
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(small), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), runRecipe(t, filepath.Join(t.TempDir(), "run"), "model.path="+dir), false, Progress{})
	if err == nil || !strings.Contains(err.Error(), "model.path") {
		t.Fatalf("tokenizer larger than the model: %v", err)
	}
}
