package cuda

import (
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
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
