// Package memplan says how much GPU memory full-parameter training of a
// model.Config needs on one device, before anything is allocated: the
// weights, their gradients and AdamW state, and the activations of one
// micro-batch, item by item, so that a run that cannot fit fails at once
// with what to change, and a run that can is sized to fit.
//
// The plan is of the CUDA training engine as keel builds it, buffer by
// buffer; train/cuda's TestEnginePlan measures the engine's peak on keel's
// CUDA emulator and holds the plan to it: never below, above by no more
// than the MoE layers' replayed routes (counted whether or not a step
// replays) and 0.1%:
//
//   - fp32 master weights, fp32 gradients (accumulated in place by the
//     products, a tied embedding and LM head sharing one), AdamW's m and v
//     in fp32, updated in place (no copy of the weights or gradients).
//   - In bf16 mode the products read a bf16 copy of the whole weight
//     arena, made once per optimiser step, and cuBLASLt has a workspace.
//     In fp32 mode keel's own products read the masters.
//   - The residual stream (each layer's input and the attention block's
//     output, xmid) is fp32 (4 bytes); what a product reads (the norms'
//     outputs, SwiGLU's output, the MoE block's grouped rows) is stored in
//     the training precision (bf16: 2 bytes, fp32: 4), as are the MLP's
//     and the experts' products' outputs; per-row statistics (inverse RMS
//     of every norm, attention's logsumexp), router probabilities and the
//     MoE routes are fp32 or int32.
//   - What one Qwen3 decoder layer saves for backward, per token (H
//     hidden, Q = heads·head_dim, K = kv_heads·head_dim): the layer input
//     (H, fp32), input_layernorm's output (H), the q, k, v projections
//     before q_norm and k_norm (Q+2K), q and k after the norm and RoPE
//     (Q+K), the attention output (Q), xmid (H, fp32) and
//     post_attention_layernorm's output (H); the inverse RMS of the two
//     layer norms (2) and of q_norm and k_norm per head (heads +
//     kv_heads), and attention's logsumexp per head (heads). In bf16 mode
//     at the head sizes flash.cu takes (32, 64, 128) all of these but the
//     layer input, xmid and the statistics are bf16: q and k after the
//     norm are flash.cu's copies, q_raw, k_raw and v one matrix (v
//     flash.cu's copy), rows rounded up to 128; at other head
//     sizes the q, k, v projections, q, k and the output are fp32, with a
//     bf16 copy of the output. In fp32 mode everything is fp32. No tokens
//     × tokens matrix is ever stored.
//   - A dense MLP saves its gate and up outputs (2I) and the SwiGLU output
//     (I). An MoE block saves the router probabilities (E), gate weight and
//     expert id per slot, the grouping by expert (rows, tokens, offsets,
//     tile map, counts per chunk of 256 slots), the replayed ids of every
//     MoE layer (uploaded at once, so not shared under Recompute), the
//     routed token copies (top_k·H), per routed copy the experts' gate and
//     up outputs (2·I_moe) and SwiGLU output (I_moe), and the experts'
//     outputs before gating (top_k·H).
//   - With Recompute (activation checkpointing) only each layer's input is
//     kept, and with flash.cu its attention output (bf16, Q) and
//     log-sum-exp (heads); backward recomputes one layer at a time, but
//     for its attention, into one shared set of a layer's activations
//     (room for a dense and an MoE block when the model has both kinds)
//     and a buffer for its output.
//   - Beyond the layers: the final norm's input and output and its inverse
//     RMS; per token the ids, positions, sequence bounds, targets,
//     log-probabilities, entropies (and in bf16 the logits' log-sum-exp),
//     and with flash.cu the order of its tiles (FlashOrderInts);
//     the LM head computes over chunks of HeadChunk tokens, holding one
//     chunk's fp32 logits (and in bf16 mode their gradient in bf16;
//     fp32 writes it over the logits).
//   - Backward holds the loss coefficients (2) and the final norm's
//     gradient (H) throughout; first the LM head's scratch, then, once it
//     is freed (the two are Exclusive items), one layer's activation
//     gradients at a time: the residual stream's and a norm output's
//     (2H), the attention output's and q's (2Q; the output's in bf16 with
//     flash.cu, rows rounded up to 128: flash.cu's dO), k's and v's (2K;
//     v's in bf16 with flash.cu), attention's row dots (heads), the norms'
//     weight-gradient partial sums, in bf16 mode q's, k's and the
//     residual's gradients as bf16 operands (Q+K+H), a dense MLP's (I
//     fp32, 2I) and an MoE block's (per routed copy H in the training
//     precision, H + 1 + 3·I_moe in fp32, and the router's E per token)
//     when the model has that kind of block, and the token rows the
//     embedding's gradient groups. In bf16 mode the wider of v's (at head
//     sizes flash.cu does not take) and the router's gradient is rounded
//     into a bf16 operand: every other gradient a product reads comes in
//     bf16 from the kernel that computes it.
//
// Not counted: the CUDA context and the memory other processes use (the
// free bytes given to Fits are measured after the context exists),
// allocator fragmentation, the RoPE tables, and the LM head's logits kept
// whole for the backward, which the engine keeps only where they fit
// (train/cuda's headKeeps).
package memplan

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strings"

	"github.com/keel-rl/keel/model"
)

// Training precisions (Mode.Precision).
const (
	BF16 = "bf16" // bf16 products and activations, fp32 master weights and optimiser state
	FP32 = "fp32" // everything in fp32
)

// HeadChunkTokens is the most token rows whose logits the bf16 mode's LM
// head holds at once.
const HeadChunkTokens = 4096

// HeadChunk is the number of the T token rows whose logits the LM head
// holds at once in precision p: in the bf16 mode HeadChunkTokens, enough
// rows for the head's products and row kernels to fill a GPU; in the fp32
// mode as the CPU engine chooses it, from the vocabulary alone
// (max(16, 2^24/vocab): 110 rows at Qwen3's 151936).
func HeadChunk(p string, vocab, T int) int {
	c := HeadChunkTokens
	if p != BF16 {
		c = max(16, (1<<24)/max(vocab, 1))
	}
	return max(1, min(c, T))
}

// WorkspaceBytes is the cuBLASLt workspace the bf16 mode's products use
// (kernels/cuda.BlasWorkspaceBytes; the fp32 mode runs keel's own
// products and has none).
const WorkspaceBytes = 32 << 20

// maxTokens bounds the tokens of a micro-batch (engines index rows with
// int32).
const maxTokens = math.MaxInt32

// Mode is how the model is trained.
type Mode struct {
	Precision string // BF16 or FP32
	// Recompute turns on activation checkpointing: keep only each layer's
	// input and recompute the layer during backward.
	Recompute bool
}

// Shape is one micro-batch: Seqs sequences of SeqLen tokens.
type Shape struct{ Seqs, SeqLen int }

// Tokens returns Seqs·SeqLen.
func (s Shape) Tokens() int { return s.Seqs * s.SeqLen }

// Item is one named part of a Budget.
type Item struct {
	Name  string
	Bytes int64
	// Batch reports whether the item depends on the micro-batch (the
	// activations, their gradients, the head's logits) rather than on the
	// model alone.
	Batch bool
	// Exclusive items are live at different times (the backward's LM
	// head scratch, then its layers' gradients): a Budget counts the
	// largest of them, not their sum.
	Exclusive bool
}

// Budget is the GPU memory a training step needs, item by item.
type Budget struct {
	Items []Item
	// Params is the model's parameter count (a tied head counted once).
	Params int64

	cfg   model.Config
	shape Shape
	mode  Mode
}

// Plan returns what training cfg on one GPU needs for micro-batches of
// shape s in mode m. It checks cfg (model.Config.Validate), s (positive,
// at most 2^31-1 tokens) and m.
func Plan(cfg *model.Config, s Shape, m Mode) (*Budget, error) {
	if cfg == nil {
		return nil, errors.New("memplan: no model config")
	}
	P, err := cfg.NumParams()
	if err != nil {
		return nil, fmt.Errorf("memplan: %w", err)
	}
	var a int64 // bytes of an activation element
	switch m.Precision {
	case BF16:
		a = 2
	case FP32:
		a = 4
	default:
		return nil, fmt.Errorf("memplan: unknown precision %q (want %q or %q)", m.Precision, BF16, FP32)
	}
	if s.Seqs <= 0 || s.SeqLen <= 0 {
		return nil, fmt.Errorf("memplan: micro-batch of %d sequences × %d tokens: both must be positive", s.Seqs, s.SeqLen)
	}
	if hi, lo := bits.Mul64(uint64(s.Seqs), uint64(s.SeqLen)); hi != 0 || lo > maxTokens {
		return nil, fmt.Errorf("memplan: micro-batch of %d sequences × %d tokens: more than %d tokens", s.Seqs, s.SeqLen, maxTokens)
	}

	var c calc
	T := int64(s.Tokens())
	H, I, V := int64(cfg.HiddenSize), int64(cfg.IntermediateSize), int64(cfg.VocabSize)
	nh, nkv, hd := int64(cfg.NumAttentionHeads), int64(cfg.NumKeyValueHeads), int64(cfg.HeadDim)
	Q, K := c.mul(nh, hd), c.mul(nkv, hd)
	E, k, Im := int64(cfg.NumExperts), int64(cfg.NumExpertsPerTok), int64(cfg.MoeIntermediateSize)
	R := c.mul(T, k) // routed (token, slot) pairs
	L := int64(cfg.NumHiddenLayers)
	Lm := int64(len(cfg.MoELayers()))
	Ld := L - Lm
	bf := m.Precision == BF16
	flash := bf && FlashHeadDim(cfg.HeadDim)
	Tp := T // the rows of flash.cu's copies: T rounded up to 128
	if flash {
		Tp = c.mul((T+127)/128, 128)
	}

	// One layer's saved activations (see the package comment).
	attn := c.mul(T, c.add(c.mul(a, 2*H), 4*H, 4*(2+2*nh+nkv))) // the norms' outputs; xmid; statistics
	switch {
	case flash:
		// q_raw, k_raw and v as their one product wrote them (bf16, side
		// by side, padded); q and k after the norm and RoPE as flash.cu's
		// bf16 copies, padded; the output in bf16.
		attn = c.add(attn, c.mul(Tp, 2, c.add(Q, 2*K)), c.mul(Tp, 2, c.add(Q, K)), c.mul(T, 2, Q))
	case bf: // q_raw, k_raw, v; q, k and the output in fp32; the output's bf16 copy
		attn = c.add(attn, c.mul(T, c.add(c.mul(4, c.add(3*Q, 3*K)), 2*Q)))
	default:
		attn = c.add(attn, c.mul(T, 4, c.add(3*Q, 3*K)))
	}
	mlp := c.mul(T, a, 3*I)
	router := c.add(c.mul(T, 4, E), c.mul(R, 8), 8*E, // probabilities; gates and ids; load statistics
		c.mul(4, c.add(E+1, 2*R, 2*(ceilDiv(R, moeTile)+E), c.mul(2, ceilDiv(R, moeChunk), E)))) // the grouping
	routed := c.mul(R, a, H)
	experts := c.mul(R, a, c.add(3*Im, H)) // gate and up, SwiGLU's output, the outputs before gating

	b := &Budget{Params: P, cfg: *cfg, shape: s, mode: m}
	if cfg.MlpOnlyLayers != nil {
		b.cfg.MlpOnlyLayers = append([]int(nil), cfg.MlpOnlyLayers...)
	}
	add := func(name string, bytes int64, batch bool) {
		if bytes > 0 {
			b.Items = append(b.Items, Item{Name: name, Bytes: bytes, Batch: batch})
		}
	}
	exclusive := func(name string, bytes int64) {
		add(name, bytes, true)
		b.Items[len(b.Items)-1].Exclusive = true
	}

	add("master weights (fp32)", c.mul(4, P), false)
	if bf {
		add("weight copies (bf16)", c.mul(2, P), false)
	}
	add("gradients (fp32)", c.mul(4, P), false)
	add("AdamW m and v (fp32)", c.mul(8, P), false)

	add(fmt.Sprintf("layer inputs (%s, fp32)", layers(L)), c.mul(L, T, 4, H), true)
	nAttn, nDense, nMoE := L, Ld, Lm
	if m.Recompute {
		// One shared set of a layer's activations, with room for either
		// kind of block when the model has both.
		nAttn, nDense, nMoE = 1, min(Ld, 1), min(Lm, 1)
	}
	label := func(n int64) string {
		if m.Recompute {
			return "1 layer, recomputed"
		}
		return layers(n)
	}
	if flash && m.Recompute {
		// Attention's output (bf16) and log-sum-exp are each layer's own,
		// kept: the backward recomputes a layer around them, not its
		// attention.
		kept := c.mul(T, c.add(2*Q, 4*nh))
		attn -= kept
		add(fmt.Sprintf("attention outputs and log-sum-exps (%s, kept)", layers(L)), c.mul(L, kept), true)
	}
	add(fmt.Sprintf("attention activations (%s)", label(nAttn)), c.mul(nAttn, attn), true)
	add(fmt.Sprintf("MLP activations (%s)", label(nDense)), c.mul(nDense, mlp), true)
	add(fmt.Sprintf("MoE router probabilities and routes (%s)", label(nMoE)), c.mul(nMoE, router), true)
	add(fmt.Sprintf("MoE replayed routes (%s)", layers(Lm)), c.mul(Lm, R, 4), true)
	add(fmt.Sprintf("MoE routed token copies (%s)", label(nMoE)), c.mul(nMoE, routed), true)
	add(fmt.Sprintf("MoE expert activations (%s)", label(nMoE)), c.mul(nMoE, experts), true)
	add("final norm input and output", c.mul(T, c.add(4*H, c.mul(a, H), 4)), true)
	tokVecs := int64(7) // token ids, positions, sequence starts and ends, targets; log-probs, entropies
	if bf {
		tokVecs++ // the head's log-sum-exp per row
	}
	vecs := c.mul(T, 4, tokVecs)
	if flash {
		vecs = c.add(vecs, c.mul(4, FlashOrderInts(T)))
	}
	add("log-probabilities and token vectors", vecs, true)

	// The backward keeps the loss's coefficients and the final norm's
	// gradient throughout; first the LM head's scratch is live, then, once
	// it is freed, one layer's gradients at a time.
	add("loss coefficients and final norm gradient", c.mul(T, 4, c.add(2, H)), true)
	chunk := int64(HeadChunk(m.Precision, cfg.VocabSize, int(T)))
	head, headName := c.mul(chunk, V, 4), fmt.Sprintf("LM head logits and their gradient (%d tokens, fp32)", chunk)
	if bf {
		head = c.add(head, c.mul(4, (c.mul(chunk, V)+1)/2))
		headName = fmt.Sprintf("LM head logits (%d tokens, fp32) and their gradient (bf16)", chunk)
	}
	exclusive(headName, head)
	grads := c.mul(T, 4, c.add(2*H, Q, K, nh)) // the residual's and a norm output's; q's; k's; flash's row dots
	if flash {
		// v's, which flash.cu writes in bf16, and attention's output's,
		// which the o product's backward writes in bf16 as flash.cu's dO,
		// its rows padded as flash.cu's copies are.
		grads = c.add(grads, c.mul(T, 2, K), c.mul(Tp, 2, Q))
	} else {
		grads = c.add(grads, c.mul(T, 4, c.add(K, Q))) // v's, attention's output's
	}
	// The norms' weight-gradient partial sums, for the largest of the
	// layer norms' (T rows of H) and q_norm's (T·heads rows of head_dim):
	// rows.cu writes a chunk of them per 256 rows of at most 256 elements,
	// per 8 rows of longer ones (kernels/cuda.NormChunk).
	normParts := func(rows, n int64) int64 {
		if n <= 256 {
			return c.mul(ceilDiv(rows, 256), n)
		}
		return c.mul(ceilDiv(rows, 8), n)
	}
	grads = c.add(grads, c.mul(4, max(normParts(T, H), normParts(c.mul(T, nh), hd))))
	if bf {
		grads = c.add(grads, c.mul(T, 2, c.add(Q, K, H))) // q's, k's and the residual's in bf16
	}
	if Ld > 0 {
		grads = c.add(grads, c.mul(T, c.add(4*I, c.mul(a, 2*I))))
	}
	if Lm > 0 { // per routed copy dy (bf16 in bf16 mode), dxg, the gate's, the experts' da and dgu; the router's
		grads = c.add(grads, c.mul(R, c.add(c.mul(a, H), c.mul(4, c.add(H, 1, 3*Im)))), c.mul(T, 4, E), 4*E)
	}
	if m.Recompute {
		grads = c.add(grads, c.mul(T, 4, H)) // the recomputed layer's output
	}
	grads = c.add(grads, c.mul(4, c.add(c.mul(3, T), 1))) // the embedding's rows grouped by token
	exclusive("activation gradients (1 layer)", grads)
	if bf {
		// The products' gradient operand (dy) rounded to bf16, for the
		// larger of v's and the router's (the residual's comes in bf16
		// from the norm backward, the experts' from the combination's,
		// and with flash.cu v's from attention's; q's and k's from their
		// norm's backward, at every head size the engine takes, 256 at
		// most).
		var w int64
		if !flash {
			w = K
		}
		if Lm > 0 {
			w = max(w, E) // the router's (the experts' dy comes in bf16)
		}
		add("bf16 gradient operand", c.mul(T, 2, w), true)
	}
	if bf {
		add("cuBLASLt workspace", WorkspaceBytes, false)
	}

	if c.overflow || b.Total() < 0 {
		return nil, fmt.Errorf("memplan: the plan for %d × %d tokens overflows 63 bits", s.Seqs, s.SeqLen)
	}
	return b, nil
}

// FlashOrderInts is the int32s of flash.cu's tiles' order for T tokens,
// as kernels/cuda.FlashOrderLen counts them: a permutation of the 64-row
// query tiles, of the 128-row ones and of the 64-key blocks.
func FlashOrderInts(T int64) int64 { return 2*ceilDiv(T, 64) + ceilDiv(T, 128) }

// FlashHeadDim says whether the bf16 mode runs attention on the tensor
// cores (flash.cu) at head size hd, as kernels/cuda.FlashHeadDim does
// (train/cuda's tests check the two agree).
func FlashHeadDim(hd int) bool { return hd == 32 || hd == 64 || hd == 128 }

// The MoE grouping's row tile and chunk of pairs (kernels/cuda's moeTile
// and moeChunk).
const moeTile, moeChunk = 64, 256

// ceilDiv returns ⌈x/y⌉ for x ≥ 0, y > 0.
func ceilDiv(x, y int64) int64 { return (x + y - 1) / y }

// layers returns "1 layer" or "N layers".
func layers(n int64) string {
	if n == 1 {
		return "1 layer"
	}
	return fmt.Sprintf("%d layers", n)
}

// calc multiplies and adds non-negative int64s, remembering an overflow.
type calc struct{ overflow bool }

func (c *calc) mul(xs ...int64) int64 {
	p := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(p, uint64(x))
		if x < 0 || hi != 0 || lo > math.MaxInt64 {
			c.overflow = true
			return 0
		}
		p = lo
	}
	return int64(p)
}

func (c *calc) add(xs ...int64) int64 {
	var s int64
	for _, x := range xs {
		if x < 0 || s > math.MaxInt64-x {
			c.overflow = true
			return 0
		}
		s += x
	}
	return s
}

// Activations returns the bytes of the items that depend on the
// micro-batch (Item.Batch): what the engine allocates at each step, at
// its peak.
func (b *Budget) Activations() int64 { return b.sum(func(it Item) bool { return it.Batch }) }

// Total returns the bytes of the items: their sum, counting only the
// largest of the Exclusive ones.
func (b *Budget) Total() int64 { return b.sum(func(Item) bool { return true }) }

// sum adds the items keep says to count, the Exclusive ones' largest
// only.
func (b *Budget) sum(keep func(Item) bool) int64 {
	var t, ex int64
	for _, it := range b.Items {
		switch {
		case !keep(it):
		case it.Exclusive:
			ex = max(ex, it.Bytes)
		default:
			t += it.Bytes
		}
	}
	return t + ex
}

// Fits returns nil if the budget fits in free bytes of device memory, and
// otherwise an error naming the total, the free bytes, the three biggest
// items and what would make it fit: Recompute when it is off, and the most
// sequences per micro-batch that fit.
func (b *Budget) Fits(free int64) error {
	total := b.Total()
	if total <= free {
		return nil
	}
	items := append([]Item(nil), b.Items...)
	sort.SliceStable(items, func(i, j int) bool { return items[i].Bytes > items[j].Bytes })
	var big []string
	for _, it := range items[:min(3, len(items))] {
		big = append(big, fmt.Sprintf("%s %s", it.Name, gib(it.Bytes)))
	}
	var w strings.Builder
	fmt.Fprintf(&w, "training needs %s (%d bytes) of GPU memory for %s, but %s (%d bytes) is free; biggest: %s",
		gib(total), total, b.describe(), gib(free), free, strings.Join(big, ", "))

	var fixes []string
	if !b.mode.Recompute {
		rm := b.mode
		rm.Recompute = true
		if r, err := Plan(&b.cfg, b.shape, rm); err == nil {
			if r.Total() <= free {
				fixes = append(fixes, fmt.Sprintf("turn on recompute (then it needs %s)", gib(r.Total())))
			} else if n := r.MaxSeqs(free); n > 0 {
				fixes = append(fixes, fmt.Sprintf("turn on recompute and use at most %s of %d tokens per micro-batch", sequences(n), b.shape.SeqLen))
			}
		}
	}
	if n := b.MaxSeqs(free); n > 0 {
		fixes = append(fixes, fmt.Sprintf("use at most %s of %d tokens per micro-batch", sequences(n), b.shape.SeqLen))
	}
	if len(fixes) > 0 {
		fmt.Fprintf(&w, "; to fit, %s", strings.Join(fixes, ", or "))
	} else {
		var fixed int64
		for _, it := range b.Items {
			if !it.Batch {
				fixed += it.Bytes
			}
		}
		fmt.Fprintf(&w, "; not even one sequence of %d tokens fits (the weights, gradients, optimiser state and workspace alone take %s): use shorter sequences, a smaller model or a bigger GPU",
			b.shape.SeqLen, gib(fixed))
	}
	return errors.New(w.String())
}

// sequences returns "1 sequence" or "N sequences".
func sequences(n int) string {
	if n == 1 {
		return "1 sequence"
	}
	return fmt.Sprintf("%d sequences", n)
}

// MaxSeqs returns the most sequences of the budget's SeqLen per
// micro-batch that fit in free bytes in the budget's mode, or 0 if not
// even one does.
func (b *Budget) MaxSeqs(free int64) int {
	fits := func(n int) bool {
		s := b.shape
		s.Seqs = n
		p, err := Plan(&b.cfg, s, b.mode)
		return err == nil && p.Total() <= free
	}
	if !fits(1) {
		return 0
	}
	// fits(lo) holds and fits(hi) does not (or hi is past the token limit).
	lo, hi := 1, 2
	limit := maxTokens / b.shape.SeqLen
	for hi <= limit && fits(hi) {
		lo, hi = hi, 2*hi
	}
	hi = min(hi, limit+1)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// describe names the model, micro-batch and mode of b.
func (b *Budget) describe() string {
	rc := "no recompute"
	if b.mode.Recompute {
		rc = "recompute"
	}
	return fmt.Sprintf("%s (%d layers, %.2fB parameters) at %d × %d tokens, %s, %s",
		b.cfg.Architecture, b.cfg.NumHiddenLayers, float64(b.Params)/1e9, b.shape.Seqs, b.shape.SeqLen, b.mode.Precision, rc)
}

// String returns the budget as a table in GiB, one item a line, under a
// line naming the model, micro-batch and mode, with the total and a note
// on the Exclusive items (marked *) last.
func (b *Budget) String() string {
	w := len("total")
	for _, it := range b.Items {
		w = max(w, len(it.Name))
	}
	var s strings.Builder
	fmt.Fprintf(&s, "memory plan: %s\n", b.describe())
	ex := false
	for _, it := range b.Items {
		mark := " "
		if it.Exclusive {
			mark, ex = "*", true
		}
		fmt.Fprintf(&s, "  %s %-*s %10.3f GiB\n", mark, w, it.Name, float64(it.Bytes)/(1<<30))
	}
	fmt.Fprintf(&s, "    %-*s %10.3f GiB\n", w, "total", float64(b.Total())/(1<<30))
	if ex {
		s.WriteString("  * not live at once: the total counts the largest\n")
	}
	return s.String()
}

// gib formats n bytes as GiB with two decimals.
func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }
