package rl

import (
	"math"
	"testing"
)

// One response of two tokens with discrepancy ratios rho = pi_old/mu =
// 0.4/0.2 = 2 and 0.8/0.1 = 8 (sequence product 16, geometric mean 4),
// every coefficient 1 before the correction, cap 5.
func TestCorrectionsHand(t *testing.T) {
	batch := []Response{{Advantage: 1, LogMu: lp(0.2, 0.1), LogPiOld: lp(0.4, 0.8), LogPi: lp(0.4, 0.8)}}
	cases := []struct {
		c               Correction
		want            []float64
		trunc, masked   int
		isMin, isMax    float64
		wantErrOnCreate bool
	}{
		{c: Correction{Mode: TokenTIS, Cap: 5}, want: []float64{2, 5}, trunc: 1, isMin: 2, isMax: 5},
		{c: Correction{Mode: TokenMIS, Cap: 5}, want: []float64{2, 0}, masked: 1, isMin: 0, isMax: 2},
		{c: Correction{Mode: SeqTIS, Cap: 5}, want: []float64{5, 5}, trunc: 2, isMin: 5, isMax: 5},
		{c: Correction{Mode: SeqMIS, Cap: 5}, want: []float64{0, 0}, masked: 2},
		{c: Correction{Mode: SeqMIS, Cap: 20}, want: []float64{16, 16}, isMin: 16, isMax: 16},
		{c: Correction{Mode: GeoMask, Low: 0.5, High: 2}, want: []float64{0, 0}, masked: 2},
		{c: Correction{Mode: GeoMask, Low: 0.5, High: 5}, want: []float64{1, 1}, isMin: 1, isMax: 1},
		{c: Correction{Mode: CorrectionNone}, want: []float64{1, 1}},
	}
	for _, tc := range cases {
		coef := [][]float32{{1, 1}}
		var st Stats
		if err := tc.c.Apply(batch, coef, &st); err != nil {
			t.Fatalf("%+v: %v", tc.c, err)
		}
		for i, w := range tc.want {
			if math.Abs(float64(coef[0][i])-w) > 1e-4 {
				t.Fatalf("%+v: coefficients %v, want %v", tc.c, coef[0], tc.want)
			}
		}
		if st.Truncated != tc.trunc || st.Masked != tc.masked {
			t.Fatalf("%+v: truncated %d masked %d, want %d %d", tc.c, st.Truncated, st.Masked, tc.trunc, tc.masked)
		}
		if tc.c.Mode != CorrectionNone && (math.Abs(st.ISMin-tc.isMin) > 1e-4 || math.Abs(st.ISMax-tc.isMax) > 1e-4) {
			t.Fatalf("%+v: IS min %v max %v, want %v %v", tc.c, st.ISMin, st.ISMax, tc.isMin, tc.isMax)
		}
	}
	for _, bad := range []Correction{{Mode: TokenTIS}, {Mode: GeoMask, Low: 2, High: 1}, {Mode: "tis"}, {Mode: SeqMIS, Cap: math.Inf(1)}} {
		if err := bad.Validate(); err == nil {
			t.Fatalf("%+v accepted", bad)
		}
	}
}

// k3 against a reference: l = log(0.5/0.25) = ln 2, k3 = 2 - ln 2 - 1; the
// coefficient gains coefKL·norm·(1 - 2).
func TestKLPenaltyHand(t *testing.T) {
	batch := []Response{{LogMu: lp(0.25), LogPiOld: lp(0.25), LogPi: lp(0.25)}}
	coef := [][]float32{{0.5}}
	k3, err := KLPenalty(batch, [][]float32{lp(0.5)}, []float64{0.5}, 0.1, coef)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(k3-(1-math.Ln2)) > 1e-6 || math.Abs(float64(coef[0][0])-(0.5-0.05)) > 1e-6 {
		t.Fatalf("k3 %v coef %v", k3, coef)
	}
}

// The statistics of two micro-batches add up to those of the whole, and
// their coefficients are the whole's when given its totals.
func TestMicroBatchesAddUp(t *testing.T) {
	b := []Response{
		{Advantage: 1, LogMu: lp(0.25, 0.1), LogPiOld: lp(0.4, 0.4), LogPi: lp(0.5, 0.6)},
		{Advantage: -0.5, LogMu: lp(0.3), LogPiOld: lp(0.5), LogPi: lp(0.3)},
		{Advantage: 0.5, LogMu: lp(0.5, 0.5, 0.9), LogPiOld: lp(0.5, 0.6, 0.9), LogPi: lp(0.55, 0.6, 0.7)},
	}
	tot := Totals{Responses: 3, Tokens: 6}
	for name, o := range map[string]Objective{"minirl": DefaultMiniRL(), "dapo": DAPO(), "grpo": GRPO(), "cispo": CISPO{0.2, 0.28}, "gspo": GSPO()} {
		whole, ws, err := o.Coefficients(b, Totals{})
		if err != nil {
			t.Fatal(err)
		}
		c1, s1, _ := o.Coefficients(b[:1], tot)
		c2, s2, _ := o.Coefficients(b[1:], tot)
		s1.Add(s2)
		parts := append(c1, c2...)
		for i := range whole {
			for j := range whole[i] {
				if whole[i][j] != parts[i][j] {
					t.Fatalf("%s: response %d token %d: %v whole, %v in micro-batches", name, i, j, whole[i][j], parts[i][j])
				}
			}
		}
		if s1 != ws {
			t.Fatalf("%s: stats %+v whole, %+v added", name, ws, s1)
		}
	}
}

// Token advantages replace the response's advantage token by token.
func TestTokenAdvantages(t *testing.T) {
	b := []Response{{Advantage: 1, TokenAdvantages: []float64{1, -1}, LogMu: lp(0.5, 0.5), LogPiOld: lp(0.5, 0.5), LogPi: lp(0.5, 0.5)}}
	c, _, err := DefaultMiniRL().Coefficients(b, Totals{})
	if err != nil {
		t.Fatal(err)
	}
	if c[0][0] != -1 || c[0][1] != 1 {
		t.Fatalf("coefficients %v, want [-1 1]", c[0])
	}
	b[0].TokenAdvantages = []float64{1}
	if _, _, err := GSPOToken().Coefficients(b, Totals{}); err == nil {
		t.Fatal("token advantages of the wrong length accepted")
	}
}

// minirl-no-is records no IS weight of its own (r is a staleness ratio):
// with a correction, the IS statistics are the correction's weights.
func TestNoISWithCorrectionStats(t *testing.T) {
	b := []Response{{Advantage: 1, LogMu: lp(0.2, 0.1), LogPiOld: lp(0.4, 0.8), LogPi: lp(0.5, 0.8)}}
	o := DefaultMiniRL()
	o.Variant = MiniRLNoIS
	c, st, err := o.Coefficients(b, Totals{})
	if err != nil {
		t.Fatal(err)
	}
	if st.HasWeights() {
		t.Fatal("minirl-no-is recorded IS weights")
	}
	if err := (Correction{Mode: TokenTIS, Cap: 5}).Apply(b, c, &st); err != nil {
		t.Fatal(err)
	}
	if math.Abs(st.ISMean()-3.5) > 1e-5 || math.Abs(st.ISMax-5) > 1e-5 { // weights 2 and 5
		t.Fatalf("IS mean %v max %v, want 3.5 and 5", st.ISMean(), st.ISMax)
	}
}
