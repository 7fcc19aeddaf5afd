package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkDeviceGemm times keel's batch-invariant float32 product
// (Ops.Gemm: the exact rollout's and the fp32 training mode's) and
// cuBLASLt's bf16 product on the shapes of a Qwen3-0.6B layer: a training
// micro-batch of 8192 tokens (forward, input and weight gradients) and a
// decoding step of 256 sequences. It reports GFLOP/s; on a GPU only (on
// the emulator the figures are the CPU's).
//
//	tools/gpu/bin/cuda.test -test.run '^$' -test.bench DeviceGemm
func BenchmarkDeviceGemm(b *testing.B) {
	d, err := Open(0)
	if err != nil {
		b.Skipf("no GPU: %v", err)
	}
	defer d.Close()
	if d.Emulated {
		b.Skip("the CUDA emulator: no GPU figure")
	}
	ops := NewOps(d)
	blas, err := d.Blas()
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	alloc := func(n int) Buffer {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		buf, err := d.Alloc(int64(n) * 4)
		if err != nil {
			b.Fatal(err)
		}
		if err := Upload(d, buf, x); err != nil {
			b.Fatal(err)
		}
		return buf
	}
	for _, s := range []struct {
		what    string
		M, N, K int
	}{{"train 8192x3072x1024", 8192, 3072, 1024}, {"train 8192x1024x3072", 8192, 1024, 3072}, {"decode 256x3072x1024", 256, 3072, 1024}, {"decode 256x1024x3072", 256, 1024, 3072}} {
		x, w, y := alloc(s.M*s.K), alloc(s.N*s.K), alloc(s.M*s.N)
		flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)
		run := func(name string, f func() error) {
			b.Run(fmt.Sprintf("%s %s", name, s.what), func(b *testing.B) {
				if err := f(); err != nil { // warm: modules, plans
					b.Fatal(err)
				}
				if err := d.Sync(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := f(); err != nil {
						b.Fatal(err)
					}
				}
				if err := d.Sync(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
		run("keel fp32 forward", func() error { return ops.Linear(y, x, w, s.M, s.K, s.N, s.N, s.K) })
		run("keel fp32 input grad", func() error { return ops.LinearBackX(x, y, w, s.M, s.K, s.N, s.K, s.N, false) })
		run("keel fp32 weight grad", func() error { return ops.LinearBackW(w, y, x, s.M, s.K, s.N, s.N, s.K) })
		run("cuBLASLt bf16 forward", func() error {
			// The operands reinterpreted as bf16 (values do not matter
			// for the time): column-major Yᶜ = (Wᶜ)ᵀ·Xᶜ.
			return blas.GemmBF16(true, false, s.N, s.M, s.K, w, s.K, x, s.K, y, s.N, false)
		})
		for _, buf := range []Buffer{x, w, y} {
			d.Free(buf)
		}
	}
}
