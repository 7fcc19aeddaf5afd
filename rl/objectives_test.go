package rl

import (
	"math"
	"testing"
)

// One response of two tokens and one of one token, hand-computed.
// Response 0, A = 1: r_0 = 0.5/0.4 = 1.25, r_1 = 0.6/0.4 = 1.5.
// Response 1, A = -0.5: r_0 = 0.3/0.5 = 0.6.
func objBatch() []Response {
	return []Response{
		{Advantage: 1, LogMu: lp(0.4, 0.4), LogPiOld: lp(0.4, 0.4), LogPi: lp(0.5, 0.6)},
		{Advantage: -0.5, LogMu: lp(0.5), LogPiOld: lp(0.5), LogPi: lp(0.3)},
	}
}

func near32(t *testing.T, name string, got [][]float32, want [][]float64) {
	t.Helper()
	for i := range want {
		for j := range want[i] {
			if math.Abs(float64(got[i][j])-want[i][j]) > 1e-5 {
				t.Fatalf("%s: %v, want %v", name, got, want)
			}
		}
	}
}

func TestPPOFamilyHand(t *testing.T) {
	b := objBatch()
	// GRPO (eps 0.2): r_0 = 1.25 > 1.2 with A > 0: clipped; r_1 too;
	// response 1: r = 0.6 < 0.8 with A < 0: clipped. All zero.
	c, st, err := GRPO().Coefficients(b, Totals{})
	if err != nil {
		t.Fatal(err)
	}
	near32(t, "grpo", c, [][]float64{{0, 0}, {0}})
	if st.ClipPos != 2 || st.ClipNeg != 1 {
		t.Fatalf("grpo stats %+v", st)
	}
	// DAPO (clip-higher 0.28): r_0 = 1.25 kept: c = -(1/T)·r·A = -1.25/3.
	c, _, _ = DAPO().Coefficients(b, Totals{})
	near32(t, "dapo", c, [][]float64{{-1.25 / 3, 0}, {0}})
	// Dr. GRPO with budget 10: -(1/(B·10))·r·A where kept (none at 0.2).
	wide := DrGRPO(10)
	wide.EpsHigh, wide.EpsLow = 1, 0.5
	c, _, _ = wide.Coefficients(b, Totals{})
	near32(t, "dr-grpo", c, [][]float64{{-1.25 / 20, -1.5 / 20}, {0.6 * 0.5 / 20}})
	// Seq-mean-token-mean with wide clips: response 0 has 2 tokens.
	g := GRPO()
	g.EpsHigh, g.EpsLow = 1, 0.5
	c, _, _ = g.Coefficients(b, Totals{})
	near32(t, "grpo wide", c, [][]float64{{-1.25 / 4, -1.5 / 4}, {0.6 * 0.5 / 2}})
	// GSPO: s_0 = sqrt(1.25·1.5) ≈ 1.369 > 1.0004: masked; response 1
	// s = 0.6 < 0.9997 with A < 0: masked.
	c, _, _ = GSPO().Coefficients(b, Totals{})
	near32(t, "gspo", c, [][]float64{{0, 0}, {0}})
	gs := GSPO()
	gs.EpsHigh, gs.EpsLow = 1, 0.5
	c, _, _ = gs.Coefficients(b, Totals{})
	s0 := math.Sqrt(1.25 * 1.5)
	near32(t, "gspo wide", c, [][]float64{{-0.5 * s0 / 2, -0.5 * s0 / 2}, {0.5 * 0.6 * 0.5}})
	if _, _, err := (PPOClip{Aggregation: "median"}).Coefficients(b, Totals{}); err == nil {
		t.Fatal("unknown aggregation accepted")
	}
	if _, _, err := DrGRPO(0).Coefficients(b, Totals{}); err == nil {
		t.Fatal("Dr. GRPO without a budget accepted")
	}
}

// CISPO never masks: the clipped ratio weighs every token.
func TestCISPOHand(t *testing.T) {
	c, st, err := CISPO{EpsLow: 0.2, EpsHigh: 0.28}.Coefficients(objBatch(), Totals{})
	if err != nil {
		t.Fatal(err)
	}
	// weights: 1.25, min(1.5, 1.28) = 1.28, max(0.6, 0.8) = 0.8; T = 3.
	near32(t, "cispo", c, [][]float64{{-1.25 / 3, -1.28 / 3}, {0.8 * 0.5 / 3}})
	if st.ClipPos != 0 || st.ClipNeg != 0 || st.Tokens != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// On-policy, every PPO-family objective is the policy gradient with its
// own normalisation: r = 1, nothing clipped.
func TestObjectivesOnPolicy(t *testing.T) {
	b := []Response{{Advantage: 2, LogMu: lp(0.3, 0.5), LogPiOld: lp(0.3, 0.5), LogPi: lp(0.3, 0.5)}}
	for name, o := range map[string]Objective{"grpo": GRPO(), "dapo": DAPO(), "gspo": GSPO(), "ppo": PPO(), "cispo": CISPO{0.2, 0.2}, "minirl": DefaultMiniRL()} {
		c, _, err := o.Coefficients(b, Totals{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range c[0] {
			if !(v < 0) {
				t.Fatalf("%s: coefficient %v should be negative (ascending J with A > 0)", name, v)
			}
		}
	}
}
