package rollout

import (
	"testing"
	"time"
)

func TestBenchDecodeRuns(t *testing.T) {
	r, err := BenchDecode("tiny-moe", 64, BF16, 4, 8, 6, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !(r.TokensPerS > 0) {
		t.Fatalf("tokens/s = %v", r.TokensPerS)
	}
}

func benchDecode(b *testing.B, preset string, p Precision, slots int) {
	r, err := BenchDecode(preset, 128, p, slots, 32, 96, 2*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.TokensPerS, "tokens/s")
}

func BenchmarkDecodeTinyMoE256Exact(b *testing.B)  { benchDecode(b, "tiny-moe", Exact, 256) }
func BenchmarkDecodeTinyMoE256BF16(b *testing.B)   { benchDecode(b, "tiny-moe", BF16, 256) }
func BenchmarkDecodeSmallMoE256Exact(b *testing.B) { benchDecode(b, "small-moe", Exact, 256) }
func BenchmarkDecodeSmallMoE256BF16(b *testing.B)  { benchDecode(b, "small-moe", BF16, 256) }
