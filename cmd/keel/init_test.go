package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

func TestInitCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	var out bytes.Buffer
	if err := runInit([]string{"--preset", "tiny-moe", "--vocab", "100", "--seed", "5", "--out", dir, "--dtype", "bf16"}, &out); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), groupDigits(m.NumParams())+" parameters") {
		t.Errorf("output %q lacks the parameter count %d", out.String(), m.NumParams())
	}
	if m.Config.NumExperts != 8 || m.Config.VocabSize != 100 {
		t.Errorf("config %+v", m.Config)
	}
	cfg, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if !strings.Contains(string(cfg), `"torch_dtype": "bfloat16"`) {
		t.Errorf("config.json: %s", cfg)
	}
	// The same seed reproduces the weights (bf16-rounded on disk).
	ref, _ := model.Preset("tiny-moe", 100)
	want := model.New(ref)
	model.Init(want, 5)
	if d := m.Layers[1].Experts[3].Up.Data[17] - want.Layers[1].Experts[3].Up.Data[17]; d > 1e-3 || d < -1e-3 {
		t.Errorf("weights differ from Init(seed 5) by %g", d)
	}

	// A non-empty directory is refused without --force.
	err = runInit([]string{"--preset", "tiny-dense", "--vocab", "100", "--out", dir}, &out)
	if err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("non-empty dir: %v", err)
	}
	if err := runInit([]string{"--preset", "tiny-dense", "--vocab", "100", "--out", dir, "--force"}, &out); err != nil {
		t.Fatal(err)
	}
	if m, err := model.Load(dir); err != nil || m.Config.IsMoE() {
		t.Errorf("after --force: %v", err)
	}

	for _, args := range [][]string{
		{"--vocab", "10", "--out", dir},
		{"--preset", "nope", "--vocab", "10", "--out", t.TempDir()},
		{"--preset", "tiny-dense", "--out", t.TempDir()},
		{"--preset", "tiny-dense", "--vocab", "10"},
		{"--preset", "tiny-dense", "--vocab", "10", "--out", t.TempDir(), "--dtype", "f16"},
	} {
		if err := runInit(args, &out); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestGroupDigits(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567"} {
		if got := groupDigits(n); got != want {
			t.Errorf("groupDigits(%d) = %q, want %q", n, got, want)
		}
	}
}
