package cuda

import (
	"fmt"
	"math"
	"os"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// DefaultMemoryFraction is the share of a GPU's free memory (less
// rollout.Options.Reserve) the backend takes when Options.MemoryFraction
// is 0: the rest is the margin for the CUDA libraries' own allocations and
// fragmentation.
const DefaultMemoryFraction = 0.9

// Memory is the device memory the backend takes for a model and options:
// a part that does not depend on the number of slots and a part per slot.
type Memory struct {
	// Fixed: the float32 weights, their bf16 or quantised copy (not in
	// exact), the RoPE tables, a step's scratch for Options.StepRows rows,
	// the reduced-precision products' operands and workspace, and the
	// decoding graphs' workspace (a dense model's, or an MoE model's
	// grouped on the device).
	Fixed int64
	// PerSlot: one slot's keys and values for Options.MaxLen positions in
	// every layer (float32 in exact, bf16 otherwise) and its output row
	// (logits over the vocabulary and the draw).
	PerSlot int64
}

// Total returns the bytes for slots slots.
func (m Memory) Total(slots int) int64 { return m.Fixed + int64(slots)*m.PerSlot }

// Plan returns what New would allocate for a model c with options opt
// (defaults filled as New fills them), before anything is allocated: the
// runner sizes the rollout beside the training engine with it.
func Plan(c *model.Config, opt rollout.Options) (Memory, error) {
	cfg := *c
	if err := cfg.Validate(); err != nil {
		return Memory{}, err
	}
	if err := opt.Fill(&cfg); err != nil {
		return Memory{}, err
	}
	params, err := cfg.NumParams()
	if err != nil {
		return Memory{}, err
	}
	kvd := int64(cfg.NumKeyValueHeads * cfg.HeadDim)
	elem := int64(4) // the cache's element: float32 in exact, else bf16
	var m Memory
	m.Fixed = params * 4
	if opt.Precision != rollout.Exact {
		elem = 2
		// The bf16 (or quantised, stored in bf16's room) weights, and the
		// largest operand a product rounds (a step's rows × the widest
		// input), and cuBLASLt's workspace.
		rows, width := operandShape(&cfg, &opt)
		m.Fixed += params*2 + int64(rows)*int64(width)*2 + kc.BlasWorkspaceBytes
		if opt.Precision == rollout.FP8 || opt.Precision == rollout.FP4 {
			// A scale per output row of every quantised matrix, and one
			// per operand row for the activations.
			m.Fixed += (matrixRows(&cfg) + int64(rows)) * 4
		}
		if opt.Precision == rollout.FP8 && os.Getenv("KEEL_FP8_GEMM") == "1" {
			// cuBLASLt's float8 products (kc.QuantLinear): the e4m3 bytes
			// of the matrices they read, in slabs (the last one's unused
			// tail at most a slab), and of their operand (counted even on
			// a card without them, which keeps neither).
			m.Fixed += float8Elems(&cfg, &opt) + kc.Float8Slab + int64(rows)*int64(width)
		}
	}
	if len(cfg.MoELayers()) == 0 || groupsOnDevice(&cfg, &opt) {
		m.Fixed += kc.BlasWorkspaceBytes // the decoding graphs' cuBLASLt workspace
	}
	m.Fixed += int64(opt.MaxLen) * int64(cfg.HeadDim/2) * 2 * 4 // cos and sin
	var s scratch
	for _, sp := range s.spans(&cfg, &opt) {
		m.Fixed += int64(max(sp.n, 1)) * 4
	}
	// spans counted Slots output rows; move them to the per-slot part: the
	// hidden row and logits, and the words of stepIn's (step row,
	// temperature, top-k, top log-probs asked, the uniform's and top-p's
	// two each) and stepOut's.
	out := int64(cfg.HiddenSize+cfg.VocabSize+8+stepOut(1)) * 4
	if opt.Precision != rollout.Exact {
		out += int64(kc.DrawScratchFloats(1, cfg.VocabSize)) * 4 // the split draw's scratch
	}
	m.Fixed -= int64(opt.Slots) * out
	m.PerSlot = int64(cfg.NumHiddenLayers)*2*int64(opt.MaxLen)*kvd*elem + out
	return m, nil
}

// expertOperand says whether the reduced precisions' operand scratch
// holds the experts' rows (every (token, slot) pair of a step) at once:
// the bf16 products grouped on the host round them together; the fp8 and
// fp4 products quantise them together, grouped on the host or not. (The
// bf16 products grouped on the device take them in bf16 from the step's
// own scratch.)
func expertOperand(c *model.Config, o *rollout.Options) bool {
	if len(c.MoELayers()) == 0 {
		return false
	}
	return o.Precision == rollout.FP8 || o.Precision == rollout.FP4 || (o.Precision == rollout.BF16 && !groupsOnDevice(c, o))
}

// operandShape is the reduced-precision products' operand scratch that New
// reserves (rows × width bf16, and a scale per row): a step's rows × the
// widest input, or, where the experts' rows are rounded or quantised at
// once (expertOperand), every (token, slot) pair's row with at least as
// many elements in all.
func operandShape(c *model.Config, o *rollout.Options) (rows, width int) {
	rows, width = o.StepRows, max(c.HiddenSize, c.NumAttentionHeads*c.HeadDim, c.IntermediateSize, c.MoeIntermediateSize)
	if expertOperand(c, o) {
		pairs := o.StepRows * c.NumExpertsPerTok
		rows, width = pairs, max((rows*width+pairs-1)/pairs, c.HiddenSize, c.MoeIntermediateSize)
	}
	return rows, width
}

// float8Elems counts the elements of the matrices QuantLinear's float8
// products read: every layer's projections and router, the LM head, and
// the experts' where they are not grouped on the device (whose grouped
// products stay emulated).
func float8Elems(c *model.Config, o *rollout.Options) int64 {
	H, qd, kvd := int64(c.HiddenSize), int64(c.NumAttentionHeads*c.HeadDim), int64(c.NumKeyValueHeads*c.HeadDim)
	n := int64(c.VocabSize) * H
	for l := 0; l < c.NumHiddenLayers; l++ {
		n += (2*qd + 2*kvd) * H
		if c.IsMoELayer(l) {
			E := int64(c.NumExperts)
			n += E * H
			if !groupsOnDevice(c, o) {
				n += E * 3 * int64(c.MoeIntermediateSize) * H
			}
		} else {
			n += 3 * int64(c.IntermediateSize) * H
		}
	}
	return n
}

// matrixRows counts the output rows of the matrices the products read:
// every layer's projections, router and experts, and the LM head (an
// untied embedding is only gathered from).
func matrixRows(c *model.Config) int64 {
	H, qd, kvd := int64(c.HiddenSize), int64(c.NumAttentionHeads*c.HeadDim), int64(c.NumKeyValueHeads*c.HeadDim)
	rows := int64(c.VocabSize)
	for l := 0; l < c.NumHiddenLayers; l++ {
		rows += qd + 2*kvd + H
		if c.IsMoELayer(l) {
			E := int64(c.NumExperts)
			rows += E + E*(2*int64(c.MoeIntermediateSize)+H)
		} else {
			rows += 2*int64(c.IntermediateSize) + H
		}
	}
	return rows
}

// fitSlots returns how many of want slots fit in the share fraction of
// free less reserve bytes of device memory, given m: want when all fit,
// fewer when not (a sample does not depend on the number of slots, only
// the speed does), an error naming the figures when not even one does.
func fitSlots(m Memory, free, reserve int64, fraction float64, want int) (int, error) {
	if fraction == 0 {
		fraction = DefaultMemoryFraction
	}
	budget := int64(float64(free-reserve) * fraction)
	if n := (budget - m.Fixed) / max(m.PerSlot, 1); budget > m.Fixed && n >= 1 {
		return int(min(n, int64(want))), nil
	}
	gib := func(b int64) float64 { return float64(b) / (1 << 30) }
	kept, hint := "", "lower the response budget or the prompt length, raise rollout.gpu_memory, or decode on another device (rollout.device)"
	if reserve > 0 {
		kept = fmt.Sprintf(" less %.2f GiB set aside for the training engine and the other rollout engine built after this one", gib(reserve))
		hint = "lower train.micro_batch_tokens or turn on train.recompute (the training engine's share), lower the response budget, or put the engines on different devices (train.device, rollout.device)"
	}
	return 0, fmt.Errorf("rollout/cuda: the weights and a step's buffers need %.2f GiB and one slot's KV cache %.2f GiB, but the rollout may take %.2f GiB (%.0f%% of the %.2f GiB free%s): %s",
		gib(m.Fixed), gib(m.PerSlot), gib(max(budget, 0)), 100*fraction, gib(free), kept, hint)
}

// StepBytes is the device memory one decoding step of slots sequences
// reads, each at context positions: every weight matrix the products read
// (float32 in exact, the bf16 or quantised copy's 2 bytes otherwise; an
// untied embedding is only gathered from, a few rows, and not counted),
// an MoE layer's experts in the share that slots tokens are expected to
// route to at least once (1 - (1 - k/E)^slots each, routes taken as
// uniform), and the keys and values of every slot. Over the step's time
// it is the bandwidth a decode reaches, the roofline of memory-bound
// decoding.
func StepBytes(c *model.Config, p rollout.Precision, slots, context int) (float64, error) {
	params, err := c.NumParams()
	if err != nil {
		return 0, err
	}
	w := float64(params)
	if !c.TieWordEmbeddings {
		w -= float64(c.VocabSize) * float64(c.HiddenSize)
	}
	if moe := len(c.MoELayers()); moe > 0 {
		E, k := float64(c.NumExperts), float64(c.NumExpertsPerTok)
		experts := E * 3 * float64(c.HiddenSize) * float64(c.MoeIntermediateSize) * float64(moe)
		touched := 1 - math.Pow(1-k/E, float64(slots))
		w -= experts * (1 - touched)
	}
	elem := 2.0
	if p == rollout.Exact {
		elem = 4
	}
	kv := float64(slots) * float64(c.NumHiddenLayers) * 2 * float64(c.NumKeyValueHeads*c.HeadDim) * elem * float64(context)
	return w*elem + kv, nil
}
