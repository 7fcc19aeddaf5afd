package device

import (
	"errors"
	"strings"
	"testing"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{{"", -1}, {"cpu", -1}, {"cuda", 0}, {"cuda:0", 0}, {"cuda:3", 3}} {
		if got, err := Parse(c.in); err != nil || got != c.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU"} {
		if _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "want cpu, cuda") {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
}

// TestTrainerCPU: "cpu" gives the CPU engine; "cuda" on a machine
// without a GPU gives an error that says where to look, not a panic.
func TestTrainerCPU(t *testing.T) {
	cfg, _ := model.Preset("tiny-dense", 40)
	m := model.New(cfg)
	tr, err := Trainer(Options{Device: "cpu"}, m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tr.(*train.Engine); !ok {
		t.Errorf("cpu gave %T", tr)
	}
	tr.Close()
	if _, err := kc.DeviceCount(); err == nil {
		t.Skip("a GPU driver is here: the error path is not reachable")
	}
	_, err = Trainer(Options{Device: "cuda"}, m, train.DefaultAdamWConfig(), nil)
	var le *kc.LibraryError
	if err == nil || !strings.Contains(err.Error(), "keel device") || !(errors.As(err, &le) || errors.Is(err, kc.ErrNoCUDA) || errors.Is(err, kc.ErrNoDevice)) {
		t.Errorf("cuda without a GPU: %v", err)
	}
}

func TestOptionsCheck(t *testing.T) {
	for _, c := range []struct {
		o  Options
		ok bool
	}{
		{Options{Device: "cpu"}, true}, {Options{Device: "cpu", Precision: "fp32"}, true},
		{Options{Device: "cpu", Precision: "bf16"}, false}, {Options{Device: "cuda", Precision: "bf16"}, true},
		{Options{Device: "cuda:1", Precision: "fp32"}, true}, {Options{Device: "cuda", Precision: "fp16"}, false},
		{Options{Device: "cpu", Recompute: true}, false}, {Options{Device: "cuda", Recompute: true}, true},
		{Options{Device: "gpu"}, false},
	} {
		if err := c.o.Check(); (err == nil) != c.ok {
			t.Errorf("%+v.Check() = %v", c.o, err)
		}
	}
}
