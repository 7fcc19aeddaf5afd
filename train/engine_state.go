package train

import (
	"sync"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// fwdState is the packed batch of one Forward and every activation the
// backward pass needs. Buffers grow when a larger batch arrives and are
// reused otherwise.
type fwdState struct {
	tasks []kernels.GemmTask // scratch list of independent products (MoE experts)

	cfg    model.Config
	T      int     // tokens in the packed stream
	tokens []int32 // [T] the packed tokens
	pos    []int32 // [T] position of each token in its sequence
	starts []int   // first packed row of each sequence
	lens   []int   // length of each sequence
	maxLen int
	temp   float32         // softmax temperature of the lm_head (1: none)
	replay []*model.Routes // per sequence, nil for live routing
	moeIdx []int           // decoder layers with an MoE block, in order

	layers  []layerAct
	xfin    []float32 // [T,H] output of the last layer
	invf    []float32 // [T] inverse RMS of the final norm
	xf      []float32 // [T,H] final-normed hidden states
	logp    []float32 // [chunk,V] log-softmax of one chunk of logit rows (all rows when headAll)
	chunk   int       // rows per lm_head chunk
	headAll bool      // logp holds every row, so Backward need not recompute
	tlp     []float32 // [T] log-prob of the next token (0 for a sequence's last row)
	ent     []float32 // [T] entropies (when computed)
	aux     float64   // load-balancing loss
	auxCnt  []float64 // [E] c_e summed over MoE layers (for the aux gradient)

	bw bwdBuffers
}

// layerAct is what one decoder layer saves.
type layerAct struct {
	xin  []float32 // [T,H] layer input (residual stream)
	inv1 []float32 // [T] inverse RMS of input_layernorm
	xn1  []float32 // [T,H] input_layernorm output
	qkv  []float32 // [T,qd+2·kvd] q, k, v projections side by side (before the norms)
	qinv []float32 // [T·heads] inverse RMS of q_norm per head
	q    []float32 // [T,heads·hd] after q_norm and RoPE
	kinv []float32 // [T·kv]
	k    []float32 // [T,kv·hd] after k_norm and RoPE
	v    []float32 // [T,kv·hd] a copy of the v projection (same stride as k)
	att  []float32 // [T,heads·hd] attention output before o_proj
	h    []float32 // [T,H] residual after attention
	inv2 []float32 // [T] inverse RMS of post_attention_layernorm
	xn2  []float32 // [T,H] post_attention_layernorm output

	// Dense MLP.
	gu []float32 // [T,2I] gate and up projections side by side
	a  []float32 // [T,I] SwiGLU output

	moe *moeAct // MoE block (nil in dense layers)

	qkvG linGroup // q, k, v projections as one product
	guG  linGroup // dense MLP: gate and up as one product
}

// moeAct is what one MoE block saves. Assignment rows are the (token, slot)
// pairs grouped by expert: expert e owns rows off[e]..off[e+1]-1, in token
// order, so each expert's work is one GEMM over contiguous rows.
type moeAct struct {
	probs []float32  // [T,E] full router softmax
	ids   []int32    // [T·k] experts per token in slot order
	gates []float32  // [T·k] gate weights
	row   []int32    // [T·k] assignment row of (token, slot)
	tok   []int32    // [T·k] token of each assignment row
	off   []int      // [E+1] first row of each expert
	xg    []float32  // [T·k,H] gathered inputs
	gug   []float32  // [T·k,2I] gate and up projections side by side
	ag    []float32  // [T·k,I] SwiGLU outputs
	yg    []float32  // [T·k,H] expert outputs (before gating)
	guG   []linGroup // per expert: gate and up as one product
}

// bwdBuffers are the backward pass's scratch buffers.
type bwdBuffers struct {
	dlog []float32 // [chunk,V]
	dx   []float32 // [T,H] gradient w.r.t. the residual stream
	dxn  []float32 // [T,H]
	datt []float32 // [T,qd]
	dqkv []float32 // [T,qd+2·kvd]
	da   []float32 // [rows,I] (dense: T rows, MoE: T·k rows)
	dgu  []float32 // [rows,2I]
	dy   []float32 // [T·k,H] MoE: gradient w.r.t. expert outputs
	dxg  []float32 // [T·k,H] MoE: gradient w.r.t. gathered inputs
	dgt  []float32 // [T·k] MoE: gradient w.r.t. gates
	dp   []float32 // [T,E] MoE: gradient w.r.t. router probabilities
	red  []float32 // chunk partial sums of norm-weight gradients
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func growI32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

// setup packs seqs into one token stream and sizes every buffer.
func (f *fwdState) setup(m *model.Model, seqs [][]int32, opt ForwardOptions) {
	c := m.Config
	f.cfg = c
	f.temp = 1
	if opt.Temperature != 0 {
		f.temp = float32(opt.Temperature)
	}
	T := 0
	f.maxLen = 0
	f.starts = f.starts[:0]
	f.lens = f.lens[:0]
	for _, s := range seqs {
		f.starts = append(f.starts, T)
		f.lens = append(f.lens, len(s))
		T += len(s)
		f.maxLen = max(f.maxLen, len(s))
	}
	f.T = T
	f.tokens = growI32(f.tokens, T)
	f.pos = growI32(f.pos, T)
	for s, seq := range seqs {
		copy(f.tokens[f.starts[s]:], seq)
		for i := range seq {
			f.pos[f.starts[s]+i] = int32(i)
		}
	}
	f.replay = f.replay[:0]
	if opt.Replay != nil {
		f.replay = append(f.replay, opt.Replay...)
	}
	f.moeIdx = c.MoELayers()

	H, V := c.HiddenSize, c.VocabSize
	qd := c.NumAttentionHeads * c.HeadDim
	kvd := c.NumKeyValueHeads * c.HeadDim
	if len(f.layers) != c.NumHiddenLayers {
		f.layers = make([]layerAct, c.NumHiddenLayers)
	}
	for i := range f.layers {
		a := &f.layers[i]
		a.xin = grow(a.xin, T*H)
		a.inv1 = grow(a.inv1, T)
		a.xn1 = grow(a.xn1, T*H)
		a.qkv = grow(a.qkv, T*(qd+2*kvd))
		a.qinv = grow(a.qinv, T*c.NumAttentionHeads)
		a.q = grow(a.q, T*qd)
		a.kinv = grow(a.kinv, T*c.NumKeyValueHeads)
		a.k = grow(a.k, T*kvd)
		a.v = grow(a.v, T*kvd)
		a.att = grow(a.att, T*qd)
		a.h = grow(a.h, T*H)
		a.inv2 = grow(a.inv2, T)
		a.xn2 = grow(a.xn2, T*H)
		if c.IsMoELayer(i) {
			if a.moe == nil {
				a.moe = &moeAct{}
			}
			mo := a.moe
			E, k, I := c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
			R := T * k
			mo.probs = grow(mo.probs, T*E)
			mo.ids = growI32(mo.ids, R)
			mo.gates = grow(mo.gates, R)
			mo.row = growI32(mo.row, R)
			mo.tok = growI32(mo.tok, R)
			if len(mo.off) != E+1 {
				mo.off = make([]int, E+1)
			}
			mo.xg = grow(mo.xg, R*H)
			mo.gug = grow(mo.gug, R*2*I)
			mo.ag = grow(mo.ag, R*I)
			mo.yg = grow(mo.yg, R*H)
		} else {
			a.moe = nil
			I := c.IntermediateSize
			a.gu = grow(a.gu, T*2*I)
			a.a = grow(a.a, T*I)
		}
	}
	f.xfin = grow(f.xfin, T*H)
	f.invf = grow(f.invf, T)
	f.xf = grow(f.xf, T*H)
	f.chunk = min(T, headChunkRows(V))
	f.headAll = f.chunk == T
	f.logp = grow(f.logp, f.chunk*V)
	f.tlp = grow(f.tlp, T)
	f.ent = grow(f.ent, T)
	if len(f.auxCnt) != c.NumExperts {
		f.auxCnt = make([]float64, c.NumExperts)
	}
}

// scratchPool hands out float32 scratch slices to parallel workers; their
// contents are never relied upon, so reuse cannot change results.
type scratchPool struct {
	mu   sync.Mutex
	free [][]float32
}

func (p *scratchPool) get(n int) []float32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if cap(p.free[i]) >= n {
			b := p.free[i]
			p.free = append(p.free[:i], p.free[i+1:]...)
			return b[:n]
		}
	}
	return make([]float32, n)
}

func (p *scratchPool) put(b []float32) {
	p.mu.Lock()
	p.free = append(p.free, b)
	p.mu.Unlock()
}
