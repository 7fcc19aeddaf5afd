package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Benchmarks run every kernel on every path this CPU has (avx512, avx2,
// portable) in one run, so the speed-ups can be read off side by side.
// Throughput is reported as MB/s of data touched (b.SetBytes) and as
// elements per second (Melem/s).

func benchPaths(b *testing.B, name string, elems, bytes int, f func()) {
	for _, p := range paths() {
		b.Run(name+"/"+p, func(b *testing.B) {
			restore := setPath(p)
			defer restore()
			b.SetBytes(int64(bytes))
			for b.Loop() {
				f()
			}
			b.ReportMetric(float64(elems)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Melem/s")
		})
	}
}

func BenchmarkDot(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{128, 1024, 4096} {
		x, y := randSlice(r, n, 1), randSlice(r, n, 1)
		var sink float32
		benchPaths(b, fmt.Sprintf("n=%d", n), n, 8*n, func() { sink += Dot(x, y) })
		_ = sink
	}
}

func BenchmarkAxpy(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{128, 1024, 4096} {
		x, y := randSlice(r, n, 1), randSlice(r, n, 1)
		benchPaths(b, fmt.Sprintf("n=%d", n), n, 12*n, func() { Axpy(1e-3, x, y) })
	}
}

func BenchmarkExp(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 3))
	for _, n := range []int{4096, 151936} {
		x, y := randSlice(r, n, 5), make([]float32, n)
		benchPaths(b, fmt.Sprintf("n=%d", n), n, 8*n, func() { Exp(y, x) })
	}
}

func BenchmarkLogSoftmax(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 4))
	for _, n := range []int{128, 4096, 151936} {
		x, y := randSlice(r, n, 5), make([]float32, n)
		benchPaths(b, fmt.Sprintf("n=%d", n), n, 8*n, func() { LogSoftmax(y, x) })
	}
}

func BenchmarkSoftmax(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 5))
	for _, n := range []int{128, 4096, 151936} {
		x, y := randSlice(r, n, 5), make([]float32, n)
		benchPaths(b, fmt.Sprintf("n=%d", n), n, 8*n, func() { Softmax(y, x) })
	}
}

func BenchmarkRMSNorm(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 6))
	for _, n := range []int{128, 1024, 4096} {
		x, w, y := randSlice(r, n, 1), randSlice(r, n, 1), make([]float32, n)
		benchPaths(b, fmt.Sprintf("n=%d", n), n, 12*n, func() { RMSNorm(y, x, w, 1e-6) })
	}
}

func BenchmarkSwiGLU(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 7))
	for _, n := range []int{512, 3072, 12288} {
		g, u, y := randSlice(r, n, 3), randSlice(r, n, 1), make([]float32, n)
		benchPaths(b, fmt.Sprintf("n=%d", n), n, 12*n, func() { SwiGLU(y, g, u) })
	}
}

// BenchmarkAttendRow: one query head against n cached keys/values of
// head_dim d (K and V rows contiguous with stride d). Elements are n·d
// multiply-adds for the scores plus n·d for the values.
func BenchmarkAttendRow(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 8))
	for _, d := range []int{32, 128} {
		for _, n := range []int{128, 1024} {
			q, k, v := randSlice(r, d, 1), randSlice(r, n*d, 1), randSlice(r, n*d, 1)
			out, p := make([]float32, d), make([]float32, n)
			scale := AttentionScale(d)
			benchPaths(b, fmt.Sprintf("d=%d/n=%d", d, n), 2*n*d, 8*n*d, func() {
				AttendRow(out, q, k, v, n, d, scale, p)
			})
		}
	}
}

// BenchmarkAttendCausal: one head's causal attention over T positions
// (T·(T+1)/2 query-key pairs, each a d-long score and a d-long value
// update), against the same work done as T AttendRow calls.
func BenchmarkAttendCausal(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 9))
	for _, d := range []int{32, 128} {
		for _, T := range []int{128, 1024} {
			q, k, v := randSlice(r, T*d, 1), randSlice(r, T*d, 1), randSlice(r, T*d, 1)
			out, p := make([]float32, T*d), make([]float32, 4*T)
			scale := AttentionScale(d)
			pairs := T * (T + 1) / 2
			benchPaths(b, fmt.Sprintf("d=%d/T=%d", d, T), 2*pairs*d, 8*pairs*d, func() {
				AttendCausal(out, q, k, v, T, d, d, d, d, scale, p, 0)
			})
			benchPaths(b, fmt.Sprintf("d=%d/T=%d/rowloop", d, T), 2*pairs*d, 8*pairs*d, func() {
				for i := 0; i < T; i++ {
					AttendRow(out[i*d:i*d+d], q[i*d:i*d+d], k, v, i+1, d, scale, p)
				}
			})
		}
	}
}
