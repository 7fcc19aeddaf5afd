package rollout

import (
	"testing"
	"time"
)

func TestBenchDecodeRuns(t *testing.T) {
	for _, group := range []int{1, 2} {
		r, err := BenchDecodeGroups("tiny-moe", 64, BF16, 4, group, 8, 6, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if !(r.TokensPerS > 0) || r.SamplesPerPrompt != group {
			t.Fatalf("group %d: %+v", group, r)
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
