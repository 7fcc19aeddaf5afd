package cuda

import (
	"fmt"
	"os"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
)

// moeActs are one sparse MoE block's routing and saved activations. The
// experts and gates are chosen on the device by model.TopK's and
// GateWeights' own scans (moe.cu's moe_route), so the GPU engines route as
// the CPU engine does, up to probabilities within rounding of each other,
// and the (token, slot) pairs are grouped by expert there too (moe.cu's
// moe_group_*), so that the forward runs every expert in one grouped
// launch and needs the host for nothing: the experts, the offsets and
// the router's probability mass come back after the last layer (moeHost),
// for the routes, the load-balancing loss and the backward's products
// per expert.
type moeActs struct {
	ml  int     // index among the MoE layers
	ids []int32 // [T, k] experts, in slot order (moeRoutes)
	off []int   // [E+1]: expert e's rows are off[e]..off[e+1] (moeRoutes)
	// hostFresh says ids and off hold the last moeForward's grouping.
	hostFresh bool
	// device
	dProbs, dGates  Buffer
	dIds, dPsum     Buffer // [T, k] int32, [E] float64
	grp             kc.MoEGroups
	xg, gug, ag, yg Buffer // [R, H], [R, 2I], [R, I], [R, H], R = T·k; all four in bf16 in the bf16 mode
}

// moeForward runs the sparse block of layer L on h2 (the post-attention
// norm's output) and writes out = resid + Σ_s gate_s·expert_s(h2), on
// the device alone: the router, the experts (or the replayed ones
// uploaded), their grouping, every expert's products in one launch
// (float32: gemm_f32_grouped, the per-expert products' bits; bf16:
// gemm_bf16_grouped on the tensor cores) and the gates' combination. With
// count it also sums the router's probabilities per expert into
// mo.dPsum (a recomputation counts nothing again); moeHost brings back
// what the host needs.
func (e *Engine) moeForward(f *fwdState, mo *moeActs, L *model.Layer, h2, resid, out Buffer, count bool) error {
	c := &e.cfg
	T, H, E, k, I := f.T, c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	R := T * k
	mo.hostFresh = false
	ew, err := e.expertSpans(e.w, L)
	if err != nil {
		return err
	}
	if err := e.linears(h2, T, H, kc.Product{Y: mo.dProbs, W: e.param(e.w, L.Router), Out: E, LdY: E}); err != nil {
		return err
	}
	if err := e.ops.Softmax(mo.dProbs, T, E); err != nil {
		return err
	}
	// The experts and gates on the device (model.TopK and GateWeights'
	// scans), or the replayed experts (uploadReplay).
	var replay Buffer
	if f.dReplay.Ptr != 0 {
		replay = sub(f.dReplay, mo.ml*R, R)
	}
	steps := []func() error{
		func() error { return e.ops.MoERoute(mo.dIds, mo.dGates, mo.dProbs, replay, T, E, k, c.NormTopKProb) },
		func() error {
			if !count {
				return nil
			}
			return e.ops.Launch("moe.cu", "moe_psum", kc.Dim3{X: (E + 127) / 128}, kc.Dim3{X: 128}, mo.dPsum, mo.dProbs, T, E)
		},
		func() error { return e.ops.MoEGroup(&mo.grp, mo.dIds, R, k) },
		// Each token's input row once per slot, grouped by expert (in bf16
		// in the bf16 mode, as the products and their gradients read it).
		func() error {
			if e.bf != nil {
				return e.ops.GatherBF16(mo.xg, h2, mo.grp.Tok, R, H)
			}
			return e.ops.Gather(mo.xg, h2, mo.grp.Tok, R, H)
		},
	}
	if e.perLaunch() {
		steps = append(steps, func() error {
			if err := e.moeRoutes(mo, T); err != nil {
				return err
			}
			return e.bf.ExpertsBF16(mo.xg, mo.gug, mo.ag, mo.yg, mo.off, func(x int) kc.ExpertWeights {
				ex := &L.Experts[x]
				return kc.ExpertWeights{Gate: e.param(e.w, ex.Gate), Up: e.param(e.w, ex.Up), Down: e.param(e.w, ex.Down)}
			}, H, I, true)
		})
	} else if e.bf != nil {
		steps = append(steps,
			func() error { return e.bf.Grouped16(&mo.grp, R, mo.gug, mo.xg, ew.gateUp, 2*I, H, H, 2*I, ew.stride) },
			func() error { return e.ops.SwiGLUBF16From16(mo.ag, mo.gug, R, I) },
			func() error { return e.bf.Grouped16(&mo.grp, R, mo.yg, mo.ag, ew.down, H, I, I, H, ew.stride) })
	} else {
		steps = append(steps,
			func() error {
				return e.ops.GemmGrouped(&mo.grp, R, mo.gug, mo.xg, ew.gateUp, 2*I, H, H, 2*I, ew.stride, false)
			},
			func() error { return e.ops.SwiGLU(mo.ag, mo.gug, R, I) },
			func() error {
				return e.ops.GemmGrouped(&mo.grp, R, mo.yg, mo.ag, ew.down, H, I, I, H, ew.stride, false)
			})
	}
	steps = append(steps, func() error {
		if e.bf != nil { // the experts' outputs in bf16
			return e.ops.MoECombine16(out, resid, mo.yg, mo.dGates, mo.grp.Row, T, k, H)
		}
		return e.ops.MoECombine(out, resid, mo.yg, mo.dGates, mo.grp.Row, T, k, H)
	})
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// perLaunch says whether the bf16 mode's expert products run one
// cuBLASLt product per expert (KEEL_MOE_GROUP=host, or expertsPerLaunch),
// from offsets brought to the host, rather than grouped on the tensor
// cores.
func (e *Engine) perLaunch() bool {
	return e.bf != nil && (e.expertsPerLaunch || os.Getenv("KEEL_MOE_GROUP") == "host")
}

// moeHost copies back what the host needs of an MoE block's forward: the
// experts (the routes) and the grouping's offsets (moeRoutes, unless the
// forward's products per expert brought them already) and, into cnt and
// psum where they are not nil, the pairs
// routed to each expert and the router's probability mass (the
// load-balancing loss).
func (e *Engine) moeHost(mo *moeActs, T int, cnt, psum []float64) error {
	E := e.cfg.NumExperts
	if !mo.hostFresh {
		if err := e.moeRoutes(mo, T); err != nil {
			return err
		}
	}
	for x := 0; x < E && cnt != nil; x++ {
		cnt[x] += float64(mo.off[x+1] - mo.off[x])
	}
	if psum == nil {
		return nil
	}
	ps := make([]float64, E)
	if err := kc.Download(e.dev, ps, mo.dPsum); err != nil {
		return err
	}
	for x := range psum {
		psum[x] += ps[x]
	}
	return nil
}

// moeRoutes copies the block's experts and the grouping's offsets to the
// host (mo.ids, mo.off).
func (e *Engine) moeRoutes(mo *moeActs, T int) error {
	c := &e.cfg
	E, k := c.NumExperts, c.NumExpertsPerTok
	mo.ids = make([]int32, T*k)
	if err := kc.Download(e.dev, mo.ids, mo.dIds); err != nil {
		return err
	}
	off := make([]int32, E+1)
	if err := kc.Download(e.dev, off, mo.grp.Off); err != nil {
		return err
	}
	mo.off = make([]int, E+1)
	for x, o := range off {
		mo.off[x] = int(o)
	}
	mo.hostFresh = true
	return nil
}

// expertsAndGradients are layer L's experts' weights and gradients as the
// grouped products read them.
func (e *Engine) expertsAndGradients(L *model.Layer) (w, g expertWeights, err error) {
	if w, err = e.expertSpans(e.w, L); err != nil {
		return w, g, err
	}
	g, err = e.expertSpans(e.g, L)
	return w, g, err
}

// expertWeights are an MoE layer's experts as the grouped products read
// them: every expert's gate and up projections ([2I, H], side by side in
// the arena) and down projection ([H, I]), expert x's stride floats after
// expert 0's.
type expertWeights struct {
	gateUp, down Buffer
	stride       int
}

// expertSpans finds layer L's experts in b, the weights or the gradients
// (the arena's layout), as the grouped products read them
// (model.ExpertLayout).
func (e *Engine) expertSpans(b Buffer, L *model.Layer) (expertWeights, error) {
	c := &e.cfg
	H, I, E := c.HiddenSize, c.MoeIntermediateSize, len(L.Experts)
	gate0, down0, stride, err := model.ExpertLayout(e.offs, L, H, I)
	if err != nil {
		return expertWeights{}, fmt.Errorf("train/cuda: %w", err)
	}
	return expertWeights{gateUp: sub(b, gate0, (E-1)*stride+2*I*H), down: sub(b, down0, (E-1)*stride+H*I), stride: stride}, nil
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
	dy := span{&s.dy, R * H}
	if e.bf != nil { // the experts' down products' gradient operand, written in bf16 (moe_combine_bwd_y16)
		dy = bf16Span(&s.dy, R*H)
	}
	if err := e.bufs(tmp, dy, span{&s.dgt, R}, span{&s.da, R * I}, span{&s.dgu, R * 2 * I}, span{&s.dxg, R * H}, span{&s.dp, T * E}, span{&s.aux, E}); err != nil {
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
	T, H, k := f.T, c.HiddenSize, c.NumExpertsPerTok
	R := T * k
	combine := "moe_combine_bwd"
	if e.bf != nil { // the experts' outputs in bf16
		combine = "moe_combine_bwd_y16"
	}
	if err := e.launch("moe.cu", combine, rowsGrid(T), block256, sc.dy, sc.dgt, dout, mo.yg, mo.dGates, mo.grp.Row, k, H); err != nil {
		return err
	}
	var err error
	switch {
	case e.perLaunch():
		err = e.moeExpertsBackBF16(mo, L, sc, R)
	case e.bf != nil:
		err = e.moeExpertsBackGroupedBF16(mo, L, sc, R)
	default:
		err = e.moeExpertsBackGrouped(mo, L, sc, R)
	}
	if err != nil {
		return err
	}
	return e.moeRouterBack(f, sc, mo, L, h2, dh2)
}

// moeExpertsBackGrouped is the experts' backward in float32, every
// expert's products in one grouped launch each (the bits of the products
// per expert): da = dy·W_down and its weights' gradient, SwiGLU's
// backward, then dxg = dg·W_gate + du·W_up (two launches, summed as the
// per-expert products sum them) and the gate's and up's gradients in one.
func (e *Engine) moeExpertsBackGrouped(mo *moeActs, L *model.Layer, sc *moeScratch, R int) error {
	c := &e.cfg
	H, I := c.HiddenSize, c.MoeIntermediateSize
	ew, gw, err := e.expertsAndGradients(L)
	if err != nil {
		return err
	}
	g, S := &mo.grp, ew.stride
	up := sub(ew.gateUp, I*H, int(ew.gateUp.Size/4)-I*H) // expert 0's up projection onwards
	steps := []func() error{
		func() error { return e.ops.GemmGroupedBackX(g, R, sc.da, sc.dy, ew.down, H, I, H, I, S, false) },
		func() error { return e.ops.GemmGroupedBackW(g, gw.down, sc.dy, mo.ag, H, I, H, I, S) },
		func() error {
			return e.launch("rows.cu", "swiglu_bwd", elemGrid(R*I), block256, sc.dgu, sc.da, mo.gug, int64(R), I)
		},
		func() error { return e.ops.GemmGroupedBackX(g, R, sc.dxg, sc.dgu, ew.gateUp, I, H, 2*I, H, S, false) },
		func() error {
			return e.ops.GemmGroupedBackX(g, R, sc.dxg, sub(sc.dgu, I, R*2*I-I), up, I, H, 2*I, H, S, true)
		},
		func() error { return e.ops.GemmGroupedBackW(g, gw.gateUp, sc.dgu, mo.xg, 2*I, H, 2*I, H, S) },
	}
	for _, st := range steps {
		if err := st(); err != nil {
			return err
		}
	}
	return nil
}

// moeExpertsBackGroupedBF16 is the experts' backward in the bf16 mode,
// every expert's products in one grouped launch each on the tensor cores:
// dy as the combination's backward wrote it (bf16), the down products'
// inputs and the grouped rows as the
// forward kept them (bf16), SwiGLU's backward writing dgu in bf16 (into
// dgu's room), and dxg = dgu·[W_gate; W_up] in one product.
func (e *Engine) moeExpertsBackGroupedBF16(mo *moeActs, L *model.Layer, sc *moeScratch, R int) error {
	c := &e.cfg
	H, I := c.HiddenSize, c.MoeIntermediateSize
	ew, gw, err := e.expertsAndGradients(L)
	if err != nil {
		return err
	}
	g, S := &mo.grp, ew.stride
	dgu16, dy16 := sc.dgu, sc.dy // dgu: bf16 [R, 2I] in the float32 buffer's first half; dy in bf16 (moe_combine_bwd_y16)
	steps := []func() error{
		func() error {
			return e.bf.GroupedBack(g, R, sc.da, gw.down, dy16, mo.ag, ew.down, H, I, H, I, I, S, false)
		},
		func() error { return e.ops.SwiGLUBackBF16From16(dgu16, sc.da, mo.gug, R, I) },
		func() error {
			return e.bf.GroupedBack(g, R, sc.dxg, gw.gateUp, dgu16, mo.xg, ew.gateUp, 2*I, H, 2*I, H, H, S, false)
		},
	}
	for _, st := range steps {
		if err := st(); err != nil {
			return err
		}
	}
	return nil
}

// moeExpertsBackBF16 is the experts' backward in the bf16 mode with a
// cuBLASLt product per expert (KEEL_MOE_GROUP=host): dy in bf16 as the
// combination's backward wrote it, dgu written in bf16 by SwiGLU's
// backward, the other inputs as the forward kept them (bf16).
func (e *Engine) moeExpertsBackBF16(mo *moeActs, L *model.Layer, sc *moeScratch, R int) error {
	c := &e.cfg
	H, I := c.HiddenSize, c.MoeIntermediateSize
	dy16 := sc.dy                             // in bf16 (moe_combine_bwd_y16)
	ag16, xg16, dgu16 := mo.ag, mo.xg, sc.dgu // the forward's bf16 rows; dgu in bf16 in its room
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
	if err := e.ops.SwiGLUBackBF16From16(dgu16, sc.da, mo.gug, R, I); err != nil {
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
	if err := e.launch("moe.cu", "moe_gather_sum", rowsGrid(T), block256, dh2, dxg, mo.grp.Row, k, H); err != nil {
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
	return e.backSaved(dh2, e.param(e.g, L.Router), dp, h2, e.param(e.w, L.Router), T, H, E, H, E, true)
}
