package rl

import (
	"fmt"
	"math"
)

// Training-inference correction modes (docs/method.md §4). Each reweighs or masks
// the tokens of a response by the discrepancy ratio rho_t = pi_old(y_t) /
// mu_old(y_t) (the same weights in the two engines), on top of any
// objective. MiniRL's own IS weight (min(pi_theta/mu_old, C)) already is a
// token-level truncation, so MiniRL takes CorrectionNone; its variant
// minirl-no-is, which has none, may take any of these.
const (
	CorrectionNone = "none"
	// TokenTIS multiplies each token by min(rho_t, Cap).
	TokenTIS = "token-tis"
	// TokenMIS multiplies each token by rho_t, or drops it (0) when rho_t
	// exceeds Cap.
	TokenMIS = "token-mis"
	// SeqTIS multiplies every token of a response by min(Π_t rho_t, Cap).
	SeqTIS = "seq-tis"
	// SeqMIS multiplies every token by Π_t rho_t, or drops the whole
	// response when the product exceeds Cap.
	SeqMIS = "seq-mis"
	// GeoMask drops a response whose geometric-mean ratio exp(mean_t log
	// rho_t) leaves [Low, High], and keeps the others with weight 1.
	GeoMask = "geo-mask"
)

// Correction is a training-inference correction with its thresholds.
type Correction struct {
	Mode      string
	Cap       float64 // TIS / MIS threshold C
	Low, High float64 // geometric-mean bounds (GeoMask)
}

// Validate reports an unknown mode or unusable thresholds, naming the
// setting.
func (c Correction) Validate() error {
	switch c.Mode {
	case "", CorrectionNone:
		return nil
	case TokenTIS, TokenMIS, SeqTIS, SeqMIS:
		if !(c.Cap > 0) || math.IsInf(c.Cap, 0) {
			return fmt.Errorf("correction %s needs a finite cap > 0 (got %g)", c.Mode, c.Cap)
		}
	case GeoMask:
		if !(c.Low > 0) || !(c.High >= c.Low) || math.IsInf(c.High, 0) {
			return fmt.Errorf("correction %s needs 0 < low <= high (got %g, %g)", c.Mode, c.Low, c.High)
		}
	default:
		return fmt.Errorf("unknown correction %q (want none, %s, %s, %s, %s or %s)", c.Mode, TokenTIS, TokenMIS, SeqTIS, SeqMIS, GeoMask)
	}
	return nil
}

// Apply multiplies coef (as an objective returned it for batch) by the
// correction's weights and records them in st (IS weight sums, min, max,
// truncated and masked counts). With CorrectionNone it changes nothing.
// Sequence products are taken in log space; the exponent is capped at 700
// so a wild sequence gives a huge, finite ratio.
func (c Correction) Apply(batch []Response, coef [][]float32, st *Stats) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Mode == "" || c.Mode == CorrectionNone {
		return nil
	}
	if err := checkLengths(batch); err != nil {
		return err
	}
	for i, r := range batch {
		n := len(r.LogPi)
		if len(coef[i]) != n {
			return fmt.Errorf("rl: correction: response %d has %d coefficients for %d tokens", i, len(coef[i]), n)
		}
		var logSeq float64
		for t := 0; t < n; t++ {
			logSeq += float64(r.LogPiOld[t]) - float64(r.LogMu[t])
		}
		for t := 0; t < n; t++ {
			rho := math.Exp(float64(r.LogPiOld[t]) - float64(r.LogMu[t]))
			var w float64
			switch c.Mode {
			case TokenTIS:
				w = rho
				if w > c.Cap {
					w = c.Cap
					st.Truncated++
				}
			case TokenMIS:
				w = rho
				if w > c.Cap {
					w = 0
					st.Masked++
				}
			case SeqTIS:
				w = math.Exp(min(logSeq, 700))
				if w > c.Cap {
					w = c.Cap
					st.Truncated++
				}
			case SeqMIS:
				w = math.Exp(min(logSeq, 700))
				if w > c.Cap {
					w = 0
					st.Masked++
				}
			case GeoMask:
				g := 1.0
				if n > 0 {
					g = math.Exp(logSeq / float64(n))
				}
				w = 1
				if g < c.Low || g > c.High {
					w = 0
					st.Masked++
				}
			}
			st.weight(w)
			coef[i][t] = float32(float64(coef[i][t]) * w)
		}
	}
	return nil
}

// KLPenalty adds the gradient of Coef · k3(pi_theta, ref) to coef, where
// k3 = exp(l) - l - 1 with l = log ref(y_t) - log pi_theta(y_t) is the
// non-negative KL estimator GRPO uses against a frozen reference model;
// norm[i] is response i's aggregation multiplier (see Norms). Minimising
// Coef·Σ norm·k3 gives d/d log pi_theta = Coef·norm·(1 - exp(l)). It
// returns Σ_t k3 over the batch's tokens (for the metric).
func KLPenalty(batch []Response, logRef [][]float32, norm []float64, coefKL float64, coef [][]float32) (float64, error) {
	var sum float64
	for i, r := range batch {
		if len(logRef[i]) != len(r.LogPi) || len(coef[i]) != len(r.LogPi) {
			return 0, fmt.Errorf("rl: KL: response %d has %d reference log-probs and %d coefficients for %d tokens", i, len(logRef[i]), len(coef[i]), len(r.LogPi))
		}
		for t := range r.LogPi {
			l := float64(logRef[i][t]) - float64(r.LogPi[t])
			e := math.Exp(min(l, 700))
			sum += e - l - 1
			coef[i][t] += float32(coefKL * norm[i] * (1 - e))
		}
	}
	return sum, nil
}
