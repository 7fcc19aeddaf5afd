package kernels

import (
	"math/rand/v2"
	"time"
)

// BenchGemm measures Gemm on an m×k by k×n product in the layout the
// forward pass uses (activations × weightᵀ, B stored n×k) for about d, and
// returns the best rate seen in GFLOP/s (2·m·n·k per product). `keel bench`
// reports it next to OpenBLAS's figure.
func BenchGemm(m, k, n int, d time.Duration) float64 {
	return BenchGemmOp(false, true, m, k, n, d)
}

// BenchGemmOp is BenchGemm for any transpose combination: (false, true) is
// A·Bᵀ, (false, false) A·B, and (true, false) the weight-gradient Aᵀ·B,
// which accumulates into C as the training engine does.
func BenchGemmOp(transA, transB bool, m, k, n int, d time.Duration) float64 {
	r := rand.New(rand.NewPCG(1, 1))
	a := make([]float32, m*k)
	b := make([]float32, k*n)
	c := make([]float32, m*n)
	for i := range a {
		a[i] = r.Float32() - 0.5
	}
	for i := range b {
		b[i] = r.Float32() - 0.5
	}
	lda, ldb := k, n
	if transA {
		lda = m
	}
	if transB {
		ldb = k
	}
	acc := transA
	run := func() { Gemm(transA, transB, m, n, k, a, lda, b, ldb, c, n, acc) }
	run() // warm up: buffers, helpers
	flop := 2 * float64(m) * float64(n) * float64(k)
	best := 0.0
	deadline := time.Now().Add(d)
	for {
		// Time batches of at least ~20 ms so the clock's resolution and
		// one-off scheduling noise do not dominate.
		reps := 0
		t0 := time.Now()
		for time.Since(t0) < 20*time.Millisecond {
			run()
			reps++
		}
		if g := flop * float64(reps) / time.Since(t0).Seconds() / 1e9; g > best {
			best = g
		}
		if time.Now().After(deadline) {
			return best
		}
	}
}
