package cuda

import (
	"errors"
	"fmt"
	"sort"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// Backward accumulates into the engine's gradient the gradient of l with
// respect to every parameter, from the activations the last Forward saved.
func (e *Engine) Backward(l train.Loss) error {
	if !e.valid || e.fw == nil {
		return errors.New("train/cuda: Backward called without a successful Forward")
	}
	f := e.fw
	if err := train.CheckLoss(l, f.lens); err != nil {
		return err
	}
	coefLP, coefH := make([]float32, f.T), make([]float32, f.T)
	for s, st := range f.starts {
		copy(coefLP[st:], l.LogProb[s])
		if l.Entropy != nil {
			copy(coefH[st:], l.Entropy[s])
		}
	}
	var tmp fwdState // this call's scratch, freed on return
	defer tmp.free(e.pool)
	if err := e.backward(f, &tmp, coefLP, coefH, l.Aux); err != nil {
		return fmt.Errorf("train/cuda: backward: %w", err)
	}
	if err := e.dev.Sync(); err != nil {
		return err
	}
	// The kept logits (headKeeps) go back to the device, not into the
	// Pool: the step's moments and other engines on the GPU get the room
	// (another Backward of this Forward recomputes them).
	f.freeLogits(e.dev)
	return nil
}

// rows.cu's rmsnorm_bwd_warp: rows of at most normWarpMax elements, a
// chunk of the weight gradient's partial sums every normWarpChunk rows
// (NORM_WMAX, NORM_WCHUNK).
const normWarpMax, normWarpChunk = 256, 256

// normChunks is the number of chunks of partial sums rows.cu's norm
// backward writes over rows of n: normWarpChunk rows a chunk for rows of
// at most normWarpMax (a warp a row), else kc.NormChunk (a block a row).
func normChunks(rows, n int) int {
	if n <= normWarpMax {
		return (rows + normWarpChunk - 1) / normWarpChunk
	}
	return (rows + kc.NormChunk - 1) / kc.NormChunk
}

func (e *Engine) backward(f, tmp *fwdState, coefLP, coefH []float32, aux float64) error {
	d, T := e.dims(), f.T
	m := e.host
	dcl, err := e.floatBuf(tmp, coefLP)
	if err != nil {
		return err
	}
	dch, err := e.floatBuf(tmp, coefH)
	if err != nil {
		return err
	}
	dxf, err := e.buf(tmp, T*d.H)
	if err != nil {
		return err
	}
	if err := e.headBackward(f, dxf, dcl, dch); err != nil {
		return err
	}
	// The norms' weight-gradient partial sums, for the largest of the
	// norms' backward passes (the layer norms over T rows of H, q_norm
	// over T·heads rows of head_dim; k_norm has fewer rows).
	part, err := e.buf(tmp, max(normChunks(T, d.H)*d.H, normChunks(T*d.heads, d.hd)*d.hd))
	if err != nil {
		return err
	}
	// norm backward over rows of n (per to a group of stride), adding the
	// weight gradient into gw. Short rows (q_norm's and k_norm's heads)
	// take a warp each; longer ones a block each.
	normBack := func(dx, dy, x, w, inv, gw Buffer, rows, n, per, stride int, acc bool) error {
		a := 0
		if acc {
			a = 1
		}
		ch := normChunks(rows, n)
		kernel, grid, block := e.ops.NormBackKernel(n, ch, false)
		if n <= normWarpMax {
			kernel, grid, block = "rmsnorm_bwd_warp", kc.Dim3{X: ch}, block256
		}
		if err := e.launch("rows.cu", kernel, grid, block, dx, part, dy, x, w, inv, rows, n, per, int64(stride), a); err != nil {
			return err
		}
		return e.launch("rows.cu", "sum_chunks", kc.SumChunksGrid(n), block256, gw, part, ch, n, 1)
	}
	// resBack is normBack over the residual stream's T rows of H into
	// dres, writing its bf16 rounding into dres16 too where the product
	// that reads dres next is the bf16 mode's (rmsnorm_bwd_dx16: the bits
	// BackFrom16's rounding would give, without its pass).
	var dres16 Buffer
	if e.bf != nil {
		if err := e.bufs(tmp, bf16Span(&dres16, T*d.H)); err != nil {
			return err
		}
	}
	resBack := func(dx, dy, x, w, inv, gw Buffer, acc, copy16 bool) error {
		if !copy16 || e.bf == nil {
			return normBack(dx, dy, x, w, inv, gw, T, d.H, 1, d.H, acc)
		}
		a := 0
		if acc {
			a = 1
		}
		ch := normChunks(T, d.H)
		kernel, grid, block := e.ops.NormBackKernel(d.H, ch, true)
		if d.H <= normWarpMax {
			kernel, grid, block = "rmsnorm_bwd_warp_dx16", kc.Dim3{X: ch}, block256
		}
		if err := e.launch("rows.cu", kernel, grid, block, dx, dres16, part, dy, x, w, inv, T, d.H, 1, int64(d.H), a); err != nil {
			return err
		}
		return e.launch("rows.cu", "sum_chunks", kc.SumChunksGrid(d.H), block256, gw, part, ch, d.H, 1)
	}
	// dense says whether layer li is a dense one (its MLP's down product
	// reads the gradient at the layer's output, dres16 in the bf16 mode).
	dense := func(li int) bool { return li >= 0 && m.Layers[li].Router == nil }
	// normRopeBack is rope_rows (the transpose), normBack in place and the
	// rounding to bf16 in one pass (norm_rope_bwd_bf16, the same bits):
	// dx16 the products' operand, laid out as x (rows ldx apart), dy
	// (float32, rows stride apart) not changed.
	// x, the norm's input (q_raw or k_raw), is bf16 with flash.cu (as its
	// product wrote it), else float32.
	normRopeBack := func(dx16, dy, x, w, inv, gw Buffer, rows, n, per, stride, ldx int) error {
		ch := normChunks(rows, n) // n ≤ normWarpMax: a warp a row
		kernel := "norm_rope_bwd_bf16"
		if e.flash() {
			kernel = "norm_rope_bwd_bf16_x16"
		}
		if err := e.launch("rows.cu", kernel, kc.Dim3{X: ch}, block256, dx16, part, dy, x, w, inv,
			e.rope.cos, e.rope.neg, f.dPos, rows, n, per, int64(stride), int64(ldx)); err != nil {
			return err
		}
		return e.launch("rows.cu", "sum_chunks", kc.SumChunksGrid(n), block256, gw, part, ch, n, 1)
	}
	dres, err := e.buf(tmp, T*d.H)
	if err != nil {
		return err
	}
	if err := resBack(dres, dxf, f.xL, e.param(e.w, m.Norm), f.invf, e.param(e.g, m.Norm), false, dense(len(m.Layers)-1)); err != nil {
		return err
	}
	var da, dgu, dh, datt, dq, dk, dv, dsum, dqkv Buffer
	dvs, datts := span{&dv, T * d.kvd}, span{&datt, T * d.qd}
	if e.flash() {
		// flash.cu writes dv in bf16, the v product's operand, as a column
		// span of dqkv [T, qkvd] (q's and k's gradients beside it, the one
		// product's operand: qkvDy), and takes attention's output gradient
		// in bf16 from the o product's backward, padded as its copies are
		// (the pad rows zero).
		dvs, datts = bf16Span(&dqkv, T*d.qkvd()), bf16Span(&datt, kc.FlashPad(T)*d.qd)
	}
	if err := e.bufs(tmp, span{&dh, T * d.H}, datts,
		span{&dq, T * d.qd}, span{&dk, T * d.kvd}, dvs, span{&dsum, T * d.heads}); err != nil {
		return err
	}
	if pad := kc.FlashPad(T); e.flash() && pad > T { // the pad rows, zero
		if err := e.dev.Zero(kc.BF16Rows(datt, T*d.qd, (pad-T)*d.qd)); err != nil {
			return err
		}
	}
	// qkvDy: the rows of dq16, dk16 and dv, the q, k and v products'
	// gradient operands (qkvd apart with flash.cu, as q_raw, k_raw and v
	// are; else each its own).
	qkvDy := [3]int{d.qd, d.kvd, d.kvd}
	if e.flash() {
		W := d.qkvd()
		qkvDy = [3]int{W, W, W}
		dv = kc.BF16Rows(dqkv, d.qd+d.kvd, T*W-d.qd-d.kvd)
	}
	// The bf16 mode takes q's and k's gradients back through RoPE and
	// their norms straight into the products' bf16 operands.
	var dq16, dk16 Buffer
	fusedQK := e.bf != nil && d.hd <= normWarpMax && !e.unfusedQK
	switch {
	case e.flash(): // spans of dqkv (the unfused path rounds into them too)
		W := d.qkvd()
		dq16, dk16 = kc.BF16Rows(dqkv, 0, T*W), kc.BF16Rows(dqkv, d.qd, T*W-d.qd)
	case fusedQK:
		if err := e.bufs(tmp, bf16Span(&dq16, T*d.qd), bf16Span(&dk16, T*d.kvd)); err != nil {
			return err
		}
	}
	// widened is x ([T, cols]) in float32: x itself, or with flash.cu's
	// bf16 q_raw and k_raw (qkvd apart) a contiguous float32 copy (the
	// unfused path, a test's).
	var wide Buffer
	widened := func(x Buffer, cols int) (Buffer, error) {
		if !e.flash() {
			return x, nil
		}
		if wide.Ptr == 0 {
			var err error
			if wide, err = e.buf(tmp, T*d.qd); err != nil {
				return Buffer{}, err
			}
		}
		return wide, e.ops.FromBF16Rows(wide, x, T, cols, d.qkvd())
	}
	nMoE := len(e.cfg.MoELayers())
	if nMoE < e.cfg.NumHiddenLayers { // dense layers; dgu is the products' bf16 operand in the bf16 mode
		ds := span{&dgu, T * 2 * d.I}
		if e.bf != nil {
			ds = bf16Span(&dgu, T*2*d.I)
		}
		if err := e.bufs(tmp, span{&da, T * d.I}, ds); err != nil {
			return err
		}
	}

	// The aux loss's gradient w.r.t. every router probability p_t,e:
	// Aux·E·c_e/N², the same for every token and MoE layer.
	var auxGrad []float32
	if nMoE > 0 {
		auxGrad = make([]float32, e.cfg.NumExperts)
		if aux != 0 {
			n := float64(T * nMoE)
			for i := range auxGrad {
				auxGrad[i] = float32(aux * float64(e.cfg.NumExperts) * f.auxCnt[i] / (n * n))
			}
		}
	}
	var msc *moeScratch
	if nMoE > 0 {
		if msc, err = e.newMoEScratch(tmp, T, auxGrad); err != nil {
			return err
		}
	}
	var flash *kc.FlashScratch
	if e.flash() {
		if flash, err = kc.NewFlashBackwardGiven(e.pool, T, d.heads, d.kv, d.hd); err != nil {
			return err
		}
		defer flash.Free()
		if f.dOrder.Ptr != 0 {
			if err := flash.UseOrder(f.dOrder); err != nil {
				return err
			}
		}
	}
	var redo Buffer // with recomputation: the recomputed layer's output, unused
	if f.recompute {
		if redo, err = e.buf(tmp, T*d.H); err != nil {
			return err
		}
	}
	if flash != nil && e.ops.FlashDQStored {
		// dS stored for the dQ pass (KEEL_FLASH_DQ=stored; not in the
		// memory plan), the backward's last allocation before the layers:
		// where it cannot be had, the two passes recompute dS, as without.
		if err := flash.StoreScores(f.ends); err != nil && !kc.IsOutOfMemory(err) {
			return err
		}
	}
	for li := len(m.Layers) - 1; li >= 0; li-- {
		l := &m.Layers[li]
		a := &f.layers[li]
		if f.recompute {
			if err := e.recomputeLayer(f, a, l, redo); err != nil {
				return fmt.Errorf("layer %d, recomputing: %w", li, err)
			}
		}
		w := func(p *model.Param) Buffer { return e.param(e.w, p) }
		g := func(p *model.Param) Buffer { return e.param(e.g, p) }
		upI := T*2*d.I - d.I
		// The MLP or MoE block: dres is the gradient at the layer's
		// output; dh becomes the gradient at h2.
		mlp := []func() error{
			func() error {
				if e.bf != nil { // dres16 is dres rounded, by the norm backward that wrote dres
					return e.bf.BackBF16(da, g(l.Down), dres16, d.H, a.ab, d.I, w(l.Down), T, d.I, d.H, d.I, false)
				}
				return e.backSaved(da, g(l.Down), dres, a.a, w(l.Down), T, d.I, d.H, d.I, d.H, false)
			},
			func() error {
				if e.bf != nil {
					return e.ops.SwiGLUBackBF16From16(dgu, da, a.gu, T, d.I)
				}
				return e.launch("rows.cu", "swiglu_bwd", elemGrid(T*d.I), block256, dgu, da, a.gu, int64(T), d.I)
			},
			func() error {
				if e.bf != nil { // dgu in bf16 already
					if err := e.bf.BackBF16(dh, g(l.Gate), dgu, 2*d.I, a.h2b, d.H, w(l.Gate), T, d.H, d.I, d.H, false); err != nil {
						return err
					}
					return e.bf.BackBF16(dh, g(l.Up), kc.BF16Rows(dgu, d.I, upI), 2*d.I, a.h2b, d.H, w(l.Up), T, d.H, d.I, d.H, true)
				}
				if err := e.linearBack(dh, g(l.Gate), dgu, a.h2, w(l.Gate), T, d.H, d.I, d.H, 2*d.I, d.H, false); err != nil {
					return err
				}
				return e.linearBack(dh, g(l.Up), sub(dgu, d.I, upI), a.h2, w(l.Up), T, d.H, d.I, d.H, 2*d.I, d.H, true)
			},
		}
		if a.moe != nil {
			mlp = []func() error{func() error { return e.moeBackward(f, msc, a.moe, l, e.pick(a.h2, a.h2b), dres, dh) }}
		}
		for i, s := range mlp {
			if err := s(); err != nil {
				return fmt.Errorf("layer %d, MLP step %d: %w", li, i, err)
			}
		}
		steps := []func() error{
			// dres becomes the gradient at xmid.
			func() error {
				return resBack(dres, dh, a.xmid, w(l.PostAttnNorm), a.inv2, g(l.PostAttnNorm), true, true)
			},
			// Attention.
			func() error {
				if flash != nil { // datt in bf16, flash.cu's dO
					return e.bf.BackBF16To16(datt, g(l.O), dres16, d.H, a.attb, d.qd, w(l.O), T, d.qd, d.H, d.qd)
				}
				if e.bf != nil {
					return e.bf.BackBF16(datt, g(l.O), dres16, d.H, a.attb, d.qd, w(l.O), T, d.qd, d.H, d.qd, false)
				}
				return e.backSaved(datt, g(l.O), dres, a.att, w(l.O), T, d.qd, d.H, d.qd, d.H, false)
			},
			func() error {
				if flash != nil {
					if err := flash.UseQKVRows(a.q16, a.k16, a.v, d.qkvd()); err != nil {
						return err
					}
					if err := flash.UseDO(datt); err != nil {
						return err
					}
					return e.ops.FlashAttentionBackward(flash, dq, dk, dv, dsum, Buffer{}, a.attb, a.lse, Buffer{}, Buffer{}, Buffer{}, f.dStart, f.dEnd, d.scale)
				}
				if err := e.launch("attn.cu", "attn_bwd_q", kc.Dim3{X: T, Y: (d.heads + 3) / 4}, kc.Dim3{X: 128},
					dq, dsum, datt, a.att, a.lse, a.q, a.k, a.v, f.dStart, d.heads, d.kv, d.hd, d.scale); err != nil {
					return err
				}
				return e.launch("attn.cu", "attn_bwd_kv", kc.Dim3{X: T, Y: (d.kv + 3) / 4}, kc.Dim3{X: 128},
					dk, dv, datt, a.lse, dsum, a.q, a.k, a.v, f.dEnd, d.heads, d.kv, d.hd, d.scale)
			},
		}
		// qkProducts: the q and k products' backward from dq16 and dk16,
		// and with flash.cu where the weights lie back to back v's too,
		// as one product over dqkv (v's step below then has none).
		joined := e.flash() && e.qkvJoined(l)
		qkProducts := func() error {
			if joined {
				wj, gj := e.qkvJoint(e.w, l), e.qkvJoint(e.g, l)
				return e.bf.BackBF16(dh, gj, dqkv, d.qkvd(), a.h1b, d.H, wj, T, d.H, d.qkvd(), d.H, false)
			}
			if err := e.bf.BackBF16(dh, g(l.Q), dq16, qkvDy[0], a.h1b, d.H, w(l.Q), T, d.H, d.qd, d.H, false); err != nil {
				return err
			}
			return e.bf.BackBF16(dh, g(l.K), dk16, qkvDy[1], a.h1b, d.H, w(l.K), T, d.H, d.kvd, d.H, true)
		}
		if fusedQK { // RoPE's and the norms' backward and the rounding, one pass each for q and k
			steps = append(steps,
				func() error {
					return normRopeBack(dq16, dq, a.qraw, w(l.QNorm), a.invq, g(l.QNorm), T*d.heads, d.hd, d.heads, d.qd, qkvDy[0])
				},
				func() error {
					return normRopeBack(dk16, dk, a.kraw, w(l.KNorm), a.invk, g(l.KNorm), T*d.kv, d.hd, d.kv, d.kvd, qkvDy[1])
				},
				qkProducts)
		} else {
			steps = append(steps,
				func() error {
					return e.launch("rows.cu", "rope_rows", rowsGrid(T), block256, dq, e.rope.cos, e.rope.neg, f.dPos, d.heads, d.hd, int64(d.qd))
				},
				func() error {
					return e.launch("rows.cu", "rope_rows", rowsGrid(T), block256, dk, e.rope.cos, e.rope.neg, f.dPos, d.kv, d.hd, int64(d.kvd))
				},
				// q_norm and k_norm, per head row, in place (from float32
				// copies of q_raw and k_raw where the products wrote bf16).
				func() error {
					x, err := widened(a.qraw, d.qd)
					if err != nil {
						return err
					}
					return normBack(dq, dq, x, w(l.QNorm), a.invq, g(l.QNorm), T*d.heads, d.hd, d.heads, d.qd, false)
				},
				func() error {
					x, err := widened(a.kraw, d.kvd)
					if err != nil {
						return err
					}
					return normBack(dk, dk, x, w(l.KNorm), a.invk, g(l.KNorm), T*d.kv, d.hd, d.kv, d.kvd, false)
				},
				func() error {
					if e.flash() { // rounded into dqkv's spans, then the fused path's products
						if err := e.ops.ToBF16RowsOut(dq16, dq, T, d.qd, qkvDy[0]); err != nil {
							return err
						}
						if err := e.ops.ToBF16RowsOut(dk16, dk, T, d.kvd, qkvDy[1]); err != nil {
							return err
						}
						return qkProducts()
					}
					h1 := e.pick(a.h1, a.h1b)
					if err := e.backSaved(dh, g(l.Q), dq, h1, w(l.Q), T, d.H, d.qd, d.H, d.qd, false); err != nil {
						return err
					}
					return e.backSaved(dh, g(l.K), dk, h1, w(l.K), T, d.H, d.kvd, d.H, d.kvd, true)
				})
		}
		steps = append(steps,
			func() error {
				if e.flash() { // dv in bf16 already
					if joined {
						return nil // with q's and k's, above
					}
					return e.bf.BackBF16(dh, g(l.V), dv, qkvDy[2], a.h1b, d.H, w(l.V), T, d.H, d.kvd, d.H, true)
				}
				return e.backSaved(dh, g(l.V), dv, e.pick(a.h1, a.h1b), w(l.V), T, d.H, d.kvd, d.H, d.kvd, true)
			},
			// dres becomes the gradient at the layer's input.
			func() error {
				return resBack(dres, dh, a.x, w(l.InputNorm), a.inv1, g(l.InputNorm), true, dense(li-1))
			},
		)
		for i, s := range steps {
			if err := s(); err != nil {
				return fmt.Errorf("layer %d, step %d: %w", li, i, err)
			}
		}
	}
	return e.embedBackward(f, tmp, dres)
}

// recomputeLayer runs layer l's forward again from its saved input a.x
// into a's (shared) activations, for its backward, but for attention on
// the tensor cores, whose output and log-sum-exp the forward kept
// (layerBufs). The routing of an MoE layer comes out the same (the same
// kernels on the same input, or the same replayed routes); its
// statistics were counted by the forward.
func (e *Engine) recomputeLayer(f *fwdState, a *layerActs, l *model.Layer, out Buffer) error {
	f.redoing = true
	defer func() { f.redoing = false }()
	if err := e.attentionForward(f, a, l); err != nil {
		return err
	}
	if a.moe != nil {
		return e.moeForward(f, a.moe, l, e.pick(a.h2, a.h2b), a.xmid, out, false)
	}
	return e.mlpForward(f, a, l, out)
}

func (e *Engine) floatBuf(f *fwdState, v []float32) (Buffer, error) {
	b, err := e.buf(f, len(v))
	if err != nil {
		return b, err
	}
	return b, kc.Upload(e.dev, b, v)
}

// headBackward writes dxf, the gradient at the final norm's output, and
// adds the LM head's (or the tied embedding's) gradient, chunk by chunk of
// rows as the forward went, recomputing each chunk's logits unless the
// forward kept them (headKeeps) (and in the float32 mode their
// log-softmax; the bf16 mode takes each row's log-sum-exp and entropy
// from the forward, so it reads the logits once).
func (e *Engine) headBackward(f *fwdState, dxf, dcl, dch Buffer) error {
	d := e.dims()
	C := e.headChunk(f.T)
	kept := f.logits.Ptr != 0 // the forward's logits (headKeeps): no product to recompute them
	var z Buffer
	var err error
	if !kept {
		if z, err = e.scratch(C * d.V); err != nil {
			return err
		}
		defer e.pool.Free(z)
	}
	// The bf16 mode writes the logits' gradient as the products' bf16
	// operand, apart from the log-probabilities.
	var z16 Buffer
	if e.bf != nil {
		if z16, err = e.scratch((C*d.V + 1) / 2); err != nil {
			return err
		}
		defer e.pool.Free(z16)
	}
	lm, glm := e.param(e.w, e.host.LMHead), e.param(e.g, e.host.LMHead)
	for c0 := 0; c0 < f.T; c0 += C {
		rows := min(C, f.T-c0)
		xf := e.rows(f.xf, c0*d.H, rows*d.H)
		dx := sub(dxf, c0*d.H, rows*d.H)
		if kept {
			z = sub(f.logits, c0*d.V, rows*d.V)
		}
		steps := []func() error{
			func() error {
				if kept {
					return nil
				}
				return e.linears(xf, rows, d.H, kc.Product{Y: z, W: lm, Out: d.V, LdY: d.V})
			},
			func() error {
				if e.bf != nil { // from the forward's log-sum-exp and entropy, the gradient written in bf16
					if err := e.launch("head.cu", "head_grad_bf16_saved", rowsGrid(rows), block256, z16, z, sub(f.lse, c0, rows), sub(f.ent, c0, rows),
						sub(dcl, c0, rows), sub(dch, c0, rows), intSub(f.dTargets, c0, rows), d.V, f.temp); err != nil {
						return err
					}
					return e.bf.BackBF16(dx, glm, z16, d.V, xf, d.H, lm, rows, d.H, d.V, d.H, false)
				}
				if err := e.ops.LogSoftmax(z, Buffer{}, rows, d.V, f.temp); err != nil {
					return err
				}
				if err := e.launch("head.cu", "head_bwd", rowsGrid(rows), block256, z, z, sub(dcl, c0, rows), sub(dch, c0, rows),
					intSub(f.dTargets, c0, rows), d.V, f.temp); err != nil {
					return err
				}
				return e.linearBack(dx, glm, z, xf, lm, rows, d.H, d.V, d.H, d.V, d.H, false)
			},
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return err
			}
		}
	}
	// z goes back to the Pool on return, without waiting for the work
	// that reads it: whoever gets it next issues after that work.
	return nil
}

// embedBackward adds the rows of dx to the embedding's gradient, grouped by
// token on the host so that each token's rows are added in order without
// atomics.
func (e *Engine) embedBackward(f, tmp *fwdState, dx Buffer) error {
	rows := make([]int32, f.T)
	for i := range rows {
		rows[i] = int32(i)
	}
	sort.SliceStable(rows, func(a, b int) bool { return f.tokens[rows[a]] < f.tokens[rows[b]] })
	var uniq, offs []int32
	for i, r := range rows {
		if i == 0 || f.tokens[r] != f.tokens[rows[i-1]] {
			uniq = append(uniq, f.tokens[r])
			offs = append(offs, int32(i))
		}
	}
	offs = append(offs, int32(len(rows)))
	bu, err := e.intBuf(tmp, uniq)
	if err != nil {
		return err
	}
	bo, err := e.intBuf(tmp, offs)
	if err != nil {
		return err
	}
	br, err := e.intBuf(tmp, rows)
	if err != nil {
		return err
	}
	return e.launch("convert.cu", "embed_bwd", kc.Dim3{X: len(uniq)}, block256, e.param(e.g, e.host.Embed), dx, bu, bo, br, e.cfg.HiddenSize)
}
