package ref64

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-12*math.Max(1, math.Abs(want)) || math.IsNaN(got) {
		t.Errorf("%s = %.15g, want %.15g", what, got, want)
	}
}

func set(p *model.Param, vals ...float32) {
	copy(p.Data, vals)
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// entropyOf returns log p[target] and the entropy of softmax(logits), by the
// textbook formulas.
func entropyOf(logits []float64, target int) (float64, float64) {
	var z float64
	for _, v := range logits {
		z += math.Exp(v)
	}
	var h float64
	for _, v := range logits {
		p := math.Exp(v) / z
		h -= p * math.Log(p)
	}
	return logits[target] - math.Log(z), h
}

// A dense 1-layer model whose every intermediate value is a closed form:
// one-hot embeddings, identity projections, so q·k reduces to rotations.
func TestDenseHandComputed(t *testing.T) {
	const eps = 1e-6
	cfg := model.Config{VocabSize: 3, HiddenSize: 4, IntermediateSize: 2, NumHiddenLayers: 1,
		NumAttentionHeads: 1, NumKeyValueHeads: 1, HeadDim: 4, RMSNormEps: eps, RopeTheta: 10000}
	m := model.New(cfg)
	set(m.Embed, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0)
	l := &m.Layers[0]
	for _, p := range []*model.Param{l.InputNorm, l.QNorm, l.KNorm, l.PostAttnNorm, m.Norm} {
		for i := range p.Data {
			p.Data[i] = 1
		}
	}
	for i := 0; i < 4; i++ {
		l.Q.Data[i*4+i] = 1
		l.K.Data[i*4+i] = 1
		l.V.Data[i*4+i] = 1
		l.O.Data[i*4+i] = 0.5
	}
	set(l.Gate, 1, 0, 0, 0, 0, 0, 0, 0)
	set(l.Up, 1, 0, 0, 0, 0, 0, 0, 0)
	set(l.Down, 1, 0, 0, 0, 0, 0, 0, 0) // [4, 2]: only (0,0) set
	set(m.LMHead, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0)

	r := FromModel(m)
	res, err := r.Forward([][]int32{{0, 1, 2}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Routes != nil || res.AuxLoss != 0 {
		t.Errorf("dense model returned routes %v, aux %g", res.Routes, res.AuxLoss)
	}
	rs := func(ss float64, n int) float64 { return 1 / math.Sqrt(ss/float64(n)+eps) } // rsqrt(mean+eps)
	// Position 0: RMSNorm([2,0,0,0]) = 2·c with c = rsqrt(1+eps); q_norm and
	// k_norm of [2c,0,0,0] give 2·c2; position 0 has no rotation and only
	// itself to attend to, so attention output = v0 = [2c,0,0,0].
	c := rs(4, 4)
	x0 := 2 + 0.5*2*c // residual + O·v0
	// Position 1: q1 = k1 = RMSNorm of [0,2c,0,0] = [0,2c',0,0], rotated in
	// the (1,3) plane by angle 1·10000^(-2/4); q1·k0 = 0 and q1·k1 = |q1|²,
	// as a rotation keeps lengths.
	cq := rs(4*c*c, 4) * c // q_norm applied to [0, 2c, 0, 0]: 2c·cq' = 2·cq
	s10 := 0.0
	s11 := (2 * cq) * (2 * cq) * 0.5 // scale 4^-0.5
	a := math.Exp(s10) / (math.Exp(s10) + math.Exp(s11))
	b := 1 - a
	x1 := [2]float64{0.5 * a * 2 * c, 2 + 0.5*b*2*c} // coordinates 0 and 1
	// MLP at position 0: h = RMSNorm([x0,0,0,0]); only coordinate 0 of h
	// feeds gate and up, and down writes back to coordinate 0.
	h0 := x0 * rs(x0*x0, 4)
	x0 += h0 * sigmoid(h0) * h0
	h1 := x1[0] * rs(x1[0]*x1[0]+x1[1]*x1[1], 4)
	x1[0] += h1 * sigmoid(h1) * h1
	// Final norm and head: logits = (h[0], h[1], 0).
	f0 := x0 * rs(x0*x0, 4)
	lp0, h0e := entropyOf([]float64{f0, 0, 0}, 1)
	inv := rs(x1[0]*x1[0]+x1[1]*x1[1], 4)
	lp1, h1e := entropyOf([]float64{x1[0] * inv, x1[1] * inv, 0}, 2)

	if len(res.LogProbs[0]) != 2 || len(res.Entropy[0]) != 2 {
		t.Fatalf("got %d log-probs and %d entropies for 3 tokens, want 2", len(res.LogProbs[0]), len(res.Entropy[0]))
	}
	near(t, "logp[0]", res.LogProbs[0][0], lp0)
	near(t, "entropy[0]", res.Entropy[0][0], h0e)
	near(t, "logp[1]", res.LogProbs[0][1], lp1)
	near(t, "entropy[1]", res.Entropy[0][1], h1e)

	// Batch independence: the same sequence beside another gives the same values.
	res2, err := r.Forward([][]int32{{2, 2}, {0, 1, 2}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res2.LogProbs[1][1] != res.LogProbs[0][1] {
		t.Errorf("log-prob depends on the batch: %g vs %g", res2.LogProbs[1][1], res.LogProbs[0][1])
	}
}

// A 1-layer, 2-token MoE model with a tied head: attention is zero, so the
// router sees RMSNorm(embedding) and every gate is a closed form.
func TestMoEHandComputed(t *testing.T) {
	const eps = 1e-6
	for _, norm := range []bool{true, false} {
		cfg := model.Config{VocabSize: 3, HiddenSize: 4, NumHiddenLayers: 1, NumAttentionHeads: 1,
			NumKeyValueHeads: 1, HeadDim: 4, RMSNormEps: eps, RopeTheta: 10000, TieWordEmbeddings: true,
			NumExperts: 3, NumExpertsPerTok: 2, MoeIntermediateSize: 1, NormTopKProb: norm}
		m := model.New(cfg)
		set(m.Embed, 2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0)
		l := &m.Layers[0]
		for _, p := range []*model.Param{l.InputNorm, l.QNorm, l.KNorm, l.PostAttnNorm, m.Norm} {
			for i := range p.Data {
				p.Data[i] = 1
			}
		}
		// Router [3 experts, 4]: token 0 (h = 2c·e0) scores (1, 0.5, -1)·c,
		// token 1 (h = 2c·e1) scores (-1, 1, 0.5)·c.
		set(l.Router, 0.5, -0.5, 0, 0, 0.25, 0.5, 0, 0, -0.5, 0.25, 0, 0)
		cu := []float64{1, -2, 0.5} // up on coordinate 0
		du := []float64{0.5, 1, -1} // up on coordinate 1
		for e := range l.Experts {
			set(l.Experts[e].Gate, 1, 1, 0, 0)
			set(l.Experts[e].Up, float32(cu[e]), float32(du[e]), 0, 0)
			set(l.Experts[e].Down, 0, 0, 1, 0)
		}
		r := FromModel(m)
		c := 1 / math.Sqrt(1+eps) // RMSNorm scale of a 2·one-hot vector
		s := [2][3]float64{{c, 0.5 * c, -c}, {-c, c, 0.5 * c}}
		softmax3 := func(v [3]float64) [3]float64 {
			z := math.Exp(v[0]) + math.Exp(v[1]) + math.Exp(v[2])
			return [3]float64{math.Exp(v[0]) / z, math.Exp(v[1]) / z, math.Exp(v[2]) / z}
		}
		p := [2][3]float64{softmax3(s[0]), softmax3(s[1])}
		// Expert e on token 0: gate = up-free silu(2c)·(2c·cu[e]).
		y0 := func(e int) float64 { g := 2 * c; return g * sigmoid(g) * 2 * c * cu[e] }
		gates := func(set []int, tok int) []float64 {
			out := make([]float64, len(set))
			var z float64
			for j, e := range set {
				if norm {
					out[j] = math.Exp(s[tok][e])
				} else {
					out[j] = p[tok][e]
				}
				z += out[j]
			}
			if norm {
				for j := range out {
					out[j] /= z
				}
			}
			return out
		}
		// log p(token 1 | token 0) with x0 = [2, 0, Y, 0] and the tied head.
		want := func(set []int) (float64, float64) {
			g := gates(set, 0)
			var y float64
			for j, e := range set {
				y += g[j] * y0(e)
			}
			inv := 1 / math.Sqrt((4+y*y)/4+eps)
			return entropyOf([]float64{2 * 2 * inv, 0, 2 * y * inv}, 1)
		}
		res, err := r.Forward([][]int32{{0, 1}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		lp, h := want([]int{0, 1})
		near(t, "live logp", res.LogProbs[0][0], lp)
		near(t, "live entropy", res.Entropy[0][0], h)
		if got, want := res.Routes[0].Nested(), [][][]int{{{0, 1}}, {{1, 2}}}; !reflect.DeepEqual(got, want) {
			t.Fatalf("live routes %v, want %v", got, want)
		}
		// Aux: rows = 2 tokens; counts (1, 2, 1).
		count := []float64{1, 2, 1}
		var aux float64
		for e := 0; e < 3; e++ {
			aux += count[e] / 2 * (p[0][e] + p[1][e]) / 2
		}
		near(t, "aux loss", res.AuxLoss, 3*aux)

		// Replay token 0 onto {2, 0}: expert 2 is not in the live top-2.
		rt := model.NewRoutes(2, 1, 2, 3)
		copy(rt.IDs8, []uint8{2, 0, 1, 2})
		res, err = r.Forward([][]int32{{0, 1}}, Options{Replay: []*model.Routes{rt}})
		if err != nil {
			t.Fatal(err)
		}
		lp, h = want([]int{2, 0})
		near(t, "replay logp", res.LogProbs[0][0], lp)
		near(t, "replay entropy", res.Entropy[0][0], h)
		near(t, "replay aux loss (live mask)", res.AuxLoss, 3*aux)
		// With the replayed sets as the aux mask the counts become (1, 1, 2).
		res, err = r.Forward([][]int32{{0, 1}}, Options{Replay: []*model.Routes{rt}, AuxMask: []*model.Routes{rt}})
		if err != nil {
			t.Fatal(err)
		}
		count = []float64{1, 1, 2}
		aux = 0
		for e := 0; e < 3; e++ {
			aux += count[e] / 2 * (p[0][e] + p[1][e]) / 2
		}
		near(t, "aux loss (replayed mask)", res.AuxLoss, 3*aux)
	}
}

func TestTopKTies(t *testing.T) {
	got := topK([]float64{1, 3, 3, 0, 3}, 2)
	if got[0] != 1 || got[1] != 2 {
		t.Errorf("topK ties = %v, want [1 2]", got)
	}
}

func TestRopeRotation(t *testing.T) {
	x := []float64{1, 2, 3, 4}
	rope(x, 3, 100)
	// Pairs (0,2) at angle 3 and (1,3) at angle 3·100^(-1/2) = 0.3.
	a, b := 3.0, 0.3
	want := []float64{math.Cos(a) - 3*math.Sin(a), 2*math.Cos(b) - 4*math.Sin(b), 3*math.Cos(a) + math.Sin(a), 4*math.Cos(b) + 2*math.Sin(b)}
	for i := range x {
		near(t, "rope", x[i], want[i])
	}
}

func TestGQAHeadMapping(t *testing.T) {
	// 4 query heads over 2 kv heads: heads 0,1 read kv head 0; heads 2,3 kv head 1.
	// V of kv head 1 is zero, so only heads 0 and 1 produce output; O sums
	// head outputs into coordinate 0 with distinct weights that reveal which.
	cfg := model.Config{VocabSize: 2, HiddenSize: 2, NumHiddenLayers: 1, IntermediateSize: 1,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 2, RMSNormEps: 1e-6, RopeTheta: 10000}
	m := model.New(cfg)
	set(m.Embed, 1, 1, 1, -1)
	l := &m.Layers[0]
	for _, p := range []*model.Param{l.InputNorm, l.QNorm, l.KNorm, l.PostAttnNorm, m.Norm} {
		for i := range p.Data {
			p.Data[i] = 1
		}
	}
	set(l.V, 1, 0, 0, 0, 0, 0, 0, 0) // [4, 2]: kv head 0 dim 0 = h[0]
	// O [2, 8]: head hh dim 0 weight 10^hh into coordinate 0.
	set(l.O, 1, 0, 10, 0, 100, 0, 1000, 0)
	set(m.LMHead, 1, 0, 0, 0)
	r := FromModel(m)
	res, err := r.Forward([][]int32{{0, 1}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Position 0 attends only to itself: v = h[0] = rsqrt(1+eps) ≈ 1; heads
	// 0 and 1 contribute (1 + 10)·v; x0 = [1 + 11v, 1].
	v := 1 / math.Sqrt(1+1e-6)
	x := 1 + 11*v
	inv := 1 / math.Sqrt((x*x+1)/2+1e-6)
	lp, _ := entropyOf([]float64{x * inv, 0}, 1)
	near(t, "GQA logp", res.LogProbs[0][0], lp)
}

func TestForwardErrors(t *testing.T) {
	cfg := model.Config{VocabSize: 3, HiddenSize: 4, NumHiddenLayers: 1, NumAttentionHeads: 1,
		NumKeyValueHeads: 1, HeadDim: 4, RMSNormEps: 1e-6, RopeTheta: 10000,
		NumExperts: 3, NumExpertsPerTok: 2, MoeIntermediateSize: 1}
	r := FromModel(model.New(cfg))
	if _, err := r.Forward([][]int32{{0, 3}}, Options{}); err == nil || !strings.Contains(err.Error(), "token 3") {
		t.Errorf("out-of-range token: err = %v", err)
	}
	rt := model.NewRoutes(2, 1, 2, 3)
	copy(rt.IDs8, []uint8{0, 0, 1, 2})
	if _, err := r.Forward([][]int32{{0, 1}}, Options{Replay: []*model.Routes{rt}}); err == nil {
		t.Error("duplicate replayed expert accepted")
	}
	if _, err := r.Forward([][]int32{{0, 1, 2}}, Options{Replay: []*model.Routes{model.NewRoutes(2, 1, 2, 3)}}); err == nil {
		t.Error("routes of the wrong length accepted")
	}
}
