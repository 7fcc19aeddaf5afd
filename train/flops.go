package train

import "github.com/keel-rl/keel/model"

// FLOPsPerToken returns the model FLOPs of one token's forward pass through
// cfg for sequences of seqLen tokens: every matrix product counted as
// 2·m·n·k (projections, router, experts actually used, lm_head) plus causal
// attention (q·K and P·V over the (seqLen+1)/2 keys a token sees on
// average). Norms, softmaxes and element-wise work are not counted. A
// training step (forward and backward) is conventionally 3 times this;
// `keel bench` divides the achieved rate by the GEMM peak to report
// utilisation.
func FLOPsPerToken(cfg model.Config, seqLen int) float64 {
	H := float64(cfg.HiddenSize)
	qd := float64(cfg.NumAttentionHeads * cfg.HeadDim)
	kvd := float64(cfg.NumKeyValueHeads * cfg.HeadDim)
	keys := float64(seqLen+1) / 2
	var f float64
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		f += 2 * H * (2*qd + 2*kvd) // q, k, v, o projections
		f += 2 * 2 * qd * keys      // q·K and P·V
		if cfg.IsMoELayer(i) {
			f += 2 * H * float64(cfg.NumExperts)
			f += float64(cfg.NumExpertsPerTok) * 3 * 2 * H * float64(cfg.MoeIntermediateSize)
		} else {
			f += 3 * 2 * H * float64(cfg.IntermediateSize)
		}
	}
	f += 2 * H * float64(cfg.VocabSize)
	return f
}
