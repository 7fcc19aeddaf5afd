package device

import (
	"strings"
	"testing"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

func TestEngineAndCheck(t *testing.T) {
	cfg, _ := model.Preset("tiny-dense", 40)
	m := model.New(cfg)
	e, err := Engine("cpu", m, rollout.Options{Slots: 2, MaxLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	if _, err := Engine("gpu", m, rollout.Options{}); err == nil || !strings.Contains(err.Error(), "want cpu, cuda") {
		t.Errorf("device gpu: %v", err)
	}
	if err := Check("cuda", rollout.FP32); err == nil || !strings.Contains(err.Error(), "on the GPU exact is float32") {
		t.Errorf("cuda with fp32: %v", err)
	}
	if err := Check("cuda", rollout.FP4); err != nil {
		t.Errorf("cuda with fp4: %v", err)
	}
	if err := Check("cuda", rollout.FP8); err != nil {
		t.Errorf("cuda with fp8: %v", err)
	}
	if err := Check("cuda", rollout.BF16); err != nil {
		t.Errorf("cuda with bf16: %v", err)
	}
	if err := Check("cuda:1", rollout.Exact); err != nil {
		t.Errorf("cuda:1 exact: %v", err)
	}
	if err := Check("cpu", rollout.FP4); err != nil {
		t.Errorf("cpu fp4: %v", err)
	}
	if _, err := kc.DeviceCount(); err == nil {
		t.Skip("a GPU driver is here: the no-GPU error is not reachable")
	}
	if _, err := Engine("cuda", m, rollout.Options{Slots: 2, MaxLen: 16}); err == nil || !strings.Contains(err.Error(), "keel device") {
		t.Errorf("cuda without a GPU: %v", err)
	}
}
