package rl

import (
	"fmt"
	"slices"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/train"
)

// ProbeResult is the discrepancy between a rollout engine's samples and
// the training engine's log-probabilities of the same tokens with the same
// weights (docs/method.md §6): what to look at before RL.
type ProbeResult struct {
	Samples int
	Discrepancy
	// RoutingDisagree[l] is the fraction of (position, slot) experts of the
	// rollout not in the training engine's set at MoE layer l;
	// RoutingSetDiffers[l] the fraction of positions whose sets differ.
	RoutingDisagree, RoutingSetDiffers []float64
}

// Probe samples n responses per prompt from s and rescores them with the
// training engine t (live routing, at the sampling temperature), the way
// the RL loop computes pi_old, in micro-batches of batchTokens.
func Probe(t train.Trainer, s Sampler, prompts [][]int32, n int, sp rollout.Sampling, batchTokens int) (*ProbeResult, error) {
	out, err := s.Generate(prompts, n, sp)
	if err != nil {
		return nil, err
	}
	moe := len(t.Config().MoELayers()) > 0
	samples := make([]*Sample, len(out))
	for i, o := range out {
		if o.Prompt < 0 || o.Prompt >= len(prompts) || len(o.Tokens) == 0 || len(o.LogProbs) != len(o.Tokens) {
			return nil, fmt.Errorf("rollout: sample %d (prompt %d) has %d tokens and %d log-probs", i, o.Prompt, len(o.Tokens), len(o.LogProbs))
		}
		samples[i] = &Sample{Prompt: &Prompt{Row: o.Prompt, IDs: prompts[o.Prompt]}, Response: o.Tokens, LogMu: o.LogProbs}
		if moe {
			if o.Routes == nil {
				return nil, fmt.Errorf("rollout: sample %d has no routes (MoE model)", i)
			}
			samples[i].Routes = o.Routes
		}
	}
	l := &Loop{
		R: &Recipe{Train: TrainSettings{MicroBatchTokens: batchTokens}, Rollout: RolloutSettings{Temperature: sp.Temperature},
			Algorithm: Algorithm{Replay: ReplayNone}},
		Trainer: t, moe: moe,
	}
	if err := l.piOld(samples); err != nil {
		return nil, err
	}
	res := &ProbeResult{Samples: len(samples)}
	logMu, logPi := make([][]float32, len(samples)), make([][]float32, len(samples))
	var mu, pi []*model.Routes
	for i, s := range samples {
		logMu[i], logPi[i] = s.LogMu, s.LogPiOld
		if moe {
			mu, pi = append(mu, s.Routes), append(pi, s.OldRoutes)
		}
	}
	res.Discrepancy = MeasureDiscrepancy(logMu, logPi)
	if moe {
		res.RoutingDisagree = RoutingDisagreement(mu, pi, nil)
		res.RoutingSetDiffers = SetsDiffer(mu, pi)
	}
	return res, nil
}

// SetsDiffer returns, per MoE layer, the fraction of positions at which a
// and b (same shapes) chose different expert sets (order ignored).
func SetsDiffer(a, b []*model.Routes) []float64 {
	if len(a) == 0 {
		return nil
	}
	out := make([]float64, a[0].Layers)
	positions := 0
	var x, y []int32
	for s := range a {
		for t := 0; t < a[s].Tokens; t++ {
			for l := range out {
				x, y = a[s].Slots(x, t, l), b[s].Slots(y, t, l)
				for _, v := range x {
					if !slices.Contains(y, v) {
						out[l]++
						break
					}
				}
			}
		}
		positions += a[s].Tokens
	}
	for l := range out {
		out[l] /= float64(max(positions, 1))
	}
	return out
}
