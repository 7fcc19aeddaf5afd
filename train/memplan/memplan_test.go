package memplan

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

const ws = 256 << 20 // the cuBLASLt workspace, in every plan

// tinyDense: vocab 10, hidden 8, intermediate 12, 2 layers, 2 heads and 1
// KV head of 4, tied embeddings. Parameters: embedding 10·8 = 80; per
// layer q 8·8 + k 4·8 + v 4·8 + o 8·8 = 192, norms 2·4 + 2·8 = 24, MLP
// 3·12·8 = 288, so 504; final norm 8. Total 80 + 2·504 + 8 = 1096.
func tinyDense() model.Config {
	return model.Config{
		Architecture: model.ArchQwen3, VocabSize: 10, HiddenSize: 8, IntermediateSize: 12,
		NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 4,
		RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositionEmbeddings: 64, TieWordEmbeddings: true,
	}
}

// tinyMoE: the same attention, untied, layer 0 dense (mlp_only_layers)
// and layer 1 an MoE block of 4 experts of 6, top 2. Parameters: embedding
// and head 2·80, final norm 8; layer 0 504; layer 1 192 + 24 + router 4·8
// + experts 4·3·6·8 = 576, so 824. Total 168 + 504 + 824 = 1496.
func tinyMoE() model.Config {
	return model.Config{
		Architecture: model.ArchQwen3MoE, VocabSize: 10, HiddenSize: 8, IntermediateSize: 12,
		NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 4,
		RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositionEmbeddings: 64,
		NumExperts: 4, NumExpertsPerTok: 2, MoeIntermediateSize: 6, DecoderSparseStep: 1,
		MlpOnlyLayers: []int{0},
	}
}

func qwen17(t *testing.T) model.Config {
	t.Helper()
	c, err := model.Preset("qwen3-1.7b", 151936)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustPlan(t *testing.T, c model.Config, s Shape, m Mode) *Budget {
	t.Helper()
	b, err := Plan(&c, s, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkItems(t *testing.T, what string, b *Budget, want []Item) {
	t.Helper()
	if !reflect.DeepEqual(b.Items, want) {
		t.Errorf("%s:\n got %v\nwant %v", what, b.Items, want)
	}
	var sum int64
	for _, it := range want {
		sum += it.Bytes
	}
	if b.Total() != sum {
		t.Errorf("%s: Total %d, want %d", what, b.Total(), sum)
	}
}

// Every item of small plans, by hand.
func TestPlanByHand(t *testing.T) {
	d := tinyDense()
	if n := int64(model.New(d).NumParams()); n != 1096 {
		t.Fatalf("tinyDense has %d parameters, the comment says 1096", n)
	}
	// 2 sequences of 3 tokens: T = 6, bf16 (2 bytes).
	// attention per token: 2·(3·8 + 3·8 + 3·4) = 120 bytes, plus fp32
	// 2 inverse RMS + q/k-norm inverse RMS (2+1) + logsumexp 2 = 7 · 4 = 28:
	// 148. MLP per token: 2·3·12 = 72. Gradients per token: 2·(2·8 + 2·8 +
	// 2·4) = 80, flash row dots 2·4 = 8, MLP 72: 160.
	b := mustPlan(t, d, Shape{2, 3}, Mode{Precision: BF16})
	if b.Params != 1096 {
		t.Errorf("Params %d", b.Params)
	}
	checkItems(t, "tiny dense bf16", b, []Item{
		{"master weights (fp32)", 4 * 1096, false},
		{"weight copies (bf16)", 2 * 1096, false},
		{"gradients (fp32)", 4 * 1096, false},
		{"AdamW m and v (fp32)", 8 * 1096, false},
		{"layer inputs (2 layers)", 192, true},                      // 2 layers · 6 · 8 · 2
		{"attention activations (2 layers)", 1776, true},            // 2 · 6 · 148
		{"MLP activations (2 layers)", 864, true},                   // 2 · 6 · 72
		{"final norm input and output", 216, true},                  // 6 · (2·8·2 + 4)
		{"LM head logits and gradient (6 tokens, fp32)", 480, true}, // 2 · 6 · 10 · 4
		{"activation gradients (1 layer)", 960, true},               // 6 · 160
		{"cuBLASLt workspace", ws, false},
	})

	r := mustPlan(t, d, Shape{2, 3}, Mode{Precision: BF16, Recompute: true})
	checkItems(t, "tiny dense bf16 recompute", r, []Item{
		{"master weights (fp32)", 4384, false},
		{"weight copies (bf16)", 2192, false},
		{"gradients (fp32)", 4384, false},
		{"AdamW m and v (fp32)", 8768, false},
		{"layer inputs (2 layers)", 192, true},
		{"attention activations (1 layer, recomputed)", 888, true},
		{"MLP activations (1 layer, recomputed)", 432, true},
		{"final norm input and output", 216, true},
		{"LM head logits and gradient (6 tokens, fp32)", 480, true},
		{"activation gradients (1 layer)", 960, true},
		{"cuBLASLt workspace", ws, false},
	})

	// fp32: no copies, 4-byte activations. Attention per token 4·60 + 28 =
	// 268, MLP 4·36 = 144, gradients 4·40 + 8 + 144 = 312.
	f := mustPlan(t, d, Shape{2, 3}, Mode{Precision: FP32})
	checkItems(t, "tiny dense fp32", f, []Item{
		{"master weights (fp32)", 4384, false},
		{"gradients (fp32)", 4384, false},
		{"AdamW m and v (fp32)", 8768, false},
		{"layer inputs (2 layers)", 384, true},
		{"attention activations (2 layers)", 3216, true},
		{"MLP activations (2 layers)", 1728, true},
		{"final norm input and output", 408, true}, // 6 · (2·8·4 + 4)
		{"LM head logits and gradient (6 tokens, fp32)", 480, true},
		{"activation gradients (1 layer)", 1872, true},
		{"cuBLASLt workspace", ws, false},
	})

	// The head holds at most 4096 rows: 5000 tokens → 2 · 4096 · 10 · 4.
	long := mustPlan(t, d, Shape{2, 2500}, Mode{Precision: BF16})
	if it := long.Items[8]; it.Name != "LM head logits and gradient (4096 tokens, fp32)" || it.Bytes != 327680 {
		t.Errorf("head chunk of 5000 tokens: %+v", it)
	}

	m := tinyMoE()
	if n := int64(model.New(m).NumParams()); n != 1496 {
		t.Fatalf("tinyMoE has %d parameters, the comment says 1496", n)
	}
	// 1 sequence of 5 tokens, bf16. Router per token: 4 logits · 4 + 2
	// slots · 16 + the grouping's 2·4/32 + 2/8 (both 0 here) = 48, and 2
	// slots' replayed ids · 4 = 8 for each MoE layer; routed copies 2·8·2 = 32; experts 2·(3·6 + 8)·2 =
	// 104. Gradients per token: 80 + 8 + max(dense 72, MoE 2·2·(18 + 16) +
	// 2·4 + 4·4 = 160) = 248. The bf16 copies skip the untied embedding:
	// 2·(1496 − 80).
	b = mustPlan(t, m, Shape{1, 5}, Mode{Precision: BF16})
	checkItems(t, "tiny MoE bf16", b, []Item{
		{"master weights (fp32)", 5984, false},
		{"weight copies (bf16)", 2832, false},
		{"gradients (fp32)", 5984, false},
		{"AdamW m and v (fp32)", 11968, false},
		{"layer inputs (2 layers)", 160, true},
		{"attention activations (2 layers)", 1480, true},
		{"MLP activations (1 layer)", 360, true},
		{"MoE router logits and routes (1 layer)", 240, true},
		{"MoE replayed routes (1 layer)", 40, true},
		{"MoE routed token copies (1 layer)", 160, true},
		{"MoE expert activations (1 layer)", 520, true},
		{"final norm input and output", 180, true},
		{"LM head logits and gradient (5 tokens, fp32)", 400, true},
		{"activation gradients (1 layer)", 1240, true},
		{"cuBLASLt workspace", ws, false},
	})
	// Recompute keeps one shared layer with room for both kinds of block
	// (the model has a dense layer and an MoE one): the dense MLP's 360
	// bytes and the MoE block's.
	r = mustPlan(t, m, Shape{1, 5}, Mode{Precision: BF16, Recompute: true})
	checkItems(t, "tiny MoE bf16 recompute", r, []Item{
		{"master weights (fp32)", 5984, false},
		{"weight copies (bf16)", 2832, false},
		{"gradients (fp32)", 5984, false},
		{"AdamW m and v (fp32)", 11968, false},
		{"layer inputs (2 layers)", 160, true},
		{"attention activations (1 layer, recomputed)", 740, true},
		{"MLP activations (1 layer, recomputed)", 360, true},
		{"MoE router logits and routes (1 layer, recomputed)", 240, true},
		{"MoE replayed routes (1 layer)", 40, true},
		{"MoE routed token copies (1 layer, recomputed)", 160, true},
		{"MoE expert activations (1 layer, recomputed)", 520, true},
		{"final norm input and output", 180, true},
		{"LM head logits and gradient (5 tokens, fp32)", 400, true},
		{"activation gradients (1 layer)", 1240, true},
		{"cuBLASLt workspace", ws, false},
	})
}

// More tokens never need less memory, item by item, and the total grows.
func TestPlanMonotonicInTokens(t *testing.T) {
	moe, _ := model.Preset("qwen3-30b-a3b", 151936)
	moe.NumHiddenLayers = 2
	for _, c := range []model.Config{tinyDense(), tinyMoE(), qwen17(t), moe} {
		for _, m := range []Mode{{BF16, false}, {BF16, true}, {FP32, false}} {
			var prev *Budget
			for _, s := range []Shape{{1, 1}, {1, 7}, {2, 7}, {1, 512}, {3, 512}, {4, 1024}, {2, 4096}, {4, 4096}, {5, 4096}} {
				b := mustPlan(t, c, s, m)
				if prev != nil {
					if b.Total() <= prev.Total() {
						t.Errorf("%s %v: %v tokens need %d, fewer tokens %d", c.Architecture, m, s, b.Total(), prev.Total())
					}
					for i, it := range b.Items {
						if it.Bytes < prev.Items[i].Bytes {
							t.Errorf("%s %v %v: %s shrank to %d from %d", c.Architecture, m, s, it.Name, it.Bytes, prev.Items[i].Bytes)
						}
					}
				}
				prev = b
			}
		}
	}
}

func activations(b *Budget) int64 {
	var n int64
	for _, it := range b.Items {
		if it.Batch {
			n += it.Bytes
		}
	}
	return n
}

// Recompute needs strictly less for more than one layer, the same for one,
// and changes nothing that does not depend on the micro-batch.
func TestRecomputeSmaller(t *testing.T) {
	one := tinyDense()
	one.NumHiddenLayers = 1
	moe, _ := model.Preset("qwen3-30b-a3b", 151936)
	moe.NumHiddenLayers = 3
	for _, c := range []model.Config{tinyDense(), tinyMoE(), qwen17(t), moe, one} {
		for _, p := range []string{BF16, FP32} {
			s := Shape{2, 300}
			full := mustPlan(t, c, s, Mode{Precision: p})
			rc := mustPlan(t, c, s, Mode{Precision: p, Recompute: true})
			fa, ra := activations(full), activations(rc)
			if c.NumHiddenLayers > 1 && ra >= fa {
				t.Errorf("%s %d layers %s: recompute activations %d, without %d", c.Architecture, c.NumHiddenLayers, p, ra, fa)
			}
			if c.NumHiddenLayers == 1 && ra != fa {
				t.Errorf("one layer %s: recompute activations %d, without %d", p, ra, fa)
			}
			if full.Total()-fa != rc.Total()-ra {
				t.Errorf("%s %s: the model's own items differ: %d and %d", c.Architecture, p, full.Total()-fa, rc.Total()-ra)
			}
		}
	}
}

// The target: full-parameter training of the Qwen3-1.7B shape at
// 4 × 4096 tokens per micro-batch fits one 80 GB card.
//
// The plan says (bf16, vocab 151936): weights, copies, gradients and AdamW
// take 18 bytes × 1.72B parameters = 28.84 GiB. With recompute the total is
// 37.51 GiB (40.3 GB): layer inputs 1.75 GiB, one recomputed layer 1.03
// GiB, the LM head's 4096-token chunk 4.64 GiB, activation gradients 0.88
// GiB. Without recompute it is 65.43 GiB (70.3 GB): the 28 layers'
// attention and MLP activations take 28.95 GiB, so it fits as well, with
// less room to spare.
func TestQwen3_17BFits80GB(t *testing.T) {
	c := qwen17(t)
	s := Shape{4, 4096}
	rc := mustPlan(t, c, s, Mode{Precision: BF16, Recompute: true})
	if err := rc.Fits(80e9); err != nil {
		t.Errorf("with recompute: %v", err)
	}
	full := mustPlan(t, c, s, Mode{Precision: BF16})
	t.Logf("\n%s\n%s", rc, full)
	if rc.Total() != 40_281_376_768 || full.Total() != 70_252_693_504 {
		t.Errorf("totals %d and %d: the plan changed; update the comment above", rc.Total(), full.Total())
	}
	// 18 bytes a parameter before any activation.
	var fixed int64
	for _, it := range rc.Items {
		if !it.Batch {
			fixed += it.Bytes
		}
	}
	if want := int64(18*1_720_574_976 + ws); fixed != want {
		t.Errorf("model-sized items %d, want %d", fixed, want)
	}
}

func TestFitsError(t *testing.T) {
	c := qwen17(t)
	s := Shape{4, 4096}
	full := mustPlan(t, c, s, Mode{Precision: BF16})
	if err := full.Fits(full.Total()); err != nil {
		t.Errorf("exactly the total: %v", err)
	}
	// 60 GB: too small for 4 × 4096 without recompute. The three biggest
	// items are the MLP activations (28 · 16384 · 36864 bytes = 16.9 GB),
	// the attention activations (28 · 16384 · 30888 = 14.2 GB) and AdamW
	// (8 · 1.72B = 13.8 GB).
	const free = 60e9
	err := full.Fits(free)
	if err == nil {
		t.Fatal("4 × 4096 without recompute fits in 60 GB?")
	}
	n := full.MaxSeqs(free)
	rc := mustPlan(t, c, s, Mode{Precision: BF16, Recompute: true})
	msg := err.Error()
	for _, want := range []string{
		gib(full.Total()), fmt.Sprint(full.Total()), "55.88 GiB (60000000000 bytes) is free",
		"MLP activations (28 layers)", "attention activations (28 layers)", "AdamW m and v (fp32)",
		"turn on recompute (then it needs " + gib(rc.Total()) + ")",
		fmt.Sprintf("use at most %s of 4096 tokens per micro-batch", sequences(n)),
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Fits error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "master weights") {
		t.Errorf("Fits error names a fourth item:\n%s", msg)
	}
	// n is the most sequences that fit.
	if n < 1 || n >= 4 {
		t.Fatalf("MaxSeqs(60 GB) = %d", n)
	}
	if mustPlan(t, c, Shape{n, 4096}, Mode{Precision: BF16}).Fits(free) != nil ||
		mustPlan(t, c, Shape{n + 1, 4096}, Mode{Precision: BF16}).Fits(free) == nil {
		t.Errorf("MaxSeqs(60 GB) = %d is not the largest that fits", n)
	}
	if got := rc.MaxSeqs(80e9); got < 4 {
		t.Errorf("with recompute, MaxSeqs(80 GB) = %d, but 4 fit", got)
	}

	// Nothing fits in 20 GB: the model's own items are 28.8 GiB.
	err = full.Fits(20e9)
	if err == nil || !strings.Contains(err.Error(), "not even one sequence of 4096 tokens fits") ||
		!strings.Contains(err.Error(), "alone take 29.09 GiB") || strings.Contains(err.Error(), "recompute (") {
		t.Errorf("20 GB: %v", err)
	}
	if full.MaxSeqs(20e9) != 0 {
		t.Errorf("MaxSeqs(20 GB) = %d", full.MaxSeqs(20e9))
	}
	// With recompute on, the error does not suggest it; 38 GB holds one
	// sequence (31.2 GB for the model, 5.0 GB for the head's chunk, 1.0 GB
	// for the rest), not two.
	if err := rc.Fits(38e9); err == nil || strings.Contains(err.Error(), "turn on recompute") ||
		!strings.Contains(err.Error(), "use at most 1 sequence of 4096 tokens per micro-batch") {
		t.Errorf("recompute, 38 GB: %v", err)
	}
}

func TestPlanErrors(t *testing.T) {
	d := tinyDense()
	bad := tinyDense()
	bad.NumKeyValueHeads = 3
	for _, tc := range []struct {
		cfg  *model.Config
		s    Shape
		m    Mode
		want string
	}{
		{&d, Shape{0, 4}, Mode{Precision: BF16}, "both must be positive"},
		{&d, Shape{4, 0}, Mode{Precision: BF16}, "both must be positive"},
		{&d, Shape{-1, 4}, Mode{Precision: FP32}, "both must be positive"},
		{&d, Shape{1 << 20, 1 << 20}, Mode{Precision: BF16}, "more than 2147483647 tokens"},
		{&d, Shape{1, 4}, Mode{Precision: "fp16"}, `unknown precision "fp16"`},
		{&d, Shape{1, 4}, Mode{}, `unknown precision ""`},
		{&bad, Shape{1, 4}, Mode{Precision: BF16}, "num_key_value_heads"},
		{nil, Shape{1, 4}, Mode{Precision: BF16}, "no model config"},
	} {
		if _, err := Plan(tc.cfg, tc.s, tc.m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Plan(%v, %+v): %v, want an error with %q", tc.s, tc.m, err, tc.want)
		}
	}
}

func TestString(t *testing.T) {
	b := mustPlan(t, tinyMoE(), Shape{1, 5}, Mode{Precision: BF16, Recompute: true})
	s := b.String()
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != len(b.Items)+2 || !strings.HasPrefix(lines[0], "memory plan: Qwen3MoeForCausalLM (2 layers") ||
		!strings.Contains(lines[0], "1 × 5 tokens, bf16, recompute") {
		t.Fatalf("String:\n%s", s)
	}
	for i, it := range b.Items {
		if !strings.HasPrefix(lines[i+1], "  "+it.Name+" ") {
			t.Errorf("line %d %q, want item %q", i+1, lines[i+1], it.Name)
		}
	}
	// The numbers line up: every row is as long, and ends in GiB.
	for _, l := range lines[1:] {
		if len(l) != len(lines[1]) || !strings.HasSuffix(l, " GiB") {
			t.Errorf("misaligned row %q (want %d characters)", l, len(lines[1]))
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "total") || !strings.Contains(last, fmt.Sprintf("%.3f GiB", float64(b.Total())/(1<<30))) {
		t.Errorf("total row %q", last)
	}
}
