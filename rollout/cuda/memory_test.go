package cuda

import (
	"math"
	"strings"
	"testing"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// Plan by hand for tiny-dense (H 128, I 384, 4 layers, 4 heads and 2 KV
// heads of 32, tied embedding) at vocabulary 100, 4 slots of 16
// positions, 8 step rows.
func TestPlanByHand(t *testing.T) {
	t.Setenv("KEEL_FP8_GEMM", "0") // set below
	cfg, err := model.Preset("tiny-dense", 100)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Plan(&cfg, rollout.Options{Precision: rollout.Exact, Slots: 4, MaxLen: 16, StepRows: 8})
	if err != nil {
		t.Fatal(err)
	}
	// Parameters: embedding 100·128 = 12,800; a layer's q, o 128·128, k, v
	// 64·128, gate, up, down 384·128, norms 128+128+32+32 = 196,928; the
	// final norm 128: 800,640.
	const params = 12800 + 4*196928 + 128
	// Per row (float32): slot, pos, tok 3; x, h1, xmid, h2, next 5·128;
	// qraw, q, att 3·128; kraw, k, v 3·64; gate|up 768, SwiGLU 384.
	const perRow = 3 + 640 + 384 + 192 + 768 + 384
	const rope = 16 * 16 * 2 * 4 // positions × head_dim/2 × cos, sin
	const graphs = 32 << 20      // a dense model's decoding graphs: cuBLASLt's workspace
	if want := int64(params*4 + rope + 8*perRow*4 + graphs); m.Fixed != want {
		t.Errorf("fixed %d bytes, want %d", m.Fixed, want)
	}
	// A slot: K and V of 16 positions × 64 in 4 layers (float32), and its
	// output row: hidden 128, logits 100, out row, temperature, top-k,
	// top log-probs asked, draw (2), top-p (2), token, log-prob,
	// truncated log-prob, 20 top tokens and their log-probs.
	if want := int64(4*2*16*64*4 + (128+100+51)*4); m.PerSlot != want {
		t.Errorf("per slot %d bytes, want %d", m.PerSlot, want)
	}
	if m.Total(3) != m.Fixed+3*m.PerSlot {
		t.Error("Total")
	}
	// bf16: the cache's element halves; the weights' bf16 copy, the
	// products' operand (8 rows × the widest input, 384), cuBLASLt's
	// workspace, the fused step's operand (the same size) and the split
	// decoding attention's sums (8 rows in 16 splits, the most for 2
	// warps a row, × 4 heads × (32 + 2) floats) join the fixed part.
	b, err := Plan(&cfg, rollout.Options{Precision: rollout.BF16, Slots: 4, MaxLen: 16, StepRows: 8})
	if err != nil {
		t.Fatal(err)
	}
	if want := m.Fixed + params*2 + 2*8*384*2 + 32<<20 + 8*16*4*34*4; b.Fixed != want {
		t.Errorf("bf16 fixed %d bytes, want %d", b.Fixed, want)
	}
	// The split draw's scratch per output row (one chunk, one block of
	// 512 at vocabulary 100): sums 2 + 2 floats, maxima, greedy maxima
	// and their indices 3, log-sum-exp 1.
	if want := int64(4*2*16*64*2 + (128+100+51+8)*4); b.PerSlot != want {
		t.Errorf("bf16 per slot %d bytes, want %d", b.PerSlot, want)
	}
	// fp8: bf16's but the fused operand, and a scale per output row of every matrix (a layer's
	// q 128, k and v 64, o 128, gate and up 384, down 128; the head 100)
	// and per step row.
	f, err := Plan(&cfg, rollout.Options{Precision: rollout.FP8, Slots: 4, MaxLen: 16, StepRows: 8})
	if err != nil {
		t.Fatal(err)
	}
	if want := b.Fixed - 8*384*2 + (4*(128+64+64+128+384+384+128)+100+8)*4; f.Fixed != want || f.PerSlot != b.PerSlot {
		t.Errorf("fp8: fixed %d bytes, want %d", f.Fixed, want)
	}
	// KEEL_FP8_GEMM: the float8 products' e4m3 bytes of every matrix they
	// read (the head 100·128; a layer's q, o 128·128, k, v 64·128, gate,
	// up, down 384·128: 196,608), a slab's tail, and their operand (8
	// rows × 384).
	t.Setenv("KEEL_FP8_GEMM", "1")
	f8, err := Plan(&cfg, rollout.Options{Precision: rollout.FP8, Slots: 4, MaxLen: 16, StepRows: 8})
	if err != nil {
		t.Fatal(err)
	}
	if want := f.Fixed + 100*128 + 4*196608 + kc.Float8Slab + 8*384; f8.Fixed != want || f8.PerSlot != f.PerSlot {
		t.Errorf("fp8 with float8 products: fixed %d bytes, want %d", f8.Fixed, want)
	}
	if _, err := Plan(&cfg, rollout.Options{Slots: 4, StepRows: 2}); err == nil {
		t.Error("step rows below slots accepted")
	}
	if kc.TopMax != rollout.MaxTopLogProbs {
		t.Errorf("the kernel reports %d top log-probabilities, the batcher asks up to %d", kc.TopMax, rollout.MaxTopLogProbs)
	}
}

// fitSlots by hand: 10 GiB fixed and 1 GiB a slot, 40 GiB free, 20 kept
// for the trainer, 90% of the rest (18 GiB) for the rollout: 8 slots.
func TestFitSlots(t *testing.T) {
	const gib = 1 << 30
	m := Memory{Fixed: 10 * gib, PerSlot: gib}
	for _, c := range []struct {
		reserve  int64
		fraction float64
		want, n  int
	}{
		{20 * gib, 0.9, 256, 8},
		{20 * gib, 0.9, 4, 4},
		{20 * gib, 0, 256, 8}, // the default fraction
		{20 * gib, 1, 256, 10},
		{0, 0.5, 256, 10},
		{28 * gib, 1, 256, 2},
	} {
		n, err := fitSlots(m, 40*gib, c.reserve, c.fraction, c.want)
		if err != nil || n != c.n {
			t.Errorf("reserve %d GiB, fraction %v, want %d: %d slots (%v), want %d", c.reserve/gib, c.fraction, c.want, n, err, c.n)
		}
	}
	_, err := fitSlots(m, 40*gib, 29*gib, 0.9, 256) // 9.9 GiB: not even the weights
	if err == nil || !strings.Contains(err.Error(), "10.00 GiB") || !strings.Contains(err.Error(), "29.00 GiB set aside for the training engine") || !strings.Contains(err.Error(), "train.micro_batch_tokens") {
		t.Errorf("got %v", err)
	}
	if _, err := fitSlots(m, 40*gib, 60*gib, 0.9, 256); err == nil {
		t.Error("a reserve above what is free accepted")
	}
}

// StepBytes by hand: tiny-dense at vocabulary 100 (800,640 parameters,
// the tied embedding read as the LM head) reads its weights and 4 slots ×
// 4 layers × K and V × 64 × 10 positions; tiny-moe's experts (8 of them,
// 2 a token, 3 × 128 × 128 each in 4 layers) count in the share one token
// touches, 1/4, and all but 0.75^64 of them at 64 tokens.
func TestStepBytesByHand(t *testing.T) {
	dense, _ := model.Preset("tiny-dense", 100)
	got, err := StepBytes(&dense, rollout.Exact, 4, 10)
	if err != nil {
		t.Fatal(err)
	}
	if want := 800640.0*4 + 4*4*2*64*4*10; got != want {
		t.Errorf("dense, exact: %v bytes, want %v", got, want)
	}
	if got, _ := StepBytes(&dense, rollout.BF16, 4, 10); got != 800640.0*2+4*4*2*64*2*10 {
		t.Errorf("dense, bf16: %v bytes", got)
	}
	moe, _ := model.Preset("tiny-moe", 100)
	params, _ := moe.NumParams()
	experts := 8.0 * 3 * 128 * 128 * 4
	for _, c := range []struct {
		slots   int
		touched float64
	}{{1, 0.25}, {64, 1 - math.Pow(0.75, 64)}} {
		got, _ := StepBytes(&moe, rollout.BF16, c.slots, 1)
		want := (float64(params)-experts*(1-c.touched))*2 + float64(c.slots)*4*2*64*2
		if math.Abs(got-want) > 1e-6*want {
			t.Errorf("moe, %d slots: %v bytes, want %v", c.slots, got, want)
		}
	}
}
