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
	var need int64
	var biggest memplan.Item
	for _, it := range p.Items {
		if it.Batch {
			need += it.Bytes
			if it.Bytes > biggest.Bytes {
				biggest = it
			}
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
// scratch took since ResetPeak (or the engine was made), measured: what
// train/memplan's Budget.Activations plans, to set beside it. It is the
// Pool's peak of bytes in use, plus the largest logits a forward kept for
// its backward (headKeeps: outside the plan, and only where they fit),
// plus the bf16 products' operand scratch: exact without kept logits, an
// upper bound with them.
func (e *Engine) PeakActivations() int64 {
	return e.pool.Stats().Peak + e.keptPeak + e.scratchHeld()
}
