package train

import (
	"math/rand/v2"
	"testing"

	"github.com/keel-rl/keel/model"
)

// benchSmallMoE and benchTinyDense are the performance-target shapes (see
// the package's benchmarks); they are built by hand so the benchmarks do
// not depend on the presets.
func benchSmallMoE() model.Config {
	return model.Config{
		Architecture: "Qwen3MoeForCausalLM", VocabSize: 128, HiddenSize: 256, NumHiddenLayers: 8,
		NumAttentionHeads: 8, NumKeyValueHeads: 4, HeadDim: 32, RMSNormEps: 1e-6, RopeTheta: 1e6,
		MaxPositionEmbeddings: 4096, NumExperts: 16, NumExpertsPerTok: 4, MoeIntermediateSize: 256,
		NormTopKProb: true, DecoderSparseStep: 1, IntermediateSize: 1024,
	}
}

func benchTinyDense() model.Config {
	return model.Config{
		Architecture: "Qwen3ForCausalLM", VocabSize: 128, HiddenSize: 128, NumHiddenLayers: 4,
		NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 32, IntermediateSize: 384,
		RMSNormEps: 1e-6, RopeTheta: 1e6, MaxPositionEmbeddings: 4096, TieWordEmbeddings: true,
	}
}

func benchEngine(b *testing.B, c model.Config, train bool) {
	const nseq, seqLen = 16, 128
	e := New(engRandomModel(c, 1))
	r := rand.New(rand.NewPCG(1, 2))
	lens := make([]int, nseq)
	for i := range lens {
		lens[i] = seqLen
	}
	seqs := engRandomSeqs(r, c.VocabSize, lens...)
	l := Loss{LogProb: engCoefs(r, seqs)}
	step := func() {
		if _, err := e.Forward(seqs, ForwardOptions{NoEntropy: train}); err != nil {
			b.Fatal(err)
		}
		if train {
			if err := e.Backward(l); err != nil {
				b.Fatal(err)
			}
		}
	}
	step() // allocate buffers
	b.ResetTimer()
	for b.Loop() {
		step()
	}
	tok := float64(nseq * seqLen * b.N)
	sec := b.Elapsed().Seconds()
	fl := FLOPsPerToken(c, seqLen)
	if train {
		fl *= 3
	}
	b.ReportMetric(tok/sec, "tokens/s")
	b.ReportMetric(tok*fl/sec/1e9, "GFLOP/s")
}

func BenchmarkForwardSmallMoE(b *testing.B)   { benchEngine(b, benchSmallMoE(), false) }
func BenchmarkTrainStepSmallMoE(b *testing.B) { benchEngine(b, benchSmallMoE(), true) }
func BenchmarkForwardTinyDense(b *testing.B)  { benchEngine(b, benchTinyDense(), false) }
func BenchmarkTrainStepTinyDense(b *testing.B) {
	benchEngine(b, benchTinyDense(), true)
}
