package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/train"
)

// keel sample's output must carry the training engine's log-probabilities
// (exact precision) and routes for every position, one line per sample.
func TestSampleCommand(t *testing.T) {
	dir, m := lpTestModel(t, true)
	in := lpWrite(t, "p.jsonl", `{"tokens": [1, 2, 3]}`+"\n\n"+`{"tokens": [4, 5]}`+"\n")
	out := filepath.Join(t.TempDir(), "s.jsonl")
	if err := runSample([]string{"--model", dir, "--input", in, "-n", "2", "--max-new-tokens", "6", "--seed", "3", "--output", out}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4", len(lines))
	}
	prompts := [][]int32{{1, 2, 3}, {4, 5}}
	eng := train.New(m)
	for i, line := range lines {
		var o sampleOutput
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatal(err)
		}
		if o.Prompt != i/2 || o.Sample != i%2 || len(o.Tokens) == 0 || o.Finish == "" {
			t.Fatalf("line %d: %+v", i, o)
		}
		seq := append(append([]int32(nil), prompts[o.Prompt]...), o.Tokens...)
		res, err := eng.Forward([][]int32{seq}, train.ForwardOptions{Record: true, NoEntropy: true})
		if err != nil {
			t.Fatal(err)
		}
		for j, lp := range o.LogProbs {
			if want := res.LogProbs[0][len(prompts[o.Prompt])-1+j]; math.Float32bits(lp) != math.Float32bits(want) {
				t.Fatalf("line %d token %d: %v, training engine %v", i, j, lp, want)
			}
		}
		if len(o.Routes) != len(seq) || len(o.Routes[0]) != 1 || len(o.Routes[0][0]) != 2 {
			t.Fatalf("line %d: routes shape %d×%d×%d", i, len(o.Routes), len(o.Routes[0]), len(o.Routes[0][0]))
		}
		for p := range seq {
			for s, id := range o.Routes[p][0] {
				if id != res.Routes[0].At(p, 0, s) {
					t.Fatalf("line %d position %d: routes differ", i, p)
				}
			}
		}
	}
}

// With top-k the output carries the truncated log-probabilities too, one
// per token and never below the full ones (renormalising over fewer tokens
// raises a probability); every precision runs.
func TestSampleCommandTruncated(t *testing.T) {
	dir, _ := lpTestModel(t, true)
	in := lpWrite(t, "p.jsonl", `{"tokens": [1, 2, 3]}`+"\n")
	for _, prec := range []string{"fp32", "bf16", "fp8"} {
		out := filepath.Join(t.TempDir(), "s.jsonl")
		args := []string{"--model", dir, "--input", in, "-n", "3", "--top-k", "4", "--max-new-tokens", "5", "--precision", prec, "--output", out}
		if err := runSample(args); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(out)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines", prec, len(lines))
		}
		for _, line := range lines {
			var o sampleOutput
			if err := json.Unmarshal([]byte(line), &o); err != nil {
				t.Fatal(err)
			}
			if len(o.TruncLogProbs) != len(o.Tokens) || len(o.Routes) != 3+len(o.Tokens) {
				t.Fatalf("%s: %+v", prec, o)
			}
			for j, tl := range o.TruncLogProbs {
				if tl < o.LogProbs[j] || tl > 0 {
					t.Fatalf("%s token %d: truncated %v, full %v", prec, j, tl, o.LogProbs[j])
				}
			}
		}
	}
}

func TestSampleCommandErrors(t *testing.T) {
	dir, _ := lpTestModel(t, false)
	bad := lpWrite(t, "bad.jsonl", `{"tokens": [1, 2]}`+"\n"+`{"tokens": [1, 99]}`+"\n")
	good := lpWrite(t, "good.jsonl", `{"tokens": [1, 2]}`+"\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", dir, "--input", bad}, "bad.jsonl:2"},
		{[]string{"--model", dir, "--input", good, "--precision", "fp16"}, "unknown precision"},
		{[]string{"--model", dir, "--input", good, "--stop", "x"}, "--stop"},
		{[]string{"--model", dir, "--input", good, "--slots", "0"}, "--slots"},
		{[]string{"--model", dir, "--input", good, "-n", "0"}, "n = 0"},
		{[]string{"--model", dir, "--input", good, "--max-new-tokens", "0"}, "max new tokens"},
		{[]string{"--model", dir, "--prompt", "hello"}, "needs a tokenizer.json"},
		{[]string{"--model", dir}, "--input or --prompt"},
		{[]string{"--model", dir, "--input", good, "--device", "cuda", "--precision", "fp32"}, "on the GPU exact is float32"},
		{[]string{"--model", dir, "--input", good, "--device", "tpu"}, "want cpu, cuda"},
	} {
		if err := runSample(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one mentioning %q", c.args, err, c.want)
		}
	}
}
