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
	if err := checkActivations(&cfg, 2048, 80<<30); err != nil {
		t.Errorf("2048 tokens in 80 GiB: %v", err)
	}
	err = checkActivations(&cfg, 65536, 8<<30)
	if err == nil || !strings.Contains(err.Error(), "65536 tokens") || !strings.Contains(err.Error(), "micro_batch_tokens") {
		t.Errorf("65536 tokens in 8 GiB: %v", err)
	}
	if err := checkActivations(&cfg, 0, 1<<30); err == nil {
		t.Error("zero tokens accepted")
	}
}
