package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// gemmBenchShapes are (M, K, N) shapes of the training engine's products.
var gemmBenchShapes = [][3]int{
	{2048, 256, 256}, {2048, 256, 1024}, {2048, 1024, 256}, {512, 512, 512}, {1024, 1024, 1024},
}

// BenchmarkGemm reports GFLOP/s for the three layouts the engines use:
// NT = A·Bᵀ (forward), NN = A·B (input gradient), TN = Aᵀ·B accumulated
// (weight gradient).
func BenchmarkGemm(b *testing.B) {
	for _, op := range []struct {
		name   string
		ta, tb bool
	}{{"NT", false, true}, {"NN", false, false}, {"TN", true, false}} {
		for _, sh := range gemmBenchShapes {
			m, k, n := sh[0], sh[1], sh[2]
			b.Run(fmt.Sprintf("%s/%dx%dx%d", op.name, m, k, n), func(b *testing.B) {
				benchGemm(b, op.ta, op.tb, m, n, k)
			})
		}
	}
}

// BenchmarkGemmDecode covers rollout-sized products with a prepacked
// weight: m tokens × 1024 hidden by a 1024×1024 weight.
func BenchmarkGemmDecode(b *testing.B) {
	for _, m := range []int{1, 4, 16, 64, 256} {
		b.Run(fmt.Sprintf("m%d", m), func(b *testing.B) {
			n, k := 1024, 1024
			r := rand.New(rand.NewPCG(1, 1))
			a, w, c := randMat(r, m*k), randMat(r, n*k), make([]float32, m*n)
			pb := PackB(true, n, k, w, k)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				GemmPacked(m, a, k, pb, c, n, false)
			}
			b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

func benchGemm(b *testing.B, ta, tb bool, m, n, k int) {
	r := rand.New(rand.NewPCG(1, 1))
	a, bb, c := randMat(r, m*k), randMat(r, k*n), make([]float32, m*n)
	lda, ldb := k, n
	if ta {
		lda = m
	}
	if tb {
		ldb = k
	}
	Gemm(ta, tb, m, n, k, a, lda, bb, ldb, c, n, ta)
	b.ResetTimer()
	for b.Loop() {
		Gemm(ta, tb, m, n, k, a, lda, bb, ldb, c, n, ta)
	}
	b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkGemmExpertCold times a decode step's expert product (64 rows,
// K 256, N 512, one goroutine) against the same weight every time (hot in
// the caches) and against 128 different weights in turn (64 MB, read from
// memory, as a MoE decode step reads its experts): the gap is what the
// micro-kernels' prefetching of B has to hide.
func BenchmarkGemmExpertCold(b *testing.B) {
	const m, k, n = 64, 256, 512
	for _, weights := range []int{1, 128} {
		b.Run(fmt.Sprintf("weights%d", weights), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			ws := make([]*PackedB, weights)
			for i := range ws {
				ws[i] = PackB(true, n, k, randMat(r, n*k), k)
			}
			a, c := randMat(r, m*k), make([]float32, m*n)
			var g GemmParts
			var s GemmScratch
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				g.Packed(m, a, k, ws[i%weights], c, n, false, 1)
				g.RunAll(&s)
			}
			b.ReportMetric(float64(2*m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
