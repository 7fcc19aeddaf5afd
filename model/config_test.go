package model

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// qwen3Dense is the config.json of the Qwen3-0.6B release.
const qwen3Dense = `{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}`

// qwen3MoE is the config.json of the Qwen3-30B-A3B release.
const qwen3MoE = `{
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}`

func TestParseReleaseConfigs(t *testing.T) {
	c, err := ParseConfig([]byte(qwen3Dense))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Architecture: ArchQwen3, VocabSize: 151936, HiddenSize: 1024, IntermediateSize: 3072,
		NumHiddenLayers: 28, NumAttentionHeads: 16, NumKeyValueHeads: 8, HeadDim: 128,
		RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositionEmbeddings: 40960, TieWordEmbeddings: true,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Qwen3-0.6B:\n got %+v\nwant %+v", c, want)
	}
	c, err = ParseConfig([]byte(qwen3MoE))
	if err != nil {
		t.Fatal(err)
	}
	want = Config{
		Architecture: ArchQwen3MoE, VocabSize: 151936, HiddenSize: 2048, IntermediateSize: 6144,
		MoeIntermediateSize: 768, NumHiddenLayers: 48, NumAttentionHeads: 32, NumKeyValueHeads: 4,
		HeadDim: 128, RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositionEmbeddings: 40960,
		NumExperts: 128, NumExpertsPerTok: 8, NormTopKProb: true, DecoderSparseStep: 1,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Qwen3-30B-A3B:\n got %+v\nwant %+v", c, want)
	}
	if got := len(c.MoELayers()); got != 48 {
		t.Errorf("MoE layers = %d, want 48", got)
	}
}

// TestDefaults checks transformers' defaults for absent fields.
func TestDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"architectures":["Qwen3MoeForCausalLM"],"hidden_size":256,"num_attention_heads":4,"num_key_value_heads":2}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Architecture: ArchQwen3MoE, VocabSize: 151936, HiddenSize: 256, IntermediateSize: 6144,
		MoeIntermediateSize: 768, NumHiddenLayers: 24, NumAttentionHeads: 4, NumKeyValueHeads: 2,
		HeadDim:    64, // hidden / heads
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 32768,
		NumExperts: 128, NumExpertsPerTok: 8, NormTopKProb: false, DecoderSparseStep: 1,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("MoE defaults:\n got %+v\nwant %+v", c, want)
	}
	c, err = ParseConfig([]byte(`{"model_type":"qwen3","num_key_value_heads":null,"num_attention_heads":8,"hidden_size":512}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Architecture != ArchQwen3 || c.HeadDim != 128 || c.NumKeyValueHeads != 8 || c.NumHiddenLayers != 32 || c.IntermediateSize != 22016 {
		t.Errorf("dense defaults: %+v", c)
	}
	// transformers 5 spelling: rope_parameters and num_local_experts.
	c, err = ParseConfig([]byte(`{"model_type":"qwen3_moe","rope_parameters":{"rope_type":"default","rope_theta":5e5},"num_local_experts":16,"num_experts_per_tok":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 5e5 || c.NumExperts != 16 {
		t.Errorf("transformers 5 fields: theta %g experts %d", c.RopeTheta, c.NumExperts)
	}
	// A dense config ignores MoE fields.
	c, err = ParseConfig([]byte(`{"architectures":["Qwen3ForCausalLM"],"num_experts":8,"mlp_only_layers":[99]}`))
	if err != nil || c.NumExperts != 0 || c.MlpOnlyLayers != nil {
		t.Errorf("dense with MoE fields: %+v, %v", c, err)
	}
}

func TestConfigErrors(t *testing.T) {
	base := `"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"num_hidden_layers":2,"num_experts":4,"num_experts_per_tok":2`
	cases := []struct{ json, field string }{
		{`{"architectures":["LlamaForCausalLM"]}`, "architectures"},
		{`{"model_type":"llama"}`, "model_type"},
		{`{}`, "architectures"},
		{`{"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3_moe"}`, "model_type"},
		{`{` + base + `,"attention_bias":true}`, "attention_bias"},
		{`{` + base + `,"use_sliding_window":true}`, "use_sliding_window"},
		{`{` + base + `,"layer_types":["full_attention","sliding_attention"]}`, "layer_types"},
		{`{` + base + `,"rope_scaling":{"rope_type":"yarn","factor":4}}`, "rope_scaling"},
		{`{` + base + `,"rope_scaling":{"factor":4}}`, "rope_scaling"},
		{`{` + base + `,"rope_parameters":{"rope_type":"linear"}}`, "rope_parameters"},
		{`{` + base + `,"hidden_act":"gelu"}`, "hidden_act"},
		{`{` + base + `,"quantization_config":{"quant_method":"fp8"}}`, "quantization_config"},
		{`{` + base + `,"vocab_size":0}`, "vocab_size"},
		{`{` + base + `,"vocab_size":"big"}`, "vocab_size"},
		{`{` + base + `,"hidden_size":-5}`, "hidden_size"},
		{`{` + base + `,"num_key_value_heads":3}`, "num_key_value_heads"},
		{`{` + base + `,"head_dim":15}`, "head_dim"},
		{`{` + base + `,"num_experts_per_tok":5}`, "num_experts_per_tok"},
		{`{` + base + `,"num_experts":0}`, "num_experts"},
		{`{` + base + `,"mlp_only_layers":[2]}`, "mlp_only_layers"},
		{`{` + base + `,"mlp_only_layers":[-1]}`, "mlp_only_layers"},
		{`{` + base + `,"decoder_sparse_step":0}`, "decoder_sparse_step"},
		{`{` + base + `,"moe_intermediate_size":0}`, "moe_intermediate_size"},
		{`{` + base + `,"mlp_only_layers":[0],"intermediate_size":0}`, "intermediate_size"},
		{`{` + base + `,"rms_norm_eps":0}`, "rms_norm_eps"},
		{`{` + base + `,"rope_theta":-1}`, "rope_theta"},
		{`{` + base + `,"num_experts":8,"num_local_experts":4}`, "num_local_experts"},
		{`{` + base + `,"vocab_size":4000000000000}`, "hidden_size"}, // too many parameters
		{`[1,2]`, "JSON object"},
		{`{` + base, "JSON object"},
	}
	dir := t.TempDir()
	for _, c := range cases {
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, []byte(c.json), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadConfig(p)
		if err == nil {
			t.Errorf("%s: no error", c.json)
			continue
		}
		if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %q should name %s and %q", c.json, err, p, c.field)
		}
	}
	// The base itself is fine: the failures above are the edits.
	if _, err := ParseConfig([]byte(`{` + base + `}`)); err != nil {
		t.Errorf("base config: %v", err)
	}
	// Validate on a hand-built config names the field.
	bad := Config{Architecture: ArchQwen3, VocabSize: 10, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 1,
		NumAttentionHeads: 2, NumKeyValueHeads: 1, HeadDim: 4, RMSNormEps: 1e-6, RopeTheta: 1e4, MaxPositionEmbeddings: 0}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "max_position_embeddings") {
		t.Errorf("Validate: %v", err)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	cfgs := []Config{}
	for _, n := range PresetNames() {
		c, err := Preset(n, 1000)
		if err != nil {
			t.Fatal(err)
		}
		cfgs = append(cfgs, c)
	}
	moe, _ := Preset("small-moe", 77)
	moe.MlpOnlyLayers = []int{0, 5}
	moe.DecoderSparseStep = 2
	moe.NormTopKProb = false
	cfgs = append(cfgs, moe)
	for _, c := range cfgs {
		p := filepath.Join(t.TempDir(), "config.json")
		if err := c.WriteFile(p, "bfloat16"); err != nil {
			t.Fatal(err)
		}
		got, err := ReadConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, c)
		}
		b, _ := os.ReadFile(p)
		s := string(b)
		for _, must := range []string{`"hidden_act": "silu"`, `"torch_dtype": "bfloat16"`, `"attention_bias": false`,
			`"rope_scaling": null`, `"use_sliding_window": false`, `"model_type": "qwen3`} {
			if !strings.Contains(s, must) {
				t.Errorf("config.json lacks %s:\n%s", must, s)
			}
		}
		if c.IsMoE() != strings.Contains(s, `"mlp_only_layers": [`) {
			t.Errorf("mlp_only_layers written wrongly for %s:\n%s", c.Architecture, s)
		}
	}
}

func TestPresets(t *testing.T) {
	if got := PresetNames(); !reflect.DeepEqual(got, []string{"qwen3-0.6b", "qwen3-1.7b", "qwen3-30b-a3b", "small-moe", "tiny-dense", "tiny-moe"}) {
		t.Errorf("PresetNames = %v", got)
	}
	if _, err := Preset("huge", 100); err == nil || !strings.Contains(err.Error(), "tiny-dense") {
		t.Errorf("unknown preset: %v", err)
	}
	if _, err := Preset("tiny-dense", 0); err == nil || !strings.Contains(err.Error(), "vocab_size") {
		t.Errorf("vocab 0: %v", err)
	}
	// Parameter counts by hand, vocab 100.
	// tiny-dense: embed 100·128 (tied) + 4 layers × (q 128·128 + k,v 2·64·128 + o 128·128
	// + q/k norms 2·32 + 2 norms 2·128 + MLP 3·384·128) + final norm 128.
	layer := 128*128 + 2*64*128 + 128*128 + 2*32 + 2*128
	wantDense := 100*128 + 4*(layer+3*384*128) + 128
	// tiny-moe: MLP replaced by router 8·128 + 8 experts × 3·128·128.
	wantMoE := 100*128 + 4*(layer+8*128+8*3*128*128) + 128
	// small-moe: hidden 256, 8 heads × 32, 4 KV heads × 32, untied head.
	sLayer := 256*256 + 2*128*256 + 256*256 + 2*32 + 2*256
	wantSmall := 2*100*256 + 8*(sLayer+16*256+16*3*256*256) + 256
	for name, want := range map[string]int{"tiny-dense": wantDense, "tiny-moe": wantMoE, "small-moe": wantSmall} {
		c, err := Preset(name, 100)
		if err != nil {
			t.Fatal(err)
		}
		if got := New(c).NumParams(); got != want {
			t.Errorf("%s: %d parameters, want %d", name, got, want)
		}
		if n, _ := c.paramCount(); n != int64(want) {
			t.Errorf("%s: paramCount %d, want %d", name, n, want)
		}
	}
}

// The release-shaped presets are the releases' config.json (the vocabulary
// aside), and have the releases' parameter counts, computed here by hand
// and through NumParams: no model is allocated (0.6B floats are 2.4 GB).
func TestQwen3Presets(t *testing.T) {
	dense, err := ParseConfig([]byte(qwen3Dense))
	if err != nil {
		t.Fatal(err)
	}
	moe, err := ParseConfig([]byte(qwen3MoE))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]Config{"qwen3-0.6b": dense, "qwen3-30b-a3b": moe} {
		got, err := Preset(name, 151936)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v\nwant the release's %+v", name, got, want)
		}
	}
	// Qwen3-1.7B's config.json differs from 0.6B's only in these two sizes.
	want17 := dense
	want17.HiddenSize, want17.IntermediateSize = 2048, 6144
	if got, _ := Preset("qwen3-1.7b", 151936); !reflect.DeepEqual(got, want17) {
		t.Errorf("qwen3-1.7b:\n got %+v\nwant %+v", got, want17)
	}
	// The small presets keep 4096 positions.
	if c, _ := Preset("tiny-dense", 10); c.MaxPositionEmbeddings != 4096 {
		t.Errorf("tiny-dense max_position_embeddings %d, want 4096", c.MaxPositionEmbeddings)
	}

	// Parameter counts with the Qwen3 vocabulary, by hand.
	// qwen3-0.6b: q 2048·1024, k and v 1024·1024 each, o 1024·2048; q/k
	// norms 2·128, layer norms 2·1024; MLP 3·3072·1024; 28 layers; tied
	// embedding 151936·1024; final norm 1024.
	//   layer = 6,291,456 + 2,304 + 9,437,184 = 15,730,944
	//   total = 28·15,730,944 + 155,582,464 + 1,024 = 596,049,920
	// qwen3-1.7b: q 2048·2048, k and v 1024·2048, o 2048·2048; norms
	// 2·128 + 2·2048; MLP 3·6144·2048; tied embedding 151936·2048.
	//   layer = 12,582,912 + 4,352 + 37,748,736 = 50,336,000
	//   total = 28·50,336,000 + 311,164,928 + 2,048 = 1,720,574,976
	// qwen3-30b-a3b: q 4096·2048, k and v 512·2048, o 2048·4096; norms
	// 2·128 + 2·2048; router 128·2048; 128 experts × 3·768·2048; untied
	// embedding and head 2·151936·2048.
	//   layer = 18,874,368 + 4,352 + 262,144 + 603,979,776 = 623,120,640
	//   total = 48·623,120,640 + 622,329,856 + 2,048 = 30,532,122,624
	for name, want := range map[string]int64{
		"qwen3-0.6b":    596_049_920,
		"qwen3-1.7b":    1_720_574_976,
		"qwen3-30b-a3b": 30_532_122_624,
	} {
		c, err := Preset(name, 151936)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.NumParams(); err != nil || got != want {
			t.Errorf("%s: NumParams %d (%v), want %d", name, got, err, want)
		}
	}
	// Without the vocabulary: 0.6B and 1.7B have 0.44B and 1.41B
	// non-embedding parameters, 30B-A3B 29.9B, as the releases state.
	for name, want := range map[string]int64{
		"qwen3-0.6b":    28*15_730_944 + 1024,
		"qwen3-1.7b":    28*50_336_000 + 2048,
		"qwen3-30b-a3b": 48*623_120_640 + 2048,
	} {
		c, _ := Preset(name, 1)
		n, _ := c.NumParams()
		emb := int64(c.HiddenSize)
		if !c.TieWordEmbeddings {
			emb *= 2
		}
		if n-emb != want {
			t.Errorf("%s: %d non-embedding parameters, want %d", name, n-emb, want)
		}
	}
	// NumParams agrees with an allocated model on the small presets, and
	// reports an invalid config.
	for _, name := range []string{"tiny-dense", "tiny-moe", "small-moe"} {
		c, _ := Preset(name, 37)
		if n, err := c.NumParams(); err != nil || n != int64(New(c).NumParams()) {
			t.Errorf("%s: NumParams %d (%v), New has %d", name, n, err, New(c).NumParams())
		}
	}
	bad, _ := Preset("tiny-dense", 10)
	bad.NumKeyValueHeads = 3
	if _, err := bad.NumParams(); err == nil || !strings.Contains(err.Error(), "num_key_value_heads") {
		t.Errorf("NumParams of an invalid config: %v", err)
	}
}
