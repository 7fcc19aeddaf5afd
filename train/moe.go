package train

import (
	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// moeForward runs one sparse MoE block: router softmax, expert choice (live
// or replayed), expert GEMMs over tokens grouped by expert, and the gated
// combination added to the residual h, written to out. It adds this
// layer's expert counts and probability sums to cnt and psum for AuxLoss.
func (f *fwdState) moeForward(ml int, a *layerAct, L *model.Layer, out []float32, cnt, psum []float64) {
	c := &f.cfg
	T, H, E, k, I := f.T, c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	mo := a.moe
	linear(mo.probs, a.xn2, L.Router.Data, T, H, E)
	kernels.ParallelFor(T, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			kernels.Softmax(mo.probs[t*E:(t+1)*E], mo.probs[t*E:(t+1)*E])
		}
	})
	for s, st := range f.starts {
		var r *model.Routes
		if s < len(f.replay) {
			r = f.replay[s]
		}
		for i := 0; i < f.lens[s]; i++ {
			t := st + i
			ids, p := mo.ids[t*k:(t+1)*k], mo.probs[t*E:(t+1)*E]
			if r != nil {
				r.Slots(ids, i, ml)
			} else {
				model.TopK(ids, p)
			}
			model.GateWeights(mo.gates[t*k:(t+1)*k], p, ids, c.NormTopKProb)
		}
	}
	// Group (token, slot) pairs by expert, tokens in order.
	off := mo.off
	clear(off)
	for _, id := range mo.ids[:T*k] {
		off[id+1]++
	}
	for e := 0; e < E; e++ {
		cnt[e] += float64(off[e+1])
		off[e+1] += off[e]
	}
	fill := make([]int, E)
	for j, id := range mo.ids[:T*k] {
		r := off[id] + fill[id]
		fill[id]++
		mo.row[j] = int32(r)
		mo.tok[r] = int32(j / k)
	}
	for t := 0; t < T; t++ {
		for e := 0; e < E; e++ {
			psum[e] += float64(mo.probs[t*E+e])
		}
	}
	R := T * k
	kernels.ParallelFor(R, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			t := int(mo.tok[r])
			copy(mo.xg[r*H:(r+1)*H], a.xn2[t*H:(t+1)*H])
		}
	})
	// The experts' products are independent: one GemmBatch per stage.
	tasks := f.tasks[:0]
	for e := 0; e < E; e++ {
		r0, n := off[e], off[e+1]-off[e]
		if n == 0 {
			continue
		}
		g := &mo.guG[e]
		if t, ok := g.forwardTask(mo.gug[r0*2*I:], 2*I, mo.xg[r0*H:], H, n); ok {
			tasks = append(tasks, t)
		} else {
			g.forward(mo.gug[r0*2*I:], 2*I, mo.xg[r0*H:], H, n)
		}
	}
	kernels.GemmBatch(tasks)
	swigluRows(mo.ag, mo.gug, R, I)
	tasks = tasks[:0]
	for e := 0; e < E; e++ {
		r0, n := off[e], off[e+1]-off[e]
		if n > 0 {
			tasks = append(tasks, linearTask(mo.yg[r0*H:], mo.ag[r0*I:], L.Experts[e].Down.Data, n, I, H))
		}
	}
	kernels.GemmBatch(tasks)
	f.tasks = tasks
	kernels.ParallelFor(T, func(lo, hi int) {
		acc := make([]float32, H)
		ys := make([][]float32, k)
		for t := lo; t < hi; t++ {
			for s := 0; s < k; s++ {
				r := int(mo.row[t*k+s])
				ys[s] = mo.yg[r*H : (r+1)*H]
			}
			model.CombineExperts(out[t*H:(t+1)*H], a.h[t*H:(t+1)*H], acc, mo.gates[t*k:(t+1)*k], ys)
		}
	})
}

// moeBackward backpropagates one MoE block. dout is the gradient of the
// block's output; the gradient w.r.t. its input xn2 is written to dxn.
// auxGrad[e] is d(weighted AuxLoss)/dp_t,e, the same for every token.
func (f *fwdState) moeBackward(a *layerAct, L, G *model.Layer, dout, dxn []float32, auxGrad []float32) {
	c := &f.cfg
	T, H, E, k, I := f.T, c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	mo := a.moe
	b := &f.bw
	R := T * k
	b.dy = grow(b.dy, R*H)
	b.dxg = grow(b.dxg, R*H)
	b.dgt = grow(b.dgt, R)
	b.da = grow(b.da, R*I)
	b.dgu = grow(b.dgu, R*2*I)
	b.dp = grow(b.dp, T*E)
	kernels.ParallelFor(T, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			d := dout[t*H : (t+1)*H]
			for s := 0; s < k; s++ {
				j := t*k + s
				r := int(mo.row[j])
				b.dgt[j] = kernels.Dot(d, mo.yg[r*H:(r+1)*H])
				dy := b.dy[r*H : (r+1)*H]
				g := mo.gates[j]
				for i := range dy {
					dy[i] = g * d[i]
				}
			}
		}
	})
	// The experts' products (input and weight gradients alike) are
	// independent: one GemmBatch per stage.
	off := mo.off
	tasks := f.tasks[:0]
	for e := 0; e < E; e++ {
		r0, n := off[e], off[e+1]-off[e]
		if n > 0 {
			tasks = append(tasks,
				linearBackXTask(b.da[r0*I:], b.dy[r0*H:], L.Experts[e].Down.Data, n, I, H, false),
				linearBackWTask(G.Experts[e].Down.Data, b.dy[r0*H:], mo.ag[r0*I:], n, I, H))
		}
	}
	kernels.GemmBatch(tasks)
	swigluBackRows(b.dgu, b.da, mo.gug, R, I)
	tasks = tasks[:0]
	for e := 0; e < E; e++ {
		r0, n := off[e], off[e+1]-off[e]
		if n == 0 {
			continue
		}
		g := &mo.guG[e]
		if t, ok := g.backWTask(b.dgu[r0*2*I:], 2*I, mo.xg[r0*H:], H, n); ok {
			tasks = append(tasks, t)
		} else {
			g.backW(b.dgu[r0*2*I:], 2*I, mo.xg[r0*H:], H, n)
		}
		if t, ok := g.backXTask(b.dxg[r0*H:], H, b.dgu[r0*2*I:], 2*I, n, false); ok {
			tasks = append(tasks, t)
		} else {
			g.backX(b.dxg[r0*H:], H, b.dgu[r0*2*I:], 2*I, n, false)
		}
	}
	kernels.GemmBatch(tasks)
	f.tasks = tasks
	kernels.ParallelFor(T, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			d := dxn[t*H : (t+1)*H]
			for s := 0; s < k; s++ {
				r := int(mo.row[t*k+s])
				if s == 0 {
					copy(d, b.dxg[r*H:(r+1)*H])
				} else {
					kernels.Axpy(1, b.dxg[r*H:(r+1)*H], d)
				}
			}
			RouterBackRow(b.dp[t*E:(t+1)*E], mo.probs[t*E:(t+1)*E], mo.gates[t*k:(t+1)*k], mo.ids[t*k:(t+1)*k], b.dgt[t*k:(t+1)*k], auxGrad, c.NormTopKProb)
		}
	})
	linearBackW(G.Router.Data, b.dp, a.xn2, T, H, E)
	linearBackX(dxn, b.dp, L.Router.Data, T, H, E, true)
}

// RouterBackRow writes to ds the gradient w.r.t. one token's router logits
// (exported as the reference of the GPU engine's router_bwd kernel),
// given the full softmax p, the gates and experts ids, the gradient dg of
// the gates and auxGrad, the gradient of the aux term w.r.t. p. With
// g_i = p_i/S (norm): dp_i = (dg_i - Σ_k dg_k·g_k)/S for i in ids;
// without: dp_i = dg_i. Then ds = p∘(dp - Σ p·dp).
func RouterBackRow(ds, p, gates []float32, ids []int32, dg, auxGrad []float32, norm bool) {
	copy(ds, auxGrad)
	if norm {
		var sum, gdg float32
		for s, id := range ids {
			sum += p[id]
			gdg += float32(dg[s] * gates[s]) // the conversion forbids fusing: two roundings, as the GPU's router_bwd
		}
		for s, id := range ids {
			ds[id] += (dg[s] - gdg) / sum
		}
	} else {
		for s, id := range ids {
			ds[id] += dg[s]
		}
	}
	var pdp float32
	for e := range ds {
		pdp += float32(p[e] * ds[e])
	}
	for e := range ds {
		ds[e] = p[e] * (ds[e] - pdp)
	}
}
