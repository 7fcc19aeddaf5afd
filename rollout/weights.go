package rollout

import (
	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// linear is one weight matrix W [out, in] (Hugging Face layout) prepared
// for y = x·Wᵀ in the engine's precision: packed float32 for exact and
// fp32, packed bfloat16 for bf16, e4m3 with per-channel scales for fp8,
// NVFP4-style blocks for fp4.
type linear struct {
	out, in int
	f32     *kernels.PackedB
	bf      *kernels.PackedBF16B
	prec    Precision
}

// set (re)packs w, rows·in floats of rows [out, in], in precision p. The
// bf16 and fp8 forms are rewritten in place, in the storage of the first
// load; the float32 form is a new kernels.PackedB each time, as the
// kernels package offers no in-place repack of one (the old one is left
// to the garbage collector).
func (l *linear) set(p Precision, w []float32, out, in int) {
	l.out, l.in, l.prec = out, in, p
	switch p {
	case Exact, FP32:
		l.f32 = kernels.PackB(true, out, in, w, in)
	case BF16:
		if l.bf == nil {
			l.bf = new(kernels.PackedBF16B)
		}
		l.bf.PackFloat32(w, out, in, in)
	case FP8:
		if l.bf == nil {
			l.bf = new(kernels.PackedBF16B)
		}
		l.bf.PackE4M3(w, out, in, in)
	case FP4:
		if l.bf == nil {
			l.bf = new(kernels.PackedBF16B)
		}
		l.bf.PackNVFP4(w, out, in, in)
	}
}

// setConcat packs the row-wise concatenation of several matrices with the
// same in (a fused gate and up projection): their outputs side by side.
// scratch holds the concatenation; it is grown as needed and returned for
// the next call.
func (l *linear) setConcat(p Precision, ws [][]float32, outs []int, in int, scratch []float32) []float32 {
	buf := scratch[:0]
	for i, w := range ws {
		buf = append(buf, w[:outs[i]*in]...)
	}
	l.set(p, buf, len(buf)/in, in)
	return buf
}

// parts sets g up to compute y = x·Wᵀ for rows rows (row strides ldx
// and ldy) in the weight's precision, cut into parts for workers
// goroutines (1: one part, the whole product).
func (l *linear) parts(g *kernels.GemmParts, y []float32, ldy int, x []float32, ldx, rows, workers int) {
	switch l.prec {
	case Exact, FP32:
		g.Packed(rows, x, ldx, l.f32, y, ldy, false, workers)
	case BF16:
		g.BF16F32A(rows, x, ldx, l.bf, y, ldy, false, workers)
	case FP8, FP4:
		g.E4M3F32A(rows, x, ldx, l.bf, y, ldy, false, workers)
	}
}

// layerWeights are one decoder layer's prepared weights.
type layerWeights struct {
	qkv, o         linear
	qNorm, kNorm   []float32
	inNorm, postNm []float32
	gu, down       linear   // dense MLP: gate and up fused
	router         linear   // MoE
	experts        []expert // MoE
}

type expert struct{ gu, down linear }

// weights are the whole model's prepared weights, owned by the engine (a
// copy: the training engine goes on changing its own).
type weights struct {
	embed   []float32
	norm    []float32
	head    linear
	layers  []layerWeights
	scratch []float32 // fused matrices before packing, reused
}

// load prepares m's weights in precision p, reusing w's buffers.
func (w *weights) load(m *model.Model, p Precision) {
	c := &m.Config
	H := c.HiddenSize
	hd := c.HeadDim
	qd, kvd := c.NumAttentionHeads*hd, c.NumKeyValueHeads*hd
	w.embed = append(w.embed[:0], m.Embed.Data...)
	w.norm = append(w.norm[:0], m.Norm.Data...)
	w.head.set(p, m.LMHead.Data, c.VocabSize, H)
	if len(w.layers) != len(m.Layers) {
		w.layers = make([]layerWeights, len(m.Layers))
	}
	for i := range m.Layers {
		L, W := &m.Layers[i], &w.layers[i]
		w.scratch = W.qkv.setConcat(p, [][]float32{L.Q.Data, L.K.Data, L.V.Data}, []int{qd, kvd, kvd}, H, w.scratch)
		W.o.set(p, L.O.Data, H, qd)
		W.qNorm = append(W.qNorm[:0], L.QNorm.Data...)
		W.kNorm = append(W.kNorm[:0], L.KNorm.Data...)
		W.inNorm = append(W.inNorm[:0], L.InputNorm.Data...)
		W.postNm = append(W.postNm[:0], L.PostAttnNorm.Data...)
		if c.IsMoELayer(i) {
			I := c.MoeIntermediateSize
			W.router.set(p, L.Router.Data, c.NumExperts, H)
			if len(W.experts) != len(L.Experts) {
				W.experts = make([]expert, len(L.Experts))
			}
			for e := range L.Experts {
				X := &L.Experts[e]
				w.scratch = W.experts[e].gu.setConcat(p, [][]float32{X.Gate.Data, X.Up.Data}, []int{I, I}, H, w.scratch)
				W.experts[e].down.set(p, X.Down.Data, H, I)
			}
		} else {
			I := c.IntermediateSize
			w.scratch = W.gu.setConcat(p, [][]float32{L.Gate.Data, L.Up.Data}, []int{I, I}, H, w.scratch)
			W.down.set(p, L.Down.Data, H, I)
		}
	}
}
