package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/internal/ref64"
	"github.com/keel-rl/keel/model"
)

func lpTestModel(t *testing.T, moe bool) (string, *model.Model) {
	t.Helper()
	cfg := model.Config{Architecture: model.ArchQwen3, VocabSize: 19, HiddenSize: 16, IntermediateSize: 24,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 8, RMSNormEps: 1e-6,
		RopeTheta: 10000, MaxPositionEmbeddings: 64, TieWordEmbeddings: true}
	if moe {
		cfg.Architecture = model.ArchQwen3MoE
		cfg.TieWordEmbeddings = false
		cfg.NumExperts, cfg.NumExpertsPerTok, cfg.MoeIntermediateSize, cfg.NormTopKProb = 5, 2, 8, true
		cfg.DecoderSparseStep = 1
		cfg.MlpOnlyLayers = []int{0} // layer 0 dense, layer 1 MoE
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	m := model.New(cfg)
	model.Init(m, 3)
	// Init's small weights make near-uniform predictions and near-tied
	// routers; scale up so the check is not trivially satisfied.
	for i := range m.Arena {
		m.Arena[i] *= 4
	}
	dir := t.TempDir()
	if err := model.Save(dir, m, "f32"); err != nil {
		t.Fatal(err)
	}
	return dir, m
}

func lpWrite(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLogprobsCommand(t *testing.T) {
	for _, moe := range []bool{false, true} {
		dir, m := lpTestModel(t, moe)
		seqs := [][]int32{{1, 5, 7, 2, 18}, {3}, {0, 0, 4, 9, 11, 12, 13, 1, 2, 6}}
		var in strings.Builder
		for i, s := range seqs {
			b, _ := json.Marshal(map[string]any{"tokens": s})
			in.Write(b)
			in.WriteString("\n")
			if i == 0 {
				in.WriteString("   \n") // blank lines are skipped
			}
		}
		inPath := lpWrite(t, "in.jsonl", in.String())
		outPath := filepath.Join(t.TempDir(), "out.jsonl")
		// A tiny batch budget forces several forward passes.
		if err := runLogprobs([]string{"--model", dir, "--input", inPath, "--output", outPath, "--batch-tokens", "6"}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(outPath)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != len(seqs) {
			t.Fatalf("moe=%v: %d output lines for %d sequences", moe, len(lines), len(seqs))
		}
		want, err := ref64.FromModel(m).Forward(seqs, ref64.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for s, line := range lines {
			var o struct {
				LogProbs []float64   `json:"logprobs"`
				Routes   [][][]int32 `json:"routes"`
			}
			if err := json.Unmarshal([]byte(line), &o); err != nil {
				t.Fatalf("output line %d: %v", s+1, err)
			}
			if len(o.LogProbs) != len(seqs[s])-1 {
				t.Fatalf("moe=%v line %d: %d log-probs for %d tokens", moe, s+1, len(o.LogProbs), len(seqs[s]))
			}
			for i, v := range o.LogProbs {
				if math.Abs(v-want.LogProbs[s][i]) > 1e-5 {
					t.Errorf("moe=%v line %d logprobs[%d] = %.7g, float64 reference %.7g", moe, s+1, i, v, want.LogProbs[s][i])
				}
			}
			if !moe {
				if o.Routes != nil {
					t.Errorf("dense model wrote routes")
				}
				continue
			}
			if len(o.Routes) != len(seqs[s]) {
				t.Fatalf("line %d: routes for %d positions, want %d", s+1, len(o.Routes), len(seqs[s]))
			}
			for pos := range o.Routes {
				if len(o.Routes[pos]) != 1 {
					t.Fatalf("line %d position %d: routes for %d layers, want 1 MoE layer", s+1, pos, len(o.Routes[pos]))
				}
				w := want.Routes[s].Slots(nil, pos, 0)
				for j := range w {
					if o.Routes[pos][0][j] != w[j] {
						t.Errorf("line %d position %d: routes %v, reference (descending probability) %v", s+1, pos, o.Routes[pos][0], w)
						break
					}
				}
			}
		}
	}
}

func TestLogprobsBadInput(t *testing.T) {
	dir, _ := lpTestModel(t, false)
	for _, tc := range []struct{ content, want string }{
		{`{"tokens": [1, 2]}` + "\n" + `{"tokens": [1, 2` + "\n", "in.jsonl:2: invalid JSON"},
		{`{"tokens": [1, 2]}` + "\n\n" + `{"tokens": [1, 19]}`, `in.jsonl:3: field "tokens"[1]: token 19 out of the vocabulary`},
		{`{"toks": [1]}`, `in.jsonl:1: missing field "tokens"`},
		{`{"tokens": []}`, `in.jsonl:1: field "tokens" is empty`},
		{`{"tokens": [1.5]}`, "in.jsonl:1: invalid JSON"},
		{`{"tokens": [-1]}`, "in.jsonl:1: field \"tokens\"[0]: token -1"},
		{`{"tokens": [1]} {"tokens": [2]}`, "in.jsonl:1: more than one JSON value"},
		{"\n\n", "in.jsonl: no sequences"},
	} {
		in := lpWrite(t, "in.jsonl", tc.content)
		out := filepath.Join(t.TempDir(), "out.jsonl")
		err := runLogprobs([]string{"--model", dir, "--input", in, "--output", out})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("input %q: error %v, want one containing %q", tc.content, err, tc.want)
		}
		if _, serr := os.Stat(out); serr == nil {
			t.Errorf("input %q: output written despite the error", tc.content)
		}
	}
	if err := runLogprobs([]string{"--input", "x"}); err == nil || !strings.Contains(err.Error(), "--model") {
		t.Errorf("missing --model: %v", err)
	}
	if err := runLogprobs([]string{"--model", t.TempDir(), "--input", "x"}); err == nil {
		t.Error("empty model directory accepted")
	}
}
