// Package rl is keel's reinforcement learning (docs/method.md): advantages,
// objectives, training-inference corrections and the measures that say
// whether the token-level surrogate is valid — pure functions over arrays,
// tested on hand-computed values — and the RL loop that runs them over the
// two engines (Loop, Run), with its recipes, checkpoints and metrics.
package rl

import (
	"math"

	"github.com/keel-rl/keel/model"
)

// Discrepancy summarises log mu_old (the rollout engine's log-probabilities
// of the sampled tokens) against log pi_old (the training engine's, same
// weights, same tokens), docs/method.md §6.
type Discrepancy struct {
	Sequences, Tokens int
	// K1 = mean_t (log mu - log pi_old) and K3 = mean_t (exp(l) - l - 1)
	// with l = log pi_old - log mu: estimators of KL(mu || pi_old).
	K1, K3 float64
	// MeanAbs and MaxAbs are the mean and max of |log mu - log pi_old|.
	MeanAbs, MaxAbs float64
	// Above01 and Above1 are the fractions of tokens with |delta log p|
	// above 0.1 and 1.0.
	Above01, Above1 float64
	// PPLGap = exp(-mean log mu) - exp(-mean log pi_old), the perplexity
	// gap over all tokens.
	PPLGap float64
	// SurrogateGap is the mean over sequences of |prod_t(1+d_t) - 1 - sum_t
	// d_t| with d_t = pi_old/mu - 1: how far the first-order (token-level)
	// surrogate is from the exact sequence ratio. The log of the product is
	// capped at 700 so a wild sequence gives a huge, finite gap.
	SurrogateGap float64
}

// MeasureDiscrepancy computes the discrepancy between logMu[s][t] and
// logPi[s][t] (the same shape: per sequence, per sampled token).
func MeasureDiscrepancy(logMu, logPi [][]float32) Discrepancy {
	var d Discrepancy
	var sumMu, sumPi float64
	for s := range logMu {
		mu, pi := logMu[s], logPi[s]
		var logRatio, first float64
		for t := range mu {
			l := float64(pi[t]) - float64(mu[t])
			d.K1 += -l
			d.K3 += math.Expm1(l) - l
			a := math.Abs(l)
			d.MeanAbs += a
			d.MaxAbs = max(d.MaxAbs, a)
			if a > 0.1 {
				d.Above01++
			}
			if a > 1 {
				d.Above1++
			}
			sumMu += float64(mu[t])
			sumPi += float64(pi[t])
			logRatio += l
			first += math.Expm1(l)
		}
		d.Tokens += len(mu)
		d.Sequences++
		d.SurrogateGap += math.Abs(math.Expm1(min(logRatio, 700)) - first)
	}
	if d.Tokens > 0 {
		n := float64(d.Tokens)
		d.K1 /= n
		d.K3 /= n
		d.MeanAbs /= n
		d.Above01 /= n
		d.Above1 /= n
		d.PPLGap = math.Exp(-sumMu/n) - math.Exp(-sumPi/n)
	}
	if d.Sequences > 0 {
		d.SurrogateGap /= float64(d.Sequences)
	}
	return d
}

// RoutingDisagreement returns, per MoE layer, the fraction of (position,
// slot) experts of a that are not among b's experts at the same position
// and layer (set difference: the order of the top-k does not matter),
// over the first n[s] positions of each sequence s (all positions when n
// is nil). a and b must have the same shapes.
func RoutingDisagreement(a, b []*model.Routes, n []int) []float64 {
	if len(a) == 0 || a[0] == nil {
		return nil
	}
	layers, k := a[0].Layers, a[0].K
	diff := make([]float64, layers)
	var count float64
	ra, rb := make([]int32, k), make([]int32, k)
	for s := range a {
		T := a[s].Tokens
		if n != nil {
			T = min(T, n[s])
		}
		for t := 0; t < T; t++ {
			for l := 0; l < layers; l++ {
				ra, rb = a[s].Slots(ra, t, l), b[s].Slots(rb, t, l)
				for _, x := range ra {
					found := false
					for _, y := range rb {
						if x == y {
							found = true
							break
						}
					}
					if !found {
						diff[l]++
					}
				}
			}
			count += float64(k)
		}
	}
	if count > 0 {
		for l := range diff {
			diff[l] /= count
		}
	}
	return diff
}
