package rl

import (
	"fmt"
	"math"
)

// Advantage estimators (SPEC.md §3-4): how the rewards of a group of G
// responses to one prompt become per-response advantages.
const (
	// GroupMean is MiniRL's: A_i = R_i - mean_j R_j, no division by the
	// standard deviation.
	GroupMean = "group-mean"
	// GroupMeanStd is GRPO's: (R_i - mean) / (std + 1e-4), with the
	// unbiased standard deviation (as TRL computes it).
	GroupMeanStd = "group-mean-std"
	// RLOO is the leave-one-out baseline: A_i = R_i - mean_{j != i} R_j.
	RLOO = "rloo"
)

// Advantages returns one advantage per reward; rewards holds consecutive
// groups of size group (a prompt's responses).
func Advantages(rewards []float64, group int, kind string) ([]float64, error) {
	if group < 1 || len(rewards)%group != 0 {
		return nil, fmt.Errorf("rl: %d rewards do not form groups of %d", len(rewards), group)
	}
	out := make([]float64, len(rewards))
	for g := 0; g < len(rewards); g += group {
		r := rewards[g : g+group]
		var mean float64
		for _, v := range r {
			mean += v
		}
		mean /= float64(group)
		switch kind {
		case GroupMean, "":
			for i, v := range r {
				out[g+i] = v - mean
			}
		case GroupMeanStd:
			var ss float64
			for _, v := range r {
				ss += (v - mean) * (v - mean)
			}
			std := 0.0
			if group > 1 {
				std = math.Sqrt(ss / float64(group-1))
			}
			for i, v := range r {
				out[g+i] = (v - mean) / (std + 1e-4)
			}
		case RLOO:
			if group < 2 {
				return nil, fmt.Errorf("rl: RLOO needs groups of at least 2")
			}
			sum := mean * float64(group)
			for i, v := range r {
				out[g+i] = v - (sum-v)/float64(group-1)
			}
		default:
			return nil, fmt.Errorf("rl: unknown advantage estimator %q (want %s, %s or %s)", kind, GroupMean, GroupMeanStd, RLOO)
		}
	}
	return out, nil
}

// Response is one sampled response's per-token log-probabilities of its
// own tokens under the three policies of SPEC.md §1, and its advantage.
type Response struct {
	Advantage float64
	LogMu     []float32 // mu_old: the rollout engine when it sampled
	LogPiOld  []float32 // pi_old: the training engine at theta_old
	LogPi     []float32 // pi_theta: the training engine now
}

// MiniRL variants (SPEC.md §3-4).
const (
	MiniRLDefault = "minirl"         // w = min(sg[pi_theta/mu_old], C), clipping mask
	MiniRLNoIS    = "minirl-no-is"   // w = pi_theta/pi_old: no training-inference correction
	MiniRLLenNorm = "minirl-lennorm" // each response's token sum divided by its length
	MiniRLOldIS   = "minirl-old-is"  // w = min(pi_old/mu_old, C): discrepancy only
	MiniRLNoClip  = "no-clip"        // M = 1
)

// MiniRL is the paper's objective,
//
//	J = (1/B) Σ_i Σ_t M_i,t · w_i,t · A_i · log pi_theta(y_i,t)
//
// over the B responses of a mini-batch, with the IS weight w and the
// decoupled clipping mask M (0 when A > 0 and r > 1+EpsHigh or A < 0 and
// r < 1-EpsLow, r = pi_theta/pi_old).
type MiniRL struct {
	Variant         string
	EpsLow, EpsHigh float64 // paper: 0.2, 0.27
	ISCap           float64 // C, paper: 5
}

// DefaultMiniRL returns the paper's settings.
func DefaultMiniRL() MiniRL {
	return MiniRL{Variant: MiniRLDefault, EpsLow: 0.2, EpsHigh: 0.27, ISCap: 5}
}

// Stats are the per-step measures of SPEC.md §5 that the objective sees.
type Stats struct {
	Tokens               int
	ISMean, ISMin, ISMax float64 // the IS weights w used (after truncation)
	ISTruncated          float64 // fraction of tokens whose weight hit the cap
	ESS                  float64 // effective sample size (Σw)² / (N·Σw²), in (0, 1]
	ClipPos, ClipNeg     float64 // fraction of tokens masked with A > 0, A < 0
	Staleness            float64 // mean |log pi_theta - log pi_old|
}

// Coefficients returns, per response and token, the coefficient c with
// which the training engine backpropagates Σ c·log pi_theta, so that
// gradient descent on it ascends J: c = -∂J/∂log pi_theta (w is a
// stop-gradient weight). It also returns the statistics of the step.
func (m MiniRL) Coefficients(batch []Response) ([][]float32, Stats, error) {
	switch m.Variant {
	case MiniRLDefault, MiniRLNoIS, MiniRLLenNorm, MiniRLOldIS, MiniRLNoClip:
	case "":
		m.Variant = MiniRLDefault
	default:
		return nil, Stats{}, fmt.Errorf("rl: unknown MiniRL variant %q", m.Variant)
	}
	if !(m.ISCap > 0) || m.EpsLow < 0 || m.EpsHigh < 0 {
		return nil, Stats{}, fmt.Errorf("rl: MiniRL needs ISCap > 0 and non-negative clip ranges (got %g, %g, %g)", m.ISCap, m.EpsLow, m.EpsHigh)
	}
	st := Stats{ISMin: math.Inf(1), ISMax: math.Inf(-1)}
	coef := make([][]float32, len(batch))
	var sumW, sumW2 float64
	scale := 1 / float64(max(len(batch), 1))
	for i, r := range batch {
		n := len(r.LogPi)
		if len(r.LogMu) != n || len(r.LogPiOld) != n {
			return nil, Stats{}, fmt.Errorf("rl: response %d has %d / %d / %d log-probs (mu_old, pi_old, pi_theta)", i, len(r.LogMu), len(r.LogPiOld), n)
		}
		norm := scale
		if m.Variant == MiniRLLenNorm && n > 0 {
			norm /= float64(n)
		}
		c := make([]float32, n)
		a := r.Advantage
		for t := 0; t < n; t++ {
			lr := float64(r.LogPi[t]) - float64(r.LogPiOld[t]) // log of the staleness ratio
			ratio := math.Exp(lr)
			st.Staleness += math.Abs(lr)
			mask := 1.0
			if m.Variant != MiniRLNoClip {
				if a > 0 && ratio > 1+m.EpsHigh {
					mask = 0
					st.ClipPos++
				} else if a < 0 && ratio < 1-m.EpsLow {
					mask = 0
					st.ClipNeg++
				}
			}
			var w float64
			switch m.Variant {
			case MiniRLNoIS:
				w = ratio
			case MiniRLOldIS:
				w = math.Exp(float64(r.LogPiOld[t]) - float64(r.LogMu[t]))
			default:
				w = math.Exp(float64(r.LogPi[t]) - float64(r.LogMu[t]))
			}
			if m.Variant != MiniRLNoIS && w > m.ISCap {
				w = m.ISCap
				st.ISTruncated++
			}
			st.ISMin, st.ISMax = math.Min(st.ISMin, w), math.Max(st.ISMax, w)
			sumW += w
			sumW2 += w * w
			c[t] = float32(-norm * mask * w * a)
		}
		st.Tokens += n
		coef[i] = c
	}
	if st.Tokens > 0 {
		n := float64(st.Tokens)
		st.ISMean = sumW / n
		st.ISTruncated /= n
		st.ClipPos /= n
		st.ClipNeg /= n
		st.Staleness /= n
		if sumW2 > 0 {
			st.ESS = sumW * sumW / (n * sumW2)
		}
	} else {
		st.ISMin, st.ISMax = 0, 0
	}
	return coef, st, nil
}
