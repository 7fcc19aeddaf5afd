package cuda

import (
	"encoding/json"
	"fmt"
	"math"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/memplan"
)

func jsonConfig(c train.AdamWConfig) (json.RawMessage, error) { return json.Marshal(c) }

// ropeTables are the RoPE cosines, sines and negated sines (the backward's
// rotation) on the device, computed on the host by model.RopeTables as the
// CPU engine computes them, for positions below n.
type ropeTables struct {
	n             int
	cos, sin, neg Buffer
}

func (r *ropeTables) free(d *kc.Device) {
	for _, b := range []Buffer{r.cos, r.sin, r.neg} {
		if b.Ptr != 0 {
			d.Free(b)
		}
	}
	*r = ropeTables{}
}

func (e *Engine) ensureRope(n int) error {
	if e.rope.n >= n {
		return nil
	}
	n = max(n, 2*e.rope.n, 64)
	e.rope.free(e.dev)
	cos, sin := model.RopeTables(e.cfg.HeadDim, e.cfg.RopeTheta, n)
	neg := make([]float32, len(sin))
	for i, v := range sin {
		neg[i] = -v
	}
	for _, t := range []struct {
		b   *Buffer
		src []float32
	}{{&e.rope.cos, cos}, {&e.rope.sin, sin}, {&e.rope.neg, neg}} {
		b, err := e.alloc(len(t.src))
		if err != nil {
			return err
		}
		*t.b = b
		if err := kc.Upload(e.dev, b, t.src); err != nil {
			return err
		}
	}
	e.rope.n = n
	return nil
}

// layerActs are what one decoder layer's backward needs, saved by the
// forward (no recomputation yet).
type layerActs struct {
	x, h1, qraw, kraw, q, k, v, att, xmid, h2, gu, a Buffer
	inv1, invq, invk, lse, inv2                      Buffer
	// In the bf16 mode the products' inputs are kept as the bf16 copies
	// the products read (h1, h2 and a dense layer's a only so; att also
	// in float32 where attention is attn.cu's, whose backward reads it):
	// the forward makes each once, in the kernel that computes it where
	// one can, and the backward's weight gradients read them again. gu is
	// bf16 in the bf16 mode, as its products write it.
	h1b, attb, h2b, ab Buffer
	// With flash.cu (the bf16 mode at its head sizes), q and k after
	// their norm and RoPE are kept only as flash.cu's bf16 row-major
	// copies ([FlashPad(T), width], the pad rows zero), which
	// NormRopeBF16From16 writes and both attention passes read
	// (FlashScratch.UseQKVRows); q and k stay unused. qraw, kraw and v hold
	// bf16 then, as their one product writes them: column spans of qkv
	// [FlashPad(T), qd + 2·kvd] (the pad rows zero), v flash.cu's copy of
	// v with its rows that far apart (UseQKVRows).
	q16, k16, qkv Buffer
	moe           *moeActs // nil in dense layers
}

// fwdState is one Forward's input and saved activations.
type fwdState struct {
	lens, starts []int
	T            int
	temp         float32
	tokens       []int32 // packed
	ends         []int32 // each token's sequence end (one past its last token), as dEnd holds it
	// device copies of the packed tokens, positions, each token's sequence
	// start and end, and each row's next token (-1 at a sequence's end)
	dTokens, dPos, dStart, dEnd, dTargets Buffer
	dReplay                               Buffer // [MoE layers][T·k] replayed experts, -1 routed live (uploadReplay)
	dOrder                                Buffer // flash.cu's tiles' order (kc.FlashOrder), with flash.cu unless Ops.FlashNoOrder
	layers                                []layerActs
	xL, invf, xf                          Buffer // last residual, final norm
	lp, ent                               Buffer // [T]
	lse                                   Buffer // [T] the bf16 mode's log-sum-exp of each row's logits, for the backward
	logits                                Buffer // [T, V] the bf16 mode's logits, kept for the backward where they fit (headKeeps; the device's, not the Pool's)
	bufs                                  []Buffer
	replay                                []*model.Routes
	work                                  *layerActs       // with recomputation: the layers' shared activations
	recompute                             bool             // this forward's setting, which its backward follows
	redoing                               bool             // the backward is recomputing a layer (recomputeLayer)
	aux                                   float64          // the MoE load-balancing loss
	auxCnt                                []float64        // per expert: (token, slot) pairs routed to it
	flash                                 *kc.FlashScratch // the bf16 mode's attention copies (forward)
}

func (f *fwdState) free(m kc.Memory) {
	for _, b := range f.bufs {
		m.Free(b)
	}
	f.bufs = nil
	f.freeLogits(m.Device())
	if f.flash != nil {
		f.flash.Free()
		f.flash = nil
	}
}

func (e *Engine) buf(f *fwdState, floats int) (Buffer, error) {
	b, err := e.scratch(floats)
	if err == nil {
		f.bufs = append(f.bufs, b)
	}
	return b, err
}

// span asks for n floats of device memory into *b.
type span struct {
	b *Buffer
	n int
}

// bf16Span asks for n bf16 values (half as many floats, rounded up).
func bf16Span(b *Buffer, n int) span { return span{b, (n + 1) / 2} }

// bufs allocates each span as part of f (freed with f); a span without a
// buffer (span{}) is skipped.
func (e *Engine) bufs(f *fwdState, spans ...span) error {
	for _, s := range spans {
		if s.b == nil { // a buffer this mode does without
			continue
		}
		var err error
		if *s.b, err = e.buf(f, s.n); err != nil {
			return err
		}
	}
	return nil
}

// uploadReplay copies every MoE layer's replayed experts (R2, R3) to the
// device at once, before the forward's first launch: an upload waits for
// the work queued before it, so one per layer would stop the GPU at every
// MoE layer. f.dReplay is [MoE layers][T·k], -1 where a token is routed
// live; it stays empty when nothing is replayed.
func (e *Engine) uploadReplay(f *fwdState) error {
	nMoE := len(e.cfg.MoELayers())
	if nMoE == 0 || !anyReplay(f.replay) {
		return nil
	}
	k := e.cfg.NumExpertsPerTok
	R := f.T * k
	rep := make([]int32, nMoE*R)
	for i := range rep {
		rep[i] = -1
	}
	for ml := range nMoE {
		for s, st := range f.starts {
			if s < len(f.replay) && f.replay[s] != nil {
				for i := 0; i < f.lens[s]; i++ {
					f.replay[s].Slots(rep[ml*R+(st+i)*k:ml*R+(st+i+1)*k], i, ml)
				}
			}
		}
	}
	var err error
	f.dReplay, err = e.intBuf(f, rep)
	return err
}

func (e *Engine) intBuf(f *fwdState, v []int32) (Buffer, error) {
	b, err := e.buf(f, len(v))
	if err != nil {
		return b, err
	}
	return b, kc.Upload(e.dev, b, v)
}

// Forward runs the model over seqs, saves what Backward needs and returns
// the log-probabilities (and entropies) of every next token.
func (e *Engine) Forward(seqs [][]int32, opt train.ForwardOptions) (*train.Result, error) {
	e.valid = false
	if err := train.CheckForward(&e.cfg, seqs, opt); err != nil {
		return nil, err
	}
	if e.fw != nil {
		e.fw.free(e.pool)
	}
	f := &fwdState{temp: 1, replay: opt.Replay, recompute: e.recompute}
	e.fw = f
	if opt.Temperature != 0 {
		f.temp = float32(opt.Temperature)
	}
	var pos, start, targets []int32
	maxLen := 0
	for _, s := range seqs {
		f.starts = append(f.starts, f.T)
		f.lens = append(f.lens, len(s))
		for i, t := range s {
			f.tokens = append(f.tokens, t)
			pos = append(pos, int32(i))
			start = append(start, int32(f.T))
			f.ends = append(f.ends, int32(f.T+len(s)))
			next := int32(-1)
			if i+1 < len(s) {
				next = s[i+1]
			}
			targets = append(targets, next)
		}
		f.T += len(s)
		maxLen = max(maxLen, len(s))
	}
	if free, _, err := e.dev.MemInfo(); err != nil {
		return nil, err
	} else if err := checkActivations(&e.cfg, f.T, free+e.pool.Cached()+e.scratchHeld(), e.precision(), e.recompute); err != nil {
		return nil, err
	}
	if err := e.ensureRope(maxLen); err != nil {
		return nil, err
	}
	var err error
	for _, t := range []struct {
		b   *Buffer
		src []int32
	}{{&f.dTokens, f.tokens}, {&f.dPos, pos}, {&f.dStart, start}, {&f.dEnd, f.ends}, {&f.dTargets, targets}} {
		if *t.b, err = e.intBuf(f, t.src); err != nil {
			return nil, err
		}
	}
	if e.flash() && !e.ops.FlashNoOrder {
		// flash.cu's tiles the heaviest first over every sequence.
		order, err := kc.FlashOrder(f.ends)
		if err != nil {
			return nil, err
		}
		if f.dOrder, err = e.intBuf(f, order); err != nil {
			return nil, err
		}
	}
	if err := e.uploadReplay(f); err != nil {
		return nil, err
	}
	if err := e.forward(f, opt); err != nil {
		return nil, err
	}
	if err := e.dev.Sync(); err != nil {
		return nil, err
	}
	res := &train.Result{LogProbs: make([][]float32, len(seqs)), AuxLoss: f.aux}
	lp := make([]float32, f.T)
	if err := kc.Download(e.dev, lp, f.lp); err != nil {
		return nil, err
	}
	var ent []float32
	if !opt.NoEntropy {
		ent = make([]float32, f.T)
		if err := kc.Download(e.dev, ent, f.ent); err != nil {
			return nil, err
		}
		res.Entropy = make([][]float32, len(seqs))
	}
	for s, st := range f.starts {
		n := f.lens[s] - 1
		res.LogProbs[s] = lp[st : st+n : st+n]
		if ent != nil {
			res.Entropy[s] = ent[st : st+n : st+n]
		}
	}
	if opt.Record {
		res.Routes = f.routes(&e.cfg)
	}
	e.valid = true
	return res, nil
}

// routes are the experts each sequence's tokens used in every MoE layer
// (nil for a dense model).
func (f *fwdState) routes(c *model.Config) []*model.Routes {
	var moe []*moeActs
	for _, a := range f.layers {
		if a.moe != nil {
			moe = append(moe, a.moe)
		}
	}
	if len(moe) == 0 {
		return nil
	}
	k := c.NumExpertsPerTok
	out := make([]*model.Routes, len(f.lens))
	for s, n := range f.lens {
		rt := model.NewRoutes(n, len(moe), k, c.NumExperts)
		for i := 0; i < n; i++ {
			t := f.starts[s] + i
			for l, mo := range moe {
				rt.SetSlots(i, l, mo.ids[t*k:(t+1)*k])
			}
		}
		out[s] = rt
	}
	return out
}

// launch runs kernel name of mod over grid × block.
func (e *Engine) launch(mod, name string, grid, block kc.Dim3, args ...any) error {
	return e.ops.Launch(mod, name, grid, block, args...)
}

func rowsGrid(rows int) kc.Dim3 { return kc.Dim3{X: rows} }

var block256 = kc.Dim3{X: 256}

// elemGrid is a grid-stride launch for n elements.
func elemGrid(n int) kc.Dim3 { return kc.Dim3{X: max(1, min((n+255)/256, 8192))} }

// flash says whether attention runs on the tensor cores (flash.cu): in the
// bf16 mode, for the head sizes it is built for. The float32 mode keeps
// attn.cu's batch-invariant kernels, which the exact rollout shares.
func (e *Engine) flash() bool { return e.bf != nil && kc.FlashHeadDim(e.cfg.HeadDim) }

// linears computes several products of the same input x [rows, in],
// contiguous (q, k and v; gate and up): float32, or in the bf16 mode the
// bf16 copy the forward keeps (pick).
func (e *Engine) linears(x Buffer, rows, in int, ps ...kc.Product) error {
	if e.bf != nil {
		return e.bf.LinearManyBF16(x, rows, in, ps...)
	}
	return e.ops.LinearMany(x, rows, in, in, ps...)
}

// backSaved is linearBack from an input x [rows, in], contiguous, as the
// forward kept it (pick): in the bf16 mode only dy is rounded.
func (e *Engine) backSaved(dx, dw, dy, x, w Buffer, rows, in, out, lddx, lddy int, acc bool) error {
	if e.bf != nil {
		return e.bf.BackFrom16(dx, dw, dy, x, w, rows, in, out, lddx, lddy, acc)
	}
	return e.linearBack(dx, dw, dy, x, w, rows, in, out, lddx, lddy, in, acc)
}

// residual computes p.Y = p.Add + x·Wᵀ for x [rows, in] as linears takes
// it: in the bf16 mode in the product's epilogue, in the fp32 mode as the
// product then the add (the CPU engine's order, which it matches).
func (e *Engine) residual(x Buffer, rows, in int, p kc.Product) error {
	if e.bf != nil {
		return e.bf.LinearManyBF16(x, rows, in, p)
	}
	if err := e.ops.Linear(p.Y, x, p.W, rows, in, p.Out, p.LdY, in); err != nil {
		return err
	}
	return e.ops.Add(p.Y, p.Add, rows*p.Out)
}

// norm is RMSNorm over rows of n into y: float32, or in the bf16 mode
// rounded to bf16 in the same pass (y then a bf16 copy: pick).
func (e *Engine) norm(y, inv, x, w Buffer, rows, n int, eps float32) error {
	if e.bf != nil {
		return e.ops.RMSNormBF16(y, inv, x, w, rows, n, eps)
	}
	return e.ops.RMSNorm(y, inv, x, w, rows, n, eps)
}

// rows is the span of n elements at offset off of a product input kept
// as the mode keeps it (pick): floats, or bf16 values in the bf16 mode.
func (e *Engine) rows(b Buffer, off, n int) Buffer {
	if e.bf != nil {
		return kc.BF16Rows(b, off, n)
	}
	return sub(b, off, n)
}

// pick is a product input as the engine's mode keeps it: f32 in the fp32
// mode, its bf16 copy b16 in the bf16 mode.
func (e *Engine) pick(f32, b16 Buffer) Buffer {
	if e.bf != nil {
		return b16
	}
	return f32
}

// linearBack is a linear layer's backward: dx[r, 0:in] (+)= dy[r, 0:out]·W
// and dW[out, in] += dyᵀ·x (the bf16 mode rounds dy once for both).
func (e *Engine) linearBack(dx, dw, dy, x, w Buffer, rows, in, out, lddx, lddy, ldx int, acc bool) error {
	if e.bf != nil {
		return e.bf.Back(dx, dw, dy, x, w, rows, in, out, lddx, lddy, ldx, acc)
	}
	if err := e.ops.LinearBackX(dx, dy, w, rows, in, out, lddx, lddy, acc); err != nil {
		return err
	}
	return e.ops.LinearBackW(dw, dy, x, rows, in, out, lddy, ldx)
}

// headChunk is the number of the T token rows whose logits the LM head
// holds at once (train/memplan.HeadChunk, which the memory plan counts).
func (e *Engine) headChunk(T int) int {
	if e.headChunkRows > 0 {
		return min(e.headChunkRows, T)
	}
	return memplan.HeadChunk(e.precision(), e.cfg.VocabSize, T)
}

type dims struct {
	H, heads, kv, hd, qd, kvd, I, V int
	eps, scale                      float32
}

func (e *Engine) dims() dims {
	c := &e.cfg
	d := dims{H: c.HiddenSize, heads: c.NumAttentionHeads, kv: c.NumKeyValueHeads, hd: c.HeadDim, I: c.IntermediateSize, V: c.VocabSize}
	d.qd, d.kvd = d.heads*d.hd, d.kv*d.hd
	d.eps = float32(c.RMSNormEps)
	d.scale = float32(1 / math.Sqrt(float64(d.hd)))
	return d
}

// qkvd is the width of q, k and v side by side: the rows of the bf16
// mode's qkv with flash.cu (layerActs).
func (d dims) qkvd() int { return d.qd + 2*d.kvd }

func (e *Engine) forward(f *fwdState, opt train.ForwardOptions) error {
	d, T := e.dims(), f.T
	m := e.host
	if d.hd > 256 {
		return fmt.Errorf("train/cuda: head_dim %d above the attention kernel's 256", d.hd)
	}
	x, err := e.buf(f, T*d.H)
	if err != nil {
		return err
	}
	if err := e.ops.Gather(x, e.param(e.w, m.Embed), f.dTokens, T, d.H); err != nil {
		return err
	}
	f.layers = make([]layerActs, len(m.Layers))
	E := e.cfg.NumExperts
	cnt, psum := make([]float64, E), make([]float64, E)
	nMoE := 0
	for li := range m.Layers {
		l := &m.Layers[li]
		a := &f.layers[li]
		if l.Router != nil {
			a.moe = &moeActs{ml: nMoE}
			nMoE++
		}
		if err := e.layerBufs(f, a, l); err != nil {
			return err
		}
		a.x = x
		if err := e.attentionForward(f, a, l); err != nil {
			return fmt.Errorf("train/cuda: layer %d: %w", li, err)
		}
		// The next residual: xmid + the MLP's (or the MoE block's) output.
		next, err := e.buf(f, T*d.H)
		if err != nil {
			return err
		}
		if l.Router != nil {
			err = e.moeForward(f, a.moe, l, e.pick(a.h2, a.h2b), a.xmid, next, true)
			if err == nil && f.recompute { // the next layer reuses the block's device memory
				err = e.moeHost(a.moe, T, cnt, psum)
			}
		} else {
			err = e.mlpForward(f, a, l, next)
		}
		if err != nil {
			return fmt.Errorf("train/cuda: layer %d: %w", li, err)
		}
		x = next
	}
	if f.flash != nil {
		// The copies go back to the Pool before the backward makes its
		// own (recomputation does not run attention's forward again).
		f.flash.Free()
		f.flash = nil
	}
	for li := range f.layers {
		if mo := f.layers[li].moe; mo != nil && !f.recompute {
			if err := e.moeHost(mo, T, cnt, psum); err != nil {
				return err
			}
		}
	}
	// AuxLoss = E·Σ_e (c_e/N)·(Σ_n p_n,e / N) over N = tokens·MoE layers,
	// as the CPU engine computes it.
	f.aux, f.auxCnt = 0, cnt
	if nMoE > 0 {
		n := float64(T * nMoE)
		for i := 0; i < E; i++ {
			f.aux += cnt[i] / n * (psum[i] / n)
		}
		f.aux *= float64(E)
	}
	f.xL = x
	xf := span{&f.xf, T * d.H}
	if e.bf != nil {
		xf = bf16Span(&f.xf, T*d.H)
	}
	if err := e.bufs(f, span{&f.invf, T}, xf, span{&f.lp, T}, span{&f.ent, T}); err != nil {
		return err
	}
	if e.bf != nil {
		if err := e.bufs(f, span{&f.lse, T}); err != nil {
			return err
		}
	}
	if err := e.norm(f.xf, f.invf, x, e.param(e.w, m.Norm), T, d.H, d.eps); err != nil {
		return err
	}
	return e.headForward(f, opt.NoEntropy, opt.Backward)
}

// layerBufs gives layer l's activations a their device memory: their own
// (saved for the backward), or, with recomputation, the one set every
// layer shares, which the backward fills again layer by layer from the
// layer's saved input. a.moe's experts (host) stay per layer either way.
// With recomputation on the tensor cores (flash.cu) attention's output
// (bf16) and log-sum-exp are each layer's own, kept for the backward,
// which recomputes the layer around them: attention's forward is the
// costliest part of a layer at long contexts (quadratic in its tokens;
// at 2 × 16384 tokens of the Qwen3-0.6B shape about a sixth of the
// step, computed from an H200's profile), and its two outputs take
// T·(2·qd + 4·heads) bytes a layer.
func (e *Engine) layerBufs(f *fwdState, a *layerActs, l *model.Layer) error {
	if f.recompute {
		if f.work == nil {
			f.work = &layerActs{moe: &moeActs{}}
			nMoE := len(e.cfg.MoELayers())
			if err := e.allocLayer(f, f.work, nMoE < e.cfg.NumHiddenLayers, nMoE > 0); err != nil {
				return err
			}
		}
		moe := a.moe
		*a = *f.work
		a.moe = nil
		if moe != nil {
			dev := *f.work.moe
			dev.ml = moe.ml
			a.moe = &dev
		}
		if e.flash() { // the shared set has none (allocLayer)
			d, T := e.dims(), f.T
			return e.bufs(f, bf16Span(&a.attb, T*d.qd), span{&a.lse, T * d.heads})
		}
		return nil
	}
	return e.allocLayer(f, a, l.Router == nil, l.Router != nil)
}

// allocLayer allocates a layer's activations: attention's, and a dense
// MLP's or an MoE block's (device side) as asked; with recomputation on
// the tensor cores, attention's output and log-sum-exp are left to
// layerBufs (each layer keeps its own).
func (e *Engine) allocLayer(f *fwdState, a *layerActs, dense, moe bool) error {
	d, T := e.dims(), f.T
	lse, attb := span{&a.lse, T * d.heads}, bf16Span(&a.attb, T*d.qd)
	if f.recompute && e.flash() {
		lse, attb = span{}, span{}
	}
	q, k, att := span{&a.q, T * d.qd}, span{&a.k, T * d.kvd}, span{&a.att, T * d.qd}
	qraw, kraw, v := span{&a.qraw, T * d.qd}, span{&a.kraw, T * d.kvd}, span{&a.v, T * d.kvd}
	Tp := kc.FlashPad(T)
	if e.flash() {
		// flash.cu writes attention's output in bf16 only (attb); the q,
		// k and v product (one) writes bf16 (as PyTorch's autocast keeps
		// a product's output) into qkv, its pad rows zero.
		q, k, att = bf16Span(&a.q16, Tp*d.qd), bf16Span(&a.k16, Tp*d.kvd), span{}
		qraw, kraw, v = bf16Span(&a.qkv, Tp*d.qkvd()), span{}, span{}
	}
	if err := e.bufs(f, qraw, kraw, q, k, v, att, span{&a.xmid, T * d.H},
		span{&a.inv1, T}, span{&a.invq, T * d.heads}, span{&a.invk, T * d.kv}, lse, span{&a.inv2, T}); err != nil {
		return err
	}
	if e.flash() {
		// q_raw, k_raw and v, one product's column spans (to the end of
		// qkv, so that each span covers its last row).
		W := d.qkvd()
		a.qraw = kc.BF16Rows(a.qkv, 0, Tp*W)
		a.kraw = kc.BF16Rows(a.qkv, d.qd, Tp*W-d.qd)
		a.v = kc.BF16Rows(a.qkv, d.qd+d.kvd, Tp*W-d.qd-d.kvd)
		if Tp > T {
			if err := e.dev.Zero(kc.BF16Rows(a.qkv, T*W, (Tp-T)*W)); err != nil {
				return err
			}
		}
	}
	// The products' inputs: float32, or bf16 in the bf16 mode (an MoE
	// block gathers its rows from h2 as kept).
	h1, h2 := span{&a.h1, T * d.H}, span{&a.h2, T * d.H}
	if e.bf != nil {
		h1 = bf16Span(&a.h1b, T*d.H)
		if err := e.bufs(f, attb); err != nil {
			return err
		}
		if err := e.bufs(f, bf16Span(&a.h2b, T*d.H)); err != nil {
			return err
		}
	}
	if err := e.bufs(f, h1); err != nil {
		return err
	}
	if e.bf == nil {
		if err := e.bufs(f, h2); err != nil {
			return err
		}
	}
	if dense {
		// gu is the gate and up products' output: in the bf16 mode their
		// bf16 output (the float32 sums rounded once, as PyTorch's autocast
		// keeps a product's output), which SwiGLU and its backward read.
		act, gu := span{&a.a, T * d.I}, span{&a.gu, T * 2 * d.I}
		if e.bf != nil {
			act, gu = bf16Span(&a.ab, T*d.I), bf16Span(&a.gu, T*2*d.I)
		}
		if err := e.bufs(f, gu, act); err != nil {
			return err
		}
	}
	if moe {
		c := &e.cfg
		E, k, H, I := c.NumExperts, c.NumExpertsPerTok, c.HiddenSize, c.MoeIntermediateSize
		R := T * k
		mo := a.moe
		// The grouped rows, the gate and up outputs, SwiGLU's output and
		// the experts' outputs: in bf16 in the bf16 mode.
		xg, gug, ag, yg := span{&mo.xg, R * H}, span{&mo.gug, R * 2 * I}, span{&mo.ag, R * I}, span{&mo.yg, R * H}
		if e.bf != nil { // the products' outputs too, as the dense MLP's
			xg, gug, ag, yg = bf16Span(&mo.xg, R*H), bf16Span(&mo.gug, R*2*I), bf16Span(&mo.ag, R*I), bf16Span(&mo.yg, R*H)
		}
		if err := e.bufs(f, span{&mo.dProbs, T * E}, span{&mo.dGates, R},
			span{&mo.dIds, R}, span{&mo.dPsum, 2 * E}, xg, gug, ag, yg); err != nil {
			return err
		}
		for _, g := range mo.grp.Layout(R, E) {
			if err := e.bufs(f, span{g.B, g.Words}); err != nil {
				return err
			}
		}
	}
	return nil
}

// attentionForward runs a layer's first half: from its input a.x to
// xmid = x + attention(norm(x)) and h2 = norm(xmid).
func (e *Engine) attentionForward(f *fwdState, a *layerActs, l *model.Layer) error {
	d, T, x := e.dims(), f.T, a.x
	steps := []func() error{
		func() error {
			return e.norm(e.pick(a.h1, a.h1b), a.inv1, x, e.param(e.w, l.InputNorm), T, d.H, d.eps)
		},
		func() error {
			// With flash.cu q_raw, k_raw and v in bf16, column spans of
			// qkv: one product where the weights lie back to back.
			y16, ldq, ldkv := e.flash(), d.qd, d.kvd
			if y16 {
				ldq, ldkv = d.qkvd(), d.qkvd()
			}
			return e.linears(e.pick(a.h1, a.h1b), T, d.H, kc.Product{Y: a.qraw, W: e.param(e.w, l.Q), Out: d.qd, LdY: ldq, Y16: y16},
				kc.Product{Y: a.kraw, W: e.param(e.w, l.K), Out: d.kvd, LdY: ldkv, Y16: y16},
				kc.Product{Y: a.v, W: e.param(e.w, l.V), Out: d.kvd, LdY: ldkv, Y16: y16})
		},
		func() error {
			if e.flash() { // from the bf16 q_raw, straight into flash.cu's bf16 copy
				return e.ops.NormRopeBF16From16(a.q16, a.invq, a.qraw, e.param(e.w, l.QNorm), e.rope.cos, e.rope.sin, f.dPos, T, d.heads, d.hd, d.qkvd(), d.eps)
			}
			return e.ops.NormRope(a.q, a.invq, a.qraw, e.param(e.w, l.QNorm), e.rope.cos, e.rope.sin, f.dPos, T, d.heads, d.hd, d.qd, d.eps)
		},
		func() error {
			if e.flash() {
				return e.ops.NormRopeBF16From16(a.k16, a.invk, a.kraw, e.param(e.w, l.KNorm), e.rope.cos, e.rope.sin, f.dPos, T, d.kv, d.hd, d.qkvd(), d.eps)
			}
			return e.ops.NormRope(a.k, a.invk, a.kraw, e.param(e.w, l.KNorm), e.rope.cos, e.rope.sin, f.dPos, T, d.kv, d.hd, d.kvd, d.eps)
		},
		func() error {
			if e.flash() {
				if f.redoing {
					return nil // the output and log-sum-exp are the forward's, kept (layerBufs)
				}
				if f.flash == nil {
					var err error
					if f.flash, err = kc.NewFlashScratchGivenQKV(e.pool, T, d.heads, d.kv, d.hd, false); err != nil {
						return err
					}
					if f.dOrder.Ptr != 0 {
						if err := f.flash.UseOrder(f.dOrder); err != nil {
							return err
						}
					}
				}
				if err := f.flash.UseQKVRows(a.q16, a.k16, a.v, d.qkvd()); err != nil {
					return err
				}
				return e.ops.FlashAttention(f.flash, a.attb, a.lse, Buffer{}, Buffer{}, Buffer{}, f.dStart, d.scale)
			}
			return e.ops.Attention(a.att, a.lse, a.q, a.k, a.v, f.dStart, T, d.heads, d.kv, d.hd, d.scale)
		},
		// xmid = x + att·Woᵀ.
		func() error {
			if e.bf != nil && !e.flash() {
				if err := e.ops.ToBF16Rows(a.attb, a.att, T, d.qd, d.qd); err != nil {
					return err
				}
			}
			return e.residual(e.pick(a.att, a.attb), T, d.qd, kc.Product{Y: a.xmid, W: e.param(e.w, l.O), Out: d.H, LdY: d.H, Add: x})
		},
		func() error {
			return e.norm(e.pick(a.h2, a.h2b), a.inv2, a.xmid, e.param(e.w, l.PostAttnNorm), T, d.H, d.eps)
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// mlpForward runs a dense layer's MLP on a.h2 and writes
// next = xmid + down(silu(gate(h2))·up(h2)).
func (e *Engine) mlpForward(f *fwdState, a *layerActs, l *model.Layer, next Buffer) error {
	d, T := e.dims(), f.T
	steps := []func() error{
		func() error {
			if e.bf != nil { // gu in bf16
				return e.linears(a.h2b, T, d.H, kc.Product{Y: a.gu, W: e.param(e.w, l.Gate), Out: d.I, LdY: 2 * d.I, Y16: true},
					kc.Product{Y: kc.BF16Rows(a.gu, d.I, T*2*d.I-d.I), W: e.param(e.w, l.Up), Out: d.I, LdY: 2 * d.I, Y16: true})
			}
			return e.linears(a.h2, T, d.H, kc.Product{Y: a.gu, W: e.param(e.w, l.Gate), Out: d.I, LdY: 2 * d.I},
				kc.Product{Y: sub(a.gu, d.I, T*2*d.I-d.I), W: e.param(e.w, l.Up), Out: d.I, LdY: 2 * d.I})
		},
		func() error {
			if e.bf != nil {
				return e.ops.SwiGLUBF16From16(a.ab, a.gu, T, d.I)
			}
			return e.ops.SwiGLU(a.a, a.gu, T, d.I)
		},
		func() error {
			return e.residual(e.pick(a.a, a.ab), T, d.I, kc.Product{Y: next, W: e.param(e.w, l.Down), Out: d.H, LdY: d.H, Add: a.xmid})
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// headForward computes, chunk by chunk of token rows, the log-softmax of
// the logits at the temperature, each row's next-token log-prob and the
// entropy (the bf16 mode: also each row's log-sum-exp, for the backward;
// its one-read kernel writes the entropy whether asked or not).
func (e *Engine) headForward(f *fwdState, noEntropy, backward bool) error {
	d := e.dims()
	C := e.headChunk(f.T)
	keep, err := e.headKeeps(f.T, backward)
	if err != nil {
		return err
	}
	var z Buffer
	if keep {
		// From the device, not the Pool: Backward gives it back to the
		// device when done, so the memory is not held as the Pool's cache.
		// Out of memory after all: the backward recomputes them.
		if f.logits, err = e.alloc(f.T * d.V); kc.IsOutOfMemory(err) {
			keep, f.logits = false, Buffer{}
		} else if err != nil {
			return err
		}
		e.keptPeak = max(e.keptPeak, f.logits.Size)
	}
	if !keep {
		if z, err = e.scratch(C * d.V); err != nil {
			return err
		}
		defer e.pool.Free(z)
	}
	lm := e.param(e.w, e.host.LMHead)
	for c0 := 0; c0 < f.T; c0 += C {
		rows := min(C, f.T-c0)
		if keep {
			z = sub(f.logits, c0*d.V, rows*d.V)
		}
		if err := e.linears(e.rows(f.xf, c0*d.H, rows*d.H), rows, d.H, kc.Product{Y: z, W: lm, Out: d.V, LdY: d.V}); err != nil {
			return err
		}
		if e.bf != nil { // one read of the logits; the entropy comes free
			if err := e.launch("head.cu", "head_stats_bf16", rowsGrid(rows), block256, z, sub(f.lse, c0, rows), sub(f.lp, c0, rows),
				sub(f.ent, c0, rows), intSub(f.dTargets, c0, rows), d.V, f.temp); err != nil {
				return err
			}
			continue
		}
		// The log-softmax, each row's target log-prob and (unless not
		// wanted) its entropy in one pass set.
		entropy := 1
		if noEntropy {
			entropy = 0
		}
		if err := e.launch("head.cu", "logsoftmax_stats_rows", rowsGrid(rows), block256, z, sub(f.lp, c0, rows), sub(f.ent, c0, rows),
			intSub(f.dTargets, c0, rows), d.V, f.temp, entropy); err != nil {
			return err
		}
	}
	// z goes back to the Pool on return, without waiting for the work
	// that reads it: whoever gets it next issues after that work.
	return nil
}

// The settings of Engine.keepLogits.
const (
	keepAuto   = 0
	keepNever  = -1
	keepAlways = 1
)

// headKeeps says whether the bf16 mode's forward over T tokens keeps all
// its logits ([T, V] float32) for the backward that follows
// (ForwardOptions.Backward), which then reads them instead of recomputing
// them (the same bits: the same product): the backward's LM-head product
// and its write of the logits are gone, some 5% of a step at Qwen3-0.6B's
// shape (2·T·V·H FLOPs; 10 GB at 16k tokens written and read). As
// PyTorch keeps its logits for autograd. Kept where they take at most a
// quarter of the memory left after the forward's activations (free and
// the Pool's, less the AdamW moments if the first Step has yet to
// allocate them), so the backward and the step keep room, and given back
// to the device when the backward is done; the float32 mode recomputes
// them (its reference path).
func (e *Engine) headKeeps(T int, backward bool) (bool, error) {
	if e.bf == nil || e.keepLogits == keepNever {
		return false, nil
	}
	if e.keepLogits == keepAlways {
		return true, nil
	}
	if !backward {
		return false, nil
	}
	free, _, err := e.dev.MemInfo()
	if err != nil {
		return false, err
	}
	room := free + e.pool.Cached()
	if e.m.Ptr == 0 {
		room -= 8 * int64(len(e.host.Arena))
	}
	return int64(T)*int64(e.cfg.VocabSize)*4 <= room/4, nil
}

// freeLogits gives the kept logits (headKeeps) back to the device.
func (f *fwdState) freeLogits(d *kc.Device) {
	if f.logits.Ptr != 0 {
		d.Free(f.logits)
		f.logits = Buffer{}
	}
}

// intSub is the span of n int32 at element offset off of b.
func intSub(b Buffer, off, n int) Buffer { return sub(b, off, n) }
