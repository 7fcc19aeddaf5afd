// Package memplan says how much GPU memory full-parameter training of a
// model.Config needs on one device, before anything is allocated: the
// weights, their gradients and AdamW state, and the activations of one
// micro-batch, item by item, so that a run that cannot fit fails at once
// with what to change, and a run that can is sized to fit.
//
// The plan is of the CUDA training engine as keel builds it:
//
//   - fp32 master weights, fp32 gradients (accumulated in place by the
//     products, a tied embedding and LM head sharing one), AdamW's m and v
//     in fp32, updated in place (no copy of the weights or gradients).
//   - In bf16 mode the products read bf16 copies of the weights, made once
//     per optimiser step: every parameter but an untied embedding, which is
//     only gathered from (the norm vectors are copied too; they are a few
//     thousand floats). In fp32 mode the products read the masters.
//   - Activations of shape [tokens, ·] are stored in the training precision
//     (bf16: 2 bytes, fp32: 4), the residual stream included; per-row
//     statistics (inverse RMS of every norm, attention's logsumexp), router
//     logits and the MoE routes are fp32 or int32 (4 bytes).
//   - What one Qwen3 decoder layer saves for backward, per token (H hidden,
//     Q = heads·head_dim, K = kv_heads·head_dim):
//     the layer input (H; the input of input_layernorm), that norm's output
//     (H; the input of q/k/v_proj), the q, k, v projections before q_norm
//     and k_norm (Q+2K; the norms' inputs, v as attention reads it), q and
//     k after the norm and RoPE (Q+K; attention's inputs), the attention
//     output (Q; o_proj's input), the residual after attention (H;
//     post_attention_layernorm's input) and that norm's output (H; the
//     MLP's input); in fp32 the inverse RMS of the two layer norms (2) and
//     of q_norm and k_norm per head (heads + kv_heads), and attention's
//     logsumexp per head (heads). Attention is a flash-style kernel: no
//     tokens × tokens matrix is ever stored.
//   - A dense MLP saves its gate and up outputs (2I) and the SwiGLU output
//     (I; down_proj's input). An MoE block saves the router logits (E,
//     fp32; the softmax overwrites them), the routes (top_k expert ids,
//     gate weights, assignment rows and their tokens: 4 int32/fp32 per
//     slot, and the grouping's counts per chunk of 256 slots and expert,
//     twice, and its tile map: E/128 + 1/32 words more), the replayed ids
//     of every MoE layer (one per slot, uploaded at once, so not shared
//     under Recompute), the routed token copies (top_k·H, grouped by expert), per
//     routed copy the experts' gate and up outputs (2·I_moe) and SwiGLU
//     output (I_moe), and the experts' outputs before gating (top_k·H; the
//     gate weights' gradient needs them).
//   - With Recompute (activation checkpointing) only each layer's input is
//     kept; backward recomputes one layer at a time into one shared set of
//     a layer's activations (room for a dense and an MoE block when the
//     model has both kinds).
//   - Beyond the layers: the final norm's input and output (2H) and its
//     inverse RMS; the LM head computes log-probabilities over chunks of
//     at most HeadChunkTokens tokens, holding one chunk's fp32 logits and
//     their gradient (2 · chunk · vocab · 4 bytes).
//   - Backward holds one layer's activation gradients at a time: the
//     residual stream's and the norm output's (2H), the attention output's
//     (Q), the q/k/v projections' (Q+2K), flash attention's per-row dot
//     product (heads, fp32), and the MLP's (3I) or the MoE block's (per
//     routed copy 3·I_moe and 2H, and in fp32 the gate weights' top_k and
//     the router probabilities' E), whichever layer kind is larger.
//   - A cuBLASLt workspace of WorkspaceBytes.
//
// Not counted: the CUDA context and the memory other processes use (the
// free bytes given to Fits are measured after the context exists),
// allocator fragmentation, and vectors of a few bytes per token or per
// position (token ids, positions, log-probabilities, RoPE tables), which
// are well under 0.1% of any plan.
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

// HeadChunkTokens is the most token rows whose logits the LM head holds at
// once.
const HeadChunkTokens = 4096

// WorkspaceBytes is the cuBLASLt workspace the engine allocates.
const WorkspaceBytes = 256 << 20

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
	nh, nkv := int64(cfg.NumAttentionHeads), int64(cfg.NumKeyValueHeads)
	Q, K := c.mul(nh, int64(cfg.HeadDim)), c.mul(nkv, int64(cfg.HeadDim))
	E, k, Im := int64(cfg.NumExperts), int64(cfg.NumExpertsPerTok), int64(cfg.MoeIntermediateSize)
	L := int64(cfg.NumHiddenLayers)
	Lm := int64(len(cfg.MoELayers()))
	Ld := L - Lm

	// Per token, per layer (see the package comment).
	attn := c.add(c.mul(a, c.add(3*H, 3*Q, 3*K)), 4*(2+2*nh+nkv))
	mlp := c.mul(a, 3*I)
	router := c.add(4*E, 16*k, k*E/32, k/8) // logits; id, gate, row, token per slot; the grouping's counts and tiles
	routed := c.mul(a, k, H)
	experts := c.mul(a, k, c.add(3*Im, H))
	// Backward's activation gradients, per token, for one layer.
	gradDense := mlp
	gradMoE := c.add(c.mul(a, k, c.add(3*Im, 2*H)), 4*k, 4*E)

	b := &Budget{Params: P, cfg: *cfg, shape: s, mode: m}
	if cfg.MlpOnlyLayers != nil {
		b.cfg.MlpOnlyLayers = append([]int(nil), cfg.MlpOnlyLayers...)
	}
	add := func(name string, bytes int64, batch bool) {
		if bytes > 0 {
			b.Items = append(b.Items, Item{Name: name, Bytes: bytes, Batch: batch})
		}
	}

	add("master weights (fp32)", c.mul(4, P), false)
	if m.Precision == BF16 {
		copied := P
		if !cfg.TieWordEmbeddings {
			copied -= c.mul(V, H) // the embedding is only gathered from
		}
		add("weight copies (bf16)", c.mul(2, copied), false)
	}
	add("gradients (fp32)", c.mul(4, P), false)
	add("AdamW m and v (fp32)", c.mul(8, P), false)

	add(fmt.Sprintf("layer inputs (%s)", layers(L)), c.mul(L, T, H, a), true)
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
	add(fmt.Sprintf("attention activations (%s)", label(nAttn)), c.mul(nAttn, T, attn), true)
	add(fmt.Sprintf("MLP activations (%s)", label(nDense)), c.mul(nDense, T, mlp), true)
	add(fmt.Sprintf("MoE router logits and routes (%s)", label(nMoE)), c.mul(nMoE, T, router), true)
	add(fmt.Sprintf("MoE replayed routes (%s)", layers(Lm)), c.mul(Lm, T, 4*k), true)
	add(fmt.Sprintf("MoE routed token copies (%s)", label(nMoE)), c.mul(nMoE, T, routed), true)
	add(fmt.Sprintf("MoE expert activations (%s)", label(nMoE)), c.mul(nMoE, T, experts), true)
	add("final norm input and output", c.mul(T, c.add(c.mul(2*a, H), 4)), true)

	chunk := min(T, HeadChunkTokens)
	add(fmt.Sprintf("LM head logits and gradient (%d tokens, fp32)", chunk), c.mul(2*4, chunk, V), true)

	gradMLP := int64(0)
	if Ld > 0 {
		gradMLP = gradDense
	}
	if Lm > 0 {
		gradMLP = max(gradMLP, gradMoE)
	}
	grads := c.add(c.mul(a, c.add(2*H, 2*Q, 2*K)), 4*nh, gradMLP)
	add("activation gradients (1 layer)", c.mul(T, grads), true)
	add("cuBLASLt workspace", WorkspaceBytes, false)

	if c.overflow || b.Total() < 0 {
		return nil, fmt.Errorf("memplan: the plan for %d × %d tokens overflows 63 bits", s.Seqs, s.SeqLen)
	}
	return b, nil
}

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

// Activations returns the sum of the items that depend on the
// micro-batch (Item.Batch): what the engine allocates at each step.
func (b *Budget) Activations() int64 {
	var n int64
	for _, it := range b.Items {
		if it.Batch {
			n += it.Bytes
		}
	}
	return n
}

// Total returns the sum of the items.
func (b *Budget) Total() int64 {
	var t int64
	for _, it := range b.Items {
		t += it.Bytes
	}
	return t
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
// line naming the model, micro-batch and mode, with the total last.
func (b *Budget) String() string {
	w := len("total")
	for _, it := range b.Items {
		w = max(w, len(it.Name))
	}
	var s strings.Builder
	fmt.Fprintf(&s, "memory plan: %s\n", b.describe())
	for _, it := range b.Items {
		fmt.Fprintf(&s, "  %-*s %10.3f GiB\n", w, it.Name, float64(it.Bytes)/(1<<30))
	}
	fmt.Fprintf(&s, "  %-*s %10.3f GiB\n", w, "total", float64(b.Total())/(1<<30))
	return s.String()
}

// gib formats n bytes as GiB with two decimals.
func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }
