package rl

import (
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	rollcuda "github.com/keel-rl/keel/rollout/cuda"
	"github.com/keel-rl/keel/train/memplan"
)

// What a GPU rollout engine leaves free for what is built after it on its
// GPU, case by case (buildEngines builds the rollout engines first):
// nothing on the CPU; the training engine's whole plan, and a KL
// reference's without the AdamW moments; for the training rollout, the
// evaluation engine's weights and a quarter of the slots (with the step
// rows of all of them); nothing for engines on another GPU; the plan for
// the longest sequence when it is longer than a micro-batch. No GPU is
// needed: only plans.
func TestGPUReserve(t *testing.T) {
	cfg, err := model.Preset("tiny-moe", 1000)
	if err != nil {
		t.Fatal(err)
	}
	recipe := func(trainDev string, kl float64) *Recipe {
		r := &Recipe{}
		r.Train.Device, r.Train.MicroBatchTokens = trainDev, 4096
		r.Rollout.Slots = 1024
		r.Algorithm.KLCoef = kl
		return r
	}
	plan := func(tokens int) *memplan.Budget {
		p, err := memplan.Plan(&cfg, memplan.Shape{Seqs: 1, SeqLen: tokens}, memplan.Mode{Precision: memplan.FP32})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := plan(4096)
	total, moments := p.Total(), 8*p.Params
	if moments >= total {
		t.Fatalf("plan: total %d, moments %d", total, moments)
	}
	ev := evalEngineSpec{device: "cuda", prec: rollout.Exact, maxLen: 200}
	em, err := rollcuda.Plan(&cfg, rollout.Options{Precision: rollout.Exact, Slots: 256, MaxLen: 200, StepRows: 1024})
	if err != nil {
		t.Fatal(err)
	}
	evalBytes := em.Total(256)
	longTotal := plan(6000).Total()
	for _, c := range []struct {
		name   string
		r      *Recipe
		device string
		len    int
		ev     evalEngineSpec
		want   int64
	}{
		{"rollout on the CPU", recipe("cuda", 0), "cpu", 300, ev, 0},
		{"trainer on the CPU", recipe("cpu", 0), "cuda", 300, ev, evalBytes},
		{"training rollout", recipe("cuda", 0), "cuda", 300, ev, total + evalBytes},
		{"with a KL reference", recipe("cuda", 0.01), "cuda", 300, ev, 2*total - moments + evalBytes},
		{"evaluation engine (or no evaluation)", recipe("cuda", 0), "cuda", 300, evalEngineSpec{}, total},
		{"evaluation on the CPU", recipe("cuda", 0), "cuda", 300, evalEngineSpec{device: "cpu", maxLen: 200}, total},
		{"trainer on another GPU", recipe("cuda:1", 0), "cuda:0", 300, evalEngineSpec{device: "cuda:0", prec: rollout.Exact, maxLen: 200}, evalBytes},
		{"sequences above a micro-batch", recipe("cuda", 0), "cuda", 6000, evalEngineSpec{}, longTotal},
	} {
		got, err := gpuReserve(c.r, &cfg, c.device, c.len, c.ev)
		if err != nil || got != c.want {
			t.Errorf("%s: %d bytes (%v), want %d", c.name, got, err, c.want)
		}
	}
	if _, err := gpuReserve(recipe("cuda", 0), &cfg, "tpu", 300, ev); err == nil {
		t.Error("device tpu accepted")
	}
}
