package evaluate

import (
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
)

// avg@k and pass@k by hand: problem A right 1 of 4 times, B 4 of 4, C never.
func TestSummariseHand(t *testing.T) {
	r := &Report{K: 4, Samples: []ProblemResult{
		{Example: data.Example{Task: "x", Difficulty: 1}, Rewards: []float64{0, 1, 0, 0}, Lengths: []int{2, 2, 2, 2}},
		{Example: data.Example{Task: "x", Difficulty: 2}, Rewards: []float64{1, 1, 1, 1}, Lengths: []int{4, 4, 4, 4}},
		{Example: data.Example{Task: "y", Difficulty: 1}, Rewards: []float64{0, 0, 0, 0}, Lengths: []int{6, 6, 6, 6}},
	}}
	r.summarise()
	want := map[string][3]float64{
		"all":  {(0.25 + 1 + 0) / 3, 2.0 / 3, 4},
		"x":    {(0.25 + 1) / 2, 1, 3},
		"x/d1": {0.25, 1, 2},
		"y":    {0, 0, 6},
	}
	if r.Scores[0].Group != "all" {
		t.Fatalf("first group %q", r.Scores[0].Group)
	}
	found := 0
	for _, s := range r.Scores {
		if w, ok := want[s.Group]; ok {
			found++
			if s.AvgAtK != w[0] || s.PassAtK != w[1] || s.MeanLen != w[2] {
				t.Errorf("%s: %+v, want avg %v pass %v len %v", s.Group, s, w[0], w[1], w[2])
			}
		}
	}
	if found != len(want) || len(r.Scores) != 6 {
		t.Fatalf("groups %+v", r.Scores)
	}
}

func TestRunOnRandomModel(t *testing.T) {
	tok := tokenizer.NewChar()
	cfg, _ := model.Preset("tiny-dense", 128)
	cfg.NumHiddenLayers = 1
	m := model.New(cfg)
	model.Init(m, 1)
	e, err := rollout.New(m, rollout.Options{Slots: 4, MaxLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ex, _ := data.Generate(data.GenSpec{Tasks: []string{"arithmetic", "linear"}, N: 4, Difficulties: []int{1}, Seed: 1})
	rep, err := Run(e, tok, ex, 3, rollout.Sampling{Temperature: 1, MaxNewTokens: 8, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Overall().Problems != 4 || len(rep.Samples[0].Responses) != 3 {
		t.Fatalf("report %+v", rep.Scores)
	}
}

// The <|im_end|> that ends a response must not reach the verifier: a
// response "Answer: 12<|im_end|>" is right.
func TestStopTokenStripped(t *testing.T) {
	tok := tokenizer.NewChar()
	r := &Report{K: 1, Samples: []ProblemResult{{Example: data.Example{Task: "arithmetic", Answer: "12"}}}}
	text := "Answer: 12"
	ids := append(tok.Encode(text), tok.MustID(tokenizer.ImEnd))
	if got := scoreSample(tok, tok.MustID(tokenizer.ImEnd), r.Samples[0].Example, ids); got != 1 {
		t.Fatalf("reward %v for %q + <|im_end|>", got, text)
	}
}

// Run refuses examples whose task has no verifier (their responses would
// all score 0), naming the row; CheckTasks accepts the built-in tasks and
// the verify-only verifiers under verl's data_source names.
func TestUnknownTask(t *testing.T) {
	ok := []data.Example{{Task: "arithmetic"}, {Task: "countdown"}, {Task: "linear"},
		{Task: "gsm8k"}, {Task: "openai/gsm8k"}, {Task: "math"}, {Task: "lighteval/MATH"}, {Task: "math_dapo"}, {Task: "aime24"}}
	if err := CheckTasks(ok); err != nil {
		t.Fatal(err)
	}
	bad := append(ok, data.Example{Task: "chess"})
	err := CheckTasks(bad)
	if err == nil || !strings.HasPrefix(err.Error(), `row 9: no verifier for task "chess" (known: arithmetic, countdown, linear, gsm8k, guess, math;`) {
		t.Fatalf("err = %v", err)
	}
	if _, err := Run(nil, nil, bad, 1, rollout.Sampling{}); err == nil || !strings.Contains(err.Error(), "row 9") {
		t.Fatalf("Run: err = %v", err)
	}
}
