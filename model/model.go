// Package model holds the Qwen3 / Qwen3-MoE decoder: its configuration (read
// from and written to Hugging Face config.json), its parameters with their
// Hugging Face tensor names, presets, random initialisation and safetensors
// I/O. It computes nothing; the training and rollout engines do.
package model

import "fmt"

// Config is the subset of a Hugging Face config.json that defines a Qwen3 or
// Qwen3-MoE decoder. JSON names are Hugging Face's.
type Config struct {
	Architecture          string  `json:"-"` // "Qwen3ForCausalLM" or "Qwen3MoeForCausalLM"
	VocabSize             int     `json:"vocab_size"`
	HiddenSize            int     `json:"hidden_size"`
	IntermediateSize      int     `json:"intermediate_size"`
	MoeIntermediateSize   int     `json:"moe_intermediate_size,omitempty"`
	NumHiddenLayers       int     `json:"num_hidden_layers"`
	NumAttentionHeads     int     `json:"num_attention_heads"`
	NumKeyValueHeads      int     `json:"num_key_value_heads"`
	HeadDim               int     `json:"head_dim"`
	RMSNormEps            float64 `json:"rms_norm_eps"`
	RopeTheta             float64 `json:"rope_theta"`
	MaxPositionEmbeddings int     `json:"max_position_embeddings"`
	TieWordEmbeddings     bool    `json:"tie_word_embeddings"`
	NumExperts            int     `json:"num_experts,omitempty"`
	NumExpertsPerTok      int     `json:"num_experts_per_tok,omitempty"`
	NormTopKProb          bool    `json:"norm_topk_prob,omitempty"`
	DecoderSparseStep     int     `json:"decoder_sparse_step,omitempty"`
	MlpOnlyLayers         []int   `json:"mlp_only_layers,omitempty"`
}

// IsMoE reports whether the model has any Mixture-of-Experts layer.
func (c *Config) IsMoE() bool { return c.NumExperts > 0 }

// IsMoELayer reports whether decoder layer i uses a sparse MoE block, with
// Hugging Face's rule: not listed in mlp_only_layers, num_experts > 0 and
// (i+1) % decoder_sparse_step == 0.
func (c *Config) IsMoELayer(i int) bool {
	if c.NumExperts <= 0 {
		return false
	}
	for _, l := range c.MlpOnlyLayers {
		if l == i {
			return false
		}
	}
	step := c.DecoderSparseStep
	if step <= 0 {
		step = 1
	}
	return (i+1)%step == 0
}

// MoELayers returns the indices of the decoder layers that use a sparse MoE
// block, in order. Routes are stored per MoE layer in this order.
func (c *Config) MoELayers() []int {
	var out []int
	for i := 0; i < c.NumHiddenLayers; i++ {
		if c.IsMoELayer(i) {
			out = append(out, i)
		}
	}
	return out
}

// Param is one named parameter tensor. Data is a view into the model's
// single arena, so all parameters can also be walked as one flat slice.
type Param struct {
	Name  string // Hugging Face tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
	Shape []int  // row-major; linear weights are [out_features, in_features]
	Data  []float32
}

// Size returns the number of elements of p.
func (p *Param) Size() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// Expert is one SwiGLU expert: down(silu(gate x) · up x).
type Expert struct {
	Gate, Up *Param // [moe_intermediate, hidden]
	Down     *Param // [hidden, moe_intermediate]
}

// Layer is one decoder layer.
type Layer struct {
	InputNorm    *Param // [hidden]
	Q            *Param // [heads·head_dim, hidden]
	K, V         *Param // [kv_heads·head_dim, hidden]
	O            *Param // [hidden, heads·head_dim]
	QNorm, KNorm *Param // [head_dim]
	PostAttnNorm *Param // [hidden]

	// Dense MLP (nil in MoE layers).
	Gate, Up *Param // [intermediate, hidden]
	Down     *Param // [hidden, intermediate]

	// Sparse MoE block (nil in dense layers).
	Router  *Param // [num_experts, hidden]: mlp.gate.weight
	Experts []Expert
}

// Model is a Qwen3 / Qwen3-MoE decoder's parameters. All parameter data lives
// in Arena, in the order of Params.
type Model struct {
	Config Config
	Embed  *Param // [vocab, hidden]
	Layers []Layer
	Norm   *Param // [hidden]
	LMHead *Param // [vocab, hidden]; the same *Param as Embed when embeddings are tied
	Arena  []float32
	params []*Param
}

// New allocates a zero-initialised model for cfg. It does not validate cfg;
// call cfg.Validate first for user input.
func New(cfg Config) *Model {
	m := &Model{Config: cfg}
	h := cfg.HiddenSize
	hd := cfg.HeadDim
	var ps []*Param
	add := func(name string, shape ...int) *Param {
		p := &Param{Name: name, Shape: shape}
		ps = append(ps, p)
		return p
	}
	m.Embed = add("model.embed_tokens.weight", cfg.VocabSize, h)
	m.Layers = make([]Layer, cfg.NumHiddenLayers)
	for i := range m.Layers {
		l := &m.Layers[i]
		pre := fmt.Sprintf("model.layers.%d.", i)
		l.InputNorm = add(pre+"input_layernorm.weight", h)
		l.Q = add(pre+"self_attn.q_proj.weight", cfg.NumAttentionHeads*hd, h)
		l.K = add(pre+"self_attn.k_proj.weight", cfg.NumKeyValueHeads*hd, h)
		l.V = add(pre+"self_attn.v_proj.weight", cfg.NumKeyValueHeads*hd, h)
		l.O = add(pre+"self_attn.o_proj.weight", h, cfg.NumAttentionHeads*hd)
		l.QNorm = add(pre+"self_attn.q_norm.weight", hd)
		l.KNorm = add(pre+"self_attn.k_norm.weight", hd)
		l.PostAttnNorm = add(pre+"post_attention_layernorm.weight", h)
		if cfg.IsMoELayer(i) {
			l.Router = add(pre+"mlp.gate.weight", cfg.NumExperts, h)
			l.Experts = make([]Expert, cfg.NumExperts)
			for e := range l.Experts {
				ep := fmt.Sprintf("%smlp.experts.%d.", pre, e)
				l.Experts[e].Gate = add(ep+"gate_proj.weight", cfg.MoeIntermediateSize, h)
				l.Experts[e].Up = add(ep+"up_proj.weight", cfg.MoeIntermediateSize, h)
				l.Experts[e].Down = add(ep+"down_proj.weight", h, cfg.MoeIntermediateSize)
			}
		} else {
			l.Gate = add(pre+"mlp.gate_proj.weight", cfg.IntermediateSize, h)
			l.Up = add(pre+"mlp.up_proj.weight", cfg.IntermediateSize, h)
			l.Down = add(pre+"mlp.down_proj.weight", h, cfg.IntermediateSize)
		}
	}
	m.Norm = add("model.norm.weight", h)
	if cfg.TieWordEmbeddings {
		m.LMHead = m.Embed
	} else {
		m.LMHead = add("lm_head.weight", cfg.VocabSize, h)
	}
	total := 0
	for _, p := range ps {
		total += p.Size()
	}
	m.Arena = make([]float32, total)
	off := 0
	for _, p := range ps {
		n := p.Size()
		p.Data = m.Arena[off : off+n : off+n]
		off += n
	}
	m.params = ps
	return m
}

// Params returns every distinct parameter in a fixed order (a tied head is
// listed once, as the embedding). The order is the arena order.
func (m *Model) Params() []*Param { return m.params }

// NumParams returns the number of distinct scalar parameters.
func (m *Model) NumParams() int { return len(m.Arena) }

// Clone returns a deep copy of m with its own arena.
func (m *Model) Clone() *Model {
	c := New(m.Config)
	copy(c.Arena, m.Arena)
	return c
}

// ZeroLike returns a zero model with m's shapes, used to hold gradients and
// optimiser moments parameter by parameter.
func (m *Model) ZeroLike() *Model { return New(m.Config) }
