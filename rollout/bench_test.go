package rollout

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

func TestBenchDecodeRuns(t *testing.T) {
	for _, group := range []int{1, 2} {
		r, err := BenchDecodeGroups("tiny-moe", 64, BF16, 4, group, 8, 6, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !(r.TokensPerS > 0) || r.SamplesPerPrompt != group || r.FullSteps == 0 || !(r.StepMS > 0) {
			t.Fatalf("group %d: %+v", group, r)
		}
		// Distinct prompts: one step prefills all four (32 prompt rows),
		// then every run has 5 full steps decoding positions 8..12 and
		// the MoE tail step at 13, which attend to 9..14 positions: 11.5
		// on average.
		if group == 1 && (r.FullSteps%6 != 0 || r.StepContext != 11.5) {
			t.Errorf("full steps %d, mean context %v: want a multiple of 6, 11.5", r.FullSteps, r.StepContext)
		}
	}
	if _, err := BenchDecodeGroups("tiny-moe", 64, BF16, 4, 3, 8, 6, time.Millisecond); err == nil {
		t.Fatal("3 samples per prompt accepted for 4 sequences")
	}
}

func benchDecode(b *testing.B, preset string, p Precision, slots, group int) {
	r, err := BenchDecodeGroups(preset, 128, p, slots, group, 32, 96, 2*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.TokensPerS, "tokens/s")
}

func BenchmarkDecodeTinyMoE256Exact(b *testing.B)    { benchDecode(b, "tiny-moe", Exact, 256, 1) }
func BenchmarkDecodeTinyMoE256BF16(b *testing.B)     { benchDecode(b, "tiny-moe", BF16, 256, 1) }
func BenchmarkDecodeTinyMoE256ExactG16(b *testing.B) { benchDecode(b, "tiny-moe", Exact, 256, 16) }
func BenchmarkDecodeSmallMoE256Exact(b *testing.B)   { benchDecode(b, "small-moe", Exact, 256, 1) }
func BenchmarkDecodeSmallMoE256BF16(b *testing.B)    { benchDecode(b, "small-moe", BF16, 256, 1) }
func BenchmarkDecodeSmallMoE64Exact(b *testing.B)    { benchDecode(b, "small-moe", Exact, 64, 1) }
func BenchmarkDecodeTinyMoE64Exact(b *testing.B)     { benchDecode(b, "tiny-moe", Exact, 64, 1) }

// Decode with Qwen3's vocabulary size (151,936): the LM head and sampling
// over a real row, 64 sequences, 32 new tokens.
func BenchmarkDecodeTinyMoE64Vocab151936(b *testing.B) {
	for _, p := range []Precision{Exact, BF16} {
		b.Run(p.String(), func(b *testing.B) {
			r, err := BenchDecodeGroups("tiny-moe", 151936, p, 64, 1, 32, 32, time.Second)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(r.TokensPerS, "tokens/s")
		})
	}
}

// idleDrawer is a Drawer that computes nothing: each step "draws" a fixed
// token for every output row. Under it, Generate's time is the batcher's
// own host work per step (slots, rows, draws, bookkeeping): what a GPU
// backend's step cannot go below.
type idleDrawer struct {
	cfg   model.Config
	opt   Options
	steps int
}

func (f *idleDrawer) Config() model.Config       { return f.cfg }
func (f *idleDrawer) Options() Options           { return f.opt }
func (f *idleDrawer) Draws() bool                { return true }
func (f *idleDrawer) CopyPrefix(dst, src, n int) {}
func (f *idleDrawer) Load(m *model.Model) error  { return nil }
func (f *idleDrawer) Close()                     {}
func (f *idleDrawer) Step(b *StepBatch) error {
	f.steps++
	for o := range b.OutRow {
		b.Drawn[o], b.DrawnLP[o] = int32(o%1000), -1
	}
	return nil
}

// BenchmarkBatcherOverhead: the batcher's host time per decoding step at
// the Qwen3-0.6B shape's vocabulary, 32-token prompts and 96 new tokens
// (keel bench's decode rows), over an idle backend.
//
//	go test ./rollout -run '^$' -bench BatcherOverhead
func BenchmarkBatcherOverhead(b *testing.B) {
	cfg, err := model.Preset("qwen3-0.6b", 151936)
	if err != nil {
		b.Fatal(err)
	}
	for _, slots := range []int{64, 256} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) {
			d := &idleDrawer{cfg: cfg, opt: Options{Precision: BF16, Slots: slots, MaxLen: 128, StepRows: max(slots, 512)}}
			e, err := NewWithBackend(d)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			prompts := make([][]int32, slots)
			for i := range prompts {
				prompts[i] = make([]int32, 32)
				for j := range prompts[i] {
					prompts[i][j] = int32(i*31+j) % 1000
				}
			}
			sp := Sampling{Temperature: 1, MaxNewTokens: 96, Seed: 1}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := e.Generate(prompts, 1, sp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(d.steps, 1))/1e3, "µs/step")
		})
	}
}

// BenchmarkSampleRow times the host's sampling of one row of Qwen3's
// 151,936-token vocabulary (what a backend that does not draw leaves to
// the batcher, per sequence per step): full, top-k 50, top-p 0.9, and top-p
// 0.9 with 20 top log-probabilities; over a flat row (logits drawn from
// N(0, 4)) and a peaked one (Zipf's law with exponent 1.5 over a random
// order: top-p 0.9 keeps about 60 tokens). BenchmarkDeviceDraw
// (kernels/cuda) times the device's draws of flat rows.
func BenchmarkSampleRow(b *testing.B) {
	const V = 151936
	r := rand.New(rand.NewPCG(2, 2))
	flat, zipf := make([]float32, V), make([]float32, V)
	for i, rank := range r.Perm(V) {
		flat[i] = float32(2 * r.NormFloat64())
		zipf[i] = float32(-1.5 * math.Log(float64(rank+1)))
	}
	ids, p := make([]int32, V), make([]float32, V)
	var top [MaxTopLogProbs]TokenLogProb
	for _, row := range []struct {
		name string
		z    []float32
	}{{"flat", flat}, {"zipf", zipf}} {
		z := row.z
		kernels.LogSoftmax(z, z)
		for _, sp := range []Sampling{{Temperature: 1}, {Temperature: 1, TopK: 50}, {Temperature: 1, TopP: 0.9}, {Temperature: 1, TopP: 0.9, TopLogProbs: 20}} {
			pl := newPolicy(sp)
			b.Run(fmt.Sprintf("%s top-k %d top-p %v top log-probs %d", row.name, sp.TopK, sp.TopP, sp.TopLogProbs), func(b *testing.B) {
				rng := rand.NewPCG(1, 1)
				for i := 0; i < b.N; i++ {
					pl.sampleOne(z, rng, ids, p)
					if n := sp.TopLogProbs; n > 0 {
						topTokens(top[:n], z)
					}
				}
			})
		}
	}
}
