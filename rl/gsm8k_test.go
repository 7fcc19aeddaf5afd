package rl

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

// A GSM8K-style Parquet file in verl's layout (data_source openai/gsm8k,
// the prompt a chat list, reward_model.ground_truth) trains with keel rl
// as it is, on a model with Qwen3's tokenizer: the prompts rendered with
// Qwen3's chat template and encoded by its byte-level BPE, rewards from
// the gsm8k verifier. The model is tiny and random, so the test checks the
// path end to end, not that it learns.
func TestRunGSM8KParquetWithQwenTokenizer(t *testing.T) {
	if testing.Short() {
		t.Skip("a model of Qwen3's vocabulary")
	}
	tmp := t.TempDir()
	tokJSON := qwenTokenizer(t)
	// A dense model of Qwen3's vocabulary (151,936), small elsewhere.
	c := tinyConfig(false)
	c.VocabSize, c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads, c.HeadDim = 151936, 16, 24, 2, 8
	c.MaxPositionEmbeddings, c.TieWordEmbeddings = 256, true
	m := model.New(c)
	model.Init(m, 3)
	modelDir := filepath.Join(tmp, "qwen-tiny")
	if err := model.Save(modelDir, m, "f32"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(modelDir, "tokenizer.json"), tokJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	rows := []data.Example{
		{Task: "openai/gsm8k", Messages: userMsg("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May? Let's think step by step and output the final answer after \"####\"."), Answer: "72"},
		{Task: "openai/gsm8k", Messages: userMsg("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn? Let's think step by step and output the final answer after \"####\"."), Answer: "10"},
		{Task: "openai/gsm8k", Messages: userMsg("Betty is saving money for a new wallet which costs $100. How much more money does she need if she has $95? Let's think step by step and output the final answer after \"####\"."), Answer: "5"},
		{Task: "openai/gsm8k", Messages: userMsg("James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year? Let's think step by step and output the final answer after \"####\"."), Answer: "624"},
	}
	pq := filepath.Join(tmp, "gsm8k.parquet")
	if err := data.WriteParquet(pq, rows); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "run")
	r, err := ParseRecipe([]byte("model: {path: "+modelDir+"}\ndata: {file: "+pq+"}\neval: {skip: true}\n"), []string{
		"out=" + out, "rollout.max_new_tokens=12", "rollout.slots=8", "train.steps=2", "train.prompts_per_step=2",
		"train.group_size=2", "log.checkpoint_every=1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), r, false, Progress{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 2 {
		t.Fatalf("%d steps, want 2", res.Steps)
	}
	recs, err := run.ReadMetrics(filepath.Join(out, MetricsFile))
	if err != nil || len(recs) != 2 {
		t.Fatalf("metrics: %d records, %v", len(recs), err)
	}
	for _, m := range recs {
		if _, ok := m["accuracy/openai/gsm8k"]; !ok {
			t.Fatalf("no per-task accuracy for openai/gsm8k in %v", m)
		}
	}
	// The verifier the run used scores a right GSM8K answer 1.
	if s := tasks.Score("openai/gsm8k", "72", "48 + 24 = 72\n#### 72"); s != 1 {
		t.Fatalf("gsm8k verifier gives %v to a right answer", s)
	}
	samples, err := os.ReadFile(filepath.Join(out, "samples", "step-000001.jsonl"))
	if err != nil || !strings.Contains(string(samples), "Natalia") && !strings.Contains(string(samples), "Weng") &&
		!strings.Contains(string(samples), "Betty") && !strings.Contains(string(samples), "James") {
		t.Fatalf("samples of step 1: %v\n%.300s", err, samples)
	}
}

func userMsg(s string) []tokenizer.Message { return []tokenizer.Message{{Role: "user", Content: s}} }

// qwenTokenizer returns Qwen3's tokenizer.json.
func qwenTokenizer(t *testing.T) []byte {
	t.Helper()
	b, err := testmodel.QwenTokenizerJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
