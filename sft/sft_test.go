package sft

import (
	"encoding/json"
	"math"
	"path/filepath"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/train"
)

func TestSequencesHand(t *testing.T) {
	seqs, coef, n := Sequences([]Example{
		{Prompt: []int32{1, 2}, Response: []int32{3, 4, 5}},
		{Prompt: nil, Response: []int32{6, 7}},
	})
	if n != 4 {
		t.Fatalf("targets = %d, want 4 (3 + 1: the first token of a prompt-less example has no prediction)", n)
	}
	w := float32(-0.25)
	want := [][]float32{{0, w, w, w}, {w}}
	for s := range want {
		if len(seqs[s]) != len(want[s])+1 {
			t.Fatalf("sequence %d: %v", s, seqs[s])
		}
		for i := range want[s] {
			if coef[s][i] != want[s][i] {
				t.Fatalf("coef[%d] = %v, want %v", s, coef[s], want[s])
			}
		}
	}
}

// Masked response tokens (a demonstration's observations) are context
// only: no coefficient and not counted.
func TestSequencesMasked(t *testing.T) {
	_, coef, n := Sequences([]Example{
		{Prompt: []int32{1, 2}, Response: []int32{3, 4, 5, 6, 7, 8}, Masked: [][2]int{{1, 3}, {4, 5}}},
	})
	if n != 3 {
		t.Fatalf("targets = %d, want 3 (tokens 3, 6 and 8)", n)
	}
	w := float32(-1.0 / 3)
	want := []float32{0, w, 0, 0, w, 0, w}
	for i := range want {
		if coef[0][i] != want[i] {
			t.Fatalf("coef = %v, want %v", coef[0], want)
		}
	}
}

func exampleSet(n int) []Example {
	var d []Example
	for i := 0; i < n; i++ {
		d = append(d, Example{Prompt: []int32{int32(i % 7), 1}, Response: []int32{2, int32(3 + i%5), 9}})
	}
	return d
}

func TestBatcherBudgetEpochsAndSeek(t *testing.T) {
	data := exampleSet(10) // 5 tokens each
	b, err := NewBatcher(data, 12, 3)
	if err != nil {
		t.Fatal(err)
	}
	var first []Position
	seen := 0
	for i := 0; i < 5; i++ { // 2+2+2+2+2 examples = one epoch
		first = append(first, b.Position())
		batch := b.Next()
		if len(batch) != 2 {
			t.Fatalf("batch %d has %d examples, want 2 (12-token budget, 5 tokens each)", i, len(batch))
		}
		seen += len(batch)
	}
	if p := b.Position(); p.Epoch != 0 || p.Cursor != 10 {
		t.Fatalf("after one epoch: %+v", p)
	}
	next := b.Next()
	if p := b.Position(); p.Epoch != 1 || p.Cursor != 2 {
		t.Fatalf("second epoch position %+v", p)
	}
	// Seeking back reproduces the batches.
	b.Seek(first[3])
	if got := b.Next(); got[0].Prompt[0] != b.data[b.order[6]].Prompt[0] {
		t.Fatalf("seek did not reproduce the batch")
	}
	b2, _ := NewBatcher(data, 12, 3)
	b2.Seek(Position{Epoch: 1, Cursor: 0})
	if got := b2.Next(); got[0].Prompt[0] != next[0].Prompt[0] || got[1].Response[1] != next[1].Response[1] {
		t.Fatalf("epoch 1 order differs between batchers")
	}
	if _, err := NewBatcher(data, 4, 1); err == nil {
		t.Fatal("an example longer than the budget was accepted")
	}
}

func tinyModel(t *testing.T) *model.Model {
	cfg, err := model.Preset("tiny-moe", 16)
	if err != nil {
		t.Fatal(err)
	}
	cfg.NumHiddenLayers = 2
	m := model.New(cfg)
	model.Init(m, 1)
	return m
}

// The trainer must fit a small deterministic data set: the response tokens
// are a function of the prompt, so the loss can fall far below log(16).
func TestTrainerFits(t *testing.T) {
	m := tinyModel(t)
	cfg := Config{Steps: 60, BatchTokens: 64, LR: 1e-2, Warmup: 5}
	tr, err := NewTrainer(engine(t, m, cfg, nil), exampleSet(35), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var firstLoss, last Stats
	for i := 0; i < 60; i++ {
		st, err := tr.Step()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			firstLoss = st
		}
		last = st
	}
	if !(firstLoss.Loss > 2) || !(last.Loss < 0.5*firstLoss.Loss) {
		t.Fatalf("loss %v -> %v: not learning", firstLoss.Loss, last.Loss)
	}
	if last.Step != 60 || last.Targets <= 0 || math.IsNaN(last.GradNorm) {
		t.Fatalf("stats %+v", last)
	}
}

// Training 6 steps straight must give the bits of training 3, saving a
// checkpoint, loading it into a new trainer and training 3 more.
func TestTrainerResumeIsExact(t *testing.T) {
	cfg := Config{Steps: 6, BatchTokens: 30, LR: 5e-3, Warmup: 2, Seed: 9}
	data := exampleSet(13)
	a, _ := NewTrainer(engine(t, tinyModel(t), cfg, nil), data, cfg)
	for i := 0; i < 6; i++ {
		if _, err := a.Step(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := NewTrainer(engine(t, tinyModel(t), cfg, nil), data, cfg)
	for i := 0; i < 3; i++ {
		b.Step()
	}
	root := filepath.Join(t.TempDir(), "ckpt")
	state, _ := json.Marshal(b.Batches.Position())
	bw, bo, err := train.Snapshot(b.Engine)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.SaveCheckpoint(root, &run.Checkpoint{Step: 3, Model: bw, Optim: (*run.OptimState)(bo), State: state}, 0); err != nil {
		t.Fatal(err)
	}
	c, err := run.LoadLatest(root)
	if err != nil {
		t.Fatal(err)
	}
	var pos Position
	json.Unmarshal(c.State, &pos)
	r, err := NewTrainer(engine(t, c.Model, cfg, (*train.OptimState)(c.Optim)), data, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Batches.Seek(pos)
	for i := 0; i < 3; i++ {
		if _, err := r.Step(); err != nil {
			t.Fatal(err)
		}
	}
	aw, _ := a.Engine.Weights()
	rw, _ := r.Engine.Weights()
	for i := range aw.Arena {
		if aw.Arena[i] != rw.Arena[i] {
			t.Fatalf("weight %d differs after resuming: %v vs %v", i, aw.Arena[i], rw.Arena[i])
		}
	}
}

// engine returns the CPU training engine for m with cfg's optimiser.
func engine(t *testing.T, m *model.Model, cfg Config, state *train.OptimState) train.Trainer {
	t.Helper()
	e, err := train.NewTrainer(m, cfg.AdamW(), state)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
