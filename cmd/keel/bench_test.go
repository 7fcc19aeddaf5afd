package main

import (
	"strings"
	"testing"
	"time"

	"github.com/keel-rl/keel/bench"
	"github.com/keel-rl/keel/rollout"
)

// Bad decode flags are refused before any measurement runs (a typo must
// not cost the minutes of the training benchmarks first): with an unknown
// preset also given, the flag's error comes first.
func TestBenchFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--decode-group", "3", "--decode-slots", "64"}, "--decode-group 3 does not divide --decode-slots 64"},
		{[]string{"--decode-group", "0"}, "--decode-group 0 does not divide"},
		{[]string{"--decode-new", "0"}, "--decode-prompt 32, --decode-new 0: both must be at least 1"},
		{[]string{"--decode-slots", "64,x"}, `--decode-slots: "x" is not a positive count`},
		{[]string{"--decode-precisions", "fp16"}, "--decode-precisions"},
		{[]string{"--len", "1"}, "--len must be at least 2"},
		{[]string{"--device", "tpu"}, `--device: device "tpu"`},
		{[]string{"--layers", "-1"}, "--layers must be >= 0"},
		{[]string{"--peak-gbps", "0"}, "--peak-gbps positive"},
		{[]string{"--rl-max-new", "0"}, "--rl-max-new at least 1"},
	} {
		args := append([]string{"--presets", "no-such-preset", "--no-gemm"}, c.args...)
		if err := runBench(args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
}

// TestBenchTrainOnLayers: the training table's --layers reaches the model
// (a Qwen3-0.6B shape of one layer and a tiny vocabulary trains on the
// CPU engine in a moment).
func TestBenchTrainOnLayers(t *testing.T) {
	r, err := bench.TrainOn(bench.TrainSpec{Device: "cpu", Preset: "qwen3-0.6b", Layers: 1, Vocab: 64, Seqs: 1, SeqLen: 8, Time: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// One layer of the 0.6B shape: 15,730,944 parameters, the tied
	// embedding 64 × 1024 and the final norm 1024.
	if want := 15730944 + 64*1024 + 1024; r.Params != want || r.TokensPerS <= 0 {
		t.Errorf("params %d (want %d), %v tokens/s", r.Params, want, r.TokensPerS)
	}
}

// TestBenchRLStepSpec: the RL-step table's spec reaches the loop: a
// Qwen3-0.6B shape of one layer, 2 prompts x 3 samples of at most 5
// tokens, on the CPU engines.
func TestBenchRLStepSpec(t *testing.T) {
	r, err := bench.RLStep(bench.RLStepSpec{Preset: "qwen3-0.6b", Vocab: 64, Layers: 1, Rollout: rollout.FP32,
		Prompts: 2, Group: 3, MaxNew: 5, Steps: 1, Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Prompts != 2 || r.Group != 3 || r.MaxNew != 5 || r.Precision != "fp32" {
		t.Errorf("result for %+v", r)
	}
	if !(r.Step > 0) || r.SampledTokensPerStep < 6 || r.SampledTokensPerStep > 2*3*5 {
		t.Errorf("step %.3g s, %.1f sampled tokens: want a positive time and 6 to 30 tokens", r.Step, r.SampledTokensPerStep)
	}
	if _, err := bench.RLStep(bench.RLStepSpec{Preset: "qwen3-0.6b", Vocab: 64, Layers: 1, Rollout: rollout.FP32,
		Prompts: 1, Group: 1, MaxNew: 2, Steps: 1, Device: "cpu", TrainPrecision: "bf16"}); err == nil {
		t.Error("bf16 training on the CPU accepted")
	}
}

// The decode table shows the bandwidth columns when the report has the
// card's bandwidth (a GPU run), and not otherwise.
func TestBenchDecodeTable(t *testing.T) {
	row := benchDecodeRow{PrecisionName: "bf16", VsForward: 0.5, GBPerS: 1675, Bandwidth: 0.5}
	row.Preset, row.Slots, row.SamplesPerPrompt, row.TokensPerS = "qwen3-0.6b", 256, 1, 12345
	var b strings.Builder
	printBenchTables(&b, &benchReport{Decode: []benchDecodeRow{row}, PeakGBPerS: 3350})
	for _, want := range []string{"weights+KV GB/s\tof bandwidth", "qwen3-0.6b\t256\t1\tbf16\t12345\t50%\t1675\t50.0%\t"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
	b.Reset()
	printBenchTables(&b, &benchReport{Decode: []benchDecodeRow{row}})
	if strings.Contains(b.String(), "GB/s") {
		t.Errorf("bandwidth columns without a card:\n%s", b.String())
	}
}

// The training table shows the measured and planned activations on a GPU
// (a report naming its device), and not on the CPU.
func TestBenchTrainTable(t *testing.T) {
	row := bench.TrainResult{Preset: "qwen3-0.6b", Params: 596049920, Tokens: 16384, FwdTokensPerS: 30000, TokensPerS: 10000,
		TrainGFLOPS: 100000, ActivationBytes: 3 << 30, ActivationHeldBytes: 4 << 30, PlannedActivationBytes: 3<<30 + 1<<28}
	var b strings.Builder
	rep := &benchReport{Device: "NVIDIA H100 80GB HBM3", Train: []bench.TrainResult{row}, Utilisation: map[string]float64{"qwen3-0.6b": 0.1}, PeakGFLOPS: 989e3}
	if err := printBench(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"activations GiB", "planned GiB", "3.00", "3.25\n", "activations: the bytes"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
	b.Reset()
	rep.Device = ""
	if err := printBench(&b, rep); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "activations") {
		t.Errorf("activation columns on the CPU:\n%s", b.String())
	}
}
