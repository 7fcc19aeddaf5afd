package rl

import (
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	rollcuda "github.com/keel-rl/keel/rollout/cuda"
	"github.com/keel-rl/keel/train/memplan"
)

// What a GPU rollout engine leaves free for what comes after it on its
// GPU, case by case: nothing on the CPU; the training engine's whole plan
// (and a KL reference's weights and state) for the training rollout,
// built first, but only its activations for the evaluation's engine,
// built last; the evaluation engine's weights and a quarter of the slots;
// nothing for engines on another GPU; the plan for the longest sequence
// when it is longer than a micro-batch. No GPU is needed: only plans.
func TestGPUReserve(t *testing.T) {
	cfg, err := model.Preset("tiny-moe", 1000)
	if err != nil {
		t.Fatal(err)
	}
	recipe := func(trainDev string, kl float64) *Recipe {
		r := &Recipe{}
		r.Train.Device, r.Train.MicroBatchTokens = trainDev, 4096
		r.Rollout.Slots = 256
		r.Algorithm.KLCoef = kl
		return r
	}
	plan := func(tokens int) (total, act int64) {
		p, err := memplan.Plan(&cfg, memplan.Shape{Seqs: 1, SeqLen: tokens}, memplan.Mode{Precision: memplan.FP32})
		if err != nil {
			t.Fatal(err)
		}
		return p.Total(), p.Activations()
	}
	total, act := plan(4096)
	if act <= 0 || act >= total {
		t.Fatalf("plan: total %d, activations %d", total, act)
	}
	ev := evalEngineSpec{device: "cuda", prec: rollout.Exact, maxLen: 200}
	em, err := rollcuda.Plan(&cfg, rollout.Options{Precision: rollout.Exact, Slots: 64, MaxLen: 200})
	if err != nil {
		t.Fatal(err)
	}
	evalBytes := em.Total(64)
	longTotal, _ := plan(6000)
	for _, c := range []struct {
		name   string
		r      *Recipe
		device string
		maxLen int
		first  bool
		ev     evalEngineSpec
		want   int64
	}{
		{name: "rollout on the CPU", r: recipe("cuda", 0), device: "cpu", maxLen: 300, first: true, ev: ev, want: 0},
		{name: "trainer on the CPU", r: recipe("cpu", 0), device: "cuda", maxLen: 300, first: true, ev: ev, want: evalBytes},
		{name: "training rollout", r: recipe("cuda", 0), device: "cuda", maxLen: 300, first: true, ev: ev, want: total + evalBytes},
		{name: "with a KL reference", r: recipe("cuda", 0.01), device: "cuda", maxLen: 300, first: true, ev: ev, want: 2*total - act + evalBytes},
		{name: "no evaluation", r: recipe("cuda", 0), device: "cuda", maxLen: 300, first: true, want: total},
		{name: "evaluation on the CPU", r: recipe("cuda", 0), device: "cuda", maxLen: 300, first: true, ev: evalEngineSpec{device: "cpu", maxLen: 200}, want: total},
		{name: "evaluation engine", r: recipe("cuda", 0), device: "cuda", maxLen: 200, first: false, want: act},
		{name: "trainer on another GPU", r: recipe("cuda:1", 0), device: "cuda:0", maxLen: 300, first: true, ev: evalEngineSpec{device: "cuda:0", prec: rollout.Exact, maxLen: 200}, want: evalBytes},
		{name: "sequences above a micro-batch", r: recipe("cuda", 0), device: "cuda", maxLen: 6000, first: true, want: longTotal},
	} {
		got, err := gpuReserve(c.r, &cfg, c.device, c.maxLen, c.first, c.ev)
		if err != nil || got != c.want {
			t.Errorf("%s: %d bytes (%v), want %d", c.name, got, err, c.want)
		}
	}
	if _, err := gpuReserve(recipe("cuda", 0), &cfg, "tpu", 300, true, ev); err == nil {
		t.Error("device tpu accepted")
	}
}
