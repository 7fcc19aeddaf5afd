package cuda

import (
	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
)

// moeActs are one sparse MoE block's routing and saved activations. The
// experts and gates are chosen on the device by model.TopK's and
// GateWeights' own scans (moe.cu's moe_route), so the GPU engines route as
// the CPU engine does, up to probabilities within rounding of each other;
// the host gets the experts back to group the (token, slot) pairs by
// expert.
type moeActs struct {
	ml  int     // index among the MoE layers
	ids []int32 // [T, k] experts, in slot order
	row []int32 // [T, k]: the grouped row of each (token, slot)
	off []int   // [E+1]: expert e's rows are off[e]..off[e+1]
	// device
	dProbs, dGates, dRow, dTok Buffer
	dIds, dReplay, dPsum       Buffer // [T, k] int32 ×2, [E] float64
	xg, gug, ag, yg            Buffer // [R, H], [R, 2I], [R, I], [R, H], R = T·k
}

// moeForward runs the sparse block of layer L on h2 (the post-attention
// norm's output) and writes out = resid + Σ_s gate_s·expert_s(h2). It adds
// the layer's expert counts and router probability sums to cnt and psum
// (nil when recomputing: counted once, by the forward).
func (e *Engine) moeForward(f *fwdState, mo *moeActs, L *model.Layer, h2, resid, out Buffer, cnt, psum []float64) error {
	c := &e.cfg
	T, H, E, k, I := f.T, c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	R := T * k
	if err := e.linear(mo.dProbs, h2, e.param(e.w, L.Router), T, H, E, E, H); err != nil {
		return err
	}
	if err := e.ops.Softmax(mo.dProbs, T, E); err != nil {
		return err
	}
	// The experts and gates on the device (model.TopK and GateWeights'
	// scans), or the replayed experts uploaded; the host gets the ids back
	// to group the rows by expert.
	var replay Buffer
	if anyReplay(f.replay) {
		rep := make([]int32, R)
		for i := range rep {
			rep[i] = -1 // routed live
		}
		for s, st := range f.starts {
			if s < len(f.replay) && f.replay[s] != nil {
				for i := 0; i < f.lens[s]; i++ {
					f.replay[s].Slots(rep[(st+i)*k:(st+i+1)*k], i, mo.ml)
				}
			}
		}
		replay = mo.dReplay
		if err := kc.Upload(e.dev, replay, rep); err != nil {
			return err
		}
	}
	if err := e.ops.MoERoute(mo.dIds, mo.dGates, mo.dProbs, replay, T, E, k, c.NormTopKProb); err != nil {
		return err
	}
	mo.ids = make([]int32, R)
	if err := kc.Download(e.dev, mo.ids, mo.dIds); err != nil {
		return err
	}
	if psum != nil { // a recomputation counts nothing again
		ps := make([]float64, E)
		if err := e.ops.Launch("moe.cu", "moe_psum", kc.Dim3{X: (E + 127) / 128}, kc.Dim3{X: 128}, mo.dPsum, mo.dProbs, T, E); err != nil {
			return err
		}
		if err := kc.Download(e.dev, ps, mo.dPsum); err != nil {
			return err
		}
		for x := range psum {
			psum[x] += ps[x]
		}
	}
	// Group the (token, slot) pairs by expert, tokens in order.
	var tok []int32
	mo.off, mo.row, tok = model.GroupByExpert(mo.ids, E, k)
	for x := 0; x < E && cnt != nil; x++ {
		cnt[x] += float64(mo.off[x+1] - mo.off[x])
	}
	if err := kc.Upload(e.dev, mo.dRow, mo.row); err != nil {
		return err
	}
	if err := kc.Upload(e.dev, mo.dTok, tok); err != nil {
		return err
	}
	// Each token's input row once per slot, grouped by expert.
	if err := e.ops.Gather(mo.xg, h2, mo.dTok, R, H); err != nil {
		return err
	}
	if e.bf != nil {
		// Each input rounded to bf16 once for every expert's products.
		if err := e.bf.ExpertsBF16(mo.xg, mo.gug, mo.ag, mo.yg, mo.off, func(x int) kc.ExpertWeights {
			ex := &L.Experts[x]
			return kc.ExpertWeights{Gate: e.param(e.w, ex.Gate), Up: e.param(e.w, ex.Up), Down: e.param(e.w, ex.Down)}
		}, H, I); err != nil {
			return err
		}
		return e.ops.MoECombine(out, resid, mo.yg, mo.dGates, mo.dRow, T, k, H)
	}
	if err := model.EachExpert(mo.off, func(x, r0, n int) error {
		ex := &L.Experts[x]
		xg := sub(mo.xg, r0*H, n*H)
		gu := sub(mo.gug, r0*2*I, n*2*I)
		if err := e.ops.LinearMany(xg, n, H, H, kc.Product{Y: gu, W: e.param(e.w, ex.Gate), Out: I, LdY: 2 * I},
			kc.Product{Y: sub(gu, I, n*2*I-I), W: e.param(e.w, ex.Up), Out: I, LdY: 2 * I}); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	if err := e.ops.SwiGLU(mo.ag, mo.gug, R, I); err != nil {
		return err
	}
	if err := model.EachExpert(mo.off, func(x, r0, n int) error {
		if err := e.linear(sub(mo.yg, r0*H, n*H), sub(mo.ag, r0*I, n*I), e.param(e.w, L.Experts[x].Down), n, I, H, H, I); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	return e.ops.MoECombine(out, resid, mo.yg, mo.dGates, mo.dRow, T, k, H)
}

// moeScratch is the MoE backward's scratch, allocated once per Backward
// and shared by the MoE layers (one layer's gradients exist at a time).
type moeScratch struct{ dy, dgt, da, dgu, dxg, dp, aux Buffer }

// newMoEScratch also uploads auxGrad[e] = d(Aux·AuxLoss)/dp_t,e, the same
// for every token and MoE layer.
func (e *Engine) newMoEScratch(tmp *fwdState, T int, auxGrad []float32) (*moeScratch, error) {
	c := &e.cfg
	H, E, k, I := c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	R := T * k
	s := &moeScratch{}
	if err := e.bufs(tmp, span{&s.dy, R * H}, span{&s.dgt, R}, span{&s.da, R * I}, span{&s.dgu, R * 2 * I}, span{&s.dxg, R * H}, span{&s.dp, T * E}, span{&s.aux, E}); err != nil {
		return nil, err
	}
	return s, kc.Upload(e.dev, s.aux, auxGrad)
}

// anyReplay reports whether some sequence replays routes.
func anyReplay(r []*model.Routes) bool {
	for _, x := range r {
		if x != nil {
			return true
		}
	}
	return false
}

// moeBackward backpropagates the sparse block of layer L: from dout, the
// gradient at the block's output, it writes dh2, the gradient at its input
// (the post-attention norm's output), and adds the experts' and router's
// weight gradients.
func (e *Engine) moeBackward(f *fwdState, sc *moeScratch, mo *moeActs, L *model.Layer, h2, dout, dh2 Buffer) error {
	c := &e.cfg
	T, H, k, I := f.T, c.HiddenSize, c.NumExpertsPerTok, c.MoeIntermediateSize
	R := T * k
	dy, dgt, da, dgu, dxg := sc.dy, sc.dgt, sc.da, sc.dgu, sc.dxg
	if err := e.launch("moe.cu", "moe_combine_bwd", rowsGrid(T), block256, dy, dgt, dout, mo.yg, mo.dGates, mo.dRow, k, H); err != nil {
		return err
	}
	if e.bf != nil {
		if err := e.moeExpertsBackBF16(mo, L, sc, R); err != nil {
			return err
		}
		return e.moeRouterBack(f, sc, mo, L, h2, dh2)
	}
	if err := model.EachExpert(mo.off, func(x, r0, n int) error {
		ex := &L.Experts[x]
		dyx, dax := sub(dy, r0*H, n*H), sub(da, r0*I, n*I)
		if err := e.linearBack(dax, e.param(e.g, ex.Down), dyx, sub(mo.ag, r0*I, n*I), e.param(e.w, ex.Down), n, I, H, I, H, I, false); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	if err := e.launch("rows.cu", "swiglu_bwd", elemGrid(R*I), block256, dgu, da, mo.gug, int64(R), I); err != nil {
		return err
	}
	if err := model.EachExpert(mo.off, func(x, r0, n int) error {
		ex := &L.Experts[x]
		dg := sub(dgu, r0*2*I, n*2*I)
		du := sub(dg, I, n*2*I-I)
		xg, dxgx := sub(mo.xg, r0*H, n*H), sub(dxg, r0*H, n*H)
		steps := []func() error{
			func() error {
				return e.linearBack(dxgx, e.param(e.g, ex.Gate), dg, xg, e.param(e.w, ex.Gate), n, H, I, H, 2*I, H, false)
			},
			func() error {
				return e.linearBack(dxgx, e.param(e.g, ex.Up), du, xg, e.param(e.w, ex.Up), n, H, I, H, 2*I, H, true)
			},
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return e.moeRouterBack(f, sc, mo, L, h2, dh2)
}

// moeExpertsBackBF16 is the experts' backward in the bf16 mode: dy, the
// down products' inputs, dgu and the grouped rows each rounded to bf16
// once for every expert's products.
func (e *Engine) moeExpertsBackBF16(mo *moeActs, L *model.Layer, sc *moeScratch, R int) error {
	c := &e.cfg
	H, I := c.HiddenSize, c.MoeIntermediateSize
	dy16, err := e.bf.Round(1, sc.dy, R, H, H)
	if err != nil {
		return err
	}
	ag16, err := e.bf.Round(0, mo.ag, R, I, I)
	if err != nil {
		return err
	}
	if err := model.EachExpert(mo.off, func(x, r0, n int) error {
		ex := &L.Experts[x]
		if err := e.bf.BackBF16(sub(sc.da, r0*I, n*I), e.param(e.g, ex.Down), kc.BF16Rows(dy16, r0*H, n*H), H,
			kc.BF16Rows(ag16, r0*I, n*I), I, e.param(e.w, ex.Down), n, I, H, I, false); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	if err := e.launch("rows.cu", "swiglu_bwd", elemGrid(R*I), block256, sc.dgu, sc.da, mo.gug, int64(R), I); err != nil {
		return err
	}
	dgu16, err := e.bf.Round(1, sc.dgu, R, 2*I, 2*I)
	if err != nil {
		return err
	}
	xg16, err := e.bf.Round(0, mo.xg, R, H, H)
	if err != nil {
		return err
	}
	if err := model.EachExpert(mo.off, func(x, r0, n int) error {
		ex := &L.Experts[x]
		dg := kc.BF16Rows(dgu16, r0*2*I, n*2*I)
		xg, dxgx := kc.BF16Rows(xg16, r0*H, n*H), sub(sc.dxg, r0*H, n*H)
		if err := e.bf.BackBF16(dxgx, e.param(e.g, ex.Gate), dg, 2*I, xg, H, e.param(e.w, ex.Gate), n, H, I, H, false); err != nil {
			return err
		}
		if err := e.bf.BackBF16(dxgx, e.param(e.g, ex.Up), kc.BF16Rows(dg, I, n*2*I-I), 2*I, xg, H, e.param(e.w, ex.Up), n, H, I, H, true); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	return nil
}

// moeRouterBack ends the MoE block's backward: dh2 from the experts'
// input gradients (summed over each token's slots), then the router's
// gradient into dh2 and the router's weights.
func (e *Engine) moeRouterBack(f *fwdState, sc *moeScratch, mo *moeActs, L *model.Layer, h2, dh2 Buffer) error {
	c := &e.cfg
	T, H, E, k := f.T, c.HiddenSize, c.NumExperts, c.NumExpertsPerTok
	dgt, dxg, dp := sc.dgt, sc.dxg, sc.dp
	if err := e.launch("moe.cu", "moe_gather_sum", rowsGrid(T), block256, dh2, dxg, mo.dRow, k, H); err != nil {
		return err
	}
	// The router's gradient, as train.RouterBackRow computes it (sc.aux
	// holds the aux loss's gradient).
	norm := 0
	if c.NormTopKProb {
		norm = 1
	}
	if err := e.ops.Launch("moe.cu", "router_bwd", kc.Dim3{X: (T + 127) / 128}, kc.Dim3{X: 128},
		dp, mo.dProbs, mo.dGates, mo.dIds, dgt, sc.aux, T, E, k, norm); err != nil {
		return err
	}
	return e.linearBack(dh2, e.param(e.g, L.Router), dp, h2, e.param(e.w, L.Router), T, H, E, H, E, H, true)
}
