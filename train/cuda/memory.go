package cuda

import (
	"fmt"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train/memplan"
)

// checkActivations returns an error, before anything is allocated, when
// the activations of a forward and backward over T tokens (train/memplan's
// plan in precision prec, with or without recomputation) need more than
// free bytes: one clear error instead of an allocation failing half way
// through a step.
func checkActivations(cfg *model.Config, T int, free int64, prec string, recompute bool) error {
	p, err := memplan.Plan(cfg, memplan.Shape{Seqs: 1, SeqLen: T}, memplan.Mode{Precision: prec, Recompute: recompute})
	if err != nil {
		return err
	}
	need := p.Activations() // the backward's Exclusive items counted as the plan counts them
	var biggest memplan.Item
	for _, it := range p.Items {
		if it.Batch && it.Bytes > biggest.Bytes {
			biggest = it
		}
	}
	if need <= free {
		return nil
	}
	hint := "turn on train.recompute, or lower"
	if recompute {
		hint = "lower"
	}
	return fmt.Errorf("train/cuda: a micro-batch of %d tokens needs %.2f GiB of activations (the most: %s, %.2f GiB) and the GPU has %.2f GiB free: %s train.micro_batch_tokens (RL) or train.batch_tokens (SFT)",
		T, float64(need)/(1<<30), biggest.Name, float64(biggest.Bytes)/(1<<30), float64(free)/(1<<30), hint)
}

// ResetPeak starts a new measure of PeakActivations.
func (e *Engine) ResetPeak() {
	e.pool.ResetPeak()
	e.keptPeak = 0
}

// PeakActivations returns the most bytes the steps' activations and
// scratch took since ResetPeak (or the engine was made), measured: asked,
// what train/memplan's Budget.Activations plans, to set beside it; held,
// the device memory behind them (the Pool rounds its buffers up to its
// size classes and serves a request from a cached buffer up to a quarter
// larger). Each is the Pool's peak, plus the largest logits a forward
// kept for its backward (headKeeps: outside the plan, and only where they
// fit), plus the bf16 products' operand scratch: exact without kept
// logits, an upper bound with them.
func (e *Engine) PeakActivations() (asked, held int64) {
	st := e.pool.Stats()
	own := e.keptPeak + e.scratchHeld()
	return st.Peak + own, st.PeakHeld + own
}
