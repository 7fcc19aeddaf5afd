// Package cuda is the rollout engine's GPU backend: a rollout.Backend whose
// weights and KV cache live in device memory, so that the rollout's
// batcher, scheduler, seeds and sampling (host code, written once) drive a
// GPU as they drive the CPU backend.
//
// In exact precision the decoding step calls the training engine's own
// batch-invariant kernels (kernels/cuda.Ops), call for call, so log mu
// equals the GPU training engine's float32 log pi_old bit for bit and the
// routes are identical. In bf16, as the CPU engine's bf16 mode, the
// products go to cuBLASLt from a bf16 copy of the weights
// (kernels/cuda.BF16Linear) and the KV cache holds bfloat16 keys and
// values (rounded once, attended in float32); the rest stays float32. In
// fp8 the products are the CPU fp8's: e4m3 weights per output channel and
// activations per token (kernels/cuda.QuantLinear, emulated through the
// bf16 GEMM), with the same bf16 cache; fp4 likewise with the CPU's
// NVFP4-style weights. The backend is a rollout.Drawer: an output row
// whose policy neither truncates nor reports top log-probabilities is
// drawn on the device from the uniform the batcher passes (draw_rows,
// rollout.DrawRow's rule), so a step copies a token and a float per such
// row to the host instead of its vocabulary's log-probabilities; the
// others' rows are copied back for the host's sampler.
package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

type Buffer = kc.Buffer

// Backend is the GPU decoding step. It is used by one rollout.Engine.
type Backend struct {
	cfg  model.Config
	opt  rollout.Options
	dev  *kc.Device
	ops  *kc.Ops
	host *model.Model // the parameter layout
	offs map[*model.Param]int
	w    Buffer

	kcache, vcache []Buffer // per layer: [slots, max_len, kv·hd]
	cos, sin       Buffer
	s              scratch
	bufs           []Buffer
	err            error    // a failed CopyPrefix, reported by the next Step
	ownDevice      bool     // Close closes dev (Open)
	bf             products // bf16 and fp8 precision's products; nil in exact

	// graphs replays decoding steps (every row an output row, at most
	// Slots rows) as CUDA graphs, one per row count graphRows gives, made
	// at first use; nil where they are off (useGraphs).
	graphs map[int]*kc.Graph
	// stage is the host's side of a step's one upload and one download.
	stage []uint32
	// pad is the host's copy of a graph step's padded inputs.
	pad struct {
		slot, pos, tok, outRow []int32
		temps                  []float32
	}
	// groupOnDevice: the MoE layers group their rows by expert on the
	// device and run all experts in one grouped product (groupsOnDevice);
	// experts is each MoE layer's weights for it, routes the host's copy of
	// a step's routes, which stay on the device until the step ends.
	groupOnDevice bool
	experts       []expertWeights
	routes        []int32
}

// expertWeights are an MoE layer's experts as the grouped products read
// them: every expert's gate and up projections ([2I, H], the two side by
// side in the arena) and its down projection ([H, I]), expert e's stride
// floats after expert 0's.
type expertWeights struct {
	gateUp, down Buffer
	stride       int
}

// scratch is one step's device memory, sized for Options.StepRows rows.
type scratch struct {
	// in holds a step's inputs, uploaded in one copy (each copy from the
	// host is a call into the driver that first waits for the device):
	// draw, topP, slot, pos, tok, outRow, temps, topK and topN are spans
	// of it (stepIn). out holds what a step's draws give back, downloaded
	// in one copy: drawn, drawnLP, drawnTLP, topTok and topLP are spans of
	// it (stepOut).
	in, out                                       Buffer
	slot, pos, tok, outRow, temps                 Buffer
	x, h1, q, k, att, xmid, h2, next              Buffer
	qkv                                           Buffer // q's, k's and v's products (qkvViews)
	gu, a                                         Buffer // dense MLP
	xo, logits                                    Buffer // output rows
	draw, topP, topK, topN                        Buffer // per output row: uniform and top-p (float64), top-k, top log-probs asked
	drawn, drawnLP, drawnTLP, topTok, topLP       Buffer // per output row drawn: token, log-prob, truncated log-prob, top tokens and log-probs
	probs, gates, row, gtok, ids, xg, gug, ag, yg Buffer // MoE
	x16                                           Buffer // bf16: a product's operand, rounded by the kernel before it
	part                                          Buffer // the reduced precisions: the decoding attention's split sums (kc.DecodeSplitFloats)
	drawScratch                                   Buffer // the reduced precisions: the split draw's (kc.DrawScratchFloats)
	grp                                           kc.MoEGroups
	xg16                                          Buffer // bf16 MoE grouped on the device: the experts' rows, then SwiGLU's
}

// groupsOnDevice says whether the MoE layers of a rollout group their rows
// by expert on the device (unless KEEL_MOE_GROUP is host): no round trip
// to the host mid-step, every expert's products in one launch, and
// decoding steps replayed as CUDA graphs. KEEL_MOE_GROUP=host groups on
// the host and launches a product per expert.
func groupsOnDevice(c *model.Config, o *rollout.Options) bool {
	return len(c.MoELayers()) > 0 && os.Getenv("KEEL_MOE_GROUP") != "host"
}

// products are the reduced-precision linear layers: kernels/cuda's
// BF16Linear (bf16) or QuantLinear (fp8, fp4).
type products interface {
	Linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error
	LinearMany(x Buffer, rows, in, ldx int, ps ...kc.Product) error
	Stale()
	Refresh() error
	Reserve(rows, width int) error
	Free()
}

// span asks for n floats of device memory into *b.
type span struct {
	b *Buffer
	n int
}

// spans lists the scratch of a step of o.StepRows rows and o.Slots output
// rows, in floats: what alloc allocates and Plan counts.
func (s *scratch) spans(c *model.Config, o *rollout.Options) []span {
	R, S, H, V := o.StepRows, o.Slots, c.HiddenSize, c.VocabSize
	qd, kvd := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	I := c.IntermediateSize
	E, k, Im := c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	spans := []span{{&s.in, stepIn(R, S)}, {&s.out, stepOut(S)},
		{&s.x, R * H}, {&s.h1, R * H}, {&s.qkv, R * (qd + 2*kvd)}, {&s.q, R * qd}, {&s.k, R * kvd},
		{&s.att, R * qd}, {&s.xmid, R * H}, {&s.h2, R * H}, {&s.next, R * H}, {&s.xo, S * H}, {&s.logits, S * V}}
	if len(c.MoELayers()) < c.NumHiddenLayers {
		spans = append(spans, span{&s.gu, R * 2 * I}, span{&s.a, R * I})
	}
	if o.Precision == rollout.BF16 {
		spans = append(spans, span{&s.x16, (R*max(H, qd, I) + 1) / 2})
	}
	if o.Precision != rollout.Exact {
		spans = append(spans, span{&s.part, kc.DecodeSplitFloats(max(R, S), c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim)},
			span{&s.drawScratch, kc.DrawScratchFloats(S, V)})
	}
	if nMoE := len(c.MoELayers()); nMoE > 0 && groupsOnDevice(c, o) {
		// Every MoE layer's routes stay on the device until the step ends.
		spans = append(spans, span{&s.probs, R * E}, span{&s.gates, R * k}, span{&s.ids, nMoE * R * k},
			span{&s.gug, R * k * 2 * Im}, span{&s.yg, R * k * H})
		if o.Precision != rollout.BF16 || H%2 != 0 { // bf16 gathers the rows in bf16 (odd H: rounded after)
			spans = append(spans, span{&s.xg, R * k * H})
		}
		if o.Precision != rollout.BF16 { // bf16's SwiGLU writes bf16 into xg16
			spans = append(spans, span{&s.ag, R * k * Im})
		}
		for _, g := range s.grp.Layout(R*k, E) {
			spans = append(spans, span{g.B, g.Words})
		}
		if o.Precision == rollout.BF16 {
			spans = append(spans, span{&s.xg16, (R*k*max(H, Im) + 1) / 2})
		}
	} else if nMoE > 0 {
		spans = append(spans, span{&s.probs, R * E}, span{&s.gates, R * k}, span{&s.row, R * k}, span{&s.gtok, R * k},
			span{&s.ids, R * k}, span{&s.xg, R * k * H}, span{&s.gug, R * k * 2 * Im}, span{&s.ag, R * k * Im}, span{&s.yg, R * k * H})
	}
	return spans
}

var _ rollout.Drawer = (*Backend)(nil)

// Draws reports that Step draws the rows the batcher asks it to
// (rollout.StepBatch.Draw), unless the vocabulary is beyond the kernel's.
func (b *Backend) Draws() bool { return b.cfg.VocabSize <= kc.DrawMaxVocab }

// New puts m on dev for decoding with opt (defaults filled as for the CPU
// backend), in exact, bf16, fp8 or fp4 precision. The KV cache is
// [layers][slots][max_len][kv·hd] for keys and for values (float32, or
// bfloat16 in bf16, fp8 and fp4), for as many of opt.Slots as fit in the
// device memory opt allows (Plan, Options.Reserve and MemoryFraction;
// Options() reports the slots kept); a model that does not fit with one
// slot is an error naming what to lower.
func New(dev *kc.Device, m *model.Model, opt rollout.Options) (*Backend, error) {
	c := m.Config
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := opt.Fill(&c); err != nil {
		return nil, err
	}
	if opt.Precision == rollout.FP32 {
		return nil, fmt.Errorf("rollout/cuda: precision fp32 (the CPU engine's own float32 kernels) has no GPU form; exact is the GPU's float32")
	}
	if c.HeadDim > 256 {
		return nil, fmt.Errorf("rollout/cuda: head_dim %d above the attention kernel's 256", c.HeadDim)
	}
	if opt.MemoryFraction < 0 || opt.MemoryFraction > 1 {
		return nil, fmt.Errorf("rollout/cuda: memory fraction %g, want within [0, 1] (0: %g)", opt.MemoryFraction, DefaultMemoryFraction)
	}
	if dev == nil {
		return nil, errors.New("rollout/cuda: no device")
	}
	mem, err := Plan(&c, opt)
	if err != nil {
		return nil, err
	}
	free, _, err := dev.MemInfo()
	if err != nil {
		return nil, err
	}
	if opt.Slots, err = fitSlots(mem, free, opt.Reserve, opt.MemoryFraction, opt.Slots); err != nil {
		return nil, err
	}
	host := model.New(c)
	b := &Backend{cfg: c, opt: opt, dev: dev, ops: kc.NewOps(dev), host: host, offs: map[*model.Param]int{},
		groupOnDevice: groupsOnDevice(&c, &opt)}
	off := 0
	for _, p := range host.Params() {
		b.offs[p] = off
		off += p.Size()
	}
	if err := b.alloc(); err != nil {
		b.Close()
		return nil, err
	}
	if b.groupOnDevice {
		if b.experts, err = b.expertLayout(); err != nil {
			b.Close()
			return nil, err
		}
	}
	switch opt.Precision {
	case rollout.BF16:
		b.bf, err = kc.NewBF16Linear(b.ops, b.w, len(host.Arena))
	case rollout.FP8, rollout.FP4:
		var mats []kc.Matrix
		for _, p := range host.Params() {
			// Every matrix a product reads (an untied embedding is only
			// gathered from).
			if len(p.Shape) == 2 && (p != host.Embed || host.LMHead == host.Embed) {
				mats = append(mats, kc.Matrix{Off: b.offs[p], Rows: p.Shape[0], Cols: p.Shape[1]})
			}
		}
		format := kc.FormatFP8
		if opt.Precision == rollout.FP4 {
			format = kc.FormatFP4
		}
		b.bf, err = kc.NewQuantLinear(b.ops, b.w, len(host.Arena), mats, format)
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	if err == nil && b.bf != nil {
		// The operands' scratch at its largest now (as Plan counts it): a
		// graph keeps the addresses it recorded.
		err = b.bf.Reserve(operandShape(&c, &opt))
	}
	if err == nil && useGraphs(&c, &opt, b.ops) {
		b.graphs = map[int]*kc.Graph{}
		err = b.ops.PrepareGraphs()
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	if err := b.Load(m); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) buf(floats int) (Buffer, error) {
	x, err := b.dev.Alloc(int64(max(floats, 1)) * 4)
	if err == nil {
		b.bufs = append(b.bufs, x)
	}
	return x, err
}

func (b *Backend) alloc() error {
	c, o := &b.cfg, &b.opt
	hd, kvd := c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	var err error
	if b.w, err = b.buf(len(b.host.Arena)); err != nil {
		return err
	}
	b.kcache, b.vcache = make([]Buffer, c.NumHiddenLayers), make([]Buffer, c.NumHiddenLayers)
	cacheFloats := o.Slots * o.MaxLen * kvd
	if b.bf16Cache() {
		cacheFloats = (cacheFloats + 1) / 2 // bf16 elements, two a float
	}
	for l := range b.kcache {
		if b.kcache[l], err = b.buf(cacheFloats); err != nil {
			return err
		}
		if b.vcache[l], err = b.buf(cacheFloats); err != nil {
			return err
		}
	}
	cos, sin := model.RopeTables(hd, c.RopeTheta, o.MaxLen)
	if b.cos, err = b.buf(len(cos)); err != nil {
		return err
	}
	if b.sin, err = b.buf(len(sin)); err != nil {
		return err
	}
	if err := kc.Upload(b.dev, b.cos, cos); err != nil {
		return err
	}
	if err := kc.Upload(b.dev, b.sin, sin); err != nil {
		return err
	}
	spans := b.s.spans(c, o)
	for _, sp := range spans {
		if *sp.b, err = b.buf(sp.n); err != nil {
			return err
		}
	}
	b.s.split(o.StepRows, o.Slots)
	return nil
}

// stepIn is the words of a step's inputs for R rows and S output rows:
// each output row's uniform and top-p (float64s: two words each, first so
// that they are 8-byte aligned), each row's slot, position and token,
// each output row's step row, temperature, top-k and number of top
// log-probabilities.
func stepIn(R, S int) int { return 4*S + 3*R + 4*S }

// stepOut is the words of what a step's draws give back for S output
// rows: each row's token, log-prob and truncated log-prob, then its
// kc.TopMax top tokens and their log-probs.
func stepOut(S int) int { return 3*S + 2*kc.TopMax*S }

// split points the step's inputs and draws at their spans of in and out.
func (s *scratch) split(R, S int) {
	at := 0
	for _, p := range []struct {
		b *Buffer
		n int
	}{{&s.draw, 2 * S}, {&s.topP, 2 * S}, {&s.slot, R}, {&s.pos, R}, {&s.tok, R}, {&s.outRow, S}, {&s.temps, S}, {&s.topK, S}, {&s.topN, S}} {
		*p.b = s.in.Floats(at, p.n)
		at += p.n
	}
	s.drawn, s.drawnLP, s.drawnTLP = s.out.Floats(0, S), s.out.Floats(S, S), s.out.Floats(2*S, S)
	s.topTok, s.topLP = s.out.Floats(3*S, kc.TopMax*S), s.out.Floats(3*S+kc.TopMax*S, kc.TopMax*S)
}

// Config returns the model's configuration.
func (b *Backend) Config() model.Config { return b.cfg }

// Options returns the backend's sizes and precision.
func (b *Backend) Options() rollout.Options { return b.opt }

// Load copies m's weights to the device.
func (b *Backend) Load(m *model.Model) error {
	if len(m.Arena) != len(b.host.Arena) {
		return fmt.Errorf("rollout/cuda: Load: %d parameters, the backend's model has %d", len(m.Arena), len(b.host.Arena))
	}
	if b.bf != nil {
		b.bf.Stale()
	}
	return kc.Upload(b.dev, b.w, m.Arena)
}

// LoadFrom copies the weights of src device to device when src is a GPU
// training engine (kernels/cuda.DeviceWeights) on the same GPU with this
// model's layout, and reports whether it did; otherwise the caller loads
// through the host (Load).
func (b *Backend) LoadFrom(src any) (bool, error) {
	dw, ok := src.(kc.DeviceWeights)
	if !ok {
		return false, nil
	}
	dev, w := dw.DeviceWeights()
	if dev == nil || dev.Ordinal != b.dev.Ordinal || w.Size != b.w.Size {
		return false, nil
	}
	if b.bf != nil {
		b.bf.Stale()
	}
	return true, b.dev.Copy(b.w, w, w.Size)
}

// CopyPrefix copies the cached keys and values of positions [0, n) of
// slot src to slot dst in every layer.
func (b *Backend) CopyPrefix(dst, src, n int) {
	if n <= 0 || dst == src || b.err != nil {
		return
	}
	kvd := int64(b.cfg.NumKeyValueHeads * b.cfg.HeadDim)
	es := int64(4) // bytes an element
	if b.bf16Cache() {
		es = 2
	}
	slotBytes, size := int64(b.opt.MaxLen)*kvd*es, int64(n)*kvd*es
	at := func(c Buffer, slot int) Buffer {
		return Buffer{Ptr: c.Ptr + uint64(int64(slot)*slotBytes), Size: size}
	}
	for l := range b.kcache {
		for _, c := range []Buffer{b.kcache[l], b.vcache[l]} {
			if err := b.dev.Copy(at(c, dst), at(c, src), size); err != nil {
				b.err = err
				return
			}
		}
	}
}

// Close frees the device memory, and closes the device when Open opened
// it (a device given to New stays the caller's).
func (b *Backend) Close() {
	for _, g := range b.graphs {
		g.Close()
	}
	b.graphs = nil
	b.ops.CloseGraphs()
	if b.bf != nil {
		b.bf.Free()
		b.bf = nil
	}
	for _, x := range b.bufs {
		b.dev.Free(x)
	}
	b.bufs = nil
	if b.ownDevice {
		b.dev.Close()
		b.ownDevice = false
	}
}

func (b *Backend) param(p *model.Param) Buffer { return b.w.Floats(b.offs[p], p.Size()) }

// splits is the runs the reduced precisions' decoding attention splits
// each row's keys into for a step of R rows (kc.Ops.DecodeSplits): by
// graphRows's count for a decoding step, so that a step gets the same
// splits replayed in a graph of padded rows as launched one by one.
func (b *Backend) splits(R int) int {
	if R <= b.opt.Slots {
		R = graphRows(R, b.opt.Slots)
	}
	return b.ops.DecodeSplits(R, b.cfg.NumAttentionHeads, b.cfg.NumKeyValueHeads)
}

// qkvViews returns where a step of R rows puts its q, k and v products,
// in s.qkv, with the row strides of q and of k and v. In the reduced
// precisions they are column spans of one [R, qd+2·kvd] matrix: their
// weights lie back to back in the arena, so the three are one product
// (kernels/cuda mergeProducts), one launch where there were three, and
// wider (at 256 decoding rows each product is far from the card's
// speed). In exact precision each is a matrix of its own, as the training
// engine's are: its products (Ops.LinearMany) are one per matrix anyway.
func (b *Backend) qkvViews(R int) (q, k, v Buffer, ldq, ldkv int) {
	qd, kvd := b.cfg.NumAttentionHeads*b.cfg.HeadDim, b.cfg.NumKeyValueHeads*b.cfg.HeadDim
	if b.opt.Precision == rollout.Exact {
		return b.s.qkv.Floats(0, R*qd), b.s.qkv.Floats(R*qd, R*kvd), b.s.qkv.Floats(R*(qd+kvd), R*kvd), qd, kvd
	}
	ld := qd + 2*kvd
	n := R * ld
	return b.s.qkv.Floats(0, n), b.s.qkv.Floats(qd, n-qd), b.s.qkv.Floats(qd+kvd, n-qd-kvd), ld, ld
}

// bf16Cache reports whether the KV cache holds bfloat16 (bf16, fp8 and
// fp4, as the CPU engine keeps it) rather than float32 (exact).
func (b *Backend) bf16Cache() bool { return b.opt.Precision != rollout.Exact }

// linear is Ops.Linear in exact precision (the training engine's product,
// bit for bit), the bf16 or fp8 products otherwise.
func (b *Backend) linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error {
	if b.bf != nil {
		return b.bf.Linear(y, x, w, rows, in, out, ldy, ldx)
	}
	return b.ops.Linear(y, x, w, rows, in, out, ldy, ldx)
}

// linears computes several products of the same input x (q, k and v;
// gate and up), from one rounding or quantisation of it in the reduced
// precisions.
func (b *Backend) linears(x Buffer, rows, in, ldx int, ps ...kc.Product) error {
	if b.bf != nil {
		return b.bf.LinearMany(x, rows, in, ldx, ps...)
	}
	return b.ops.LinearMany(x, rows, in, ldx, ps...)
}

// Step runs the rows of sb through the model: keys and values into the
// cache, the output rows' log-probabilities and every row's routes into
// sb. A decoding step (every row an output row) of a dense model replays
// a CUDA graph of its launches (stepGraph); any other step launches them
// one by one.
func (b *Backend) Step(sb *rollout.StepBatch) error {
	if b.err != nil {
		return b.err
	}
	if err := b.checkBatch(sb); err != nil {
		return err
	}
	R, nOut := sb.Rows(), len(sb.OutRow)
	if R == 0 {
		return nil
	}
	if b.graphs != nil && nOut == R && R <= b.opt.Slots {
		return b.stepGraph(sb)
	}
	if err := b.upload(sb.Slot, sb.Pos, sb.Tok, sb.OutRow, sb.OutTemp, sb); err != nil {
		return err
	}
	if err := b.forward(sb, R, nOut); err != nil {
		return err
	}
	if err := b.routesOut(sb, R, R); err != nil {
		return err
	}
	if nOut == 0 {
		return b.dev.Sync()
	}
	return b.outputs(sb, nOut)
}

// routesOut copies the routes of a step's first R rows from the device
// into sb, where the MoE layers grouped on the device left them (a step of
// run rows: layer ml's at ml·run·k).
func (b *Backend) routesOut(sb *rollout.StepBatch, R, run int) error {
	nMoE, k := len(b.cfg.MoELayers()), b.cfg.NumExpertsPerTok
	if !b.groupOnDevice || nMoE == 0 {
		return nil
	}
	b.routes = slices.Grow(b.routes[:0], nMoE*run*k)[:nMoE*run*k]
	if err := kc.Download(b.dev, b.routes, b.s.ids); err != nil {
		return err
	}
	for ml := range nMoE {
		copy(sb.Routes[ml][:R*k], b.routes[ml*run*k:])
	}
	return nil
}

// upload copies a step's rows (slot, position, token) and output rows
// (step row, temperature, and for a row drawn on the device its uniform,
// top-k, top-p and number of top log-probabilities) to the device, in one
// copy: they are packed here as scratch.in lays them out (split).
func (b *Backend) upload(slot, pos, tok, outRow []int32, temps []float32, sb *rollout.StepBatch) error {
	R, S := b.opt.StepRows, b.opt.Slots
	st := slices.Grow(b.stage[:0], stepIn(R, S))[:stepIn(R, S)]
	clear(st)
	for o, u := range sb.Draw {
		putFloat64(st[2*o:], u)
		if o < len(sb.TopP) {
			putFloat64(st[2*S+2*o:], sb.TopP[o])
		}
	}
	at := 4 * S
	for _, src := range []struct {
		v   []int32
		cap int
	}{{slot, R}, {pos, R}, {tok, R}, {outRow, S}} {
		for i, v := range src.v {
			st[at+i] = uint32(v)
		}
		at += src.cap
	}
	for i, t := range temps {
		st[at+i] = math.Float32bits(t)
	}
	at += S
	for i, k := range sb.TopK {
		st[at+i] = uint32(k)
	}
	at += S
	for i, n := range sb.TopN {
		st[at+i] = uint32(n)
	}
	b.stage = st
	return kc.Upload(b.dev, b.s.in, st)
}

// putFloat64 writes v into two words, little-endian, as the GPU reads it.
func putFloat64(w []uint32, v float64) {
	bits := math.Float64bits(v)
	w[0], w[1] = uint32(bits), uint32(bits>>32)
}

// useGraphs says whether the backend replays decoding steps as CUDA
// graphs: for dense models and MoE models grouped on the device (an MoE
// layer grouped on the host brings its routes there mid-step, which a
// graph cannot), where the driver has graphs, the run is not profiled
// (KEEL_CUDA_PROFILE) and KEEL_CUDA_GRAPHS is not 0.
func useGraphs(c *model.Config, opt *rollout.Options, o *kc.Ops) bool {
	return (len(c.MoELayers()) == 0 || groupsOnDevice(c, opt)) && o.GraphsAvailable() && os.Getenv("KEEL_CUDA_GRAPHS") != "0"
}

// graphRows is the rows of the graph that runs a decoding step of R rows:
// R rounded up to a power of two up to 8, then to a multiple of 8, at
// most slots. The rows beyond R are padding: slot -1 (no cache written,
// attention zeros), position 0, token 0, their outputs never read. So a
// rollout of 256 sequences records at most 35 graphs as its sequences
// end.
func graphRows(R, slots int) int {
	n := 1
	for n < R && n < 8 {
		n *= 2
	}
	if R > 8 {
		n = (R + 7) / 8 * 8
	}
	return min(n, slots)
}

// stepGraph runs a decoding step as a graph of graphRows rows, recorded
// after the first step of that size: the inputs padded and uploaded, the
// weights' reduced-precision copies refreshed (outside the graph), the
// graph replayed, then the draws and copies of outputs as a plain step's.
// A graph runs the launches the plain step makes, over more rows: in
// exact precision, whose kernels are batch invariant, the same bits.
func (b *Backend) stepGraph(sb *rollout.StepBatch) error {
	R, nOut := sb.Rows(), len(sb.OutRow)
	n := graphRows(R, b.opt.Slots)
	p := &b.pad
	p.slot = append(append(p.slot[:0], sb.Slot...), fill(n-R, -1)...)
	p.pos = append(append(p.pos[:0], sb.Pos...), fill(n-R, 0)...)
	p.tok = append(append(p.tok[:0], sb.Tok...), fill(n-R, 0)...)
	p.outRow = append(p.outRow[:0], sb.OutRow...)
	for r := R; r < n; r++ {
		p.outRow = append(p.outRow, int32(r))
	}
	p.temps = append(p.temps[:0], sb.OutTemp...)
	for r := R; r < n; r++ {
		p.temps = append(p.temps, 1)
	}
	if err := b.upload(p.slot, p.pos, p.tok, p.outRow, p.temps, sb); err != nil {
		return err
	}
	if b.bf != nil {
		if err := b.bf.Refresh(); err != nil {
			return err
		}
	}
	if g := b.graphs[n]; g != nil {
		if err := g.Launch(); err != nil {
			return err
		}
		if err := b.routesOut(sb, R, n); err != nil {
			return err
		}
		return b.outputs(sb, nOut)
	}
	// The first step of n rows runs its launches one by one (loading
	// whatever kernel and cuBLASLt algorithm is still unloaded, which a
	// recording should not do), then records them for the next.
	if err := b.forward(nil, n, n); err != nil {
		return err
	}
	g, err := b.ops.Capture(func() error { return b.forward(nil, n, n) })
	if err != nil {
		return fmt.Errorf("rollout/cuda: recording the decoding step of %d rows: %w", n, err)
	}
	b.graphs[n] = g
	if err := b.routesOut(sb, R, n); err != nil {
		return err
	}
	return b.outputs(sb, nOut)
}

// fill returns n copies of v (in a slice append copies from).
func fill(n int, v int32) []int32 {
	x := make([]int32, n)
	for i := range x {
		x[i] = v
	}
	return x
}

// forward launches a step of R rows (inputs uploaded) through the layers
// and the LM head of its nOut output rows, up to their log-softmax; sb
// receives the routes of MoE layers grouped on the host (nil in a graph:
// those grouped on the device leave them there, for routesOut).
func (b *Backend) forward(sb *rollout.StepBatch, R, nOut int) error {
	c := &b.cfg
	s, o := &b.s, b.ops
	H, V, hd := c.HiddenSize, c.VocabSize, c.HeadDim
	heads, kv := c.NumAttentionHeads, c.NumKeyValueHeads
	qd, kvd := heads*hd, kv*hd
	eps := float32(c.RMSNormEps)
	scale := float32(1 / math.Sqrt(float64(hd)))
	x, next := s.x, s.next
	qraw, kraw, vraw, ldq, ldkv := b.qkvViews(R)
	if err := o.Gather(x, b.param(b.host.Embed), s.tok, R, H); err != nil {
		return err
	}
	ml := 0
	for li := range b.host.Layers {
		l := &b.host.Layers[li]
		if f := b.fused(); f != nil && (l.Router == nil || (b.groupOnDevice && H%2 == 0)) {
			if err := b.layerBF16(f, li, ml, R, x, next); err != nil {
				return fmt.Errorf("rollout/cuda: layer %d: %w", li, err)
			}
			if l.Router != nil {
				ml++
			}
			x, next = next, x
			continue
		}
		steps := []func() error{
			func() error { return o.RMSNorm(s.h1, Buffer{}, x, b.param(l.InputNorm), R, H, eps) },
			func() error {
				return b.linears(s.h1, R, H, H, kc.Product{Y: qraw, W: b.param(l.Q), Out: qd, LdY: ldq},
					kc.Product{Y: kraw, W: b.param(l.K), Out: kvd, LdY: ldkv}, kc.Product{Y: vraw, W: b.param(l.V), Out: kvd, LdY: ldkv})
			},
			func() error {
				return o.NormRope(s.q, Buffer{}, qraw, b.param(l.QNorm), b.cos, b.sin, s.pos, R, heads, hd, ldq, eps)
			},
			func() error {
				return o.NormRope(s.k, Buffer{}, kraw, b.param(l.KNorm), b.cos, b.sin, s.pos, R, kv, hd, ldkv, eps)
			},
			func() error {
				if b.bf16Cache() {
					return o.KVStoreBF16(b.kcache[li], b.vcache[li], s.k, vraw, s.slot, s.pos, R, b.opt.MaxLen, kvd, ldkv)
				}
				return o.KVStore(b.kcache[li], b.vcache[li], s.k, vraw, s.slot, s.pos, R, b.opt.MaxLen, kvd)
			},
			func() error {
				if b.bf16Cache() {
					return o.AttnDecodeBF16Split(false, s.att, s.part, s.q, b.kcache[li], b.vcache[li], s.slot, s.pos, R, b.opt.MaxLen, heads, kv, hd, scale, b.splits(R))
				}
				return o.AttnDecode(s.att, s.q, b.kcache[li], b.vcache[li], s.slot, s.pos, R, b.opt.MaxLen, heads, kv, hd, scale)
			},
			func() error { return b.linear(s.xmid, s.att, b.param(l.O), R, qd, H, H, qd) },
			func() error { return o.Add(s.xmid, x, R*H) },
			func() error { return o.RMSNorm(s.h2, Buffer{}, s.xmid, b.param(l.PostAttnNorm), R, H, eps) },
		}
		for _, st := range steps {
			if err := st(); err != nil {
				return fmt.Errorf("rollout/cuda: layer %d: %w", li, err)
			}
		}
		var err error
		if l.Router != nil && b.groupOnDevice {
			err = b.moeGrouped(ml, l, R, next, false)
			ml++
		} else if l.Router != nil {
			err = b.moe(sb, ml, l, R, next)
			ml++
		} else {
			err = b.mlp(l, R, next)
		}
		if err != nil {
			return fmt.Errorf("rollout/cuda: layer %d: %w", li, err)
		}
		x, next = next, x
	}
	if nOut == 0 {
		return nil
	}
	// The output rows only: gather, final norm, LM head (per-row kernels:
	// the same bits as over all rows). The log-softmax at each row's
	// temperature comes after the step (outputs).
	steps := []func() error{
		func() error { return o.Gather(s.xo, x, s.outRow, nOut, H) },
		func() error {
			if f := b.fused(); f != nil {
				if err := o.RMSNormBF16(s.x16, Buffer{}, s.xo, b.param(b.host.Norm), nOut, H, eps); err != nil {
					return err
				}
				return f.LinearManyBF16(s.x16, nOut, H, kc.Product{Y: s.logits, W: b.param(b.host.LMHead), Out: V, LdY: V})
			}
			if err := o.RMSNorm(s.h1, Buffer{}, s.xo, b.param(b.host.Norm), nOut, H, eps); err != nil {
				return err
			}
			return b.linear(s.logits, s.h1, b.param(b.host.LMHead), nOut, H, V, V, H)
		},
	}
	for _, st := range steps {
		if err := st(); err != nil {
			return fmt.Errorf("rollout/cuda: head: %w", err)
		}
	}
	return nil
}

// outputs takes the output rows' log-softmax from their logits, draws the
// rows the batcher asked the device to draw and copies the rest's
// log-probabilities to the host: all of them in one copy when no row is
// drawn, else row by row. The reduced precisions draw from the logits
// (DrawRowsRaw: two reads of a row, no log-softmax written but the host's
// rows'); exact takes the log-softmax the training engine's kernels take,
// then draws from it.
func (b *Backend) outputs(sb *rollout.StepBatch, nOut int) error {
	V, s := b.cfg.VocabSize, &b.s
	drawn := 0
	for _, u := range sb.Draw {
		if u >= 0 {
			drawn++
		}
	}
	// The uniforms came with the step's inputs (upload).
	d := kc.Draws{Tok: s.drawn, LP: s.drawnLP, TLP: s.drawnTLP, TopTok: s.topTok, TopLP: s.topLP,
		U: s.draw, Temps: s.temps, TopK: s.topK, TopP: s.topP, TopN: s.topN, Scratch: s.drawScratch}
	var err error
	switch {
	case drawn > 0 && b.opt.Precision != rollout.Exact:
		err = b.ops.DrawRowsRaw(d, s.logits, nOut, V)
		if err == nil && drawn < nOut {
			err = b.ops.LogSoftmaxHostRows(s.logits, s.temps, s.draw, nOut, V)
		}
	case drawn > 0:
		if err = b.ops.LogSoftmaxTemps(s.logits, s.temps, nOut, V); err == nil {
			err = b.ops.DrawRows(d, s.logits, nOut, V)
		}
	default:
		if err := b.ops.LogSoftmaxTemps(s.logits, s.temps, nOut, V); err != nil {
			return fmt.Errorf("rollout/cuda: head: %w", err)
		}
		return kc.Download(b.dev, sb.LogProbs[:nOut*V], s.logits)
	}
	if err != nil {
		return fmt.Errorf("rollout/cuda: drawing: %w", err)
	}
	// Tokens and log-probs in one copy: out is [drawn S][drawnLP S][drawnTLP
	// S], then (only copied if a row asked for them) the top tokens and
	// log-probs, kc.TopMax a row.
	S, tops := b.opt.Slots, false
	for o, u := range sb.Draw {
		tops = tops || (u >= 0 && o < len(sb.TopN) && sb.TopN[o] > 0)
	}
	n := 3 * S
	if tops {
		n = stepOut(S)
	}
	got := slices.Grow(b.stage[:0], n)[:n]
	if err := kc.Download(b.dev, got, s.out); err != nil {
		return err
	}
	for o := range nOut {
		sb.Drawn[o], sb.DrawnLP[o] = int32(got[o]), math.Float32frombits(got[S+o])
		if o < len(sb.DrawnTLP) {
			sb.DrawnTLP[o] = math.Float32frombits(got[2*S+o])
		}
		if !tops || sb.Draw[o] < 0 || o >= len(sb.TopN) {
			continue
		}
		for j := range min(int(sb.TopN[o]), kc.TopMax) {
			at := o*kc.TopMax + j
			sb.Top[o*rollout.MaxTopLogProbs+j] = rollout.TokenLogProb{Token: int32(got[3*S+at]), LogProb: math.Float32frombits(got[3*S+kc.TopMax*S+at])}
		}
	}
	b.stage = got
	for o, u := range sb.Draw[:nOut] {
		if u < 0 {
			if err := kc.Download(b.dev, sb.LogProbs[o*V:(o+1)*V], s.logits.Floats(o*V, V)); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkBatch refuses a step batch that does not fit the backend: a slot or
// position out of range would write another slot's cache on the device,
// where nothing stops it.
func (b *Backend) checkBatch(sb *rollout.StepBatch) error {
	R, outs := sb.Rows(), len(sb.OutRow)
	nMoE := len(b.cfg.MoELayers())
	switch {
	case len(sb.Pos) != R || len(sb.Tok) != R || len(sb.OutTemp) != outs || (len(sb.Draw) != 0 && len(sb.Draw) != outs) ||
		(len(sb.TopK) != 0 && len(sb.TopK) != outs) || (len(sb.TopP) != 0 && len(sb.TopP) != outs) || (len(sb.TopN) != 0 && len(sb.TopN) != outs):
		return errors.New("rollout/cuda: step batch: rows or output rows of different lengths")
	case R > b.opt.StepRows || outs > b.opt.Slots:
		return fmt.Errorf("rollout/cuda: step batch of %d rows and %d output rows, limits %d and %d", R, outs, b.opt.StepRows, b.opt.Slots)
	case len(sb.LogProbs) < outs*b.cfg.VocabSize || len(sb.Routes) != nMoE || (len(sb.Draw) != 0 && (len(sb.Drawn) < outs || len(sb.DrawnLP) < outs)):
		return errors.New("rollout/cuda: step batch: log-probs or routes not allocated for the model")
	}
	for o, n := range sb.TopN {
		if n < 0 || n > kc.TopMax || (n > 0 && len(sb.Top) < (o+1)*rollout.MaxTopLogProbs) {
			return fmt.Errorf("rollout/cuda: output row %d: %d top log-probabilities (at most %d, room for %d)", o, n, kc.TopMax, len(sb.Top)/rollout.MaxTopLogProbs)
		}
	}
	for _, r := range sb.Routes {
		if len(r) < R*b.cfg.NumExpertsPerTok {
			return errors.New("rollout/cuda: step batch: routes not allocated for its rows")
		}
	}
	for r := 0; r < R; r++ {
		if s, p, t := sb.Slot[r], sb.Pos[r], sb.Tok[r]; s < 0 || int(s) >= b.opt.Slots || p < 0 || int(p) >= b.opt.MaxLen || t < 0 || int(t) >= b.cfg.VocabSize {
			return fmt.Errorf("rollout/cuda: step row %d: slot %d, position %d, token %d out of range", r, s, p, t)
		}
	}
	for _, o := range sb.OutRow {
		if o < 0 || int(o) >= R {
			return fmt.Errorf("rollout/cuda: output row %d of %d rows", o, R)
		}
	}
	return nil
}

// fused returns the bf16 precision's products, whose step runs fused
// (layerBF16); nil in the other precisions.
func (b *Backend) fused() *kc.BF16Linear {
	f, _ := b.bf.(*kc.BF16Linear)
	return f
}

// layerBF16 is a layer of the bf16 step with its roundings fused: each
// kernel that feeds products writes their bf16 operand itself (the norms,
// the attention, SwiGLU), and the residual adds ride in the output and
// down projections' epilogues, q and k's norm and RoPE and the cache
// writes share one launch. The numbers are the plain step's (the same
// roundings), a dense layer in 12 launches instead of 20. An MoE layer
// (the ml-th, grouped on the device) takes the bf16 h2 the fused norm
// writes.
func (b *Backend) layerBF16(f *kc.BF16Linear, li, ml, R int, x, next Buffer) error {
	c, s, o := &b.cfg, &b.s, b.ops
	l := &b.host.Layers[li]
	H, hd := c.HiddenSize, c.HeadDim
	heads, kv := c.NumAttentionHeads, c.NumKeyValueHeads
	qd, kvd := heads*hd, kv*hd
	eps := float32(c.RMSNormEps)
	scale := float32(1 / math.Sqrt(float64(hd)))
	qraw, kraw, vraw, ld, _ := b.qkvViews(R)
	steps := []func() error{
		func() error { return o.RMSNormBF16(s.x16, Buffer{}, x, b.param(l.InputNorm), R, H, eps) },
		func() error {
			return f.LinearManyBF16(s.x16, R, H, kc.Product{Y: qraw, W: b.param(l.Q), Out: qd, LdY: ld},
				kc.Product{Y: kraw, W: b.param(l.K), Out: kvd, LdY: ld}, kc.Product{Y: vraw, W: b.param(l.V), Out: kvd, LdY: ld})
		},
		func() error {
			return o.NormRopeKVBF16(s.q, b.kcache[li], b.vcache[li], qraw, kraw, vraw, b.param(l.QNorm), b.param(l.KNorm),
				b.cos, b.sin, s.slot, s.pos, R, ld, heads, kv, hd, b.opt.MaxLen, eps)
		},
		func() error {
			return o.AttnDecodeBF16Split(true, s.x16, s.part, s.q, b.kcache[li], b.vcache[li], s.slot, s.pos, R, b.opt.MaxLen, heads, kv, hd, scale, b.splits(R))
		},
		func() error {
			return f.LinearManyBF16(s.x16, R, qd, kc.Product{Y: s.xmid, W: b.param(l.O), Out: H, LdY: H, Add: x})
		},
		func() error { return o.RMSNormBF16(s.x16, Buffer{}, s.xmid, b.param(l.PostAttnNorm), R, H, eps) },
	}
	if l.Router != nil {
		steps = append(steps, func() error { return b.moeGrouped(ml, l, R, next, true) })
	} else {
		steps = append(steps, b.mlpBF16(f, l, R, next)...)
	}
	for _, st := range steps {
		if err := st(); err != nil {
			return err
		}
	}
	return nil
}

// mlpBF16 is the fused dense MLP of layerBF16, from the bf16 h2 in x16.
func (b *Backend) mlpBF16(f *kc.BF16Linear, l *model.Layer, R int, next Buffer) []func() error {
	c, s, o := &b.cfg, &b.s, b.ops
	H, I := c.HiddenSize, c.IntermediateSize
	return []func() error{
		func() error {
			return f.LinearManyBF16(s.x16, R, H, kc.Product{Y: s.gu, W: b.param(l.Gate), Out: I, LdY: 2 * I},
				kc.Product{Y: s.gu.Floats(I, R*2*I-I), W: b.param(l.Up), Out: I, LdY: 2 * I})
		},
		func() error { return o.SwiGLUBF16(s.x16, s.gu, R, I) },
		func() error {
			return f.LinearManyBF16(s.x16, R, I, kc.Product{Y: next, W: b.param(l.Down), Out: H, LdY: H, Add: s.xmid})
		},
	}
}

// mlp runs a dense layer's MLP on the step's h2 into next = xmid + MLP.
func (b *Backend) mlp(l *model.Layer, R int, next Buffer) error {
	c, s, o := &b.cfg, &b.s, b.ops
	H, I := c.HiddenSize, c.IntermediateSize
	steps := []func() error{
		func() error {
			return b.linears(s.h2, R, H, H, kc.Product{Y: s.gu, W: b.param(l.Gate), Out: I, LdY: 2 * I},
				kc.Product{Y: s.gu.Floats(I, R*2*I-I), W: b.param(l.Up), Out: I, LdY: 2 * I})
		},
		func() error { return o.SwiGLU(s.a, s.gu, R, I) },
		func() error { return b.linear(next, s.a, b.param(l.Down), R, I, H, H, I) },
		func() error { return o.Add(next, s.xmid, R*H) },
	}
	for _, st := range steps {
		if err := st(); err != nil {
			return err
		}
	}
	return nil
}

// moe runs the ml-th MoE layer on the step's h2 into next, routing with
// the GPU training engine's kernel (live top-k: the rollout has no
// replay), and writes every row's experts into sb.Routes[ml].
func (b *Backend) moe(sb *rollout.StepBatch, ml int, l *model.Layer, R int, next Buffer) error {
	c, s, o := &b.cfg, &b.s, b.ops
	H, E, k, I := c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	if err := b.linear(s.probs, s.h2, b.param(l.Router), R, H, E, E, H); err != nil {
		return err
	}
	if err := o.Softmax(s.probs, R, E); err != nil {
		return err
	}
	// The experts and gates on the device, with the training engine's
	// kernel; the experts come back as the step's routes and to group the
	// rows by expert.
	if err := o.MoERoute(s.ids, s.gates, s.probs, Buffer{}, R, E, k, c.NormTopKProb); err != nil {
		return err
	}
	ids := sb.Routes[ml][:R*k]
	if err := kc.Download(b.dev, ids, s.ids); err != nil {
		return err
	}
	off, row, tok := model.GroupByExpert(ids, E, k)
	if err := kc.Upload(b.dev, s.row, row); err != nil {
		return err
	}
	if err := kc.Upload(b.dev, s.gtok, tok); err != nil {
		return err
	}
	if err := o.Gather(s.xg, s.h2, s.gtok, R*k, H); err != nil {
		return err
	}
	if f := b.fused(); f != nil {
		// Each input rounded to bf16 once for every expert's products;
		// SwiGLU's bf16 output in ag's room.
		xg16, err := f.Round(0, s.xg, R*k, H, H)
		if err != nil {
			return err
		}
		if err := f.ExpertsBF16(xg16, s.gug, s.ag, s.yg, off, func(x int) kc.ExpertWeights {
			ex := &l.Experts[x]
			return kc.ExpertWeights{Gate: b.param(ex.Gate), Up: b.param(ex.Up), Down: b.param(ex.Down)}
		}, H, I, false); err != nil {
			return err
		}
		return o.MoECombine(next, s.xmid, s.yg, s.gates, s.row, R, k, H)
	}
	if err := model.EachExpert(off, func(x, r0, n int) error {
		ex := &l.Experts[x]
		xg, gu := s.xg.Floats(r0*H, n*H), s.gug.Floats(r0*2*I, n*2*I)
		if err := b.linears(xg, n, H, H, kc.Product{Y: gu, W: b.param(ex.Gate), Out: I, LdY: 2 * I},
			kc.Product{Y: gu.Floats(I, n*2*I-I), W: b.param(ex.Up), Out: I, LdY: 2 * I}); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	if err := o.SwiGLU(s.ag, s.gug, R*k, I); err != nil {
		return err
	}
	if err := model.EachExpert(off, func(x, r0, n int) error {
		if err := b.linear(s.yg.Floats(r0*H, n*H), s.ag.Floats(r0*I, n*I), b.param(l.Experts[x].Down), n, I, H, H, I); err != nil {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	return o.MoECombine(next, s.xmid, s.yg, s.gates, s.row, R, k, H)
}

// Open opens GPU ordinal and puts m on it (New); the backend closes the
// device when it is closed.
func Open(ordinal int, m *model.Model, opt rollout.Options) (*Backend, error) {
	dev, err := kc.Open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("rollout on cuda:%d: %w (keel device shows what keel finds)", ordinal, err)
	}
	b, err := New(dev, m, opt)
	if err != nil {
		dev.Close()
		return nil, err
	}
	b.ownDevice = true
	return b, nil
}

// expertLayout finds each MoE layer's experts in the arena as the grouped
// products read them (model.ExpertLayout).
func (b *Backend) expertLayout() ([]expertWeights, error) {
	c := &b.cfg
	H, I, E := c.HiddenSize, c.MoeIntermediateSize, c.NumExperts
	var out []expertWeights
	for li := range b.host.Layers {
		l := &b.host.Layers[li]
		if l.Router == nil {
			continue
		}
		gate0, down0, stride, err := model.ExpertLayout(b.offs, l, H, I)
		if err != nil {
			return nil, fmt.Errorf("rollout/cuda: layer %d: %w", li, err)
		}
		out = append(out, expertWeights{
			gateUp: b.w.Floats(gate0, (E-1)*stride+2*I*H),
			down:   b.w.Floats(down0, (E-1)*stride+H*I),
			stride: stride,
		})
	}
	return out, nil
}

// moeGrouped runs the ml-th MoE layer on the step's h2 into next without
// the host: the router, the experts and gates (moe_route, the training
// engine's kernel), the rows grouped by expert (moe_group_*), every
// expert's products in one grouped launch (exact: gemm_f32_grouped, the
// training engine's per-expert products bit for bit; bf16: on the tensor
// cores from bf16 rows; fp8 and fp4: QuantLinear.Grouped, the quantised
// values' product there), and the gates' combination. The layer's routes
// stay on the device (s.ids at ml·R·k) until routesOut. in16 says s.x16
// already holds h2 in bf16 (layerBF16's fused norm; H even).
func (b *Backend) moeGrouped(ml int, l *model.Layer, R int, next Buffer, in16 bool) error {
	c, s, o := &b.cfg, &b.s, b.ops
	H, E, k, I := c.HiddenSize, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize
	P, ew := R*k, b.experts[ml]
	ids := s.ids.Floats(ml*P, P)
	f := b.fused()
	router := func() error { return b.linear(s.probs, s.h2, b.param(l.Router), R, H, E, E, H) }
	if f != nil { // h2 rounded once, for the router and the experts
		router = func() error {
			if in16 {
				return f.LinearManyBF16(s.x16, R, H, kc.Product{Y: s.probs, W: b.param(l.Router), Out: E, LdY: E})
			}
			if err := o.ToBF16(s.x16, s.h2, R*H); err != nil {
				return err
			}
			return f.LinearManyBF16(s.x16, R, H, kc.Product{Y: s.probs, W: b.param(l.Router), Out: E, LdY: E})
		}
	}
	steps := []func() error{
		router,
		func() error { return o.Softmax(s.probs, R, E) },
		func() error { return o.MoERoute(ids, s.gates, s.probs, Buffer{}, R, E, k, c.NormTopKProb) },
		func() error { return o.MoEGroup(&s.grp, ids, P, k) },
	}
	if f != nil {
		steps = append(steps,
			func() error {
				if H%2 == 0 { // bf16 rows gathered as pairs, four bytes at a time
					return o.Gather(s.xg16, s.x16, s.grp.Tok, P, H/2)
				}
				if err := o.Gather(s.xg, s.h2, s.grp.Tok, P, H); err != nil {
					return err
				}
				return o.ToBF16(s.xg16, s.xg, P*H)
			},
			func() error { return f.Grouped(&s.grp, P, s.gug, s.xg16, ew.gateUp, 2*I, H, H, 2*I, ew.stride) },
			func() error { return o.SwiGLUBF16(s.xg16, s.gug, P, I) }, // the rows are no longer read
			func() error { return f.Grouped(&s.grp, P, s.yg, s.xg16, ew.down, H, I, I, H, ew.stride) })
	} else {
		// exact: the float32 products; fp8 and fp4: the quantised ones.
		product := func(y, x, w Buffer, N, K int) error {
			return o.GemmGrouped(&s.grp, P, y, x, w, N, K, K, N, ew.stride, false)
		}
		if q, ok := b.bf.(*kc.QuantLinear); ok {
			product = func(y, x, w Buffer, N, K int) error { return q.Grouped(&s.grp, P, y, x, w, N, K, K, N, ew.stride) }
		}
		steps = append(steps,
			func() error { return o.Gather(s.xg, s.h2, s.grp.Tok, P, H) },
			func() error { return product(s.gug, s.xg, ew.gateUp, 2*I, H) },
			func() error { return o.SwiGLU(s.ag, s.gug, P, I) },
			func() error { return product(s.yg, s.ag, ew.down, H, I) })
	}
	steps = append(steps, func() error { return o.MoECombine(next, s.xmid, s.yg, s.gates, s.grp.Row, R, k, H) })
	for _, st := range steps {
		if err := st(); err != nil {
			return err
		}
	}
	return nil
}
