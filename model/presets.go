package model

import (
	"fmt"
	"sort"
	"strings"
)

// presets are small Qwen3-shaped models for experiments that must run in
// minutes on a CPU. All use Qwen3's rope_theta 1e6, rms_norm_eps 1e-6 and
// head_dim 32. The two tiny presets tie the LM head to the embedding (as
// the small Qwen3 releases do) so the vocabulary costs parameters once;
// small-moe keeps them separate, like the Qwen3-MoE releases. The MoE
// presets renormalise the top-k router probabilities (norm_topk_prob true,
// as the Qwen3-MoE releases do) and use a sparse block in every layer.
var presets = map[string]Config{
	"tiny-dense": {
		Architecture: ArchQwen3, HiddenSize: 128, IntermediateSize: 384,
		NumHiddenLayers: 4, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32,
		TieWordEmbeddings: true,
	},
	"tiny-moe": {
		Architecture: ArchQwen3MoE, HiddenSize: 128,
		// intermediate_size is unused (every layer is sparse) but written,
		// as transformers expects the field.
		IntermediateSize: 384,
		NumHiddenLayers:  4, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32,
		NumExperts: 8, NumExpertsPerTok: 2, MoeIntermediateSize: 128,
		NormTopKProb: true, DecoderSparseStep: 1,
		TieWordEmbeddings: true,
	},
	"small-moe": {
		Architecture: ArchQwen3MoE, HiddenSize: 256,
		IntermediateSize: 768,
		NumHiddenLayers:  8, NumAttentionHeads: 8, NumKeyValueHeads: 4, HeadDim: 32,
		NumExperts: 16, NumExpertsPerTok: 4, MoeIntermediateSize: 256,
		NormTopKProb: true, DecoderSparseStep: 1,
	},
}

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
	p.MaxPositionEmbeddings = 4096
	if err := p.Validate(); err != nil {
		return Config{}, fmt.Errorf("preset %s: %w", name, err)
	}
	return p, nil
}
