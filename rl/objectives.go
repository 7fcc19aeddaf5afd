package rl

import (
	"fmt"
	"math"
)

// Objective turns a mini-batch of responses into the per-token
// coefficients c with which the training engine backpropagates
// Σ c·log pi_theta: c = -∂J/∂log pi_theta, so gradient descent ascends J.
// tot gives the sizes of the whole mini-batch when batch is one
// micro-batch of it (the zero Totals: batch is the mini-batch).
type Objective interface {
	Coefficients(batch []Response, tot Totals) ([][]float32, Stats, error)
}

// Loss aggregations (docs/method.md §4): how token terms are summed and
// normalised across a mini-batch of B responses with T tokens in all.
const (
	SeqSumMean       = "seq-sum-mean"        // Σ_t per response, mean over responses (MiniRL)
	TokenMean        = "token-mean"          // Σ over all tokens / T (DAPO, CISPO)
	SeqMeanTokenMean = "seq-mean-token-mean" // mean over a response's tokens, then over responses (GRPO)
	ConstantNorm     = "constant-normalised" // Σ / (B · budget) (Dr. GRPO)
)

// Norms returns each response's multiplier of its token terms under an
// aggregation, with B and T taken from tot (the whole mini-batch).
func Norms(batch []Response, agg string, budget int, tot Totals) ([]float64, error) {
	out := make([]float64, len(batch))
	tot = tot.of(batch)
	B := float64(max(tot.Responses, 1))
	T := tot.Tokens
	for i, r := range batch {
		switch agg {
		case SeqSumMean:
			out[i] = 1 / B
		case TokenMean:
			out[i] = 1 / float64(max(T, 1))
		case SeqMeanTokenMean:
			out[i] = 1 / (B * float64(max(len(r.LogPi), 1)))
		case ConstantNorm:
			if budget <= 0 {
				return nil, fmt.Errorf("rl: %s needs a positive budget", ConstantNorm)
			}
			out[i] = 1 / (B * float64(budget))
		default:
			return nil, fmt.Errorf("rl: unknown aggregation %q", agg)
		}
	}
	return out, nil
}

// PPOClip is the clipped surrogate min(r·A, clip(r, 1-EpsLow, 1+EpsHigh)·A)
// per token with r = pi_theta/pi_old, or, with Sequence set, GSPO's
// sequence ratio s = (pi_theta(y)/pi_old(y))^(1/|y|) in place of r for
// every token of the response. Its gradient w.r.t. log pi_theta is r·A
// (s·A/|y| for GSPO) where the unclipped term is the minimum, 0 where the
// clipped constant is. The named settings below are GRPO, Dr. GRPO, DAPO,
// GSPO and classic PPO.
type PPOClip struct {
	EpsLow, EpsHigh float64
	Aggregation     string
	Budget          int  // ConstantNorm only: the generation budget
	Sequence        bool // GSPO: one sequence-level ratio per response
}

// GRPO returns GRPO's surrogate (use it with GroupMeanStd advantages):
// mean over each response's tokens, then over responses, eps 0.2. The
// optional KL to a reference model is not part of it.
func GRPO() PPOClip { return PPOClip{EpsLow: 0.2, EpsHigh: 0.2, Aggregation: SeqMeanTokenMean} }

// DrGRPO returns Dr. GRPO: GRPO without the 1/|y| and without the std
// (use GroupMean advantages), token sums divided by the generation budget.
func DrGRPO(budget int) PPOClip {
	return PPOClip{EpsLow: 0.2, EpsHigh: 0.2, Aggregation: ConstantNorm, Budget: budget}
}

// DAPO returns DAPO's token-level part: token mean over the batch with
// clip-higher (0.2 / 0.28). Dynamic sampling and the overlong penalty act
// on the data and the rewards, before the objective.
func DAPO() PPOClip { return PPOClip{EpsLow: 0.2, EpsHigh: 0.28, Aggregation: TokenMean} }

// GSPO returns GSPO: the length-normalised sequence ratio, clipped at
// 3e-4 / 4e-4, averaged over responses.
func GSPO() PPOClip {
	return PPOClip{EpsLow: 3e-4, EpsHigh: 4e-4, Aggregation: SeqSumMean, Sequence: true}
}

// PPO returns the classic per-token clipped surrogate, token mean, 0.2.
func PPO() PPOClip { return PPOClip{EpsLow: 0.2, EpsHigh: 0.2, Aggregation: TokenMean} }

// Coefficients implements Objective.
func (p PPOClip) Coefficients(batch []Response, tot Totals) ([][]float32, Stats, error) {
	if p.EpsLow < 0 || p.EpsHigh < 0 {
		return nil, Stats{}, fmt.Errorf("rl: clip ranges must be non-negative (got %g, %g)", p.EpsLow, p.EpsHigh)
	}
	agg := p.Aggregation
	if agg == "" {
		agg = TokenMean
	}
	if p.Sequence && agg != SeqSumMean {
		return nil, Stats{}, fmt.Errorf("rl: a sequence-level ratio is averaged over responses (%s)", SeqSumMean)
	}
	nm, err := Norms(batch, agg, p.Budget, tot)
	if err != nil {
		return nil, Stats{}, err
	}
	if err := checkLengths(batch); err != nil {
		return nil, Stats{}, err
	}
	var st Stats
	coef := make([][]float32, len(batch))
	for i, r := range batch {
		n := len(r.LogPi)
		c := make([]float32, n)
		seqRatio := 0.0
		if p.Sequence && n > 0 {
			var s float64
			for t := range r.LogPi {
				s += float64(r.LogPi[t]) - float64(r.LogPiOld[t])
			}
			seqRatio = math.Exp(s / float64(n))
		}
		for t := 0; t < n; t++ {
			a := r.adv(t)
			lr := float64(r.LogPi[t]) - float64(r.LogPiOld[t])
			st.StaleSum += math.Abs(lr)
			ratio, grad := math.Exp(lr), math.Exp(lr)
			if p.Sequence {
				ratio, grad = seqRatio, seqRatio/float64(n)
			}
			switch {
			case a > 0 && ratio > 1+p.EpsHigh:
				st.ClipPos++
			case a < 0 && ratio < 1-p.EpsLow:
				st.ClipNeg++
			default:
				c[t] = float32(-nm[i] * grad * a)
			}
		}
		st.Tokens += n
		coef[i] = c
	}
	return coef, st, nil
}

// CISPO is (1/T) Σ sg[clip(r, 1-EpsLow, 1+EpsHigh)]·A·log pi_theta over the
// T tokens of the batch: the clipped ratio is a stop-gradient weight, so
// no token is ever masked.
type CISPO struct {
	EpsLow, EpsHigh float64
}

// Coefficients implements Objective.
func (p CISPO) Coefficients(batch []Response, tot Totals) ([][]float32, Stats, error) {
	if err := checkLengths(batch); err != nil {
		return nil, Stats{}, err
	}
	nm, _ := Norms(batch, TokenMean, 0, tot)
	var st Stats
	coef := make([][]float32, len(batch))
	for i, r := range batch {
		c := make([]float32, len(r.LogPi))
		for t := range c {
			lr := float64(r.LogPi[t]) - float64(r.LogPiOld[t])
			st.StaleSum += math.Abs(lr)
			w := math.Min(math.Max(math.Exp(lr), 1-p.EpsLow), 1+p.EpsHigh)
			c[t] = float32(-nm[i] * w * r.adv(t))
		}
		st.Tokens += len(c)
		coef[i] = c
	}
	return coef, st, nil
}

func checkLengths(batch []Response) error {
	for i, r := range batch {
		if len(r.LogMu) != len(r.LogPi) || len(r.LogPiOld) != len(r.LogPi) {
			return fmt.Errorf("rl: response %d has %d / %d / %d log-probs (mu_old, pi_old, pi_theta)", i, len(r.LogMu), len(r.LogPiOld), len(r.LogPi))
		}
		if r.TokenAdvantages != nil && len(r.TokenAdvantages) != len(r.LogPi) {
			return fmt.Errorf("rl: response %d has %d token advantages for %d tokens", i, len(r.TokenAdvantages), len(r.LogPi))
		}
	}
	return nil
}

// GSPOToken returns GSPO-token: the token ratio s_i,t = sg[s_i]·pi_theta(y_t)
// / sg[pi_theta(y_t)], which has GSPO's value and gradient per token but
// lets every token carry its own advantage (Response.TokenAdvantages).
// With one advantage per response it is GSPO exactly.
func GSPOToken() PPOClip { return GSPO() }
