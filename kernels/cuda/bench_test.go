package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/keel-rl/keel/kernels"
)

// BenchmarkDeviceGemm times keel's batch-invariant float32 product
// (Ops.Gemm: the exact rollout's and the fp32 training mode's; where it
// takes 32 × 32 tiles, also the 64 × 64 kernel it took before) and
// cuBLASLt's bf16 product on the shapes of a Qwen3-0.6B layer: a training
// micro-batch of 8192 tokens (forward, input and weight gradients) and a
// decoding step of 256 and 64 sequences (4096 columns: q, k and v as one
// product), and the Qwen3-30B-A3B shape's q and o products at 4096 tokens
// (KEEL_CUDA_PROFILE had them at 10 and 17 TFLOP/s on an H200, its first
// calls in the mean), cuBLASLt with its algorithm timed among the
// heuristic's candidates and without. It reports GFLOP/s; on a GPU only (on the
// emulator the figures are the CPU's).
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
	}{{"train 8192x3072x1024", 8192, 3072, 1024}, {"train 8192x1024x3072", 8192, 1024, 3072}, {"decode 256x3072x1024", 256, 3072, 1024},
		{"decode 256x1024x3072", 256, 1024, 3072}, {"decode 256x4096x1024", 256, 4096, 1024}, {"decode 64x4096x1024", 64, 4096, 1024},
		{"moe train 4096x4096x2048", 4096, 4096, 2048}, {"moe train 4096x2048x4096", 4096, 2048, 4096}} {
		x, w, y := alloc(s.M*s.K), alloc(s.N*s.K), alloc(s.M*s.N)
		flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)
		run := func(name string, f func() error) {
			b.Run(fmt.Sprintf("%s %s", name, s.what), func(b *testing.B) {
				timeDevice(b, d, f)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
		run("keel fp32 forward", func() error { return ops.Linear(y, x, w, s.M, s.K, s.N, s.N, s.K) })
		if smallTiles(s.M, s.N, d.SMs) { // the generic 64-tile kernel Ops.Gemm ran here before gemm_f32_32(_fwd)
			run("keel fp32 forward 64-tiles", func() error {
				return ops.Launch("gemm.cu", "gemm_f32", Dim3{X: (s.N + 63) / 64, Y: (s.M + 63) / 64}, block256,
					y, x, w, s.M, s.N, s.K, int64(s.K), int64(1), int64(1), int64(s.K), int64(s.N), 0)
			})
		}
		run("keel fp32 input grad", func() error { return ops.LinearBackX(x, y, w, s.M, s.K, s.N, s.K, s.N, false) })
		run("keel fp32 weight grad", func() error { return ops.LinearBackW(w, y, x, s.M, s.K, s.N, s.N, s.K) })
		// cuBLASLt with the heuristic's first algorithm (the default),
		// then with the plan's algorithm timed among the heuristic's
		// candidates (KEEL_BLAS_TUNE=1). The operands reinterpreted as
		// bf16 (values do not matter for the time): column-major Yᶜ =
		// (Wᶜ)ᵀ·Xᶜ.
		for _, tune := range []bool{false, true} {
			name := "cuBLASLt bf16 forward"
			if tune {
				name += " tuned"
			}
			d.do(func() error {
				blas.mu.Lock()
				defer blas.mu.Unlock()
				blas.tune = tune
				blas.closePlans()
				return nil
			})
			run(name, func() error { return blas.GemmBF16(true, false, s.N, s.M, s.K, w, s.K, x, s.K, y, s.N, false) })
		}
		blas.tune = os.Getenv("KEEL_BLAS_TUNE") == "1"
		for _, buf := range []Buffer{x, w, y} {
			d.Free(buf)
		}
	}
}

// BenchmarkDeviceExperts times the MoE experts' forward products
// (gemm_bf16_grouped) of the Qwen3-30B-A3B shape, 128 experts of 768 on a
// hidden size of 2048, 8 a token: over a decoding step's 256 tokens
// (about 16 rows an expert) and a training micro-batch's 4,096 (about
// 256), with the 32 × 32 warps and with the few-row warps. It reports
// microseconds a call and the experts' weight bytes over that time
// ("weight GB/s": each expert's weights are read once per 64-row tile of
// its rows, once at 256 tokens, about 4 times at 4,096); on a GPU only.
//
//	tools/gpu/bin/cuda.test -test.run '^$' -test.bench DeviceExperts
func BenchmarkDeviceExperts(b *testing.B) {
	d := benchDevice(b)
	const E, k, H, I = 128, 8, 2048, 768
	r := rand.New(rand.NewPCG(4, 4))
	// random fills n bf16 values with a repeated 8 MiB pattern of random
	// ones (the tensor cores' power, and so their clock, depends on the
	// data: zeros would flatter them).
	pattern := make([]uint16, 1<<22)
	for i := range pattern {
		pattern[i] = uint16(kernels.BF16FromFloat32(float32(r.NormFloat64())))
	}
	random := func(n int) Buffer {
		n += n & 1 // whole words
		buf, err := d.Alloc(int64(2 * n))
		if err != nil {
			b.Fatal(err)
		}
		for at := 0; at < n; at += len(pattern) {
			if err := Upload(d, buf.Floats(at/2, min(len(pattern), n-at)/2), pattern[:min(len(pattern), n-at)]); err != nil {
				b.Fatal(err)
			}
		}
		return buf
	}
	for _, tokens := range []int{256, 4096} {
		pairs := tokens * k
		ids := make([]int32, pairs) // k distinct experts a token
		for t := 0; t < tokens; t++ {
			for s, e := range r.Perm(E)[:k] {
				ids[t*k+s] = int32(e)
			}
		}
		ops := NewOps(d)
		gr := &MoEGroups{}
		spans := gr.Layout(pairs, E)
		for _, s := range spans {
			*s.B = benchBuf(b, d, make([]int32, max(s.Words, 1)))
		}
		bids := benchBuf(b, d, ids)
		if err := ops.MoEGroup(gr, bids, pairs, k); err != nil {
			b.Fatal(err)
		}
		for _, p := range []struct {
			what string
			N, K int
		}{{"gate+up", 2 * I, H}, {"down", H, I}} {
			w, x := random(E*p.N*p.K), random(pairs*p.K)
			y, err := d.Alloc(int64(pairs * p.N * 4))
			if err != nil {
				b.Fatal(err)
			}
			for _, few := range []int8{-1, 1} {
				ops.groupedFew = few
				warps := "32x32 warps"
				if few > 0 {
					warps = "few-row warps"
				}
				b.Run(fmt.Sprintf("%s %d tokens %s", p.what, tokens, warps), func(b *testing.B) {
					timeDevice(b, d, func() error {
						return ops.GemmGroupedBF16(gr, pairs, y, x, w, p.N, p.K, p.K, p.N, p.N*p.K, false)
					})
					per := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(1e6*per, "us/call")
					b.ReportMetric(float64(E*p.N*p.K*2)/per/1e9, "weight_GB/s")
				})
			}
			for _, buf := range []Buffer{w, x, y} {
				d.Free(buf)
			}
		}
		d.Free(bids)
		for _, s := range spans {
			d.Free(*s.B)
		}
	}
}

// BenchmarkDeviceDraw times a decoding step's draws at 256 rows of
// Qwen3's 151,936-token vocabulary, from log-probabilities (draw_rows:
// the exact rollout's) and from logits (draw_rows_raw: the reduced
// precisions'): full sampling (every RL recipe's), top-k 50, top-p 0.9,
// and top-p 0.9 with 20 top log-probabilities (what `keel serve` is
// asked); the full draw from logits also a block a row against the split
// draw (the rollout's), at 256 and 64 rows. It reports microseconds a
// step; on a GPU only.
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
		if c.what != "full" {
			continue
		}
		// The full draw from the logits split over blocks of
		// DrawChunkTokens (given scratch: the rollout's), and both at 64
		// rows, where a block a row leaves half of an H100's
		// multiprocessors idle.
		split := dr
		split.Scratch = benchBuf(b, d, make([]float32, DrawScratchFloats(rows, V)))
		ops.DrawSplitAlways = true // at every row count: the rule is what these rows time
		for _, n := range []int{rows, 64} {
			for _, dd := range []Draws{dr, split} {
				name := fmt.Sprintf("logits full, %d rows", n)
				if dd.Scratch.Ptr != 0 {
					name += ", split"
				}
				b.Run(name, func(b *testing.B) {
					timeDevice(b, d, func() error { return ops.DrawRowsRaw(dd, braw, n, V) })
					b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e6, "us/step")
				})
			}
		}
		ops.DrawSplitAlways = false
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

// BenchmarkDeviceFlash times flash.cu on the Qwen3-0.6B shape's attention
// (16 query heads, 8 KV heads of 128), causal over packed sequences, 8 of
// 2,048 tokens and 2 of 16,384 (issue 24's rows): the forward by each of
// its three kernels and the backward by its pipelined and one-stage
// kernels, with the dK/dV pass's 32-query tiles and from stored dS
// (StoreScores: D's pass, the dK/dV pass storing dS, the dQ pass reading
// it), from q's, k's, v's and dO's bf16 copies as the training engine
// gives them. It reports TFLOP/s of the causal attention: the forward
// 4·hd·heads·Σ L(L+1)/2, the backward 2.5 times that.
//
//	tools/gpu/bin/cuda.test -test.run '^$' -test.bench DeviceFlash
func BenchmarkDeviceFlash(b *testing.B) {
	d := benchDevice(b)
	const heads, kv, hd = 16, 8, 128
	qd, kvd := heads*hd, kv*hd
	scale := float32(1 / math.Sqrt(hd))
	r := rand.New(rand.NewPCG(3, 3))
	random := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	for _, c := range []struct{ seqs, L int }{{8, 2048}, {2, 16384}} {
		lens := make([]int, c.seqs)
		for i := range lens {
			lens[i] = c.L
		}
		_, T, seqStart, seqEnd := packSeqs(lens)
		ops := NewOps(d)
		bq, bk, bv := benchBuf(b, d, random(T*qd)), benchBuf(b, d, random(T*kvd)), benchBuf(b, d, random(T*kvd))
		bdo, bst, ben := benchBuf(b, d, random(T*qd)), benchBuf(b, d, seqStart), benchBuf(b, d, seqEnd)
		copy16 := func(src Buffer, width int) Buffer {
			buf, err := d.Alloc(int64(FlashPad(T) * width * 2))
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Zero(buf); err != nil {
				b.Fatal(err)
			}
			if err := ops.ToBF16(buf, src, T*width); err != nil {
				b.Fatal(err)
			}
			return buf
		}
		q16, k16, v16, do16 := copy16(bq, qd), copy16(bk, kvd), copy16(bv, kvd), copy16(bdo, qd)
		scratch := func(backward bool) *FlashScratch {
			s, err := NewFlashScratchGivenQKV(d, T, heads, kv, hd, false)
			if backward {
				s, err = NewFlashBackwardGiven(d, T, heads, kv, hd)
			}
			if err != nil {
				b.Fatal(err)
			}
			if err := s.UseQKV(q16, k16, v16); err != nil {
				b.Fatal(err)
			}
			if backward {
				if err := s.UseDO(do16); err != nil {
					b.Fatal(err)
				}
			}
			return s
		}
		fs, bs := scratch(false), scratch(true)
		out16, lse, dsum := benchBuf(b, d, make([]bf16x, T*qd)), benchBuf(b, d, make([]float32, T*heads)), benchBuf(b, d, make([]float32, T*heads))
		dq, dk, dv16 := benchBuf(b, d, make([]float32, T*qd)), benchBuf(b, d, make([]float32, T*kvd)), benchBuf(b, d, make([]bf16x, T*kvd))
		var causal float64 // Σ L(L+1)/2 over the sequences
		for _, l := range lens {
			causal += float64(l) * float64(l+1) / 2
		}
		fwd := 4 * hd * heads * causal
		shape := fmt.Sprintf("%d x %d", c.seqs, c.L)
		ord, err := FlashOrder(seqEnd)
		if err != nil {
			b.Fatal(err)
		}
		bord := benchBuf(b, d, ord)
		// "ordered": the tiles in FlashOrder's order (UseOrder, the training
		// engine's default), against each sequence's from its last.
		for _, v := range []struct {
			name                          string
			wide, wideQ                   bool
			single, dkvWide, back, stored bool
			ordered                       bool
		}{{"forward narrow", false, false, false, false, false, false, false}, {"forward wide", true, false, false, false, false, false, false},
			{"forward wideq", false, true, false, false, false, false, false}, {"forward wideq ordered", false, true, false, false, false, false, true},
			{"forward wideq ordered headwise", false, true, false, false, false, false, true},
			{"backward pipelined", false, true, false, false, true, false, false},
			{"backward one-stage", false, true, true, false, true, false, false}, {"backward dkv 32-query tiles", false, true, false, true, true, false, false},
			{"backward dkv 32-query tiles ordered", false, true, false, true, true, false, true},
			{"backward dkv 32-query tiles ordered headwise", false, true, false, true, true, false, true},
			{"backward stored dS", false, true, false, true, true, true, false}, {"backward stored dS ordered", false, true, false, true, true, true, true}} {
			o := NewOps(d)
			o.FlashWide, o.FlashWideQ, o.FlashBackwardSingle, o.FlashDKVWide = v.wide, v.wideQ, v.single, v.dkvWide
			o.FlashOrderHeadwise = strings.HasSuffix(v.name, "headwise")
			fs.order, bs.order = Buffer{}, Buffer{}
			if v.ordered {
				if err := fs.UseOrder(bord); err != nil {
					b.Fatal(err)
				}
				if err := bs.UseOrder(bord); err != nil {
					b.Fatal(err)
				}
			}
			if v.stored {
				if err := bs.StoreScores(seqEnd); err != nil {
					b.Fatal(err)
				}
			}
			f, flops := func() error { return o.FlashAttention(fs, out16, lse, Buffer{}, Buffer{}, Buffer{}, bst, scale) }, fwd
			if v.back {
				if err := f(); err != nil { // the backward's out16 and lse
					b.Fatal(err)
				}
				f = func() error {
					return o.FlashAttentionBackward(bs, dq, dk, dv16, dsum, Buffer{}, out16, lse, Buffer{}, Buffer{}, Buffer{}, bst, ben, scale)
				}
				flops *= 2.5
			}
			b.Run(shape+" "+v.name, func(b *testing.B) {
				timeDevice(b, d, f)
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
				b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e3, "ms/call")
			})
			bs.freeScores()
		}
		fs.Free()
		bs.Free()
		for _, buf := range []Buffer{bq, bk, bv, bdo, bst, ben, bord, q16, k16, v16, do16, out16, lse, dsum, dq, dk, dv16} {
			d.Free(buf)
		}
	}
}

// bf16x is a bf16 element's room in a benchmark's buffer.
type bf16x uint16
