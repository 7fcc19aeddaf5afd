package rl

import (
	"fmt"
	"math"
)

// Advantage estimators (docs/method.md §3-4): how the rewards of a group of G
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
// own tokens under the three policies of docs/method.md §1, and its advantage.
type Response struct {
	Advantage float64
	// TokenAdvantages, when set, gives every token its own advantage in
	// place of Advantage (GSPO-token and per-token shaping).
	TokenAdvantages []float64
	LogMu           []float32 // mu_old: the rollout engine when it sampled
	LogPiOld        []float32 // pi_old: the training engine at theta_old
	LogPi           []float32 // pi_theta: the training engine now
}

// adv is token t's advantage.
func (r *Response) adv(t int) float64 {
	if r.TokenAdvantages != nil {
		return r.TokenAdvantages[t]
	}
	return r.Advantage
}

// MiniRL variants (docs/method.md §3-4).
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

// Totals are the sizes of the whole mini-batch an objective normalises
// by. A mini-batch is cut into micro-batches (whole responses) to bound
// memory; each micro-batch's coefficients must be those it has inside the
// whole mini-batch, so the normalisers come from here, not from the slice
// passed in. The zero value means "the slice is the whole mini-batch".
type Totals struct {
	Responses, Tokens int
}

// of returns t, or batch's own totals when t is zero.
func (t Totals) of(batch []Response) Totals {
	if t.Responses > 0 {
		return t
	}
	t = Totals{Responses: len(batch)}
	for _, r := range batch {
		t.Tokens += len(r.LogPi)
	}
	return t
}

// Stats are the per-token measures of docs/method.md §6 that the objective sees,
// kept as sums and counts so that the statistics of micro-batches add up
// (Add) to those of their mini-batch.
type Stats struct {
	Tokens       int
	ISSum, ISSq  float64 // Σw and Σw² of the IS weights used (after truncation)
	ISMin, ISMax float64 // over the tokens (0 when Tokens is 0)
	Truncated    int     // tokens whose IS weight hit the cap
	Masked       int     // tokens zeroed by a training-inference correction (MIS, rejection)
	ClipPos      int     // tokens clipped (masked) with A > 0
	ClipNeg      int     // tokens clipped with A < 0
	StaleSum     float64 // Σ|log pi_theta - log pi_old|
	weights      int     // weights recorded into ISSum (min/max valid when > 0)
}

// Add accumulates o into s.
func (s *Stats) Add(o Stats) {
	if o.weights > 0 {
		if s.weights == 0 {
			s.ISMin, s.ISMax = o.ISMin, o.ISMax
		} else {
			s.ISMin, s.ISMax = math.Min(s.ISMin, o.ISMin), math.Max(s.ISMax, o.ISMax)
		}
		s.weights += o.weights
	}
	s.Tokens += o.Tokens
	s.ISSum += o.ISSum
	s.ISSq += o.ISSq
	s.Truncated += o.Truncated
	s.Masked += o.Masked
	s.ClipPos += o.ClipPos
	s.ClipNeg += o.ClipNeg
	s.StaleSum += o.StaleSum
}

// weight records one token's IS weight.
func (s *Stats) weight(w float64) {
	if s.weights == 0 {
		s.ISMin, s.ISMax = w, w
	}
	s.weights++
	s.ISMin, s.ISMax = math.Min(s.ISMin, w), math.Max(s.ISMax, w)
	s.ISSum += w
	s.ISSq += w * w
}

func frac(n int, d int) float64 {
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

// HasWeights reports whether any IS weight was recorded (objectives and
// corrections without one record none).
func (s Stats) HasWeights() bool { return s.weights > 0 }

// ISMean is the mean IS weight.
func (s Stats) ISMean() float64 { return safeDiv(s.ISSum, float64(s.weights)) }

// ESS is the effective sample size of the IS weights as a fraction of the
// tokens, (Σw)² / (N·Σw²), in (0, 1]; 1 when every weight is equal.
func (s Stats) ESS() float64 { return safeDiv(s.ISSum*s.ISSum, float64(s.weights)*s.ISSq) }

// TruncatedFrac, MaskedFrac, ClipPosFrac and ClipNegFrac are fractions of
// the tokens.
func (s Stats) TruncatedFrac() float64 { return frac(s.Truncated, s.Tokens) }
func (s Stats) MaskedFrac() float64    { return frac(s.Masked, s.Tokens) }
func (s Stats) ClipPosFrac() float64   { return frac(s.ClipPos, s.Tokens) }
func (s Stats) ClipNegFrac() float64   { return frac(s.ClipNeg, s.Tokens) }

// Staleness is the mean |log pi_theta - log pi_old| over the tokens.
func (s Stats) Staleness() float64 { return safeDiv(s.StaleSum, float64(s.Tokens)) }

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Coefficients returns, per response and token, the coefficient c with
// which the training engine backpropagates Σ c·log pi_theta, so that
// gradient descent on it ascends J: c = -∂J/∂log pi_theta (w is a
// stop-gradient weight). It also returns the statistics of the batch. tot
// gives the mini-batch's size when batch is one micro-batch of it.
func (m MiniRL) Coefficients(batch []Response, tot Totals) ([][]float32, Stats, error) {
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
	if err := checkLengths(batch); err != nil {
		return nil, Stats{}, err
	}
	var st Stats
	coef := make([][]float32, len(batch))
	scale := 1 / float64(max(tot.of(batch).Responses, 1))
	for i, r := range batch {
		n := len(r.LogPi)
		norm := scale
		if m.Variant == MiniRLLenNorm && n > 0 {
			norm /= float64(n)
		}
		c := make([]float32, n)
		for t := 0; t < n; t++ {
			a := r.adv(t)
			lr := float64(r.LogPi[t]) - float64(r.LogPiOld[t]) // log of the staleness ratio
			ratio := math.Exp(lr)
			st.StaleSum += math.Abs(lr)
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
				st.Truncated++
			}
			if m.Variant != MiniRLNoIS { // r is a staleness ratio, not an IS correction
				st.weight(w)
			}
			c[t] = float32(-norm * mask * w * a)
		}
		st.Tokens += n
		coef[i] = c
	}
	return coef, st, nil
}
