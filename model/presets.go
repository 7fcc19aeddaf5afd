package model

import (
	"fmt"
	"sort"
	"strings"
)

// presets are Qwen3-shaped model configurations, without the vocabulary
// (which comes from the tokenizer). All use Qwen3's rope_theta 1e6 and
// rms_norm_eps 1e-6 (Preset fills them in).
//
// tiny-dense, tiny-moe and small-moe are small models for experiments that
// must run in minutes on a CPU: head_dim 32, max_position_embeddings 4096.
// The two tiny presets tie the LM head to the embedding (as the small Qwen3
// releases do) so the vocabulary costs parameters once; small-moe keeps them
// separate, like the Qwen3-MoE releases.
//
// qwen3-0.6b, qwen3-1.7b and qwen3-30b-a3b have the shapes of the Qwen3
// releases of those names (their config.json values: head_dim 128,
// max_position_embeddings 40960, tied embeddings for the two dense ones, not
// for the MoE one); with the Qwen3 tokenizer's vocabulary (151936) they have
// the releases' parameter counts. They are for GPUs: in float32, 0.6B
// parameters are 2.4 GB and 30B-A3B 122 GB.
//
// The MoE presets renormalise the top-k router probabilities (norm_topk_prob
// true, as the Qwen3-MoE releases do) and use a sparse block in every layer
// (decoder_sparse_step 1). Their intermediate_size is unused (every layer is
// sparse) but written, as transformers expects the field.
var presets = map[string]Config{
	"tiny-dense": {
		Architecture: ArchQwen3, HiddenSize: 128, IntermediateSize: 384,
		NumHiddenLayers: 4, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32,
		TieWordEmbeddings: true,
	},
	"tiny-moe": {
		Architecture: ArchQwen3MoE, HiddenSize: 128, IntermediateSize: 384,
		NumHiddenLayers: 4, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32,
		NumExperts: 8, NumExpertsPerTok: 2, MoeIntermediateSize: 128,
		NormTopKProb: true, DecoderSparseStep: 1,
		TieWordEmbeddings: true,
	},
	"small-moe": {
		Architecture: ArchQwen3MoE, HiddenSize: 256, IntermediateSize: 768,
		NumHiddenLayers: 8, NumAttentionHeads: 8, NumKeyValueHeads: 4, HeadDim: 32,
		NumExperts: 16, NumExpertsPerTok: 4, MoeIntermediateSize: 256,
		NormTopKProb: true, DecoderSparseStep: 1,
	},
	"qwen3-0.6b": {
		Architecture: ArchQwen3, HiddenSize: 1024, IntermediateSize: 3072,
		NumHiddenLayers: 28, NumAttentionHeads: 16, NumKeyValueHeads: 8, HeadDim: 128,
		MaxPositionEmbeddings: releaseMaxPositions, TieWordEmbeddings: true,
	},
	"qwen3-1.7b": {
		Architecture: ArchQwen3, HiddenSize: 2048, IntermediateSize: 6144,
		NumHiddenLayers: 28, NumAttentionHeads: 16, NumKeyValueHeads: 8, HeadDim: 128,
		MaxPositionEmbeddings: releaseMaxPositions, TieWordEmbeddings: true,
	},
	"qwen3-30b-a3b": {
		Architecture: ArchQwen3MoE, HiddenSize: 2048, IntermediateSize: 6144,
		NumHiddenLayers: 48, NumAttentionHeads: 32, NumKeyValueHeads: 4, HeadDim: 128,
		NumExperts: 128, NumExpertsPerTok: 8, MoeIntermediateSize: 768,
		NormTopKProb: true, DecoderSparseStep: 1,
		MaxPositionEmbeddings: releaseMaxPositions,
	},
}

// releaseMaxPositions is the max_position_embeddings of the Qwen3 releases;
// the small presets, which set none, get smallMaxPositions.
const (
	releaseMaxPositions = 40960
	smallMaxPositions   = 4096
)

// PresetNames returns the names Preset accepts, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Preset returns the configuration of a named preset with the given
// vocabulary size (which comes from the tokenizer, so it is not part of
// the preset).
func Preset(name string, vocab int) (Config, error) {
	p, ok := presets[name]
	if !ok {
		return Config{}, fmt.Errorf("unknown preset %q (known: %s)", name, strings.Join(PresetNames(), ", "))
	}
	p.VocabSize = vocab
	p.RMSNormEps = 1e-6
	p.RopeTheta = 1e6
	if p.MaxPositionEmbeddings == 0 {
		p.MaxPositionEmbeddings = smallMaxPositions
	}
	if err := p.Validate(); err != nil {
		return Config{}, fmt.Errorf("preset %s: %w", name, err)
	}
	return p, nil
}

// NumParams returns the number of distinct scalar parameters of a model of
// c (a tied LM head counted once): what New(c).NumParams() returns, without
// allocating the model. It returns Validate's error for an invalid c.
func (c *Config) NumParams() (int64, error) {
	if err := c.Validate(); err != nil {
		return 0, err
	}
	n, _ := c.paramCount() // Validate checked that it neither overflows nor exceeds maxParams
	return n, nil
}
