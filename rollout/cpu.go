package rollout

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/keel-rl/keel/internal/sysmem"
	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// cpuBackend is the CPU forward pass behind New's Engine: a private copy
// of the weights in its precision, a KV cache for Slots sequences and the
// activations of one step (StepRows rows), all allocated once, and a
// worker pool that the Engine borrows for sampling.
type cpuBackend struct {
	cfg  model.Config
	opt  Options
	w    weights
	pool *kernels.Pool

	// Dimensions.
	hid, vocab, hd, nh, nkv, qd, kvd, qkvd int
	moeLayers                              []int // model layer index of each MoE layer
	moeIndex                               []int // per model layer: index into moeLayers, or -1
	eps, scale                             float32
	cos, sin                               []float32

	kc, vc [][]float32 // per layer: [Slots][MaxLen][kvd] (exact, fp32)
	kv16   []bf16Cache // per layer (bf16, fp8): see attn_bf16.go
	// release frees the cache's storage (mapped outside the Go heap).
	release []func()

	// The current step's rows (the StepBatch's, set by Step) and
	// activations (StepRows rows each).
	rows                       int
	slot, pos                  []int32
	tok                        []int32
	x, xn, qkv, q, att, h, xn2 []float32
	probs                      [][]float32 // per worker: attention probabilities
	kvs                        [][]float32 // per worker: one row's keys before rounding (bf16 cache)
	acc                        [][]float32 // per worker: scratch of H floats (CombineExperts) or hd (online attention)
	gu, a                      []float32   // dense MLP
	moe                        moeBuffers
	// Output rows (the StepBatch's): the step rows whose next-token
	// distribution is wanted (at most one per slot), each at its own
	// sequence's temperature.
	outRow  []int32
	outTemp []float32
	xo      []float32 // [outs, H] normed inputs of the head
	lp      []float32 // [outs, V] log-probs (the StepBatch's)

	// routes[ml][r*k:] are the experts of step row r in MoE layer ml (the
	// StepBatch's).
	routes [][]int32

	// The layer (and MoE layer) being computed, for the row-parallel
	// methods below (stored as method values once, so calls allocate
	// nothing).
	cur, curML                               int
	fnEmbed, fnNorm1, fnHeads, fnAttn        func(w, lo, hi int)
	fnNorm2, fnSwiGLU, fnAddH, fnFinal       func(w, lo, hi int)
	fnRouter, fnGather, fnSwiGLUX, fnCombine func(w, lo, hi int)
	fnHead, fnParts, fnExperts, fnBlock      func(w, lo, hi int)
	blocks                                   []int // chunk bounds of the fused path (planBlocks)
	// For tests: fuse > 0 takes the fused path whenever it can, < 0
	// never; blockUnit replaces blockGrain.
	fuse, blockUnit int

	// GEMMs run on the backend's pool: parts is the product being computed
	// (see gemm), scratch each worker's packing space, and xparts each
	// worker's expert products (run whole by one worker).
	parts   kernels.GemmParts
	scratch []kernels.GemmScratch
	xparts  []kernels.GemmParts
	curW    *layerWeights // the layer whose experts fnExperts runs
}

// moeBuffers are the MoE activations of one step (rows·k expert rows).
type moeBuffers struct {
	probs, gates    []float32
	off, fill       []int   // per expert: first grouped row, rows filled
	row             []int32 // per (row, slot): its grouped row
	tok             []int32 // per grouped row: its step row
	xg, gug, ag, yg []float32
	order           []int // active experts, most rows first
}

// newCPUBackend builds the CPU backend for m (whose weights it copies in
// opt's precision) with opt's sizes, defaults filled in and checked.
func newCPUBackend(m *model.Model, opt Options) (*cpuBackend, error) {
	c := m.Config
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := opt.fill(&c); err != nil {
		return nil, err
	}
	if err := checkCacheSize(&c, &opt); err != nil {
		return nil, err
	}
	e := &cpuBackend{cfg: c, opt: opt, pool: kernels.NewPool(runtime.GOMAXPROCS(0))}
	e.hid, e.vocab, e.hd = c.HiddenSize, c.VocabSize, c.HeadDim
	e.nh, e.nkv = c.NumAttentionHeads, c.NumKeyValueHeads
	e.qd, e.kvd = e.nh*e.hd, e.nkv*e.hd
	e.qkvd = e.qd + 2*e.kvd
	e.eps = float32(c.RMSNormEps)
	e.scale = kernels.AttentionScale(e.hd)
	e.cos, e.sin = model.RopeTables(e.hd, c.RopeTheta, opt.MaxLen)
	e.moeIndex = make([]int, c.NumHiddenLayers)
	for i := range e.moeIndex {
		e.moeIndex[i] = -1
		if c.IsMoELayer(i) {
			e.moeIndex[i] = len(e.moeLayers)
			e.moeLayers = append(e.moeLayers, i)
		}
	}
	e.w.load(m, opt.Precision)
	e.alloc()
	e.bind()
	return e, nil
}

// fill sets the defaults of the zero fields of opt for the model c and
// checks the result.
func (opt *Options) fill(c *model.Config) error {
	if opt.Precision < Exact || opt.Precision > FP4 {
		return fmt.Errorf("rollout: unknown precision %d", opt.Precision)
	}
	if opt.Slots == 0 {
		opt.Slots = 64
	}
	if opt.MaxLen == 0 {
		opt.MaxLen = min(1024, max(c.MaxPositionEmbeddings, 1))
	}
	if opt.StepRows == 0 {
		opt.StepRows = max(opt.Slots, 512)
	}
	if err := opt.check(); err != nil {
		return err
	}
	if c.MaxPositionEmbeddings > 0 && opt.MaxLen > c.MaxPositionEmbeddings {
		return fmt.Errorf("rollout: max length %d exceeds the model's max_position_embeddings %d", opt.MaxLen, c.MaxPositionEmbeddings)
	}
	return nil
}

// check refuses sizes no engine can run with.
func (opt *Options) check() error {
	switch {
	case opt.Slots < 1:
		return fmt.Errorf("rollout: slots = %d, want >= 1", opt.Slots)
	case opt.MaxLen < 2:
		return fmt.Errorf("rollout: max length = %d, want >= 2", opt.MaxLen)
	case opt.StepRows < opt.Slots:
		return fmt.Errorf("rollout: step rows = %d, want >= slots (%d)", opt.StepRows, opt.Slots)
	}
	return nil
}

// checkCacheSize refuses a KV cache larger than the machine's memory with
// an error that says what to lower, rather than letting the allocation
// kill the process.
func checkCacheSize(c *model.Config, opt *Options) error {
	elem := 4.0 // float32
	if opt.Precision >= BF16 {
		elem = 2
	}
	per := float64(c.NumHiddenLayers) * float64(c.NumKeyValueHeads*c.HeadDim) * 2 * elem // K and V
	bytes := per * float64(opt.Slots) * float64(opt.MaxLen)
	if mem, ok := sysmem.Total(); ok && bytes > float64(mem) {
		return fmt.Errorf("rollout: the KV cache would take %.1f GB (%d slots × %d positions × %d layers × %d K and V values × %g bytes), more than this machine's %.1f GB: lower the slots or the maximum length",
			bytes/1e9, opt.Slots, opt.MaxLen, c.NumHiddenLayers, 2*c.NumKeyValueHeads*c.HeadDim, elem, float64(mem)/1e9)
	}
	return nil
}

// Config returns the model configuration the backend serves.
func (e *cpuBackend) Config() model.Config { return e.cfg }

// Options returns the backend's sizes and precision.
func (e *cpuBackend) Options() Options { return e.opt }

// Load re-packs or re-quantises m's weights in place into the buffers the
// backend already holds.
func (e *cpuBackend) Load(m *model.Model) error {
	e.w.load(m, e.opt.Precision)
	return nil
}

// Step runs b's rows through the model (see StepBatch), writing the
// output rows' log-probabilities and every row's routes into b.
func (e *cpuBackend) Step(b *StepBatch) error {
	if err := e.checkBatch(b); err != nil {
		return err
	}
	e.rows = b.Rows()
	e.slot, e.pos, e.tok = b.Slot, b.Pos, b.Tok
	e.outRow, e.outTemp = b.OutRow, b.OutTemp
	e.lp, e.routes = b.LogProbs, b.Routes
	e.forward()
	return nil
}

// checkBatch refuses a batch outside the backend's limits (a batcher's
// bug) before it writes out of bounds.
func (e *cpuBackend) checkBatch(b *StepBatch) error {
	R, outs := b.Rows(), len(b.OutRow)
	switch {
	case len(b.Pos) != R || len(b.Tok) != R || len(b.OutTemp) != outs:
		return errors.New("rollout: step batch: rows or output rows of different lengths")
	case R > e.opt.StepRows || outs > e.opt.Slots:
		return fmt.Errorf("rollout: step batch of %d rows and %d output rows, limits %d and %d", R, outs, e.opt.StepRows, e.opt.Slots)
	case len(b.LogProbs) < outs*e.vocab || len(b.Routes) != len(e.moeLayers):
		return errors.New("rollout: step batch: log-probs or routes not allocated for the model")
	}
	for _, r := range b.Routes {
		if len(r) < R*e.cfg.NumExpertsPerTok {
			return errors.New("rollout: step batch: routes not allocated for its rows")
		}
	}
	return nil
}

// CopyPrefix copies positions [0, n) of every layer's keys and values from
// slot src to slot dst.
func (e *cpuBackend) CopyPrefix(dst, src, n int) {
	d, s := e.cacheRow(int32(dst), 0), e.cacheRow(int32(src), 0)
	m := n * e.kvd
	for l := range e.kc {
		copy(e.kc[l][d:d+m], e.kc[l][s:s+m])
		copy(e.vc[l][d:d+m], e.vc[l][s:s+m])
	}
	for l := range e.kv16 {
		kv := &e.kv16[l]
		copy(kv.k[d:d+m], kv.k[s:s+m])
		copy(kv.v[d:d+m], kv.v[s:s+m])
	}
}

// Close stops the worker goroutines and drops the KV cache; the backend
// must not be used afterwards. A second Close does nothing.
func (e *cpuBackend) Close() {
	if e.pool != nil {
		e.pool.Close()
		e.pool = nil
	}
	e.kc, e.vc, e.kv16 = nil, nil, nil
	for _, f := range e.release {
		f()
	}
	e.release = nil
}

// big32 and big16 allocate KV cache storage (see bigSlice), remembering
// how to free it on Close.
func (e *cpuBackend) big32(n int) []float32 {
	s, free := bigSlice[float32](n)
	e.release = append(e.release, free)
	return s
}

func (e *cpuBackend) big16(n int) []kernels.BF16 {
	s, free := bigSlice[kernels.BF16](n)
	e.release = append(e.release, free)
	return s
}

// alloc allocates the KV cache and the activations of a step (the rows,
// output rows, log-probabilities and routes are the StepBatch's).
func (e *cpuBackend) alloc() {
	c := &e.cfg
	R, S, L := e.opt.StepRows, e.opt.Slots, e.opt.MaxLen
	if e.bf16KV() {
		e.kv16 = make([]bf16Cache, c.NumHiddenLayers)
		for l := range e.kv16 {
			e.kv16[l].k = prefault(e.big16(S * L * e.kvd))
			e.kv16[l].v = prefault(e.big16(S * L * e.kvd))
		}
	} else {
		e.kc = make([][]float32, c.NumHiddenLayers)
		e.vc = make([][]float32, c.NumHiddenLayers)
		for l := range e.kc {
			e.kc[l] = prefault(e.big32(S * L * e.kvd))
			e.vc[l] = prefault(e.big32(S * L * e.kvd))
		}
	}
	f := func(n int) []float32 { return make([]float32, n) }
	e.x, e.xn, e.h, e.xn2 = f(R*e.hid), f(R*e.hid), f(R*e.hid), f(R*e.hid)
	e.qkv, e.q, e.att = f(R*e.qkvd), f(R*e.qd), f(R*e.qd)
	e.probs = make([][]float32, e.pool.Workers())
	e.acc = make([][]float32, e.pool.Workers())
	e.kvs = make([][]float32, e.pool.Workers())
	e.scratch = make([]kernels.GemmScratch, e.pool.Workers())
	e.blocks = make([]int, 0, R+1)
	e.xparts = make([]kernels.GemmParts, e.pool.Workers())
	for i := range e.probs {
		e.probs[i] = f(L)
		e.acc[i] = f(max(e.hid, e.hd))
		e.kvs[i] = f(e.kvd)
	}
	if c.NumExperts == 0 || len(e.moeLayers) < c.NumHiddenLayers {
		e.gu, e.a = f(R*2*c.IntermediateSize), f(R*c.IntermediateSize)
	}
	if len(e.moeLayers) > 0 {
		k, E, I := c.NumExpertsPerTok, c.NumExperts, c.MoeIntermediateSize
		mo := &e.moe
		mo.probs, mo.gates = f(R*E), f(R*k)
		mo.off, mo.fill = make([]int, E+1), make([]int, E)
		mo.row, mo.tok = make([]int32, R*k), make([]int32, R*k)
		mo.xg, mo.gug, mo.ag, mo.yg = f(R*k*e.hid), f(R*k*2*I), f(R*k*I), f(R*k*e.hid)
		mo.order = make([]int, 0, E)
	}
	// At most one output row per slot and step (its decode row, or the
	// row that completes its prompt): the head's input is sized by slots,
	// not step rows, as the StepBatch's log-probabilities are, which
	// matters with a real vocabulary (151,936 log-probs per row).
	e.xo = f(S * e.hid)
}

// prefault writes every page of a fresh buffer once, so that the first
// decode steps to reach a position do not each pay a page fault (the KV
// cache is hundreds of megabytes that the OS maps lazily).
func prefault[T float32 | kernels.BF16](b []T) []T {
	for i := 0; i < len(b); i += 1024 {
		b[i] = 0
	}
	return b
}

// bf16KV reports whether the KV cache is bfloat16 (bf16, fp8 and fp4).
func (e *cpuBackend) bf16KV() bool { return e.opt.Precision >= BF16 }

func (e *cpuBackend) bind() {
	e.fnEmbed, e.fnNorm1, e.fnHeads, e.fnAttn = e.embedRows, e.norm1Rows, e.headRows, e.attnRows
	e.fnNorm2, e.fnSwiGLU, e.fnAddH, e.fnFinal = e.norm2Rows, e.swigluRows, e.addHRows, e.finalRows
	e.fnRouter, e.fnGather, e.fnSwiGLUX, e.fnCombine = e.routerRows, e.gatherRows, e.swigluExpertRows, e.combineRows
	e.fnHead, e.fnParts, e.fnExperts, e.fnBlock = e.headSoftmaxRows, e.partRows, e.expertRows, e.blockRows
}

// gemm computes y = x·Wᵀ for rows rows (row strides ldx, ldy) on the
// backend's pool, the product cut into parts.
func (e *cpuBackend) gemm(l *linear, y []float32, ldy int, x []float32, ldx, rows int) {
	l.parts(&e.parts, y, ldy, x, ldx, rows, e.pool.Workers())
	e.pool.RunGrain(e.parts.Len(), 1, e.fnParts)
}

func (e *cpuBackend) partRows(w, lo, hi int) {
	for i := lo; i < hi; i++ {
		e.parts.Run(i, &e.scratch[w])
	}
}

// forward runs the e.rows rows set up in slot, pos and tok through the
// model: their keys and values go into the cache at (slot, pos), and the
// log-softmax of the rows listed in outRow, each at its temperature in
// outTemp, is left in lp. Rows of one slot must be in increasing
// position, and every position below a row's must already be cached or
// in this step.
func (e *cpuBackend) forward() {
	R := e.rows
	e.pool.Run(R, e.fnEmbed)
	fused := e.planBlocks()
	for l := range e.w.layers {
		e.cur = l
		W := &e.w.layers[l]
		ml := e.moeIndex[l]
		if fused {
			// Everything up to the experts is row by row: one loop over
			// slot-aligned chunks of rows (see blockRows).
			e.pool.RunChunks(e.blocks, e.fnBlock)
			if ml >= 0 {
				e.moeDispatch(ml, W)
			}
			continue
		}
		e.pool.Run(R, e.fnNorm1)
		e.gemm(&W.qkv, e.qkv, e.qkvd, e.xn, e.hid, R)
		e.pool.Run(R, e.fnHeads) // q/k norms, RoPE, K and V into the cache
		e.pool.Run(R*e.nh, e.fnAttn)
		e.gemm(&W.o, e.h, e.hid, e.att, e.qd, R)
		e.pool.Run(R, e.fnNorm2) // h += x, xn2 = RMSNorm(h)
		if ml >= 0 {
			e.gemm(&W.router, e.moe.probs, e.cfg.NumExperts, e.xn2, e.hid, R)
			e.curML = ml // routerRows records into routes[ml]
			e.pool.Run(R, e.fnRouter)
			e.moeDispatch(ml, W)
		} else {
			I := e.cfg.IntermediateSize
			e.gemm(&W.gu, e.gu, 2*I, e.xn2, e.hid, R)
			e.pool.Run(R, e.fnSwiGLU)
			e.gemm(&W.down, e.x, e.hid, e.a, I, R)
			e.pool.Run(R, e.fnAddH) // x = mlp + h
		}
	}
	outs := len(e.outRow)
	if outs == 0 {
		return
	}
	e.pool.Run(outs, e.fnFinal)
	e.gemm(&e.w.head, e.lp, e.vocab, e.xo, e.hid, outs)
	e.pool.Run(outs, e.fnHead)
}

func (e *cpuBackend) embedRows(_, lo, hi int) {
	H := e.hid
	for r := lo; r < hi; r++ {
		t := int(e.tok[r])
		copy(e.x[r*H:(r+1)*H], e.w.embed[t*H:(t+1)*H])
	}
}

func (e *cpuBackend) norm1Rows(_, lo, hi int) {
	H, w := e.hid, e.w.layers[e.cur].inNorm
	for r := lo; r < hi; r++ {
		kernels.RMSNorm(e.xn[r*H:(r+1)*H], e.x[r*H:(r+1)*H], w, e.eps)
	}
}

// cacheRow returns the offset of (slot, pos) in a layer's K or V cache.
func (e *cpuBackend) cacheRow(slot, pos int32) int {
	return (int(slot)*e.opt.MaxLen + int(pos)) * e.kvd
}

// headRows applies q_norm / k_norm and RoPE per head, as the training
// engine's headNormRope, writing q and the row's keys and values into the
// cache.
func (e *cpuBackend) headRows(w, lo, hi int) {
	W := &e.w.layers[e.cur]
	half := e.hd / 2
	for r := lo; r < hi; r++ {
		p := int(e.pos[r])
		cs, sn := e.cos[p*half:(p+1)*half], e.sin[p*half:(p+1)*half]
		raw := e.qkv[r*e.qkvd:]
		kernels.NormRopeHeads(e.q[r*e.qd:(r+1)*e.qd], raw, e.nh, W.qNorm, cs, sn, e.eps, nil)
		var k []float32
		c := e.cacheRow(e.slot[r], e.pos[r])
		if e.bf16KV() {
			k = e.kvs[w]
		} else {
			k = e.kc[e.cur][c : c+e.kvd]
		}
		kernels.NormRopeHeads(k, raw[e.qd:], e.nkv, W.kNorm, cs, sn, e.eps, nil)
		v := raw[e.qd+e.kvd : e.qd+2*e.kvd]
		if e.bf16KV() {
			e.storeBF16(e.slot[r], e.pos[r], k, v)
		} else {
			copy(e.vc[e.cur][c:c+e.kvd], v)
		}
	}
}

// storeBF16 rounds one position's keys and values into the bf16 cache of
// the current layer.
func (e *cpuBackend) storeBF16(slot, pos int32, k, v []float32) {
	kv := &e.kv16[e.cur]
	c := e.cacheRow(slot, pos)
	kernels.ToBF16(kv.k[c:c+e.kvd], k)
	kernels.ToBF16(kv.v[c:c+e.kvd], v)
}

// attnRows computes attention for (row, head) items lo..hi-1 over the
// row's cached prefix: kernels.AttendRow, as the training engine, or the
// engine's own kernels: online softmax in fp32 mode, over the bfloat16
// cache in bf16 and fp8.
func (e *cpuBackend) attnRows(w, lo, hi int) {
	group := e.nh / e.nkv
	for it := lo; it < hi; it++ {
		r, h := it/e.nh, it%e.nh
		n := int(e.pos[r]) + 1
		if h == e.nh/2 && (r+1)*e.nh < hi {
			e.prefetchKV(r + 1)
		}
		o := r*e.qd + h*e.hd
		out, q := e.att[o:o+e.hd], e.q[o:o+e.hd]
		if e.bf16KV() {
			e.attendBF16(out, q, e.slot[r], h/group, n, e.probs[w])
			continue
		}
		kc, vc := e.kc[e.cur], e.vc[e.cur]
		base := e.cacheRow(e.slot[r], 0) + (h/group)*e.hd
		if e.opt.Precision == FP32 {
			attendOnline(out, q, kc[base:], vc[base:], n, e.kvd, e.scale, e.probs[w], e.acc[w])
		} else {
			kernels.AttendRow(out, q, kc[base:], vc[base:], n, e.kvd, e.scale, e.probs[w])
		}
	}
}

// prefetchKV asks for step row r's cached keys and values (its slot's
// prefix, every head) to be brought into the caches while the row before
// it attends (it is called halfway through that row's heads): each row
// reads its own slot's cache, tens of KB at a new address, which the
// hardware prefetchers do not see coming.
func (e *cpuBackend) prefetchKV(r int) {
	c, n := e.cacheRow(e.slot[r], 0), (int(e.pos[r])+1)*e.kvd
	if e.bf16KV() {
		kv := &e.kv16[e.cur]
		kernels.Prefetch(kv.k[c : c+n])
		kernels.Prefetch(kv.v[c : c+n])
		return
	}
	kernels.Prefetch(e.kc[e.cur][c : c+n])
	kernels.Prefetch(e.vc[e.cur][c : c+n])
}

// attendBF16 is one query head's attention over the first n positions of
// KV head kvh of slot in the current layer's bfloat16 cache.
func (e *cpuBackend) attendBF16(out, q []float32, slot int32, kvh, n int, probs []float32) {
	kv := &e.kv16[e.cur]
	base := e.cacheRow(slot, 0) + kvh*e.hd
	p := probs[:n]
	dotRowsBF16(p, q, kv.k[base:], n, e.kvd, e.scale)
	kernels.Softmax(p, p)
	clear(out)
	axpyRowsBF16(out, p, kv.v[base:], n, e.kvd)
}

// attendOnlineBlock is the key block of the fp32 mode's attention: keys
// of one block are scored, exponentiated and summed in one pass each, so
// a prefix of up to a block is one pass of each kernel (normalised at the
// end, as decoding kernels do), and longer ones rescale as blocks come.
const attendOnlineBlock = 256

// attendOnline is the fp32 mode's attention for one query head: a one-pass
// softmax over blocks of keys with a running maximum, as decoding kernels
// do, rescaling the unnormalised output when the maximum grows and
// dividing by the float64 sum at the end. Mathematically AttendRow; the
// rounding differs (AttendRow normalises the probabilities before the
// weighted sum).
func attendOnline(out, q, keys, values []float32, n, stride int, scale float32, s, acc []float32) {
	d := len(q)
	acc = acc[:d]
	clear(acc)
	m := float32(math.Inf(-1))
	var l float64
	for b0 := 0; b0 < n; b0 += attendOnlineBlock {
		nb := min(attendOnlineBlock, n-b0)
		sc := s[:nb]
		kernels.DotRows(sc, q, keys[b0*stride:], nb, stride, scale)
		if mb := kernels.Max(sc); mb > m {
			if l > 0 {
				c := float32(math.Exp(float64(m - mb)))
				kernels.Scale(acc, acc, c)
				l *= float64(c)
			}
			m = mb
		}
		l += kernels.ExpSum(sc, sc, m)
		kernels.AxpyRows(acc, sc, values[b0*stride:], nb, stride)
	}
	kernels.Scale(out[:d], acc, float32(1/l))
}

func (e *cpuBackend) norm2Rows(_, lo, hi int) {
	H, w := e.hid, e.w.layers[e.cur].postNm
	for r := lo; r < hi; r++ {
		h, x := e.h[r*H:(r+1)*H], e.x[r*H:(r+1)*H]
		for i := range h {
			h[i] += x[i]
		}
		kernels.RMSNorm(e.xn2[r*H:(r+1)*H], h, w, e.eps)
	}
}

func (e *cpuBackend) swigluRows(_, lo, hi int) {
	I := e.cfg.IntermediateSize
	for r := lo; r < hi; r++ {
		kernels.SwiGLU(e.a[r*I:(r+1)*I], e.gu[2*r*I:(2*r+1)*I], e.gu[(2*r+1)*I:(2*r+2)*I])
	}
}

func (e *cpuBackend) addHRows(_, lo, hi int) {
	H := e.hid
	x, h := e.x[lo*H:hi*H], e.h[lo*H:hi*H]
	for i := range x {
		x[i] += h[i]
	}
}

// moeDispatch runs the experts of one sparse MoE block, as the training
// engine does, once the router has chosen them (routerRows: softmax,
// top-k, recorded; gates from the full softmax): expert products over rows
// grouped by expert, gated sum in slot order added to h.
func (e *cpuBackend) moeDispatch(ml int, W *layerWeights) {
	c := &e.cfg
	R, E, k, I, H := e.rows, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize, e.hid
	mo := &e.moe
	ids := e.routes[ml][:R*k]
	clear(mo.off)
	for _, id := range ids {
		mo.off[id+1]++
	}
	for x := 0; x < E; x++ {
		mo.off[x+1] += mo.off[x]
	}
	clear(mo.fill)
	for j, id := range ids {
		g := mo.off[id] + mo.fill[id]
		mo.fill[id]++
		mo.row[j] = int32(g)
		mo.tok[g] = int32(j / k)
	}
	// Active experts, most rows first: when there are enough of them to
	// keep every worker busy, each runs whole on one worker (gather, both
	// products, SwiGLU), largest first so the short ones fill the gaps.
	// Otherwise each product is split across the workers.
	mo.order = mo.order[:0]
	for x := 0; x < E; x++ {
		if n := mo.off[x+1] - mo.off[x]; n > 0 {
			i := len(mo.order)
			mo.order = append(mo.order, x)
			for ; i > 0 && mo.off[mo.order[i-1]+1]-mo.off[mo.order[i-1]] < n; i-- {
				mo.order[i] = mo.order[i-1]
			}
			mo.order[i] = x
		}
	}
	if len(mo.order) >= 2*e.pool.Workers() {
		e.curW = W
		e.pool.RunGrain(len(mo.order), 1, e.fnExperts)
		e.curW = nil
	} else {
		e.pool.Run(R*k, e.fnGather)
		for _, x := range mo.order {
			r0, n := mo.off[x], mo.off[x+1]-mo.off[x]
			e.gemm(&W.experts[x].gu, mo.gug[r0*2*I:], 2*I, mo.xg[r0*H:], H, n)
		}
		e.pool.Run(R*k, e.fnSwiGLUX)
		for _, x := range mo.order {
			r0, n := mo.off[x], mo.off[x+1]-mo.off[x]
			e.gemm(&W.experts[x].down, mo.yg[r0*H:], H, mo.ag[r0*I:], I, n)
		}
	}
	e.pool.Run(R, e.fnCombine)
}

// blockChunksPerWorker is how many chunks of rows the fused path aims at
// per worker: enough to rebalance uneven attention prefixes.
const blockChunksPerWorker = 4

// blockGrain is the rows of a chunk in the fused path: two micro-kernel
// tiles (14 rows each on AVX-512), so a chunk's products use whole tiles.
const blockGrain = 28

// planBlocks cuts the step's rows into chunks for blockRows, each holding
// whole slots (a slot's rows are contiguous, in increasing position, and a
// row attends to the keys its slot's earlier rows of this step write, so
// they must run in order on one worker). It reports whether the fused path
// applies: with fewer than two chunks per worker (one long prompt being
// prefilled) the rows are better split operation by operation.
func (e *cpuBackend) planBlocks() bool {
	if e.fuse < 0 {
		return false
	}
	R, unit := e.rows, e.blockUnit
	if unit == 0 {
		unit = blockGrain
	}
	grain := max(unit, (R/(blockChunksPerWorker*e.pool.Workers())+unit/2)/unit*unit)
	e.blocks = append(e.blocks[:0], 0)
	for lo := 0; lo < R; {
		hi := min(lo+grain, R)
		for hi < R && e.slot[hi] == e.slot[hi-1] {
			hi++
		}
		e.blocks = append(e.blocks, hi)
		lo = hi
	}
	return e.fuse > 0 || e.pool.Workers() == 1 || len(e.blocks)-1 >= 2*e.pool.Workers()
}

// blockRows runs rows lo..hi-1 of the current layer up to its experts on
// worker w: input norm, QKV product, q/k norms and RoPE with the keys and
// values written to the cache, attention, output product, residual and
// post-attention norm, then the router (MoE layers) or the whole MLP
// (dense layers). Every product is computed for these rows alone, which
// gives the bits of the whole-batch product (the GEMMs are batch
// invariant), so the fused path and the operation-by-operation one agree.
func (e *cpuBackend) blockRows(w, lo, hi int) {
	W := &e.w.layers[e.cur]
	H, n := e.hid, hi-lo
	g, s := &e.xparts[w], &e.scratch[w]
	e.norm1Rows(w, lo, hi)
	W.qkv.parts(g, e.qkv[lo*e.qkvd:], e.qkvd, e.xn[lo*H:], H, n, 1)
	g.RunAll(s)
	e.headRows(w, lo, hi)
	e.attnRows(w, lo*e.nh, hi*e.nh)
	W.o.parts(g, e.h[lo*H:], H, e.att[lo*e.qd:], e.qd, n, 1)
	g.RunAll(s)
	e.norm2Rows(w, lo, hi)
	if ml := e.moeIndex[e.cur]; ml >= 0 {
		W.router.parts(g, e.moe.probs[lo*e.cfg.NumExperts:], e.cfg.NumExperts, e.xn2[lo*H:], H, n, 1)
		g.RunAll(s)
		e.routeRows(ml, lo, hi)
		return
	}
	I := e.cfg.IntermediateSize
	W.gu.parts(g, e.gu[lo*2*I:], 2*I, e.xn2[lo*H:], H, n, 1)
	g.RunAll(s)
	e.swigluRows(w, lo, hi)
	W.down.parts(g, e.x[lo*H:], H, e.a[lo*I:], I, n, 1)
	g.RunAll(s)
	e.addHRows(w, lo, hi)
}

// expertRows runs experts mo.order[lo:hi] of layer e.curW, each whole on
// worker w: gather its rows, gate and up product, SwiGLU, down product.
func (e *cpuBackend) expertRows(w, lo, hi int) {
	I, H := e.cfg.MoeIntermediateSize, e.hid
	mo := &e.moe
	g, s := &e.xparts[w], &e.scratch[w]
	for _, x := range mo.order[lo:hi] {
		r0, r1 := mo.off[x], mo.off[x+1]
		e.gatherRows(w, r0, r1)
		X := &e.curW.experts[x]
		X.gu.parts(g, mo.gug[r0*2*I:], 2*I, mo.xg[r0*H:], H, r1-r0, 1)
		g.RunAll(s)
		e.swigluExpertRows(w, r0, r1)
		X.down.parts(g, mo.yg[r0*H:], H, mo.ag[r0*I:], I, r1-r0, 1)
		g.RunAll(s)
	}
}

func (e *cpuBackend) routerRows(_, lo, hi int) { e.routeRows(e.curML, lo, hi) }

// routeRows turns router logits into experts (recorded in routes[ml]) and
// gates for rows lo..hi-1.
func (e *cpuBackend) routeRows(ml, lo, hi int) {
	c := &e.cfg
	E, k := c.NumExperts, c.NumExpertsPerTok
	mo := &e.moe
	ids := e.routes[ml]
	for r := lo; r < hi; r++ {
		p := mo.probs[r*E : (r+1)*E]
		kernels.Softmax(p, p)
		model.TopK(ids[r*k:(r+1)*k], p)
		model.GateWeights(mo.gates[r*k:(r+1)*k], p, ids[r*k:(r+1)*k], c.NormTopKProb)
	}
}

func (e *cpuBackend) gatherRows(_, lo, hi int) {
	H := e.hid
	for g := lo; g < hi; g++ {
		t := int(e.moe.tok[g])
		copy(e.moe.xg[g*H:(g+1)*H], e.xn2[t*H:(t+1)*H])
	}
}

func (e *cpuBackend) swigluExpertRows(_, lo, hi int) {
	I := e.cfg.MoeIntermediateSize
	mo := &e.moe
	for g := lo; g < hi; g++ {
		kernels.SwiGLU(mo.ag[g*I:(g+1)*I], mo.gug[2*g*I:(2*g+1)*I], mo.gug[(2*g+1)*I:(2*g+2)*I])
	}
}

func (e *cpuBackend) combineRows(w, lo, hi int) {
	H, k := e.hid, e.cfg.NumExpertsPerTok
	mo := &e.moe
	var ysArr [16][]float32
	ys := ysArr[:0]
	if k > len(ysArr) {
		ys = make([][]float32, 0, k)
	}
	for r := lo; r < hi; r++ {
		ys = ys[:0]
		for s := 0; s < k; s++ {
			g := int(mo.row[r*k+s])
			ys = append(ys, mo.yg[g*H:(g+1)*H])
		}
		model.CombineExperts(e.x[r*H:(r+1)*H], e.h[r*H:(r+1)*H], e.acc[w], mo.gates[r*k:(r+1)*k], ys)
	}
}

// finalRows applies the final norm to the output rows, gathering them.
func (e *cpuBackend) finalRows(_, lo, hi int) {
	H := e.hid
	for o := lo; o < hi; o++ {
		r := int(e.outRow[o])
		kernels.RMSNorm(e.xo[o*H:(o+1)*H], e.x[r*H:(r+1)*H], e.w.norm, e.eps)
	}
}

// headSoftmaxRows turns logits into log-probabilities at each output
// row's temperature (logits divided by it first, unless it is 1 or 0:
// greedy decoding reports the untempered distribution).
func (e *cpuBackend) headSoftmaxRows(_, lo, hi int) {
	V := e.vocab
	for o := lo; o < hi; o++ {
		z := e.lp[o*V : (o+1)*V]
		if t := e.outTemp[o]; t != 1 && t != 0 {
			for i := range z {
				z[i] /= t
			}
		}
		kernels.LogSoftmax(z, z)
	}
}

// Fill sets the defaults of opt's zero fields for the model c (64 slots,
// MaxLen up to 1024, StepRows at least 512) and checks the result: what
// every backend, the CPU's or a GPU's, starts from.
func (opt *Options) Fill(c *model.Config) error { return opt.fill(c) }
