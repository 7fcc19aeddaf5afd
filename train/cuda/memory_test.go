package cuda

import (
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train/memplan"
)

func TestCheckActivations(t *testing.T) {
	cfg, err := model.Preset("qwen3-0.6b", 151936)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkActivations(&cfg, 2048, 80<<30, false); err != nil {
		t.Errorf("2048 tokens in 80 GiB: %v", err)
	}
	err = checkActivations(&cfg, 65536, 8<<30, false)
	if err == nil || !strings.Contains(err.Error(), "65536 tokens") || !strings.Contains(err.Error(), "turn on train.recompute") {
		t.Errorf("65536 tokens in 8 GiB: %v", err)
	}
	// Recomputation keeps one layer's activations: 16384 tokens need
	// several times less.
	if checkActivations(&cfg, 16384, 20<<30, false) == nil {
		t.Error("16384 tokens without recompute fit 20 GiB?")
	}
	if err := checkActivations(&cfg, 16384, 20<<30, true); err != nil {
		t.Errorf("16384 tokens with recompute in 20 GiB: %v", err)
	}
	if err := checkActivations(&cfg, 0, 1<<30, false); err == nil {
		t.Error("zero tokens accepted")
	}
}

// TestCheckActivationsBenchRows: the rows tools/gpu/check.sh times on an
// 80 GB card pass the engine's memory check with room for the model
// (activations planned in float32, as the engine keeps them): the Qwen3-0.6B
// shape at 8 × 2048 tokens, and at 2 × 16384 with recomputation.
func TestCheckActivationsBenchRows(t *testing.T) {
	cfg, err := model.Preset("qwen3-0.6b", 151936)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tokens    int
		recompute bool
	}{{8 * 2048, false}, {2 * 16384, true}} {
		p, err := memplan.Plan(&cfg, memplan.Shape{Seqs: 1, SeqLen: c.tokens}, memplan.Mode{Precision: memplan.FP32, Recompute: c.recompute})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d tokens, recompute %v: plan %.1f GiB", c.tokens, c.recompute, float64(p.Total())/(1<<30))
		if err := checkActivations(&cfg, c.tokens, 60<<30, c.recompute); err != nil {
			t.Errorf("%d tokens (recompute %v) in 60 GiB: %v", c.tokens, c.recompute, err)
		}
	}
}
