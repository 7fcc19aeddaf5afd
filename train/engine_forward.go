package train

import (
	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// forward runs the packed batch through the model, saving activations in f.
func (e *Engine) forward(f *fwdState, opt ForwardOptions) {
	m := e.Model
	c := &f.cfg
	T, H, V := f.T, c.HiddenSize, c.VocabSize
	eps := float32(c.RMSNormEps)
	d := newAttnDims(c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim)
	e.rope.ensure(c.HeadDim, c.RopeTheta, f.maxLen)

	x := f.xfin
	if len(f.layers) > 0 {
		x = f.layers[0].xin
	}
	emb := m.Embed.Data
	kernels.ParallelFor(T, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			tok := int(f.tokens[t])
			copy(x[t*H:(t+1)*H], emb[tok*H:(tok+1)*H])
		}
	})

	E := c.NumExperts
	cnt := make([]float64, E)
	psum := make([]float64, E)
	ml := 0
	for li := range f.layers {
		a := &f.layers[li]
		L := &m.Layers[li]
		out := f.xfin
		if li+1 < len(f.layers) {
			out = f.layers[li+1].xin
		}
		G := &e.Grad.Layers[li]
		a.qkvG = e.group([]*model.Param{L.Q, L.K, L.V}, []*model.Param{G.Q, G.K, G.V})
		if a.moe != nil {
			a.moe.guG = a.moe.guG[:0]
			for x := range L.Experts {
				a.moe.guG = append(a.moe.guG, e.group([]*model.Param{L.Experts[x].Gate, L.Experts[x].Up}, []*model.Param{G.Experts[x].Gate, G.Experts[x].Up}))
			}
		} else {
			a.guG = e.group([]*model.Param{L.Gate, L.Up}, []*model.Param{G.Gate, G.Up})
		}
		normRows(a.xn1, a.xin, a.inv1, L.InputNorm.Data, T, H, eps)
		qs := d.qd + 2*d.kvd
		a.qkvG.forward(a.qkv, qs, a.xn1, H, T)
		headNormRope(a.q, a.qkv, a.qinv, L.QNorm.Data, T, d.heads, d.hd, qs, f.pos, e.rope.cos, e.rope.sin, eps)
		headNormRope(a.k, a.qkv[d.qd:], a.kinv, L.KNorm.Data, T, d.kv, d.hd, qs, f.pos, e.rope.cos, e.rope.sin, eps)
		kernels.ParallelFor(T, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				copy(a.v[t*d.kvd:(t+1)*d.kvd], a.qkv[t*qs+d.qd+d.kvd:])
			}
		})
		attnForward(a.att, a.q, a.k, a.v, d, f.starts, f.lens, f.maxLen, &e.pool)
		linear(a.h, a.att, L.O.Data, T, d.qd, H)
		addRows(a.h, a.xin, T, H)
		normRows(a.xn2, a.h, a.inv2, L.PostAttnNorm.Data, T, H, eps)
		if a.moe != nil {
			f.moeForward(ml, a, L, out, cnt, psum)
			ml++
		} else {
			f.mlpForward(a, L, out)
		}
	}

	// AuxLoss = E·Σ_e (c_e/N)·(Σ_n p_n,e / N) over N = tokens·MoE layers.
	f.aux = 0
	copy(f.auxCnt, cnt)
	if ml > 0 {
		n := float64(T * ml)
		for i := 0; i < E; i++ {
			f.aux += cnt[i] / n * (psum[i] / n)
		}
		f.aux *= float64(E)
	}

	normRows(f.xf, f.xfin, f.invf, m.Norm.Data, T, H, eps)
	for c0 := 0; c0 < T; c0 += f.chunk {
		rows := min(f.chunk, T-c0)
		f.headChunk(m.LMHead.Data, c0, rows)
		kernels.ParallelFor(rows, func(lo, hi int) {
			p := make([]float32, V)
			for r := lo; r < hi; r++ {
				t := c0 + r
				z := f.logp[r*V : (r+1)*V]
				f.tlp[t] = 0
				if f.hasNext(t) {
					f.tlp[t] = z[f.tokens[t+1]]
				}
				if !opt.NoEntropy {
					f.ent[t] = entropyRow(z, p)
				}
			}
		})
	}
}

// addRows computes dst += src over rows×n elements in parallel.
func addRows(dst, src []float32, rows, n int) {
	kernels.ParallelFor(rows, func(lo, hi int) {
		d, s := dst[lo*n:hi*n], src[lo*n:hi*n]
		for i := range d {
			d[i] += s[i]
		}
	})
}

// mlpForward runs a dense SwiGLU MLP and writes out = h + mlp(xn2).
func (f *fwdState) mlpForward(a *layerAct, L *model.Layer, out []float32) {
	c := &f.cfg
	T, H, I := f.T, c.HiddenSize, c.IntermediateSize
	a.guG.forward(a.gu, 2*I, a.xn2, H, T)
	swigluRows(a.a, a.gu, T, I)
	linear(out, a.a, L.Down.Data, T, I, H)
	addRows(out, a.h, T, H)
}

// mlpBackward backpropagates a dense MLP: dout is the gradient of its
// output, the gradient w.r.t. xn2 is written to dxn.
func (f *fwdState) mlpBackward(a *layerAct, L, G *model.Layer, dout, dxn []float32) {
	c := &f.cfg
	T, H, I := f.T, c.HiddenSize, c.IntermediateSize
	b := &f.bw
	b.da = grow(b.da, T*I)
	b.dgu = grow(b.dgu, T*2*I)
	linearBackX(b.da, dout, L.Down.Data, T, I, H, false)
	linearBackW(G.Down.Data, dout, a.a, T, I, H)
	swigluBackRows(b.dgu, b.da, a.gu, T, I)
	a.guG.backW(b.dgu, 2*I, a.xn2, H, T)
	a.guG.backX(dxn, H, b.dgu, 2*I, T, false)
}
