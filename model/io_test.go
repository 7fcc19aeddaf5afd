package model

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/keel-rl/keel/safetensors"
)

// microConfig is a tiny MoE with a dense layer 0, untied head.
func microConfig() Config {
	return Config{
		Architecture: ArchQwen3MoE, VocabSize: 11, HiddenSize: 8, IntermediateSize: 12,
		MoeIntermediateSize: 6, NumHiddenLayers: 2, NumAttentionHeads: 2, NumKeyValueHeads: 1,
		HeadDim: 4, RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositionEmbeddings: 64,
		NumExperts: 3, NumExpertsPerTok: 2, NormTopKProb: true, DecoderSparseStep: 1,
		MlpOnlyLayers: []int{0},
	}
}

func equalModels(t *testing.T, a, b *Model, round func(float32) float32) {
	t.Helper()
	pa, pb := a.Params(), b.Params()
	if len(pa) != len(pb) {
		t.Fatalf("%d vs %d params", len(pa), len(pb))
	}
	for i := range pa {
		if pa[i].Name != pb[i].Name {
			t.Fatalf("param %d: %s vs %s", i, pa[i].Name, pb[i].Name)
		}
		for j, v := range pa[i].Data {
			if w := round(v); pb[i].Data[j] != w {
				t.Fatalf("%s[%d] = %g, want %g", pa[i].Name, j, pb[i].Data[j], w)
			}
		}
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	ident := func(v float32) float32 { return v }
	bf16 := func(v float32) float32 { return safetensors.Float32FromBF16(safetensors.BF16FromFloat32(v)) }
	tiny, _ := Preset("tiny-moe", 50)
	for _, tc := range []struct {
		name  string
		cfg   Config
		opt   SaveOptions
		round func(float32) float32
	}{
		{"micro f32", microConfig(), SaveOptions{DType: "f32"}, ident},
		{"micro bf16", microConfig(), SaveOptions{DType: "bf16"}, bf16},
		{"micro sharded", microConfig(), SaveOptions{DType: "f32", MaxShardBytes: 300}, ident},
		{"tiny-moe tied bf16 sharded", tiny, SaveOptions{DType: "bf16", MaxShardBytes: 100000}, bf16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(tc.cfg)
			Init(m, 7)
			dir := t.TempDir()
			if err := SaveWith(dir, m, tc.opt); err != nil {
				t.Fatal(err)
			}
			got, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			equalModels(t, m, got, tc.round)
			if tc.cfg.TieWordEmbeddings && got.LMHead != got.Embed {
				t.Error("loaded tied model has a separate head")
			}
			_, err = os.Stat(filepath.Join(dir, safetensors.IndexFileName))
			if sharded := err == nil; sharded != (tc.opt.MaxShardBytes > 0) {
				t.Errorf("index present = %v", sharded)
			}
		})
	}
}

// TestSaveSwitchesLayout saves sharded then single-file into one directory:
// the stale layout must be removed so the directory is unambiguous.
func TestSaveSwitchesLayout(t *testing.T) {
	m := New(microConfig())
	Init(m, 1)
	dir := t.TempDir()
	if err := SaveWith(dir, m, SaveOptions{MaxShardBytes: 300}); err != nil {
		t.Fatal(err)
	}
	Init(m, 2)
	if err := Save(dir, m, "f32"); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 2 || names[0] != "config.json" || names[1] != "model.safetensors" {
		t.Errorf("directory holds %v", names)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	equalModels(t, m, got, func(v float32) float32 { return v })
}

// TestLoadHandMade loads a checkpoint whose safetensors bytes are built by
// hand: a one-layer dense model with hidden 2, one head of dim 2, vocab 3,
// intermediate 1, tied embeddings, in F32, BF16 and F16 mixed; it also
// carries lm_head.weight, which a tied model may do.
func TestLoadHandMade(t *testing.T) {
	dir := t.TempDir()
	cfg := `{"architectures":["Qwen3ForCausalLM"],"vocab_size":3,"hidden_size":2,"intermediate_size":1,
	"num_hidden_layers":1,"num_attention_heads":1,"num_key_value_heads":1,"head_dim":2,"tie_word_embeddings":true}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	type tensor struct {
		name  string
		dtype string
		shape string
		vals  []float32 // values exactly representable in the dtype
	}
	ts := []tensor{
		{"model.embed_tokens.weight", "F32", "[3,2]", []float32{1, 2, 3, 4, 5, 6}},
		{"lm_head.weight", "F32", "[3,2]", []float32{9, 9, 9, 9, 9, 9}},
		{"model.layers.0.input_layernorm.weight", "BF16", "[2]", []float32{1, -1.5}},
		{"model.layers.0.self_attn.q_proj.weight", "F16", "[2,2]", []float32{0.5, 0.25, -2, 1024}},
		{"model.layers.0.self_attn.k_proj.weight", "F32", "[2,2]", []float32{1, 0, 0, 1}},
		{"model.layers.0.self_attn.v_proj.weight", "F32", "[2,2]", []float32{2, 0, 0, 2}},
		{"model.layers.0.self_attn.o_proj.weight", "F32", "[2,2]", []float32{3, 0, 0, 3}},
		{"model.layers.0.self_attn.q_norm.weight", "F32", "[2]", []float32{7, 8}},
		{"model.layers.0.self_attn.k_norm.weight", "F32", "[2]", []float32{9, 10}},
		{"model.layers.0.post_attention_layernorm.weight", "F32", "[2]", []float32{11, 12}},
		{"model.layers.0.mlp.gate_proj.weight", "F32", "[1,2]", []float32{13, 14}},
		{"model.layers.0.mlp.up_proj.weight", "F32", "[1,2]", []float32{15, 16}},
		{"model.layers.0.mlp.down_proj.weight", "BF16", "[2,1]", []float32{0.125, -256}},
		{"model.norm.weight", "F32", "[2]", []float32{17, 18}},
	}
	var data []byte
	hdr := "{"
	for i, tt := range ts {
		begin := len(data)
		for _, v := range tt.vals {
			switch tt.dtype {
			case "F32":
				data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
			case "BF16":
				data = binary.LittleEndian.AppendUint16(data, uint16(math.Float32bits(v)>>16))
			case "F16": // the test values are normal halves: rebias the exponent
				b := math.Float32bits(v)
				h := uint16(b>>16)&0x8000 | uint16((b>>23&0xff)-112)<<10 | uint16(b>>13&0x3ff)
				data = binary.LittleEndian.AppendUint16(data, h)
			}
		}
		if i > 0 {
			hdr += ","
		}
		hdr += `"` + tt.name + `":{"dtype":"` + tt.dtype + `","shape":` + tt.shape +
			`,"data_offsets":[` + strconv.Itoa(begin) + `,` + strconv.Itoa(len(data)) + `]}`
	}
	hdr += "}"
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	file = append(append(file, hdr...), data...)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Param{}
	for _, p := range m.Params() {
		byName[p.Name] = p
	}
	for _, tt := range ts {
		if tt.name == "lm_head.weight" {
			continue
		}
		p := byName[tt.name]
		for i, v := range tt.vals {
			if p.Data[i] != v {
				t.Errorf("%s[%d] = %g, want %g", tt.name, i, p.Data[i], v)
			}
		}
	}
	if m.LMHead != m.Embed || m.LMHead.Data[0] != 1 {
		t.Error("tied head is not the embedding")
	}
}

func TestLoadErrors(t *testing.T) {
	cfg := microConfig()
	m := New(cfg)
	Init(m, 3)
	all := func() []safetensors.Tensor {
		var ts []safetensors.Tensor
		for _, p := range m.Params() {
			ts = append(ts, safetensors.Tensor{Name: p.Name, Shape: p.Shape, Data: p.Data})
		}
		return ts
	}
	cases := []struct {
		name string
		edit func([]safetensors.Tensor) []safetensors.Tensor
		want string
	}{
		{"missing", func(ts []safetensors.Tensor) []safetensors.Tensor { return ts[1:] }, `missing tensor "model.embed_tokens.weight"`},
		{"extra", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return append(ts, safetensors.Tensor{Name: "model.layers.9.mlp.gate.weight", Shape: []int{1}, Data: []float32{0}})
		}, `unexpected tensor "model.layers.9.mlp.gate.weight"`},
		{"shape", func(ts []safetensors.Tensor) []safetensors.Tensor {
			ts[0].Shape = []int{ts[0].Shape[1], ts[0].Shape[0]}
			return ts
		}, `"model.embed_tokens.weight" has shape [8 11], want [11 8]`},
	}
	for _, c := range cases {
		dir := t.TempDir()
		if err := cfg.WriteFile(filepath.Join(dir, "config.json"), ""); err != nil {
			t.Fatal(err)
		}
		if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), c.edit(all()), safetensors.F32, nil); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: err = %v, want %q and the path", c.name, err, c.want)
		}
	}
	// A config far larger than the weights fails before allocating.
	dir := t.TempDir()
	huge := cfg
	huge.VocabSize = 1 << 30
	if err := huge.WriteFile(filepath.Join(dir, "config.json"), ""); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), all(), safetensors.F32, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "do not match") {
		t.Errorf("huge config: %v", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("empty dir: %v", err)
	}
	if err := Save(t.TempDir(), m, "f8"); err == nil || !strings.Contains(err.Error(), "f8") {
		t.Errorf("bad dtype: %v", err)
	}
}
