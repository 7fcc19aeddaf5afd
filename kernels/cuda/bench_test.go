package cuda

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/keel-rl/keel/kernels"
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
	d := benchDevice(b)
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
				timeDevice(b, d, f)
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

// BenchmarkDeviceDraw times a decoding step's draws at 256 rows of
// Qwen3's 151,936-token vocabulary, from log-probabilities (draw_rows:
// the exact rollout's) and from logits (draw_rows_raw: the reduced
// precisions'): full sampling (every RL recipe's), top-k 50, top-p 0.9,
// and top-p 0.9 with 20 top log-probabilities (what `keel serve` is
// asked). It reports microseconds a step; on a GPU only.
//
//	tools/gpu/bin/cuda.test -test.run '^$' -test.bench DeviceDraw
func BenchmarkDeviceDraw(b *testing.B) {
	d := benchDevice(b)
	ops := NewOps(d)
	const rows, V = 256, 151936
	r := rand.New(rand.NewPCG(2, 2))
	logits := make([]float32, rows*V)
	for i := range logits {
		logits[i] = float32(2 * r.NormFloat64()) // a spread like a trained model's
	}
	z := slices.Clone(logits)
	for i := 0; i < rows; i++ {
		kernels.LogSoftmax(z[i*V:(i+1)*V], z[i*V:(i+1)*V])
	}
	u, temps := make([]float64, rows), make([]float32, rows)
	for i := range u {
		u[i], temps[i] = r.Float64(), 1
	}
	bz, braw := benchBuf(b, d, z), benchBuf(b, d, logits)
	base := Draws{U: benchBuf(b, d, u), Temps: benchBuf(b, d, temps),
		Tok: benchBuf(b, d, make([]int32, rows)), LP: benchBuf(b, d, make([]float32, rows)), TLP: benchBuf(b, d, make([]float32, rows)),
		TopTok: benchBuf(b, d, make([]int32, rows*TopMax)), TopLP: benchBuf(b, d, make([]float32, rows*TopMax))}
	per := func(k int32, p float64, n int32) (Buffer, Buffer, Buffer) {
		ks, ps, ns := make([]int32, rows), make([]float64, rows), make([]int32, rows)
		for i := range ks {
			ks[i], ps[i], ns[i] = k, p, n
		}
		return benchBuf(b, d, ks), benchBuf(b, d, ps), benchBuf(b, d, ns)
	}
	for _, c := range []struct {
		what string
		k    int32
		p    float64
		n    int32
	}{{"full", 0, 0, 0}, {"top-k 50", 50, 0, 0}, {"top-p 0.9", 0, 0.9, 0}, {"top-p 0.9 + 20 top log-probs", 0, 0.9, 20}} {
		dr := base
		dr.TopK, dr.TopP, dr.TopN = per(c.k, c.p, c.n)
		for _, raw := range []bool{false, true} {
			name, f := "log-probs "+c.what, func() error { return ops.DrawRows(dr, bz, rows, V) }
			if raw {
				name, f = "logits "+c.what, func() error { return ops.DrawRowsRaw(dr, braw, rows, V) }
			}
			b.Run(name, func(b *testing.B) {
				timeDevice(b, d, f)
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "us/step")
			})
		}
	}
}

// benchBuf allocates a device buffer holding x.
func benchBuf[T any](b *testing.B, d *Device, x []T) Buffer {
	buf, err := d.Alloc(int64(len(x)) * int64(unsafe.Sizeof(x[0])))
	if err != nil {
		b.Fatal(err)
	}
	if err := Upload(d, buf, x); err != nil {
		b.Fatal(err)
	}
	return buf
}

// timeDevice runs f once to warm it (modules, plans), then b.N times
// between the timer's reset and a sync with the device.
func timeDevice(b *testing.B, d *Device, f func() error) {
	if err := f(); err != nil {
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
}

// benchDevice opens the GPU for a benchmark, closed when it ends; it
// skips without one, and on the CUDA emulator (no GPU figure).
func benchDevice(b *testing.B) *Device {
	d, err := Open(0)
	if err != nil {
		b.Skipf("no GPU: %v", err)
	}
	b.Cleanup(func() { d.Close() })
	if d.Emulated {
		b.Skip("the CUDA emulator: no GPU figure")
	}
	return d
}
