package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/internal/sysmem"
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

// --layers changes the preset's depth. The configs are checked without
// allocating weights (one qwen3-30b-a3b layer is 623M floats); the one
// model written is a one-layer qwen3-0.6b with a 64-token vocabulary
// (15.8M floats, 63 MB).
func TestInitLayers(t *testing.T) {
	c, err := initConfig("qwen3-30b-a3b", 64, 2)
	if err != nil {
		t.Fatal(err)
	}
	if c.NumHiddenLayers != 2 || c.NumExperts != 128 || c.NumExpertsPerTok != 8 || c.VocabSize != 64 {
		t.Errorf("qwen3-30b-a3b --layers 2: %+v", c)
	}
	// 2 layers × 623,120,640 + untied embedding and head 2·64·2048 + final norm 2048.
	if n, err := c.NumParams(); err != nil || n != 2*623_120_640+2*64*2048+2048 {
		t.Errorf("qwen3-30b-a3b --layers 2: %d parameters (%v)", n, err)
	}
	if c, err := initConfig("qwen3-30b-a3b", 64, 0); err != nil || c.NumHiddenLayers != 48 {
		t.Errorf("--layers 0 keeps the preset's 48: %d (%v)", c.NumHiddenLayers, err)
	}
	for _, tc := range []struct {
		layers int
		want   string
	}{
		{-1, "--layers must be positive"},
		{1 << 20, "--layers 1048576"}, // 6.5e14 parameters: Validate refuses
	} {
		if _, err := initConfig("qwen3-30b-a3b", 64, tc.layers); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--layers %d: %v, want an error with %q", tc.layers, err, tc.want)
		}
	}
	var out bytes.Buffer
	if err := runInit([]string{"--preset", "tiny-dense", "--vocab", "10", "--layers", "-2", "--out", t.TempDir()}, &out); err == nil || !strings.Contains(err.Error(), "--layers") {
		t.Errorf("runInit --layers -2: %v", err)
	}

	dir := filepath.Join(t.TempDir(), "m")
	if err := runInit([]string{"--preset", "qwen3-0.6b", "--vocab", "64", "--layers", "1", "--dtype", "bf16", "--out", dir}, &out); err != nil {
		t.Fatal(err)
	}
	got, err := model.ReadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got.NumHiddenLayers != 1 || got.HiddenSize != 1024 || got.MaxPositionEmbeddings != 40960 {
		t.Errorf("written config %+v", got)
	}
	// One layer (15,730,944, see model's preset test) + tied embedding
	// 64·1024 + final norm 1024.
	if !strings.Contains(out.String(), "1 layers") || !strings.Contains(out.String(), "15,797,504 parameters") {
		t.Errorf("output %q", out.String())
	}
}

// TestInitRefusesWhatCannotFit: a preset whose float32 weights exceed the
// machine's memory is refused before anything is allocated.
func TestInitRefusesWhatCannotFit(t *testing.T) {
	if mem, ok := sysmem.Total(); !ok || mem > 100e9 {
		t.Skip("this machine could hold the weights: the test would make them")
	}
	err := runInit([]string{"--preset", "qwen3-30b-a3b", "--vocab", "151936", "--out", t.TempDir()}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--layers") || !strings.Contains(err.Error(), "122.1 GB") {
		t.Errorf("the full 30B-A3B preset: %v", err)
	}
}
