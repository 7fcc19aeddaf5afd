package rl

import (
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
	"math"
	"testing"
)

func TestAdvantagesHand(t *testing.T) {
	r := []float64{1, 0, 0, 1, 1, 1, 1, 1}
	a, err := Advantages(r, 4, GroupMean)
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0}
	for i := range want {
		if a[i] != want[i] {
			t.Fatalf("group mean: %v, want %v", a, want)
		}
	}
	// Unbiased std of {1,0,0,1} is sqrt(1/3).
	a, _ = Advantages(r, 4, GroupMeanStd)
	if s := 0.5 / (math.Sqrt(1.0/3) + 1e-4); math.Abs(a[0]-s) > 1e-12 || a[4] != 0 {
		t.Fatalf("group mean/std: %v", a)
	}
	// RLOO: 1 - (0+0+1)/3 = 2/3; 0 - 2/3.
	a, _ = Advantages(r, 4, RLOO)
	if math.Abs(a[0]-2.0/3) > 1e-12 || math.Abs(a[1]+2.0/3) > 1e-12 {
		t.Fatalf("rloo: %v", a)
	}
	if _, err := Advantages(r, 3, GroupMean); err == nil {
		t.Fatal("8 rewards in groups of 3 accepted")
	}
	if _, err := Advantages(r, 4, "median"); err == nil {
		t.Fatal("unknown estimator accepted")
	}
}

func lp(ps ...float64) []float32 {
	out := make([]float32, len(ps))
	for i, p := range ps {
		out[i] = float32(math.Log(p))
	}
	return out
}

// Hand-computed MiniRL coefficients on two responses.
//
// Response 0 (A = +1): token 0 with pi = 0.5, pi_old = 0.4 (r = 1.25 <=
// 1.27, kept), mu = 0.25 (w = 2); token 1 with pi = 0.6, pi_old = 0.4
// (r = 1.5 > 1.27: masked), mu = 0.1 (w = 6, truncated to 5).
// Response 1 (A = -0.5): token 0 with pi = 0.3, pi_old = 0.5 (r = 0.6 <
// 0.8: masked), mu = 0.3 (w = 1).
// c = -(1/B)·M·w·A with B = 2.
func TestMiniRLHand(t *testing.T) {
	batch := []Response{
		{Advantage: 1, LogMu: lp(0.25, 0.1), LogPiOld: lp(0.4, 0.4), LogPi: lp(0.5, 0.6)},
		{Advantage: -0.5, LogMu: lp(0.3), LogPiOld: lp(0.5), LogPi: lp(0.3)},
	}
	c, st, err := DefaultMiniRL().Coefficients(batch, Totals{})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]float64{{-0.5 * 2 * 1, 0}, {0}}
	for i := range want {
		for j := range want[i] {
			if math.Abs(float64(c[i][j])-want[i][j]) > 1e-5 {
				t.Fatalf("c = %v, want %v", c, want)
			}
		}
	}
	if st.Tokens != 3 || math.Abs(st.ClipPosFrac()-1.0/3) > 1e-9 || math.Abs(st.ClipNegFrac()-1.0/3) > 1e-9 ||
		math.Abs(st.TruncatedFrac()-1.0/3) > 1e-9 || math.Abs(st.ISMax-5) > 1e-5 || math.Abs(st.ISMin-1) > 1e-5 {
		t.Fatalf("stats %+v", st)
	}
	if ws := []float64{2, 5, 1}; math.Abs(st.ESS()-(8*8)/(3*30.0)) > 1e-5 || math.Abs(st.ISMean()-8.0/3) > 1e-5 {
		t.Fatalf("ESS %v mean %v (weights %v)", st.ESS(), st.ISMean(), ws)
	}
	// Variants on the same batch.
	noClip := DefaultMiniRL()
	noClip.Variant = MiniRLNoClip
	c, _, _ = noClip.Coefficients(batch, Totals{})
	if math.Abs(float64(c[0][1])+0.5*5) > 1e-5 || math.Abs(float64(c[1][0])-0.5*1*0.5) > 1e-5 {
		t.Fatalf("no-clip: %v", c)
	}
	lenNorm := DefaultMiniRL()
	lenNorm.Variant = MiniRLLenNorm
	c, _, _ = lenNorm.Coefficients(batch, Totals{})
	if math.Abs(float64(c[0][0])+0.5) > 1e-5 { // divided by |y_0| = 2
		t.Fatalf("lennorm: %v", c)
	}
	oldIS := DefaultMiniRL()
	oldIS.Variant = MiniRLOldIS
	c, _, _ = oldIS.Coefficients(batch, Totals{})
	if math.Abs(float64(c[0][0])+0.5*1.6) > 1e-5 { // w = pi_old/mu = 0.4/0.25
		t.Fatalf("old-is: %v", c)
	}
	noIS := DefaultMiniRL()
	noIS.Variant = MiniRLNoIS
	c, _, _ = noIS.Coefficients(batch, Totals{})
	if math.Abs(float64(c[0][0])+0.5*1.25) > 1e-5 { // w = r
		t.Fatalf("no-is: %v", c)
	}
	if _, _, err := DefaultMiniRL().Coefficients([]Response{{LogMu: lp(0.5), LogPiOld: lp(0.5, 0.5), LogPi: lp(0.5)}}, Totals{}); err == nil {
		t.Fatal("mismatched lengths accepted")
	}
}

// On-policy (pi_theta = pi_old) the mask is 1 and w = pi_old/mu_old.
func TestMiniRLOnPolicy(t *testing.T) {
	b := []Response{{Advantage: 2, LogMu: lp(0.2, 0.9), LogPiOld: lp(0.3, 0.9), LogPi: lp(0.3, 0.9)}}
	c, st, _ := DefaultMiniRL().Coefficients(b, Totals{})
	if math.Abs(float64(c[0][0])+2*1.5) > 1e-5 || math.Abs(float64(c[0][1])+2) > 1e-5 || st.ClipPos != 0 || st.StaleSum != 0 {
		t.Fatalf("on-policy: %v %+v", c, st)
	}
}

// Ascending J through the training engine and AdamW raises the
// probability of a rewarded token: the sign convention of Coefficients
// matches Backward (which differentiates Σ c·log pi) and gradient descent.
func TestMiniRLStepImprovesRewardedToken(t *testing.T) {
	cfg := model.Config{Architecture: model.ArchQwen3, VocabSize: 11, HiddenSize: 16, IntermediateSize: 24,
		NumHiddenLayers: 1, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 8, RMSNormEps: 1e-6,
		RopeTheta: 10000, MaxPositionEmbeddings: 16}
	m := model.New(cfg)
	model.Init(m, 4)
	eng, err := train.NewTrainer(m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Two responses to the prompt [1, 2]: token 3 (reward 1) and token 4 (reward 0).
	seqs := [][]int32{{1, 2, 3}, {1, 2, 4}}
	adv, _ := Advantages([]float64{1, 0}, 2, GroupMean)
	logp := func() (float32, float32) {
		res, _ := eng.Forward(seqs, train.ForwardOptions{NoEntropy: true})
		return res.LogProbs[0][1], res.LogProbs[1][1]
	}
	good0, bad0 := logp()
	for step := 0; step < 5; step++ {
		eng.ZeroGrad()
		res, _ := eng.Forward(seqs, train.ForwardOptions{NoEntropy: true})
		var batch []Response
		for i := range seqs {
			lp := res.LogProbs[i][1:] // the response token's log-prob
			batch = append(batch, Response{Advantage: adv[i], LogMu: lp, LogPiOld: lp, LogPi: lp})
		}
		c, _, err := DefaultMiniRL().Coefficients(batch, Totals{})
		if err != nil {
			t.Fatal(err)
		}
		coef := [][]float32{{0, c[0][0]}, {0, c[1][0]}}
		if err := eng.Backward(train.Loss{LogProb: coef}); err != nil {
			t.Fatal(err)
		}
		if _, err := eng.Step(1e-2, 0); err != nil {
			t.Fatal(err)
		}
	}
	good1, bad1 := logp()
	if !(good1 > good0+0.1) || !(bad1 < bad0) {
		t.Fatalf("log pi(rewarded) %v -> %v, log pi(unrewarded) %v -> %v", good0, good1, bad0, bad1)
	}
}
