package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
)

// The Hugging Face architectures keel implements.
const (
	ArchQwen3    = "Qwen3ForCausalLM"
	ArchQwen3MoE = "Qwen3MoeForCausalLM"
)

// modelTypes maps each architecture to its config.json "model_type".
var modelTypes = map[string]string{ArchQwen3: "qwen3", ArchQwen3MoE: "qwen3_moe"}

// maxParams bounds the parameter count Validate accepts (2^40 floats, 4 TiB),
// so that sizes from a corrupt config cannot overflow the arena arithmetic.
const maxParams = 1 << 40

// hfDefaults returns the values transformers' Qwen3Config / Qwen3MoeConfig
// use for fields absent from config.json. The MoE head_dim default,
// hidden/heads, is applied after the other fields are read.
func hfDefaults(arch string) Config {
	if arch == ArchQwen3MoE {
		return Config{
			Architecture: arch, VocabSize: 151936, HiddenSize: 2048, IntermediateSize: 6144,
			NumHiddenLayers: 24, NumAttentionHeads: 32, NumKeyValueHeads: 4,
			RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 32768,
			MoeIntermediateSize: 768, NumExperts: 128, NumExpertsPerTok: 8,
			NormTopKProb: false, DecoderSparseStep: 1,
		}
	}
	return Config{
		Architecture: arch, VocabSize: 151936, HiddenSize: 4096, IntermediateSize: 22016,
		NumHiddenLayers: 32, NumAttentionHeads: 32, NumKeyValueHeads: 32, HeadDim: 128,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 32768,
	}
}

// ReadConfig reads a Hugging Face config.json for Qwen3ForCausalLM or
// Qwen3MoeForCausalLM, fills absent fields with transformers' defaults and
// validates the result. Fields keel does not use are ignored; features it
// does not implement (attention bias, sliding windows, RoPE scaling,
// quantisation) are errors rather than silently wrong models. Every error
// names the file and the field.
func ReadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := parseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig is ReadConfig for config.json bytes already in memory.
func ParseConfig(b []byte) (Config, error) {
	c, err := parseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	return c, nil
}

func parseConfig(b []byte) (Config, error) {
	var f hfFields
	if err := json.Unmarshal(b, &f); err != nil {
		return Config{}, fmt.Errorf("not a JSON object: %v", err)
	}
	if f == nil {
		return Config{}, errors.New("not a JSON object")
	}
	arch, err := f.architecture()
	if err != nil {
		return Config{}, err
	}
	if err := f.unsupported(); err != nil {
		return Config{}, err
	}
	c := hfDefaults(arch)
	thetaInParams, err := f.rope(&c)
	if err != nil {
		return Config{}, err
	}
	if err := f.dense(&c, thetaInParams); err != nil {
		return Config{}, err
	}
	if arch == ArchQwen3MoE {
		if err := f.moe(&c); err != nil {
			return Config{}, err
		}
	}
	if err := c.check(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// hfFields is a config.json object, field by field, so that absent, null
// and mistyped fields can each be told apart and named in errors.
type hfFields map[string]json.RawMessage

// present reports whether field k is there and not null.
func (f hfFields) present(k string) bool {
	v, ok := f[k]
	return ok && !isNull(v)
}

// get decodes field k into dst when present, leaving dst as it is
// otherwise.
func (f hfFields) get(k string, dst any) error {
	if !f.present(k) {
		return nil
	}
	if err := json.Unmarshal(f[k], dst); err != nil {
		return fmt.Errorf("field %q: %s", k, typeError(err, f[k]))
	}
	return nil
}

// intField is an integer field of config.json and where it goes.
type intField struct {
	key string
	dst *int
}

// getInts decodes integer fields in order (the first bad one is named).
func (f hfFields) getInts(fields ...intField) error {
	for _, fd := range fields {
		if err := f.get(fd.key, fd.dst); err != nil {
			return err
		}
	}
	return nil
}

// architecture reads "architectures" and "model_type", which must agree on
// one architecture keel supports.
func (f hfFields) architecture() (string, error) {
	var archs []string
	var modelType string
	if err := f.get("architectures", &archs); err != nil {
		return "", err
	}
	if err := f.get("model_type", &modelType); err != nil {
		return "", err
	}
	switch {
	case len(archs) > 1:
		return "", fmt.Errorf("field \"architectures\": %q lists several architectures; keel loads exactly one", archs)
	case len(archs) == 1:
		arch := archs[0]
		mt, ok := modelTypes[arch]
		if !ok {
			return "", fmt.Errorf("field \"architectures\": unsupported architecture %q (keel supports %s and %s)", arch, ArchQwen3, ArchQwen3MoE)
		}
		if modelType != "" && modelType != mt {
			return "", fmt.Errorf("field \"model_type\": %q does not match architecture %s (want %q)", modelType, arch, mt)
		}
		return arch, nil
	}
	for a, mt := range modelTypes {
		if modelType == mt {
			return a, nil
		}
	}
	if modelType == "" {
		return "", errors.New(`field "architectures": missing (and no "model_type" either)`)
	}
	return "", fmt.Errorf("field \"model_type\": unsupported model type %q (keel supports qwen3 and qwen3_moe)", modelType)
}

// unsupported refuses the features keel does not implement.
func (f hfFields) unsupported() error {
	var actFn string
	if err := f.get("hidden_act", &actFn); err != nil {
		return err
	}
	if actFn != "" && actFn != "silu" {
		return fmt.Errorf("field \"hidden_act\": %q is not supported (only \"silu\")", actFn)
	}
	var flag bool
	if err := f.get("attention_bias", &flag); err != nil {
		return err
	}
	if flag {
		return errors.New(`field "attention_bias": true is not supported (Qwen3 attention has no bias)`)
	}
	flag = false
	if err := f.get("use_sliding_window", &flag); err != nil {
		return err
	}
	if flag {
		return errors.New(`field "use_sliding_window": sliding-window attention is not supported`)
	}
	var layerTypes []string
	if err := f.get("layer_types", &layerTypes); err != nil {
		return err
	}
	for i, t := range layerTypes {
		if t != "full_attention" {
			return fmt.Errorf("field \"layer_types\"[%d]: %q is not supported (only \"full_attention\")", i, t)
		}
	}
	if f.present("quantization_config") {
		return errors.New(`field "quantization_config": quantised checkpoints are not supported; use a float32/bfloat16/float16 checkpoint`)
	}
	return nil
}

// rope refuses RoPE scaling and takes rope_theta from rope_parameters
// (transformers 5) when it is there, reporting whether it was.
func (f hfFields) rope(c *Config) (thetaInParams bool, err error) {
	for _, k := range []string{"rope_scaling", "rope_parameters"} {
		if !f.present(k) {
			continue
		}
		var rp struct {
			RopeType  string   `json:"rope_type"`
			Type      string   `json:"type"` // older spelling of rope_type
			RopeTheta *float64 `json:"rope_theta"`
		}
		if err := f.get(k, &rp); err != nil {
			return false, err
		}
		rt := rp.RopeType
		if rt == "" {
			rt = rp.Type
		}
		if rt != "" && rt != "default" {
			return false, fmt.Errorf("field %q: RoPE scaling type %q is not supported (only plain RoPE)", k, rt)
		}
		if rt == "" && k == "rope_scaling" {
			return false, errors.New(`field "rope_scaling": RoPE scaling is not supported (expected null)`)
		}
		if rp.RopeTheta != nil {
			c.RopeTheta = *rp.RopeTheta
			thetaInParams = true
		}
	}
	return thetaInParams, nil
}

// dense reads the fields every architecture has.
func (f hfFields) dense(c *Config, thetaInParams bool) error {
	if err := f.getInts(
		intField{"vocab_size", &c.VocabSize}, intField{"hidden_size", &c.HiddenSize},
		intField{"intermediate_size", &c.IntermediateSize}, intField{"num_hidden_layers", &c.NumHiddenLayers},
		intField{"num_attention_heads", &c.NumAttentionHeads}, intField{"max_position_embeddings", &c.MaxPositionEmbeddings},
	); err != nil {
		return err
	}
	if err := f.get("rms_norm_eps", &c.RMSNormEps); err != nil {
		return err
	}
	if !thetaInParams { // transformers 5 keeps rope_theta in rope_parameters
		if err := f.get("rope_theta", &c.RopeTheta); err != nil {
			return err
		}
	}
	if err := f.get("tie_word_embeddings", &c.TieWordEmbeddings); err != nil {
		return err
	}
	// num_key_value_heads: absent means the class default, an explicit null
	// means "as many as the attention heads" (transformers' rule).
	if v, ok := f["num_key_value_heads"]; ok && isNull(v) {
		c.NumKeyValueHeads = c.NumAttentionHeads
	} else if err := f.get("num_key_value_heads", &c.NumKeyValueHeads); err != nil {
		return err
	}
	moe := c.Architecture == ArchQwen3MoE
	if moe {
		c.HeadDim = 0
	}
	if err := f.get("head_dim", &c.HeadDim); err != nil {
		return err
	}
	if moe && c.HeadDim == 0 && c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads // Qwen3MoE attention's fallback
	}
	return nil
}

// moe reads the MoE block's fields.
func (f hfFields) moe(c *Config) error {
	if err := f.getInts(
		intField{"moe_intermediate_size", &c.MoeIntermediateSize}, intField{"num_experts_per_tok", &c.NumExpertsPerTok},
		intField{"decoder_sparse_step", &c.DecoderSparseStep},
	); err != nil {
		return err
	}
	// transformers 5 may write the expert count as num_local_experts.
	if f.present("num_experts") {
		if err := f.get("num_experts", &c.NumExperts); err != nil {
			return err
		}
		var alt int
		if err := f.get("num_local_experts", &alt); err != nil {
			return err
		}
		if f.present("num_local_experts") && alt != c.NumExperts {
			return fmt.Errorf("field \"num_local_experts\": %d disagrees with \"num_experts\" %d", alt, c.NumExperts)
		}
	} else if err := f.get("num_local_experts", &c.NumExperts); err != nil {
		return err
	}
	if err := f.get("norm_topk_prob", &c.NormTopKProb); err != nil {
		return err
	}
	if err := f.get("mlp_only_layers", &c.MlpOnlyLayers); err != nil {
		return err
	}
	if len(c.MlpOnlyLayers) == 0 {
		c.MlpOnlyLayers = nil
	}
	return nil
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// typeError turns a json type error into "expected a number, got string".
func typeError(err error, v json.RawMessage) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("expected %s, got %s", kindName(te.Type.Kind().String()), strings.TrimSpace(string(v)))
	}
	return err.Error()
}

func kindName(k string) string {
	switch k {
	case "int", "int64":
		return "an integer"
	case "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "string":
		return "a string"
	case "slice":
		return "a list"
	case "struct", "map":
		return "an object"
	}
	return k
}

// Validate checks that c describes a model keel can build: a supported
// architecture, positive sizes, heads divisible by KV heads, an even
// head_dim (RoPE rotates pairs), a consistent MoE block. Errors name the
// config.json field at fault.
func (c *Config) Validate() error {
	if err := c.check(); err != nil {
		return fmt.Errorf("model config: %w", err)
	}
	return nil
}

func (c *Config) check() error {
	fieldErr := func(field, format string, args ...any) error {
		return fmt.Errorf("field %q: %s", field, fmt.Sprintf(format, args...))
	}
	moe := c.Architecture == ArchQwen3MoE
	if c.Architecture == "" {
		return fieldErr("architectures", "missing: set Config.Architecture to %s or %s", ArchQwen3, ArchQwen3MoE)
	}
	if _, ok := modelTypes[c.Architecture]; !ok {
		return fieldErr("architectures", "unsupported architecture %q (keel supports %s and %s)", c.Architecture, ArchQwen3, ArchQwen3MoE)
	}
	positive := []struct {
		key string
		v   int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"num_hidden_layers", c.NumHiddenLayers},
		{"num_attention_heads", c.NumAttentionHeads}, {"num_key_value_heads", c.NumKeyValueHeads},
		{"head_dim", c.HeadDim}, {"max_position_embeddings", c.MaxPositionEmbeddings},
	}
	for _, p := range positive {
		if p.v <= 0 {
			return fieldErr(p.key, "must be positive, got %d", p.v)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fieldErr("num_key_value_heads", "%d does not divide num_attention_heads %d", c.NumKeyValueHeads, c.NumAttentionHeads)
	}
	if c.HeadDim%2 != 0 {
		return fieldErr("head_dim", "must be even for rotary embeddings, got %d", c.HeadDim)
	}
	if !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		return fieldErr("rms_norm_eps", "must be a positive number, got %g", c.RMSNormEps)
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		return fieldErr("rope_theta", "must be a positive number, got %g", c.RopeTheta)
	}
	if moe {
		switch {
		case c.NumExperts <= 0:
			return fieldErr("num_experts", "must be positive for %s, got %d", ArchQwen3MoE, c.NumExperts)
		case c.NumExpertsPerTok <= 0:
			return fieldErr("num_experts_per_tok", "must be positive, got %d", c.NumExpertsPerTok)
		case c.NumExpertsPerTok > c.NumExperts:
			return fieldErr("num_experts_per_tok", "%d exceeds num_experts %d", c.NumExpertsPerTok, c.NumExperts)
		case c.MoeIntermediateSize <= 0:
			return fieldErr("moe_intermediate_size", "must be positive, got %d", c.MoeIntermediateSize)
		case c.DecoderSparseStep <= 0:
			return fieldErr("decoder_sparse_step", "must be positive, got %d", c.DecoderSparseStep)
		}
		for i, l := range c.MlpOnlyLayers {
			if l < 0 || l >= c.NumHiddenLayers {
				return fieldErr("mlp_only_layers", "entry %d is layer %d, outside [0, %d)", i, l, c.NumHiddenLayers)
			}
		}
	} else {
		if c.NumExperts != 0 || len(c.MlpOnlyLayers) != 0 {
			return fieldErr("num_experts", "%s has no experts; use %s for a MoE model", ArchQwen3, ArchQwen3MoE)
		}
	}
	dense := false
	for i := 0; i < c.NumHiddenLayers && !dense; i++ {
		dense = !c.IsMoELayer(i)
	}
	if dense && c.IntermediateSize <= 0 {
		return fieldErr("intermediate_size", "must be positive, got %d", c.IntermediateSize)
	}
	if _, ok := c.paramCount(); !ok {
		return fieldErr("hidden_size", "the sizes give more than %d parameters", int64(maxParams))
	}
	return nil
}

// paramCount returns the number of scalar parameters New would allocate,
// and false if it overflows or exceeds maxParams. c must have passed the
// positivity checks.
func (c *Config) paramCount() (int64, bool) {
	ok := true
	mul := func(a ...int) uint64 {
		p := uint64(1)
		for _, x := range a {
			hi, lo := bits.Mul64(p, uint64(x))
			if hi != 0 || lo > maxParams {
				ok = false
				return 0
			}
			p = lo
		}
		return p
	}
	h, hd := c.HiddenSize, c.HeadDim
	total := mul(c.VocabSize, h) + uint64(h)
	if !c.TieWordEmbeddings {
		total += mul(c.VocabSize, h)
	}
	perAttn := mul(c.NumAttentionHeads, hd, h)*2 + mul(c.NumKeyValueHeads, hd, h)*2 + uint64(2*hd) + uint64(2*h)
	for i := 0; i < c.NumHiddenLayers && ok; i++ {
		total += perAttn
		if c.IsMoELayer(i) {
			total += mul(c.NumExperts, h) + mul(c.NumExperts, c.MoeIntermediateSize, h, 3)
		} else {
			total += mul(c.IntermediateSize, h, 3)
		}
		if total > maxParams {
			ok = false
		}
	}
	return int64(total), ok && total <= maxParams
}

// hfConfigJSON is the config.json keel writes, keys in the alphabetical
// order transformers itself uses. Pointer fields are MoE-only and omitted
// for dense models.
type hfConfigJSON struct {
	Architectures         []string  `json:"architectures"`
	AttentionBias         bool      `json:"attention_bias"`
	AttentionDropout      float64   `json:"attention_dropout"`
	DecoderSparseStep     *int      `json:"decoder_sparse_step,omitempty"`
	HeadDim               int       `json:"head_dim"`
	HiddenAct             string    `json:"hidden_act"`
	HiddenSize            int       `json:"hidden_size"`
	InitializerRange      float64   `json:"initializer_range"`
	IntermediateSize      int       `json:"intermediate_size"`
	MaxPositionEmbeddings int       `json:"max_position_embeddings"`
	MaxWindowLayers       int       `json:"max_window_layers"`
	MlpOnlyLayers         *[]int    `json:"mlp_only_layers,omitempty"`
	ModelType             string    `json:"model_type"`
	MoeIntermediateSize   *int      `json:"moe_intermediate_size,omitempty"`
	NormTopKProb          *bool     `json:"norm_topk_prob,omitempty"`
	NumAttentionHeads     int       `json:"num_attention_heads"`
	NumExperts            *int      `json:"num_experts,omitempty"`
	NumExpertsPerTok      *int      `json:"num_experts_per_tok,omitempty"`
	NumHiddenLayers       int       `json:"num_hidden_layers"`
	NumKeyValueHeads      int       `json:"num_key_value_heads"`
	OutputRouterLogits    *bool     `json:"output_router_logits,omitempty"`
	RMSNormEps            float64   `json:"rms_norm_eps"`
	RopeScaling           *struct{} `json:"rope_scaling"`
	RopeTheta             float64   `json:"rope_theta"`
	RouterAuxLossCoef     *float64  `json:"router_aux_loss_coef,omitempty"`
	SlidingWindow         *int      `json:"sliding_window"`
	TieWordEmbeddings     bool      `json:"tie_word_embeddings"`
	TorchDType            string    `json:"torch_dtype"`
	UseCache              bool      `json:"use_cache"`
	UseSlidingWindow      bool      `json:"use_sliding_window"`
	VocabSize             int       `json:"vocab_size"`
}

// InitializerRange is the standard deviation of Init's normal weights, and
// the initializer_range written to config.json (transformers' default).
const InitializerRange = 0.02

// MarshalHF returns c as a Hugging Face config.json that transformers loads
// as Qwen3ForCausalLM or Qwen3MoeForCausalLM. torchDType is the stored
// weights' dtype as transformers names it ("float32", "bfloat16"); empty
// means "float32".
func (c Config) MarshalHF(torchDType string) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if torchDType == "" {
		torchDType = "float32"
	}
	j := hfConfigJSON{
		Architectures:         []string{c.Architecture},
		HeadDim:               c.HeadDim,
		HiddenAct:             "silu",
		HiddenSize:            c.HiddenSize,
		InitializerRange:      InitializerRange,
		IntermediateSize:      c.IntermediateSize,
		MaxPositionEmbeddings: c.MaxPositionEmbeddings,
		MaxWindowLayers:       c.NumHiddenLayers,
		ModelType:             modelTypes[c.Architecture],
		NumAttentionHeads:     c.NumAttentionHeads,
		NumHiddenLayers:       c.NumHiddenLayers,
		NumKeyValueHeads:      c.NumKeyValueHeads,
		RMSNormEps:            c.RMSNormEps,
		RopeTheta:             c.RopeTheta,
		TieWordEmbeddings:     c.TieWordEmbeddings,
		TorchDType:            torchDType,
		UseCache:              true,
		VocabSize:             c.VocabSize,
	}
	if c.Architecture == ArchQwen3MoE {
		step, moeI, e, k, norm := c.DecoderSparseStep, c.MoeIntermediateSize, c.NumExperts, c.NumExpertsPerTok, c.NormTopKProb
		mlpOnly := append([]int{}, c.MlpOnlyLayers...)
		noLogits, aux := false, 0.001
		j.DecoderSparseStep, j.MoeIntermediateSize, j.NumExperts, j.NumExpertsPerTok = &step, &moeI, &e, &k
		j.NormTopKProb, j.MlpOnlyLayers, j.OutputRouterLogits, j.RouterAuxLossCoef = &norm, &mlpOnly, &noLogits, &aux
	}
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// WriteFile writes c as config.json at path (see MarshalHF), atomically.
func (c Config) WriteFile(path, torchDType string) error {
	b, err := c.MarshalHF(torchDType)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}
