package train

import (
	"github.com/keel-rl/keel/internal/testmodel"
	"math"
	"math/rand/v2"

	"github.com/keel-rl/keel/model"
)

// This file is a plain float64 re-implementation of the Qwen3 / Qwen3-MoE
// forward pass, one sequence at a time, written from the Hugging Face
// definitions without sharing code with the engine. Tests compare the
// engine's log-probabilities with it and its gradients with central finite
// differences of it.

// engTinyConfig returns a small config; moe selects a Qwen3-MoE with its
// second layer dense (mlp_only_layers).
func engTinyConfig(moe, normTopK, tie bool) model.Config {
	c := model.Config{
		Architecture: "Qwen3ForCausalLM", VocabSize: 11, HiddenSize: 8, IntermediateSize: 12,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 4,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 256, TieWordEmbeddings: tie,
	}
	if moe {
		c.Architecture = "Qwen3MoeForCausalLM"
		c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize = 4, 2, 6
		c.NormTopKProb = normTopK
		c.DecoderSparseStep = 1
		c.MlpOnlyLayers = []int{1}
	}
	return c
}

// engRandomModel fills a model with seeded random weights: norms near 1,
// linear weights with a scale that keeps activations O(1).
func engRandomModel(c model.Config, seed uint64) *model.Model {
	return testmodel.Random(c, seed)
}

func engRandomSeqs(r *rand.Rand, vocab int, lens ...int) [][]int32 {
	out := make([][]int32, len(lens))
	for i, n := range lens {
		out[i] = make([]int32, n)
		for t := range out[i] {
			out[i][t] = int32(r.IntN(vocab))
		}
	}
	return out
}

// refModel views a float64 copy of a model's arena by parameter.
type refModel struct {
	c   model.Config
	w   []float64
	off map[*model.Param]int
	m   *model.Model
}

func newRefModel(m *model.Model) *refModel {
	rm := &refModel{c: m.Config, w: make([]float64, len(m.Arena)), off: map[*model.Param]int{}, m: m}
	for i, v := range m.Arena {
		rm.w[i] = float64(v)
	}
	o := 0
	for _, p := range m.Params() {
		rm.off[p] = o
		o += p.Size()
	}
	return rm
}

func (rm *refModel) p(p *model.Param) []float64 {
	o := rm.off[p]
	return rm.w[o : o+p.Size()]
}

func refRMS(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i := range x {
		out[i] = x[i] * r * w[i]
	}
	return out
}

// refLin returns x·Wᵀ for W [out,in].
func refLin(x, w []float64, out int) []float64 {
	in := len(x)
	y := make([]float64, out)
	for o := 0; o < out; o++ {
		var s float64
		for i := 0; i < in; i++ {
			s += x[i] * w[o*in+i]
		}
		y[o] = s
	}
	return y
}

func refRope(x []float64, pos int, theta float64) {
	hd := len(x)
	h := hd / 2
	for i := 0; i < h; i++ {
		a := float64(pos) * math.Pow(theta, -float64(2*i)/float64(hd))
		c, s := math.Cos(a), math.Sin(a)
		x0, x1 := x[i], x[i+h]
		x[i] = x0*c - x1*s
		x[i+h] = x1*c + x0*s
	}
}

func refSoftmax(x []float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = max(mx, v)
	}
	var s float64
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = math.Exp(v - mx)
		s += out[i]
	}
	for i := range out {
		out[i] /= s
	}
	return out
}

func refSwiGLU(x, gw, uw, dw []float64, inter, hidden int) []float64 {
	g := refLin(x, gw, inter)
	u := refLin(x, uw, inter)
	for i := range g {
		g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
	}
	return refLin(g, dw, hidden)
}

// refOut is what the reference computes for a batch.
type refOut struct {
	logp, ent [][]float64
	aux       float64
	loss      float64
}

// run computes the batch with the experts of routes forced (routes[s] must
// be non-nil for MoE models) and gates from the live router softmax, and
// the loss Σ c·logp + Σ e·H + auxW·AuxLoss.
func (rm *refModel) run(seqs [][]int32, routes []*model.Routes, lc, le [][]float32, auxW float64) refOut {
	c := rm.c
	m := rm.m
	H, hd, nh, nkv := c.HiddenSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	E, K := c.NumExperts, c.NumExpertsPerTok
	var res refOut
	cnt := make([]float64, E)
	psum := make([]float64, E)
	nrows := 0
	for s, seq := range seqs {
		n := len(seq)
		x := make([][]float64, n)
		for t, tok := range seq {
			x[t] = append([]float64(nil), rm.p(m.Embed)[int(tok)*H:(int(tok)+1)*H]...)
		}
		ml := 0
		for li := range m.Layers {
			L := &m.Layers[li]
			q := make([][]float64, n)
			k := make([][]float64, n)
			v := make([][]float64, n)
			for t := 0; t < n; t++ {
				xn := refRMS(x[t], rm.p(L.InputNorm), c.RMSNormEps)
				q[t] = refLin(xn, rm.p(L.Q), nh*hd)
				k[t] = refLin(xn, rm.p(L.K), nkv*hd)
				v[t] = refLin(xn, rm.p(L.V), nkv*hd)
				for h := 0; h < nh; h++ {
					copy(q[t][h*hd:], refRMS(q[t][h*hd:(h+1)*hd], rm.p(L.QNorm), c.RMSNormEps))
					refRope(q[t][h*hd:(h+1)*hd], t, c.RopeTheta)
				}
				for h := 0; h < nkv; h++ {
					copy(k[t][h*hd:], refRMS(k[t][h*hd:(h+1)*hd], rm.p(L.KNorm), c.RMSNormEps))
					refRope(k[t][h*hd:(h+1)*hd], t, c.RopeTheta)
				}
			}
			nx := make([][]float64, n)
			for t := 0; t < n; t++ {
				att := make([]float64, nh*hd)
				for h := 0; h < nh; h++ {
					kh := h / (nh / nkv)
					sc := make([]float64, t+1)
					for j := 0; j <= t; j++ {
						var d float64
						for i := 0; i < hd; i++ {
							d += q[t][h*hd+i] * k[j][kh*hd+i]
						}
						sc[j] = d / math.Sqrt(float64(hd))
					}
					p := refSoftmax(sc)
					for j := 0; j <= t; j++ {
						for i := 0; i < hd; i++ {
							att[h*hd+i] += p[j] * v[j][kh*hd+i]
						}
					}
				}
				o := refLin(att, rm.p(L.O), H)
				hh := make([]float64, H)
				for i := range hh {
					hh[i] = x[t][i] + o[i]
				}
				xn2 := refRMS(hh, rm.p(L.PostAttnNorm), c.RMSNormEps)
				var y []float64
				if L.Router != nil {
					p := refSoftmax(refLin(xn2, rm.p(L.Router), E))
					ids := routes[s].Slots(nil, t, ml)
					var S float64
					for _, id := range ids {
						S += p[id]
						cnt[id]++
					}
					for e := range p {
						psum[e] += p[e]
					}
					y = make([]float64, H)
					for _, id := range ids {
						g := p[id]
						if c.NormTopKProb {
							g /= S
						}
						ex := &L.Experts[id]
						ye := refSwiGLU(xn2, rm.p(ex.Gate), rm.p(ex.Up), rm.p(ex.Down), c.MoeIntermediateSize, H)
						for i := range y {
							y[i] += g * ye[i]
						}
					}
				} else {
					y = refSwiGLU(xn2, rm.p(L.Gate), rm.p(L.Up), rm.p(L.Down), c.IntermediateSize, H)
				}
				nx[t] = make([]float64, H)
				for i := range y {
					nx[t][i] = hh[i] + y[i]
				}
			}
			if L.Router != nil {
				ml++
			}
			x = nx
		}
		nrows += n * ml
		lp := make([]float64, n-1)
		en := make([]float64, n-1)
		for t := 0; t < n-1; t++ {
			xf := refRMS(x[t], rm.p(m.Norm), c.RMSNormEps)
			z := refLin(xf, rm.p(m.LMHead), c.VocabSize)
			p := refSoftmax(z)
			for vv := range p {
				if p[vv] > 0 {
					en[t] -= p[vv] * math.Log(p[vv])
				}
			}
			lp[t] = math.Log(p[seq[t+1]])
			if lc != nil {
				res.loss += float64(lc[s][t]) * lp[t]
			}
			if le != nil {
				res.loss += float64(le[s][t]) * en[t]
			}
		}
		res.logp = append(res.logp, lp)
		res.ent = append(res.ent, en)
	}
	if nrows > 0 {
		N := float64(nrows)
		for e := 0; e < E; e++ {
			res.aux += cnt[e] / N * psum[e] / N
		}
		res.aux *= float64(E)
		res.loss += auxW * res.aux
	}
	_ = K
	return res
}
