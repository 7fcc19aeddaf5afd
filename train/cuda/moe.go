package cuda

import (
	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// moeActs are one sparse MoE block's routing (host) and saved activations
// (device). The router's softmax comes to the host, where the experts are
// chosen (top-k, or the replayed ones) and the (token, slot) pairs grouped
// by expert with the CPU engine's functions, so both engines route alike
// and a route is the same whichever engine computed the probabilities
// (up to probabilities within rounding of each other).
type moeActs struct {
	ml    int       // index among the MoE layers
	probs []float32 // [T, E] router softmax
	ids   []int32   // [T, k] experts, in slot order
	gates []float32 // [T, k]
	row   []int32   // [T, k]: the grouped row of each (token, slot)
	off   []int     // [E+1]: expert e's rows are off[e]..off[e+1]
	// device
	dProbs, dGates, dRow, dTok Buffer
	xg, gug, ag, yg            Buffer // [R, H], [R, 2I], [R, I], [R, H], R = T·k
}

// moeForward runs the sparse block of layer L on h2 (the post-attention
// norm's output) and writes out = resid + Σ_s gate_s·expert_s(h2). It adds
// the layer's expert counts and router probability sums to cnt and psum.
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
	mo.probs = make([]float32, T*E)
	if err := kc.Download(e.dev, mo.probs, mo.dProbs); err != nil {
		return err
	}
	mo.ids, mo.gates = make([]int32, R), make([]float32, R)
	for s, st := range f.starts {
		var r *model.Routes
		if s < len(f.replay) {
			r = f.replay[s]
		}
		for i := 0; i < f.lens[s]; i++ {
			t := st + i
			ids, p := mo.ids[t*k:(t+1)*k], mo.probs[t*E:(t+1)*E]
			if r != nil {
				r.Slots(ids, i, mo.ml)
			} else {
				model.TopK(ids, p)
			}
			model.GateWeights(mo.gates[t*k:(t+1)*k], p, ids, c.NormTopKProb)
		}
	}
	// Group the (token, slot) pairs by expert, tokens in order.
	var tok []int32
	mo.off, mo.row, tok = model.GroupByExpert(mo.ids, E, k)
	for x := 0; x < E; x++ {
		cnt[x] += float64(mo.off[x+1] - mo.off[x])
	}
	for t := 0; t < T; t++ {
		for x := 0; x < E; x++ {
			psum[x] += float64(mo.probs[t*E+x])
		}
	}
	for _, u := range []struct {
		b   Buffer
		src any
	}{{mo.dGates, mo.gates}, {mo.dRow, mo.row}, {mo.dTok, tok}} {
		var err error
		switch v := u.src.(type) {
		case []float32:
			err = kc.Upload(e.dev, u.b, v)
		case []int32:
			err = kc.Upload(e.dev, u.b, v)
		}
		if err != nil {
			return err
		}
	}
	// Each token's input row once per slot, grouped by expert.
	if err := e.ops.Gather(mo.xg, h2, mo.dTok, R, H); err != nil {
		return err
	}
	for x := 0; x < E; x++ {
		r0, n := mo.off[x], mo.off[x+1]-mo.off[x]
		if n == 0 {
			continue
		}
		ex := &L.Experts[x]
		xg := sub(mo.xg, r0*H, n*H)
		gu := sub(mo.gug, r0*2*I, n*2*I)
		if err := e.linear(gu, xg, e.param(e.w, ex.Gate), n, H, I, 2*I, H); err != nil {
			return err
		}
		if err := e.linear(sub(gu, I, n*2*I-I), xg, e.param(e.w, ex.Up), n, H, I, 2*I, H); err != nil {
			return err
		}
	}
	if err := e.ops.SwiGLU(mo.ag, mo.gug, R, I); err != nil {
		return err
	}
	for x := 0; x < E; x++ {
		r0, n := mo.off[x], mo.off[x+1]-mo.off[x]
		if n == 0 {
			continue
		}
		if err := e.linear(sub(mo.yg, r0*H, n*H), sub(mo.ag, r0*I, n*I), e.param(e.w, L.Experts[x].Down), n, I, H, H, I); err != nil {
			return err
		}
	}
	return e.ops.MoECombine(out, resid, mo.yg, mo.dGates, mo.dRow, T, k, H)
}

// moeScratch is the MoE backward's scratch, allocated once per Backward
// and shared by the MoE layers (one layer's gradients exist at a time).
type moeScratch struct{ dy, dgt, da, dgu, dxg, dp Buffer }

func (e *Engine) newMoEScratch(tmp *fwdState, T int) (*moeScratch, error) {
	c := &e.cfg
	H, E, k, I := c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	R := T * k
	s := &moeScratch{}
	err := e.bufs(tmp, span{&s.dy, R * H}, span{&s.dgt, R}, span{&s.da, R * I}, span{&s.dgu, R * 2 * I}, span{&s.dxg, R * H}, span{&s.dp, T * E})
	return s, err
}

// moeBackward backpropagates the sparse block of layer L: from dout, the
// gradient at the block's output, it writes dh2, the gradient at its input
// (the post-attention norm's output), and adds the experts' and router's
// weight gradients. auxGrad[e] is d(Aux·AuxLoss)/dp_t,e.
func (e *Engine) moeBackward(f *fwdState, sc *moeScratch, mo *moeActs, L *model.Layer, h2, dout, dh2 Buffer, auxGrad []float32) error {
	c := &e.cfg
	T, H, E, k, I := f.T, c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	R := T * k
	dy, dgt, da, dgu, dxg, dp := sc.dy, sc.dgt, sc.da, sc.dgu, sc.dxg, sc.dp
	if err := e.launch("moe.cu", "moe_combine_bwd", rowsGrid(T), block256, dy, dgt, dout, mo.yg, mo.dGates, mo.dRow, k, H); err != nil {
		return err
	}
	for x := 0; x < E; x++ {
		r0, n := mo.off[x], mo.off[x+1]-mo.off[x]
		if n == 0 {
			continue
		}
		ex := &L.Experts[x]
		dyx, dax := sub(dy, r0*H, n*H), sub(da, r0*I, n*I)
		if err := e.linearBackX(dax, dyx, e.param(e.w, ex.Down), n, I, H, I, H, false); err != nil {
			return err
		}
		if err := e.linearBackW(e.param(e.g, ex.Down), dyx, sub(mo.ag, r0*I, n*I), n, I, H, H, I); err != nil {
			return err
		}
	}
	if err := e.launch("rows.cu", "swiglu_bwd", elemGrid(R*I), block256, dgu, da, mo.gug, int64(R), I); err != nil {
		return err
	}
	for x := 0; x < E; x++ {
		r0, n := mo.off[x], mo.off[x+1]-mo.off[x]
		if n == 0 {
			continue
		}
		ex := &L.Experts[x]
		dg := sub(dgu, r0*2*I, n*2*I)
		du := sub(dg, I, n*2*I-I)
		xg, dxgx := sub(mo.xg, r0*H, n*H), sub(dxg, r0*H, n*H)
		steps := []func() error{
			func() error { return e.linearBackW(e.param(e.g, ex.Gate), dg, xg, n, H, I, 2*I, H) },
			func() error { return e.linearBackW(e.param(e.g, ex.Up), du, xg, n, H, I, 2*I, H) },
			func() error { return e.linearBackX(dxgx, dg, e.param(e.w, ex.Gate), n, H, I, H, 2*I, false) },
			func() error { return e.linearBackX(dxgx, du, e.param(e.w, ex.Up), n, H, I, H, 2*I, true) },
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return err
			}
		}
	}
	if err := e.launch("moe.cu", "moe_gather_sum", rowsGrid(T), block256, dh2, dxg, mo.dRow, k, H); err != nil {
		return err
	}
	// The router's gradient on the host, as the CPU engine computes it.
	dgate := make([]float32, R)
	if err := kc.Download(e.dev, dgate, dgt); err != nil {
		return err
	}
	ds := make([]float32, T*E)
	for t := 0; t < T; t++ {
		train.RouterBackRow(ds[t*E:(t+1)*E], mo.probs[t*E:(t+1)*E], mo.gates[t*k:(t+1)*k], mo.ids[t*k:(t+1)*k], dgate[t*k:(t+1)*k], auxGrad, c.NormTopKProb)
	}
	if err := kc.Upload(e.dev, dp, ds); err != nil {
		return err
	}
	if err := e.linearBackW(e.param(e.g, L.Router), dp, h2, T, H, E, E, H); err != nil {
		return err
	}
	return e.linearBackX(dh2, dp, e.param(e.w, L.Router), T, H, E, H, E, true)
}
