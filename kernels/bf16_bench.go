package kernels

import (
	"math/rand/v2"
	"time"
)

// BenchGemmBF16 measures the bf16 precision mode's GEMM, C[m×n] = A·Bᵀ with
// float32 activations A[m×k] rounded on the way in and pre-packed bf16
// weights B[n×k], for about d, and returns the best rate seen in GFLOP/s
// (2·m·n·k per call). Taking the best of many short timed batches filters
// out interference from other processes; `keel bench` reports it.
func BenchGemmBF16(m, k, n int, d time.Duration) (gflops float64) {
	if m <= 0 || k <= 0 || n <= 0 {
		return 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	a := make([]float32, m*k)
	b := make([]float32, n*k)
	for i := range a {
		a[i] = float32(rng.NormFloat64())
	}
	for i := range b {
		b[i] = float32(rng.NormFloat64())
	}
	c := make([]float32, m*n)
	pb := PackBF16BFloat32(b, n, k, k)
	call := func() { GemmBF16F32A(m, a, k, pb, c, n, false) }
	call() // warm-up: workers, scratch buffers, caches
	flop := 2 * float64(m) * float64(n) * float64(k)
	// Short batches of at least 2 ms, best batch wins: on a shared machine
	// a short batch is more likely to catch the cores undisturbed.
	deadline := time.Now().Add(d)
	for {
		reps := 0
		t0 := time.Now()
		for time.Since(t0) < 2*time.Millisecond {
			call()
			reps++
		}
		if g := flop * float64(reps) / time.Since(t0).Seconds() / 1e9; g > gflops {
			gflops = g
		}
		if time.Now().After(deadline) {
			return gflops
		}
	}
}
