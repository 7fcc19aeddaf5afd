package main

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keel-rl/keel/bench"
	"github.com/keel-rl/keel/internal/cudatest"
)

// gpuRL is the built-in quickstart with both engines on the GPU, cut to a
// few seconds of work: 4 prompts x 4 samples of up to 32 tokens a step, a
// checkpoint every step.
func gpuRL(name string, steps int, precision string) []string {
	return []string{"--name", name, "--quiet", "--set", "device=cuda", "--set", "rollout.precision=" + precision,
		"--set", "train.steps=" + strconv.Itoa(steps), "--set", "train.warmup=0", "--set", "train.schedule=constant",
		"--set", "train.prompts_per_step=4", "--set", "train.group_size=4", "--set", "rollout.max_new_tokens=32",
		"--set", "eval.skip=true", "--set", "log.checkpoint_every=1"}
}

// TestRLOnGPU runs keel rl with train.device and rollout.device cuda (on a
// GPU, or on the CUDA emulator in CI) and checks what holds by
// construction: the exact rollout's log mu equals the GPU trainer's log
// pi_old on every token of every step (train-infer k3, the largest |Δ| and
// the routing disagreement all 0), so MiniRL with and without IS are one
// run, bit for bit; a run stopped after two steps and resumed to three
// ends with the same weights, samples and metrics, bit for bit, as one run
// of three; an asynchronous run (the rollout one version behind, beside the
// trainer on the same GPU) is deterministic; and a GPU run resumes on the
// CPU.
func TestRLOnGPU(t *testing.T) {
	cudatest.Device(t) // skips without a GPU
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	dir := t.TempDir()
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	if err := runRL(gpuRL("whole", 3, "exact")); err != nil {
		t.Fatal(err)
	}
	recs, _ := readMetrics(t, "runs/whole")
	if len(recs) != 3 {
		t.Fatalf("%d metrics records, want 3", len(recs))
	}
	for _, r := range recs {
		for _, k := range []string{"train_infer/k3", "train_infer/abs_diff_max", "routing/infer_vs_old"} {
			if v, ok := r[k].(float64); !ok || v != 0 {
				t.Errorf("step %v: %s = %v, want exactly 0 (exact rollout against the GPU trainer)", r["step"], k, r[k])
			}
		}
	}

	// Asynchronous (rollout.staleness 1): the rollout's worker decodes on
	// the same GPU while the trainer trains (a graph recorded while the
	// trainer synchronises: kernels/cuda's TestDeviceCaptureBesideSync);
	// the run is deterministic all the same, and its batches lag one
	// version from the second step on.
	for _, name := range []string{"async1", "async2"} {
		if err := runRL(append(gpuRL(name, 3, "exact"), "--set", "rollout.staleness=1")); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	sameRun(t, "an asynchronous run again", "runs/async1", "runs/async2")
	arecs, _ := readMetrics(t, "runs/async1")
	for s, r := range arecs {
		if want := float64(min(1, s)); r["rollout/lag_max"] != want {
			t.Errorf("asynchronous run, step %d: rollout/lag_max = %v, want %v", s+1, r["rollout/lag_max"], want)
		}
	}

	// Without IS the exact rollout's ratios are all 1: the same run.
	if err := runRL(append(gpuRL("noIS", 3, "exact"), "--set", "algorithm.objective=minirl-no-is")); err != nil {
		t.Fatal(err)
	}
	a, err1 := os.ReadFile("runs/whole/model/model.safetensors")
	b, err2 := os.ReadFile("runs/noIS/model/model.safetensors")
	if err1 != nil || err2 != nil || !bytes.Equal(a, b) {
		t.Errorf("MiniRL without IS on the exact rollout: final weights differ from MiniRL's (%v, %v)", err1, err2)
	}
	noIS, _ := readMetrics(t, "runs/noIS")
	for i := range min(len(recs), len(noIS)) {
		for _, k := range []string{"reward/mean", "grad_norm", "entropy", "surrogate/gap"} {
			if recs[i][k] != noIS[i][k] {
				t.Errorf("step %d: %s %v with IS, %v without", i+1, k, recs[i][k], noIS[i][k])
			}
		}
	}

	// Two steps, then the run's recipe extended to three and resumed.
	if err := runRL(gpuRL("parts", 2, "exact")); err != nil {
		t.Fatal(err)
	}
	extend := func(run, from, to string) {
		t.Helper()
		p := filepath.Join(run, "recipe.yaml")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.Replace(string(b), "steps: 2\n", "steps: 3\n", 1)
		s = strings.ReplaceAll(s, "device: "+from+"\n", "device: "+to+"\n")
		if s == string(b) {
			t.Fatalf("%s: nothing to change", p)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	extend("runs/parts", "cuda", "cuda")
	if err := runRL([]string{"--resume", "runs/parts", "--quiet"}); err != nil {
		t.Fatal(err)
	}
	sameRun(t, "stopped after two steps and resumed on the GPU", "runs/whole", "runs/parts")

	// The same two GPU steps, resumed on the CPU: the CPU's exact rollout
	// against its own trainer is exact too.
	if err := runRL(gpuRL("moved", 2, "exact")); err != nil {
		t.Fatal(err)
	}
	extend("runs/moved", "cuda", "cpu")
	if err := runRL([]string{"--resume", "runs/moved", "--quiet"}); err != nil {
		t.Fatal(err)
	}
	recs, _ = readMetrics(t, "runs/moved")
	if len(recs) != 3 {
		t.Fatalf("resumed on the CPU: %d metrics records, want 3", len(recs))
	}
	if k3 := recs[2]["train_infer/k3"]; k3 != 0.0 {
		t.Errorf("resumed on the CPU: step 3's train-infer k3 = %v, want exactly 0", k3)
	}
}

// TestBenchTrainOnGPU: keel bench's GPU training rows carry the
// activations' measured peak beside train/memplan's plan for them. The
// bench step keeps its logits for the backward where they fit (they do
// here), which the plan leaves out: the measure is at most the plan plus
// the kept logits (tokens × vocab × 4 bytes), and at least half the plan
// (a measure that lost the Pool's count would be near zero).
func TestBenchTrainOnGPU(t *testing.T) {
	cudatest.Device(t) // skips without a GPU
	for _, rc := range []bool{false, true} {
		r, err := bench.TrainOn(bench.TrainSpec{Device: "cuda", Precision: "bf16", Recompute: rc, Preset: "tiny-moe", Vocab: 64,
			Seqs: 2, SeqLen: 24, Time: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		kept := int64(r.Tokens * 64 * 4)
		t.Logf("recompute %v: activations %d bytes, planned %d, kept logits %d", rc, r.ActivationBytes, r.PlannedActivationBytes, kept)
		if r.PlannedActivationBytes <= 0 || r.ActivationBytes > r.PlannedActivationBytes+kept || r.ActivationBytes < r.PlannedActivationBytes/2 {
			t.Errorf("recompute %v: activations %d bytes, planned %d (kept logits %d)", rc, r.ActivationBytes, r.PlannedActivationBytes, kept)
		}
	}
}

// TestServeOnGPU: keel serve --device cuda answers as --device cpu does:
// the same completions for the same seeds, under top-k and top-p and with
// top log-probabilities, which the GPU rollout draws and reports on the
// device, and with full sampling; the log-probabilities within 1e-4 (the
// exact GPU rollout is the GPU trainer's bits, not the CPU's).
func TestServeOnGPU(t *testing.T) {
	cudatest.Device(t) // skips without a GPU
	dir := t.TempDir()
	if err := serveTestModel(dir); err != nil {
		t.Fatal(err)
	}
	cpu := startServe(t, dir, "--device", "cpu")
	gpu := startServe(t, dir, "--device", "cuda")
	if !strings.Contains(gpu.out.String(), " on cuda") {
		t.Fatalf("keel serve --device cuda:\n%s", gpu.out)
	}
	type choice struct {
		Text     string
		Logprobs struct {
			Tokens        []string
			TokenLogprobs []float32            `json:"token_logprobs"`
			TopLogprobs   []map[string]float32 `json:"top_logprobs"`
		}
	}
	complete := func(url, body string) []choice {
		t.Helper()
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s: %s", url, resp.Status, raw)
		}
		var out struct{ Choices []choice }
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s: %v: %s", url, err, raw)
		}
		return out.Choices
	}
	near := func(a, b float32) bool { return math.Abs(float64(a-b)) <= 1e-4 }
	for _, body := range []string{
		`{"prompt": "12+7=", "max_tokens": 16, "n": 4, "temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 7, "logprobs": 3}`,
		`{"prompt": "3*4=", "max_tokens": 16, "n": 4, "temperature": 1, "seed": 8, "logprobs": 0}`,
	} {
		want, got := complete(cpu.url, body), complete(gpu.url, body)
		t.Logf("%s: the GPU's first choice %q, %d tokens, %d positions of top log-probs", body, got[0].Text, len(got[0].Logprobs.Tokens), len(got[0].Logprobs.TopLogprobs))
		if len(got) != len(want) || len(got) == 0 {
			t.Fatalf("%s: %d choices on the GPU, %d on the CPU", body, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.Text != w.Text || !slices.Equal(g.Logprobs.Tokens, w.Logprobs.Tokens) {
				t.Fatalf("%s choice %d: GPU %q, CPU %q", body, i, g.Text, w.Text)
			}
			if !slices.EqualFunc(g.Logprobs.TokenLogprobs, w.Logprobs.TokenLogprobs, near) {
				t.Fatalf("%s choice %d: log-probs %v on the GPU, %v on the CPU", body, i, g.Logprobs.TokenLogprobs, w.Logprobs.TokenLogprobs)
			}
			if len(g.Logprobs.TopLogprobs) != len(w.Logprobs.TopLogprobs) {
				t.Fatalf("%s choice %d: top log-probs at %d positions on the GPU, %d on the CPU", body, i, len(g.Logprobs.TopLogprobs), len(w.Logprobs.TopLogprobs))
			}
			for j, top := range g.Logprobs.TopLogprobs {
				if !maps.EqualFunc(top, w.Logprobs.TopLogprobs[j], near) {
					t.Fatalf("%s choice %d position %d: top log-probs %v on the GPU, %v on the CPU", body, i, j, top, w.Logprobs.TopLogprobs[j])
				}
			}
		}
	}
}
