package train

import "github.com/keel-rl/keel/kernels"

// backward accumulates the gradient of l into e.Grad. It reads the saved
// activations without changing them, so it may run more than once.
func (e *Engine) backward(f *fwdState, l Loss) {
	m, g := e.Model, e.Grad
	c := &f.cfg
	T, H, V := f.T, c.HiddenSize, c.VocabSize
	d := newAttnDims(c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim)
	b := &f.bw
	b.dlog = grow(b.dlog, f.chunk*V)
	b.dx = grow(b.dx, T*H)
	b.dxn = grow(b.dxn, T*H)
	b.datt = grow(b.datt, T*d.qd)
	qs := d.qd + 2*d.kvd
	b.dqkv = grow(b.dqkv, T*qs)

	coefLP := make([]float32, T)
	coefH := make([]float32, T)
	for s, st := range f.starts {
		copy(coefLP[st:], l.LogProb[s])
		if l.Entropy != nil {
			copy(coefH[st:], l.Entropy[s])
		}
	}
	for c0 := 0; c0 < T; c0 += f.chunk {
		rows := min(f.chunk, T-c0)
		if !f.headAll {
			f.headChunk(m.LMHead.Data, c0, rows)
		}
		f.headBackward(b.dlog, c0, rows, coefLP, coefH)
		linearBackX(b.dxn[c0*H:], b.dlog, m.LMHead.Data, rows, H, V, false)
		linearBackW(g.LMHead.Data, b.dlog, f.xf[c0*H:], rows, H, V)
	}
	normBackRows(b.dx, b.dxn, f.xfin, f.invf, m.Norm.Data, T, H, 1, H, g.Norm.Data, &b.red, false)

	// Aux-loss gradient w.r.t. every router probability p_t,e:
	// Aux·E·c_e/N², the same for every token and MoE layer.
	nMoE := len(f.moeIdx)
	var auxGrad []float32
	if nMoE > 0 {
		auxGrad = make([]float32, c.NumExperts)
		if l.Aux != 0 {
			n := float64(T * nMoE)
			for i := range auxGrad {
				auxGrad[i] = float32(l.Aux * float64(c.NumExperts) * f.auxCnt[i] / (n * n))
			}
		}
	}

	for li := len(f.layers) - 1; li >= 0; li-- {
		a := &f.layers[li]
		L, G := &m.Layers[li], &g.Layers[li]
		// b.dx is the gradient of the layer output x = h + mlp(xn2).
		if a.moe != nil {
			f.moeBackward(a, L, G, b.dx, b.dxn, auxGrad)
		} else {
			f.mlpBackward(a, L, G, b.dx, b.dxn)
		}
		normBackRows(b.dx, b.dxn, a.h, a.inv2, L.PostAttnNorm.Data, T, H, 1, H, G.PostAttnNorm.Data, &b.red, true)
		// b.dx is now the gradient of h = x_in + o_proj(att).
		linearBackX(b.datt, b.dx, L.O.Data, T, d.qd, H, false)
		linearBackW(G.O.Data, b.dx, a.att, T, d.qd, H)
		dq, dk, dv := b.dqkv, b.dqkv[d.qd:], b.dqkv[d.qd+d.kvd:]
		attnBackward(dq, dk, dv, qs, b.datt, a.q, a.k, a.v, d, f.starts, f.lens, &e.pool)
		ropeBack(dq, T, d.heads, d.hd, qs, f.pos, e.rope.cos, e.rope.neg)
		ropeBack(dk, T, d.kv, d.hd, qs, f.pos, e.rope.cos, e.rope.neg)
		normBackRows(dq, dq, a.qkv, a.qinv, L.QNorm.Data, T*d.heads, d.hd, d.heads, qs, G.QNorm.Data, &b.red, false)
		normBackRows(dk, dk, a.qkv[d.qd:], a.kinv, L.KNorm.Data, T*d.kv, d.hd, d.kv, qs, G.KNorm.Data, &b.red, false)
		a.qkvG.backW(b.dqkv, qs, a.xn1, H, T)
		a.qkvG.backX(b.dxn, H, b.dqkv, qs, T, false)
		normBackRows(b.dx, b.dxn, a.xin, a.inv1, L.InputNorm.Data, T, H, 1, H, G.InputNorm.Data, &b.red, true)
	}

	// Embedding rows, in token order (a fixed order for repeated tokens).
	ge := g.Embed.Data
	for t := 0; t < T; t++ {
		tok := int(f.tokens[t])
		kernels.Axpy(1, b.dx[t*H:(t+1)*H], ge[tok*H:(tok+1)*H])
	}
}
