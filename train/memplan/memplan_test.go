package memplan

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

const ws = 32 << 20 // the cuBLASLt workspace, in every bf16 plan

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
	// The sum, but of the Exclusive items (the backward's head scratch
	// and its layer gradients) only the larger.
	var sum, ex int64
	for _, it := range want {
		if it.Exclusive {
			ex = max(ex, it.Bytes)
		} else {
			sum += it.Bytes
		}
	}
	if b.Total() != sum+ex {
		t.Errorf("%s: Total %d, want %d", what, b.Total(), sum+ex)
	}
}

// Every item of small plans, by hand. tinyDense's head size (4) is not
// flash.cu's, so the bf16 mode keeps attention's q, k and output in fp32.
func TestPlanByHand(t *testing.T) {
	d := tinyDense()
	if n := int64(model.New(d).NumParams()); n != 1096 {
		t.Fatalf("tinyDense has %d parameters, the comment says 1096", n)
	}
	// 2 sequences of 3 tokens: T = 6, bf16 (2 bytes), H 8, Q 8, K 4, I 12.
	// Attention per token: h1, h2 2·2·8 = 32; xmid, q_raw, k_raw, v
	// 4·(8+8+4+4) = 96; inverse RMS 2 + q/k-norm's 2+1 + logsumexp 2 = 7 ·
	// 4 = 28; q, attention's output, k in fp32 4·(8+8+4) = 80 and the
	// output's bf16 copy 2·8 = 16: 252. MLP per token: 2·3·12 = 72.
	b := mustPlan(t, d, Shape{2, 3}, Mode{Precision: BF16})
	if b.Params != 1096 {
		t.Errorf("Params %d", b.Params)
	}
	// The backward keeps the loss coefficients and the final norm's
	// gradient, 6·4·(2 + 8) = 240; one layer's gradients, 6 tokens:
	// 4·(2·8 + 2·8 + 2·4 + 2 row dots) = 168 a token, 1008; the norms'
	// partial sums 4·max(⌈6/256⌉·8, ⌈12/256⌉·4) = 32; q's, k's and the
	// residual's bf16 6·2·(8+4+8) = 240; the MLP's 6·(4·12 + 2·24) = 576;
	// the embedding's grouping 4·(3·6+1) = 76: 1932. The gradient operand
	// is v's (head size 4 is not flash.cu's): 6·4·2.
	checkItems(t, "tiny dense bf16", b, []Item{
		{"master weights (fp32)", 4 * 1096, false, false},
		{"weight copies (bf16)", 2 * 1096, false, false},
		{"gradients (fp32)", 4 * 1096, false, false},
		{"AdamW m and v (fp32)", 8 * 1096, false, false},
		{"layer inputs (2 layers, fp32)", 384, true, false},                            // 2 layers · 6 · 8 · 4
		{"attention activations (2 layers)", 3024, true, false},                        // 2 · 6 · 252
		{"MLP activations (2 layers)", 864, true, false},                               // 2 · 6 · 72
		{"final norm input and output", 312, true, false},                              // 6 · (8·4 + 8·2 + 4)
		{"log-probabilities and token vectors", 192, true, false},                      // 6 · 8 · 4
		{"loss coefficients and final norm gradient", 240, true, false},                // 6 · 4 · (2 + 8)
		{"LM head logits (6 tokens, fp32) and their gradient (bf16)", 360, true, true}, // 6·10·4 + 6·10·2
		{"activation gradients (1 layer)", 1932, true, true},
		{"bf16 gradient operand", 48, true, false},
		{"cuBLASLt workspace", ws, false, false},
	})

	// Recompute: one layer's activations, and the recomputed layer's
	// output among the gradients (6·8·4 = 192 more).
	r := mustPlan(t, d, Shape{2, 3}, Mode{Precision: BF16, Recompute: true})
	checkItems(t, "tiny dense bf16 recompute", r, []Item{
		{"master weights (fp32)", 4384, false, false},
		{"weight copies (bf16)", 2192, false, false},
		{"gradients (fp32)", 4384, false, false},
		{"AdamW m and v (fp32)", 8768, false, false},
		{"layer inputs (2 layers, fp32)", 384, true, false},
		{"attention activations (1 layer, recomputed)", 1512, true, false},
		{"MLP activations (1 layer, recomputed)", 432, true, false},
		{"final norm input and output", 312, true, false},
		{"log-probabilities and token vectors", 192, true, false},
		{"loss coefficients and final norm gradient", 240, true, false}, // 6 · 4 · (2 + 8)
		{"LM head logits (6 tokens, fp32) and their gradient (bf16)", 360, true, true},
		{"activation gradients (1 layer)", 2124, true, true},
		{"bf16 gradient operand", 48, true, false},
		{"cuBLASLt workspace", ws, false, false},
	})

	// fp32: no copies, no workspace, 4-byte activations. Attention per
	// token 4·16 + 96 + 28 + 80 = 268, MLP 4·36 = 144, token vectors 7
	// (no log-sum-exp), the head's gradient in place of its logits,
	// gradients 1248 + 32 + 6·(48 + 96) + 76 = 2220.
	f := mustPlan(t, d, Shape{2, 3}, Mode{Precision: FP32})
	checkItems(t, "tiny dense fp32", f, []Item{
		{"master weights (fp32)", 4384, false, false},
		{"gradients (fp32)", 4384, false, false},
		{"AdamW m and v (fp32)", 8768, false, false},
		{"layer inputs (2 layers, fp32)", 384, true, false},
		{"attention activations (2 layers)", 3216, true, false},
		{"MLP activations (2 layers)", 1728, true, false},
		{"final norm input and output", 408, true, false}, // 6 · (2·8·4 + 4)
		{"log-probabilities and token vectors", 168, true, false},
		{"loss coefficients and final norm gradient", 240, true, false}, // 6 · 4 · (2 + 8)
		{"LM head logits and their gradient (6 tokens, fp32)", 240, true, true},
		{"activation gradients (1 layer)", 1980, true, true},
	})

	// The bf16 head holds at most 4096 rows: 5000 tokens → 4096 · 10 · (4
	// + 2). The fp32 head holds max(16, 2^24/vocab) rows, as the CPU
	// engine: 4096 at a vocabulary of 4096, 110 at 151936.
	long := mustPlan(t, d, Shape{2, 2500}, Mode{Precision: BF16})
	if it := long.Items[10]; it.Name != "LM head logits (4096 tokens, fp32) and their gradient (bf16)" || it.Bytes != 245760 {
		t.Errorf("head chunk of 5000 tokens: %+v", it)
	}
	for _, c := range []struct{ vocab, T, want int }{{10, 6, 6}, {10, 5000, 5000}, {4096, 5000, 4096}, {151936, 5000, 110}, {151936, 50, 50}, {1 << 21, 5000, 16}} {
		if got := HeadChunk(FP32, c.vocab, c.T); got != c.want {
			t.Errorf("HeadChunk(fp32, vocab %d, %d tokens) = %d, want %d", c.vocab, c.T, got, c.want)
		}
	}

	m := tinyMoE()
	if n := int64(model.New(m).NumParams()); n != 1496 {
		t.Fatalf("tinyMoE has %d parameters, the comment says 1496", n)
	}
	// 1 sequence of 5 tokens, bf16; R = 5·2 = 10 routed pairs. Router per
	// MoE layer: probabilities 5·4·4 = 80, gates and ids 10·8 = 80, load
	// statistics 8·4 = 32, the grouping 4·(offsets 5 + rows and tokens 20
	// + tiles 2·(⌈10/64⌉ + 4) + counts 2·⌈10/256⌉·4) = 4·43 = 172: 364.
	// Replayed ids 10·4 = 40; routed copies 10·2·8 = 160; experts
	// 10·2·(3·6 + 8) = 520. Gradients: 5·168 = 840, partial sums 32,
	// q's, k's and the residual's bf16 5·40 = 200, the MLP's 5·96 = 480,
	// the MoE block's 10·(2·8 + 4·(8 + 1 + 3·6)) + 5·4·4 + 4·4 = 1336,
	// the grouping 4·16 = 64: 2952. The gradient operand's widest rows
	// are v's and the router's (4): 5·4·2. The bf16 copies cover the
	// whole arena.
	b = mustPlan(t, m, Shape{1, 5}, Mode{Precision: BF16})
	checkItems(t, "tiny MoE bf16", b, []Item{
		{"master weights (fp32)", 5984, false, false},
		{"weight copies (bf16)", 2992, false, false},
		{"gradients (fp32)", 5984, false, false},
		{"AdamW m and v (fp32)", 11968, false, false},
		{"layer inputs (2 layers, fp32)", 320, true, false},
		{"attention activations (2 layers)", 2520, true, false},
		{"MLP activations (1 layer)", 360, true, false},
		{"MoE router probabilities and routes (1 layer)", 364, true, false},
		{"MoE replayed routes (1 layer)", 40, true, false},
		{"MoE routed token copies (1 layer)", 160, true, false},
		{"MoE expert activations (1 layer)", 520, true, false},
		{"final norm input and output", 260, true, false},
		{"log-probabilities and token vectors", 160, true, false},
		{"loss coefficients and final norm gradient", 200, true, false}, // 5 · 4 · (2 + 8)
		{"LM head logits (5 tokens, fp32) and their gradient (bf16)", 300, true, true},
		{"activation gradients (1 layer)", 2952, true, true},
		{"bf16 gradient operand", 40, true, false},
		{"cuBLASLt workspace", ws, false, false},
	})
	// Recompute keeps one shared layer with room for both kinds of block
	// (the model has a dense layer and an MoE one), and 5·8·4 = 160 for
	// the recomputed output.
	r = mustPlan(t, m, Shape{1, 5}, Mode{Precision: BF16, Recompute: true})
	checkItems(t, "tiny MoE bf16 recompute", r, []Item{
		{"master weights (fp32)", 5984, false, false},
		{"weight copies (bf16)", 2992, false, false},
		{"gradients (fp32)", 5984, false, false},
		{"AdamW m and v (fp32)", 11968, false, false},
		{"layer inputs (2 layers, fp32)", 320, true, false},
		{"attention activations (1 layer, recomputed)", 1260, true, false},
		{"MLP activations (1 layer, recomputed)", 360, true, false},
		{"MoE router probabilities and routes (1 layer, recomputed)", 364, true, false},
		{"MoE replayed routes (1 layer)", 40, true, false},
		{"MoE routed token copies (1 layer, recomputed)", 160, true, false},
		{"MoE expert activations (1 layer, recomputed)", 520, true, false},
		{"final norm input and output", 260, true, false},
		{"log-probabilities and token vectors", 160, true, false},
		{"loss coefficients and final norm gradient", 200, true, false}, // 5 · 4 · (2 + 8)
		{"LM head logits (5 tokens, fp32) and their gradient (bf16)", 300, true, true},
		{"activation gradients (1 layer)", 3112, true, true},
		{"bf16 gradient operand", 40, true, false},
		{"cuBLASLt workspace", ws, false, false},
	})

	// A head size flash.cu takes (32): q_raw, k_raw and v in bf16 as their
	// one product writes them, q and k as flash.cu's bf16 copies, all of
	// ⌈T/128⌉·128 rows, and the output in bf16; no copies of flash.cu's
	// own. tinyDense with head_dim 32: Q 64, K 32; T = 6, 128 rows.
	// Attention per layer: 6·(2·16 + 4·8 + 28) + 128·2·128 + 128·2·96 +
	// 6·2·64 = 552 + 32768 + 24576 + 768 = 58664.
	fd := tinyDense()
	fd.HeadDim = 32
	fb := mustPlan(t, fd, Shape{2, 3}, Mode{Precision: BF16})
	if it := fb.Items[5]; it.Name != "attention activations (2 layers)" || it.Bytes != 2*58664 {
		t.Errorf("flash attention activations: %+v, want 2 · 58664", it)
	}
	for _, it := range fb.Items {
		if strings.Contains(it.Name, "flash") {
			t.Errorf("flash: an item %+v: flash.cu reads the engine's own copies", it)
		}
	}
	// Its gradients: 6·4·(2·8 + 64 + 2·32 + 2) = 3504 less v's in bf16
	// 6·2·32 = 384, with attention's output's in bf16 as flash.cu's dO,
	// 128·2·64 = 16384; the partial sums 4·max(⌈6/256⌉·8, ⌈12/256⌉·32) =
	// 128; q's, k's and the residual's bf16 6·2·(64+32+8) = 1248; the MLP's
	// 576; the grouping 76: 21532. No gradient operand is rounded apart
	// (the residual's comes from the norm backward, v's from attention's,
	// both in bf16): the workspace follows.
	if it := fb.Items[11]; it.Name != "activation gradients (1 layer)" || it.Bytes != 21532 {
		t.Errorf("flash gradients: %+v, want 21532", it)
	}
	if it := fb.Items[12]; it.Name != "cuBLASLt workspace" {
		t.Errorf("flash: %+v after the gradients, want the workspace (no gradient operand)", it)
	}
	// Under recompute each layer keeps attention's output (bf16) and
	// log-sum-exp: 6·(2·64 + 4·2) = 816 bytes a layer, out of the
	// recomputed layer's 58664.
	fr := mustPlan(t, fd, Shape{2, 3}, Mode{Precision: BF16, Recompute: true})
	want := map[string]int64{"attention outputs and log-sum-exps (2 layers, kept)": 2 * 816,
		"attention activations (1 layer, recomputed)": 58664 - 816}
	for _, it := range fr.Items {
		if w, ok := want[it.Name]; ok {
			if it.Bytes != w {
				t.Errorf("flash under recompute: %s %d bytes, want %d", it.Name, it.Bytes, w)
			}
			delete(want, it.Name)
		}
	}
	for name := range want {
		t.Errorf("flash under recompute: no item %q", name)
	}
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

// Recompute needs strictly less for more than one layer; for one, exactly
// the recomputed layer's output more (T·H·4 bytes; tinyDense's head size
// is not flash.cu's, so no copies of the forward's are kept); and it
// changes nothing that does not depend on the micro-batch.
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
			fa, ra := full.Activations(), rc.Activations()
			if c.NumHiddenLayers > 1 && ra >= fa {
				t.Errorf("%s %d layers %s: recompute activations %d, without %d", c.Architecture, c.NumHiddenLayers, p, ra, fa)
			}
			if c.NumHiddenLayers == 1 && ra != fa+int64(s.Tokens()*c.HiddenSize*4) {
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
// 38.98 GiB (41.8 GB): layer inputs 3.50 GiB (the fp32 residual stream),
// attention's outputs and log-sum-exps 1.78 GiB (kept, so that the backward
// does not recompute attention), one recomputed layer 1.03 GiB, the LM
// head's 4096-token chunk 3.48 GiB (the layer gradients, 1.64 GiB, come
// after it is freed). Without
// recompute it is 66.86 GiB (71.8 GB): the 28 layers' attention and MLP
// activations take 30.70 GiB, so it fits as well, with 8 GB to spare.
func TestQwen3_17BFits80GB(t *testing.T) {
	c := qwen17(t)
	s := Shape{4, 4096}
	rc := mustPlan(t, c, s, Mode{Precision: BF16, Recompute: true})
	if err := rc.Fits(80e9); err != nil {
		t.Errorf("with recompute: %v", err)
	}
	full := mustPlan(t, c, s, Mode{Precision: BF16})
	t.Logf("\n%s\n%s", rc, full)
	if rc.Total() != 41_849_655_808 || full.Total() != 71_792_660_992 {
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
	// the attention activations (28 · 16384 · 34984 = 16.0 GB) and AdamW
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

	// Nothing fits in 20 GB: the model's own items are 28.9 GiB.
	err = full.Fits(20e9)
	if err == nil || !strings.Contains(err.Error(), "not even one sequence of 4096 tokens fits") ||
		!strings.Contains(err.Error(), "alone take 28.87 GiB") || strings.Contains(err.Error(), "recompute (") {
		t.Errorf("20 GB: %v", err)
	}
	if full.MaxSeqs(20e9) != 0 {
		t.Errorf("MaxSeqs(20 GB) = %d", full.MaxSeqs(20e9))
	}
	// With recompute on, the error does not suggest it; 37 GB holds one
	// sequence (36.6 GB), not two (38.4 GB).
	if err := rc.Fits(37e9); err == nil || strings.Contains(err.Error(), "turn on recompute") ||
		!strings.Contains(err.Error(), "use at most 1 sequence of 4096 tokens per micro-batch") {
		t.Errorf("recompute, 37 GB: %v", err)
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
	if len(lines) != len(b.Items)+3 || !strings.HasPrefix(lines[0], "memory plan: Qwen3MoeForCausalLM (2 layers") ||
		!strings.Contains(lines[0], "1 × 5 tokens, bf16, recompute") {
		t.Fatalf("String:\n%s", s)
	}
	// Each item a row, the Exclusive ones (the head's scratch and the
	// layer gradients) marked.
	marked := 0
	for i, it := range b.Items {
		mark := "    "
		if it.Exclusive {
			mark = "  * "
			marked++
		}
		if !strings.HasPrefix(lines[i+1], mark+it.Name+" ") {
			t.Errorf("line %d %q, want item %q after %q", i+1, lines[i+1], it.Name, mark)
		}
	}
	if marked != 2 || lines[len(lines)-1] != "  * not live at once: the total counts the largest" {
		t.Errorf("%d items marked, last line %q", marked, lines[len(lines)-1])
	}
	// The numbers line up: every row is as long, and ends in GiB.
	rows := lines[1 : len(lines)-1]
	for _, l := range rows {
		if len(l) != len(rows[0]) || !strings.HasSuffix(l, " GiB") {
			t.Errorf("misaligned row %q (want %d characters)", l, len(rows[0]))
		}
	}
	if last := rows[len(rows)-1]; !strings.Contains(last, "total") || !strings.Contains(last, fmt.Sprintf("%.3f GiB", float64(b.Total())/(1<<30))) {
		t.Errorf("total row %q", last)
	}
	// Without Exclusive items, no note.
	plain := &Budget{Items: []Item{{Name: "a", Bytes: 1 << 30}}}
	if strings.Contains(plain.String(), "not live at once") {
		t.Errorf("a note without Exclusive items:\n%s", plain.String())
	}
}
