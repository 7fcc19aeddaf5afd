package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-rl/keel/kernels"
)

// gemmRef is C = (acc ? C : 0) + A·B in float64 with the strides of
// gemm_f32, and per element the bound a float32 sum of those K products
// (and C) may be off by: K·2⁻²³·Σ|terms|, a few times the worst case of
// rounding each of the K steps.
func gemmRef(c, a, b []float32, M, N, K int, sam, sak, sbk, sbn, ldc int, acc bool) (out []float32, bound []float64) {
	out = append([]float32(nil), c...)
	bound = make([]float64, len(c))
	for m := 0; m < M; m++ {
		for n := 0; n < N; n++ {
			var s, abs float64
			for k := 0; k < K; k++ {
				p := float64(a[m*sam+k*sak]) * float64(b[k*sbk+n*sbn])
				s += p
				abs += math.Abs(p)
			}
			if acc {
				s += float64(c[m*ldc+n])
				abs += math.Abs(float64(c[m*ldc+n]))
			}
			out[m*ldc+n] = float32(s)
			bound[m*ldc+n] = float64(K+1)*0x1p-23*abs + 1e-30
		}
	}
	return out, bound
}

// withinBound checks every element of got against want within its bound.
func withinBound(t *testing.T, what string, got, want []float32, bound []float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= bound[i]) {
			t.Fatalf("%s[%d] = %g, want %g (bound %.3g)", what, i, got[i], want[i], bound[i])
		}
	}
}

// gemm runs the product through Ops.Gemm (which picks the tile size by
// shape).
func (g *gpu) gemm(c, a, b Buffer, M, N, K, sam, sak, sbk, sbn, ldc int, acc bool) {
	g.t.Helper()
	if err := NewOps(g.d).Gemm(c, a, b, M, N, K, sam, sak, sbk, sbn, ldc, acc); err != nil {
		g.t.Fatal(err)
	}
	if err := g.d.Sync(); err != nil {
		g.t.Fatal(err)
	}
}

// gemmKernel runs one of the two GEMM kernels by name, whatever the shape.
func (g *gpu) gemmKernel(name string, tile int, c, a, b Buffer, M, N, K, sam, sak, sbk, sbn, ldc int) {
	g.t.Helper()
	g.launch2D("gemm.cu", name, Dim3{X: (N + tile - 1) / tile, Y: (M + tile - 1) / tile}, 256,
		c, a, b, M, N, K, int64(sam), int64(sak), int64(sbk), int64(sbn), int64(ldc), 0)
}

// TestDeviceGemm checks the three products of a linear layer on odd
// shapes against float64, and batch invariance: rows computed alone are
// the same bits as inside a larger M.
func TestDeviceGemm(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(8, 8))
	for _, s := range []struct{ M, N, K int }{{1, 1, 1}, {1, 7, 129}, {70, 33, 65}, {130, 200, 1000}, {3, 4096, 16}, {300, 260, 77}} {
		M, N, K := s.M, s.N, s.K
		x, w, dy := randF32(r, M*K, 1), randF32(r, N*K, 1), randF32(r, M*N, 1)
		bx, bw, bdy := bufOf(g, x), bufOf(g, w), bufOf(g, dy)
		name := fmt.Sprintf("%dx%dx%d", M, N, K)

		y := g.poisoned(M * N)
		g.gemm(y, bx, bw, M, N, K, K, 1, 1, K, N, false)
		want, bound := gemmRef(make([]float32, M*N), x, w, M, N, K, K, 1, 1, K, N, false)
		withinBound(t, name+" forward", g.f32(y, M*N), want, bound)

		dx := g.poisoned(M * K)
		g.gemm(dx, bdy, bw, M, K, N, N, 1, K, 1, K, false)
		want, bound = gemmRef(make([]float32, M*K), dy, w, M, K, N, N, 1, K, 1, K, false)
		withinBound(t, name+" input grad", g.f32(dx, M*K), want, bound)

		dw0 := randF32(r, N*K, 1)
		dw := bufOf(g, dw0)
		g.gemm(dw, bdy, bx, N, K, M, 1, N, K, 1, K, true)
		want, bound = gemmRef(dw0, dy, x, N, K, M, 1, N, K, 1, K, true)
		withinBound(t, name+" weight grad", g.f32(dw, N*K), want, bound)

		// The three kernels, whatever Ops would choose: the same bits, in
		// the three layouts (each loads its tiles along its own contiguous
		// index).
		for _, l := range []struct {
			what                        string
			a, b                        Buffer
			m, n, k, sam, sak, sbk, sbn int
		}{{"forward", bx, bw, M, N, K, K, 1, 1, K}, {"input grad", bdy, bw, M, K, N, N, 1, K, 1}, {"weight grad", bdy, bx, N, K, M, 1, N, K, 1}} {
			c32, c64, c128 := g.poisoned(l.m*l.n), g.poisoned(l.m*l.n), g.poisoned(l.m*l.n)
			g.gemmKernel("gemm_f32_32", 32, c32, l.a, l.b, l.m, l.n, l.k, l.sam, l.sak, l.sbk, l.sbn, l.n)
			g.gemmKernel("gemm_f32", 64, c64, l.a, l.b, l.m, l.n, l.k, l.sam, l.sak, l.sbk, l.sbn, l.n)
			g.gemmKernel("gemm_f32_128", 128, c128, l.a, l.b, l.m, l.n, l.k, l.sam, l.sak, l.sbk, l.sbn, l.n)
			sameBits(t, name+" "+l.what+": 128-tile kernel against the 64-tile one", g.f32(c128, l.m*l.n), g.f32(c64, l.m*l.n))
			sameBits(t, name+" "+l.what+": 32-tile kernel against the 64-tile one", g.f32(c32, l.m*l.n), g.f32(c64, l.m*l.n))
			if l.sak == 1 && l.sbk == 1 { // the forward's layout's own kernels; the strides they do not read poisoned
				f32, f64 := g.poisoned(l.m*l.n), g.poisoned(l.m*l.n)
				g.gemmKernel("gemm_f32_32_fwd", 32, f32, l.a, l.b, l.m, l.n, l.k, l.sam, -7, -7, l.sbn, l.n)
				g.gemmKernel("gemm_f32_fwd", 64, f64, l.a, l.b, l.m, l.n, l.k, l.sam, -7, -7, l.sbn, l.n)
				sameBits(t, name+" "+l.what+": 32-tile forward kernel against the 64-tile one", g.f32(f32, l.m*l.n), g.f32(c64, l.m*l.n))
				sameBits(t, name+" "+l.what+": 64-tile forward kernel against the 64-tile one", g.f32(f64, l.m*l.n), g.f32(c64, l.m*l.n))
			}
		}
		if M > 1 {
			all := g.f32(y, M*N)
			last := bufOf(g, x[(M-1)*K:])
			y1 := g.poisoned(N)
			g.gemm(y1, last, bw, 1, N, K, K, 1, 1, K, N, false)
			sameBits(t, name+" last row alone", g.f32(y1, N), all[(M-1)*N:])
		}
	}
}

// attnRef is causal GQA attention in float64 over packed sequences, with
// its backward for the upstream gradient dout.
func attnRef(q, k, v, dout []float32, starts, lens []int, heads, kv, hd int) (out, dq, dk, dv []float64) {
	T := 0
	for _, l := range lens {
		T += l
	}
	qd, kvd, group := heads*hd, kv*hd, heads/kv
	scale := 1 / math.Sqrt(float64(hd))
	out, dq = make([]float64, T*qd), make([]float64, T*qd)
	dk, dv = make([]float64, T*kvd), make([]float64, T*kvd)
	for s, st := range starts {
		for h := 0; h < heads; h++ {
			g := h / group
			for i := st; i < st+lens[s]; i++ {
				n := i - st + 1
				p := make([]float64, n)
				mx := math.Inf(-1)
				for j := 0; j < n; j++ {
					var d float64
					for e := 0; e < hd; e++ {
						d += float64(q[i*qd+h*hd+e]) * float64(k[(st+j)*kvd+g*hd+e])
					}
					p[j] = d * scale
					mx = math.Max(mx, p[j])
				}
				var z float64
				for j := range p {
					p[j] = math.Exp(p[j] - mx)
					z += p[j]
				}
				dp := make([]float64, n)
				var D float64
				for j := range p {
					p[j] /= z
					for e := 0; e < hd; e++ {
						out[i*qd+h*hd+e] += p[j] * float64(v[(st+j)*kvd+g*hd+e])
						dp[j] += float64(dout[i*qd+h*hd+e]) * float64(v[(st+j)*kvd+g*hd+e])
					}
				}
				for j := range p {
					D += p[j] * dp[j]
				}
				for j := range p {
					ds := p[j] * (dp[j] - D) * scale
					for e := 0; e < hd; e++ {
						dq[i*qd+h*hd+e] += ds * float64(k[(st+j)*kvd+g*hd+e])
						dk[(st+j)*kvd+g*hd+e] += ds * float64(q[i*qd+h*hd+e])
						dv[(st+j)*kvd+g*hd+e] += p[j] * float64(dout[i*qd+h*hd+e])
					}
				}
			}
		}
	}
	return
}

// packSeqs lays sequences of lens tokens one after another: each one's
// first row, the rows, and every row's sequence start and end.
func packSeqs(lens []int) (starts []int, T int, seqStart, seqEnd []int32) {
	for _, l := range lens {
		starts = append(starts, T)
		for i := 0; i < l; i++ {
			seqStart = append(seqStart, int32(T))
			seqEnd = append(seqEnd, int32(T+l))
		}
		T += l
	}
	return starts, T, seqStart, seqEnd
}

// bf16Buf is a device buffer of x rounded to bf16, as the CPU kernels
// round.
func bf16Buf(g *gpu, x []float32) Buffer {
	b := make([]kernels.BF16, len(x))
	kernels.ToBF16(b, x)
	u := make([]uint16, len(b))
	for i, v := range b {
		u[i] = uint16(v)
	}
	return bufOf(g, u)
}

// roundBF16 is x rounded to bf16 and back, as the CPU kernels round.
func roundBF16(x []float32) []float32 {
	b := make([]kernels.BF16, len(x))
	kernels.ToBF16(b, x)
	y := make([]float32, len(x))
	kernels.FromBF16(y, b)
	return y
}

func f64to32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

func TestDeviceAttention(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(9, 9))
	for _, c := range []struct {
		lens          []int
		heads, kv, hd int
	}{{[]int{1}, 1, 1, 2}, {[]int{5, 1, 40}, 4, 2, 32}, {[]int{70, 3}, 16, 8, 128}, {[]int{9}, 6, 3, 256},
		// Groups of 8, 5 and 9 query heads a KV head: the decoding
		// step's grouped kernels (up to 8), and the per-head one past.
		{[]int{33, 2}, 8, 1, 64}, {[]int{17}, 10, 2, 32}, {[]int{4}, 9, 1, 16},
		// The fast decoding's other groups and head sizes.
		{[]int{6, 13}, 4, 1, 128}, {[]int{9, 4}, 2, 2, 64}, {[]int{7, 3}, 8, 2, 32}, {[]int{5}, 16, 2, 128},
		{[]int{6}, 4, 2, 64}} {
		starts, T, seqStart, seqEnd := packSeqs(c.lens)
		qd, kvd := c.heads*c.hd, c.kv*c.hd
		q, k, v, dout := randF32(r, T*qd, 1), randF32(r, T*kvd, 1), randF32(r, T*kvd, 1), randF32(r, T*qd, 1)
		out, dq, dk, dv := attnRef(q, k, v, dout, starts, c.lens, c.heads, c.kv, c.hd)
		bq, bk, bv, bdo := bufOf(g, q), bufOf(g, k), bufOf(g, v), bufOf(g, dout)
		bst, ben := bufOf(g, seqStart), bufOf(g, seqEnd)
		bout, blse := g.poisoned(T*qd), g.poisoned(T*c.heads)
		scale := float32(1 / math.Sqrt(float64(c.hd)))
		launch2 := func(fn string, y int, args ...any) {
			m, err := g.d.Module("attn.cu")
			if err != nil {
				t.Fatal(err)
			}
			f, err := m.Function(fn)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Launch(Dim3{X: T, Y: (y + 3) / 4}, Dim3{X: 128}, 0, args...); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatalf("%s: %v", fn, err)
			}
		}
		// The training engine's tiled kernel (through Ops), against
		// float64, and bit for bit against the per-row kernel and the
		// rollout's decoding step over a KV cache holding the same rows.
		// The grouped decoding kernels are the reference the fast ones
		// (the default) are checked against below.
		ops := NewOps(g.d)
		ops.DecodeFast = false
		if err := ops.Attention(bout, blse, bq, bk, bv, bst, T, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("attention %v", c)
		tiled := g.f32(bout, T*qd)
		closeTo(t, name+" out", tiled, f64to32(out), 1e-5)
		rowOut, rowLse := g.poisoned(T*qd), g.poisoned(T*c.heads)
		launch2("attn_fwd", c.heads, rowOut, rowLse, bq, bk, bv, bst, c.heads, c.kv, c.hd, scale)
		sameBits(t, name+" tiled against per-row", tiled, g.f32(rowOut, T*qd))
		sameBits(t, name+" tiled against per-row lse", g.f32(blse, T*c.heads), g.f32(rowLse, T*c.heads))
		// The decoding step: sequence s in slot s, its rows at positions
		// 0..len-1, all attending at once.
		maxLen := 0
		for _, l := range c.lens {
			maxLen = max(maxLen, l)
		}
		var slot, pos []int32
		for s, l := range c.lens {
			for i := 0; i < l; i++ {
				slot, pos = append(slot, int32(s)), append(pos, int32(i))
			}
		}
		kcache, vcache := g.poisoned(len(c.lens)*maxLen*kvd), g.poisoned(len(c.lens)*maxLen*kvd)
		bslot, bpos := bufOf(g, slot), bufOf(g, pos)
		dec := g.poisoned(T * qd)
		if err := ops.KVStore(kcache, vcache, bk, bv, bslot, bpos, T, maxLen, kvd); err != nil {
			t.Fatal(err)
		}
		if err := ops.AttnDecode(dec, bq, kcache, vcache, bslot, bpos, T, maxLen, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		sameBits(t, name+" tiled against decoding", tiled, g.f32(dec, T*qd))
		// The bf16 cache: decoding over it is decoding over a float32
		// cache of the bf16-rounded keys and values, bit for bit.
		kc16 := bufOf(g, make([]uint16, len(c.lens)*maxLen*kvd))
		vc16 := bufOf(g, make([]uint16, len(c.lens)*maxLen*kvd))
		dec16, decRounded := g.poisoned(T*qd), g.poisoned(T*qd)
		if err := ops.KVStoreBF16(kc16, vc16, bk, bv, bslot, bpos, T, maxLen, kvd, kvd); err != nil {
			t.Fatal(err)
		}
		if err := ops.AttnDecodeBF16(dec16, bq, kc16, vc16, bslot, bpos, T, maxLen, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := ops.KVStore(kcache, vcache, bufOf(g, roundBF16(k)), bufOf(g, roundBF16(v)), bslot, bpos, T, maxLen, kvd); err != nil {
			t.Fatal(err)
		}
		if err := ops.AttnDecode(decRounded, bq, kcache, vcache, bslot, bpos, T, maxLen, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		sameBits(t, name+" bf16 cache against rounded float32 cache", g.f32(dec16, T*qd), g.f32(decRounded, T*qd))
		// A warp per query head (KEEL_DECODE_ATTN=head) against the
		// grouped kernels: the same bits, over both caches, and with the
		// output rounded to bf16.
		perHead := NewOps(g.d)
		perHead.DecodePerHead, perHead.DecodeFast = true, false
		ph, ph16, g16, p16 := g.poisoned(T*qd), g.poisoned(T*qd), g.poisoned(T*qd), g.poisoned(T*qd)
		if err := perHead.AttnDecode(ph, bq, kcache, vcache, bslot, bpos, T, maxLen, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := perHead.AttnDecodeBF16(ph16, bq, kc16, vc16, bslot, bpos, T, maxLen, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := ops.AttnDecodeBF16To16(g16, bq, kc16, vc16, bslot, bpos, T, maxLen, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := perHead.AttnDecodeBF16To16(p16, bq, kc16, vc16, bslot, bpos, T, maxLen, c.heads, c.kv, c.hd, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		sameBits(t, name+" decoding, grouped against per head", g.f32(decRounded, T*qd), g.f32(ph, T*qd))
		sameBits(t, name+" bf16 decoding, grouped against per head", g.f32(dec16, T*qd), g.f32(ph16, T*qd))
		sameBits(t, name+" bf16 decoding to bf16, grouped against per head", g.f32(g16, (T*qd+1)/2), g.f32(p16, (T*qd+1)/2))
		// Keys split into runs (flash-decoding, the reduced precisions'):
		// within float32 rounding of the unsplit kernel, runs of one key
		// and empty runs included; its bf16 output is its float32 output
		// rounded; a padding row gets zeros.
		padSlot := append([]int32(nil), slot...)
		padSlot[T-1] = -1
		bpad := bufOf(g, padSlot)
		want16 := g.f32(dec16, T*qd)
		// decodeSplit runs o's bf16 decoding with each row's keys in
		// splits runs, into float32 and into bf16, and checks it within tol
		// of the unsplit grouped kernels, the padding row zeros, its bf16
		// output its float32 output rounded.
		decodeSplit := func(o *Ops, splits int, tol float64, what string) {
			part := g.poisoned(T * splits * c.heads * (c.hd + 2))
			sp, sp16 := g.poisoned(T*qd), g.poisoned(T*qd)
			if err := o.AttnDecodeBF16Split(false, sp, part, bq, kc16, vc16, bpad, bpos, T, maxLen, c.heads, c.kv, c.hd, scale, splits); err != nil {
				t.Fatal(err)
			}
			if err := o.AttnDecodeBF16Split(true, sp16, part, bq, kc16, vc16, bpad, bpos, T, maxLen, c.heads, c.kv, c.hd, scale, splits); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			got := g.f32(sp, T*qd)
			closeTo(t, what, got[:(T-1)*qd], want16[:(T-1)*qd], tol)
			for i, v := range got[(T-1)*qd:] {
				if v != 0 {
					t.Fatalf("%s: the padding row's output %d is %v", what, i, v)
				}
			}
			w16 := make([]kernels.BF16, T*qd)
			kernels.ToBF16(w16, got)
			for i, v := range g.u16(sp16, T*qd) {
				if v != uint16(w16[i]) {
					t.Fatalf("%s: bf16 output %d is %#04x, the float32 output rounded %#04x", what, i, v, uint16(w16[i]))
				}
			}
		}
		for _, o := range []*Ops{ops, perHead} {
			for _, splits := range []int{2, 3, 16} {
				decodeSplit(o, splits, 2e-6, fmt.Sprintf("%s bf16 decoding in %d splits (per head %v)", name, splits, o.DecodePerHead))
			}
		}
		if splits := ops.DecodeSplits(T, c.heads, c.kv); splits < 1 || splits > 16 || T*splits*c.heads*(c.hd+2) > DecodeSplitFloats(T, c.heads, c.kv, c.hd) && splits > 1 {
			t.Errorf("%s: %d splits for %d rows, scratch for %d floats", name, splits, T, DecodeSplitFloats(T, c.heads, c.kv, c.hd))
		}
		// The fast kernels (the default; head sizes 32, 64 and 128),
		// grouped and a warp per head: within float32 rounding of the
		// grouped kernels' bf16 decoding (every row's prefix, 1 to 70 keys:
		// each tail of their four-key steps), split and not, their bf16
		// output their float32 output rounded, a padding row zeros.
		if c.hd == 32 || c.hd == 64 || c.hd == 128 {
			for _, perHead := range []bool{false, true} {
				fast := NewOps(g.d)
				fast.DecodeFast, fast.DecodePerHead = true, perHead
				if k, _ := fast.decodeKernel("attn_decode_bf16", c.heads, c.kv, c.hd); !strings.HasPrefix(k, "attn_decode_fast") && fastDecode(c.hd, c.heads/c.kv) {
					t.Fatalf("%s: the fast decoding asked for, %s launched", name, k)
				}
				for _, splits := range []int{1, 2, 3, 16} {
					decodeSplit(fast, splits, 1e-5, fmt.Sprintf("%s fast bf16 decoding in %d splits (per head %v)", name, splits, perHead))
				}
				if c.hd < 64 {
					continue
				}
				// The deep kernels (eight keys' rows in flight, head sizes
				// 64 and 128): the fast kernels' bits, split and not, into
				// float32 and bf16, a padding row among them.
				deep := NewOps(g.d)
				deep.DecodeFast, deep.DecodeDeep, deep.DecodePerHead = true, true, perHead
				if k, _ := deep.decodeKernel("attn_decode_bf16", c.heads, c.kv, c.hd); !strings.HasPrefix(k, "attn_decode_deep") {
					t.Fatalf("%s: the deep decoding asked for, %s launched", name, k)
				}
				run := func(o *Ops, splits int) ([]float32, []float32) {
					part := g.poisoned(T * splits * c.heads * (c.hd + 2))
					sp, sp16 := g.poisoned(T*qd), g.poisoned(T*qd)
					for _, out16 := range []bool{false, true} {
						out := sp
						if out16 {
							out = sp16
						}
						if err := o.AttnDecodeBF16Split(out16, out, part, bq, kc16, vc16, bpad, bpos, T, maxLen, c.heads, c.kv, c.hd, scale, splits); err != nil {
							t.Fatal(err)
						}
					}
					if err := g.d.Sync(); err != nil {
						t.Fatal(err)
					}
					return g.f32(sp, T*qd), g.f32(sp16, (T*qd+1)/2)
				}
				for _, splits := range []int{1, 2, 3, 16} {
					f32, f16 := run(fast, splits)
					d32, d16 := run(deep, splits)
					what := fmt.Sprintf("%s deep against fast bf16 decoding in %d splits (per head %v)", name, splits, perHead)
					sameBits(t, what, d32, f32)
					sameBits(t, what+" to bf16", d16, f16)
				}
			}
		}
		bdq, bdsum := g.poisoned(T*qd), g.poisoned(T*c.heads)
		bdk, bdv := g.poisoned(T*kvd), g.poisoned(T*kvd)
		launch2("attn_bwd_q", c.heads, bdq, bdsum, bdo, bout, blse, bq, bk, bv, bst, c.heads, c.kv, c.hd, scale)
		launch2("attn_bwd_kv", c.kv, bdk, bdv, bdo, blse, bdsum, bq, bk, bv, ben, c.heads, c.kv, c.hd, scale)
		closeTo(t, name+" dq", g.f32(bdq, T*qd), f64to32(dq), 1e-4)
		closeTo(t, name+" dk", g.f32(bdk, T*kvd), f64to32(dk), 1e-4)
		closeTo(t, name+" dv", g.f32(bdv, T*kvd), f64to32(dv), 1e-4)
	}
}

// TestDeviceFlashAttention: the tensor-core attention of the bf16 mode
// (its output rounded to bf16) and its backward against float64 over the
// bf16-rounded inputs (the kernels
// round q, k, v and dO as they load them), on packed sequences that share
// and cross tiles, every head size it is built for, and grouped heads.
// What remains is P and dS rounded to bf16 before their products and
// float32 sums: well under 1e-2 of each output's norm. The tiles' copies
// through cp.async and through plain loads give the same bits.
func TestDeviceFlashAttention(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(11, 3))
	// The narrow forward is the reference the other two are compared with,
	// whatever KEEL_FLASH_FWD says.
	narrow := func() *Ops {
		o := NewOps(g.d)
		o.FlashWide, o.FlashWideQ, o.FlashDKVWide = false, false, false
		return o
	}
	ops := narrow()
	for _, c := range []struct {
		lens          []int
		heads, kv, hd int
	}{{[]int{1}, 1, 1, 32}, {[]int{5, 1, 40}, 4, 2, 32}, {[]int{70, 3}, 4, 2, 128}, {[]int{130, 64, 1, 9}, 6, 3, 64}, {[]int{200}, 2, 1, 128}} {
		starts, T, seqStart, seqEnd := packSeqs(c.lens)
		qd, kvd := c.heads*c.hd, c.kv*c.hd
		q, k, v, dout := randF32(r, T*qd, 1), randF32(r, T*kvd, 1), randF32(r, T*kvd, 1), randF32(r, T*qd, 1)
		out, dq, dk, dv := attnRef(roundBF16(q), roundBF16(k), roundBF16(v), roundBF16(dout), starts, c.lens, c.heads, c.kv, c.hd)
		bq, bk, bv, bdo := bufOf(g, q), bufOf(g, k), bufOf(g, v), bufOf(g, dout)
		bst, ben := bufOf(g, seqStart), bufOf(g, seqEnd)
		bout, blse, bdsum := g.poisoned(T*qd), g.poisoned(T*c.heads), g.poisoned(T*c.heads)
		bdq, bdk, bdv := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd)
		scale := float32(1 / math.Sqrt(float64(c.hd)))
		fs, err := NewFlashScratch(g.d, T, c.heads, c.kv, c.hd, false)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := NewFlashScratch(g.d, T, c.heads, c.kv, c.hd, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := ops.FlashAttention(fs, bout, blse, bq, bk, bv, bst, scale); err != nil {
			t.Fatal(err)
		}
		if err := ops.FlashAttentionBackward(fs, bdq, bdk, bdv, bdsum, bdo, bout, blse, bq, bk, bv, bst, ben, scale); err == nil {
			t.Error("a backward with a forward's scratch was accepted")
		}
		if err := ops.FlashAttention(bs, bout, blse, bq, bk, bv, bst, scale); err == nil {
			t.Error("a forward with a backward's scratch was accepted")
		}
		if err := ops.FlashAttentionBackward(bs, bdq, bdk, bdv, bdsum, bdo, bout, blse, bq, bk, bv, bst, ben, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("flash attention %v", c)
		// The same with plain copies instead of cp.async: the same bytes
		// reach shared memory, so the same bits come out.
		plain := narrow()
		plain.FlashPlainCopies = !ops.FlashPlainCopies
		pout, plse, pdsum := g.poisoned(T*qd), g.poisoned(T*c.heads), g.poisoned(T*c.heads)
		pdq, pdk, pdv := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd)
		if err := plain.FlashAttention(fs, pout, plse, bq, bk, bv, bst, scale); err != nil {
			t.Fatal(err)
		}
		if err := plain.FlashAttentionBackward(bs, pdq, pdk, pdv, pdsum, bdo, pout, plse, bq, bk, bv, bst, ben, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		for _, x := range []struct {
			what string
			a, b Buffer
			n    int
		}{{"out", bout, pout, (T*qd + 1) / 2}, {"lse", blse, plse, T * c.heads}, {"dq", bdq, pdq, T * qd}, {"dk", bdk, pdk, T * kvd}, {"dv (bf16)", bdv, pdv, (T*kvd + 1) / 2}} {
			sameBits(t, fmt.Sprintf("%s %s, cp.async %v against %v", name, x.what, !ops.FlashPlainCopies, !plain.FlashPlainCopies), g.f32(x.a, x.n), g.f32(x.b, x.n))
		}
		// With q's and k's bf16 copies given (the training engine's, made by
		// NormRopeBF16, padded with zero rows): the same bits.
		gq, gk := g.poisoned(FlashPad(T)*qd/2), g.poisoned(FlashPad(T)*kvd/2)
		for _, z := range []Buffer{gq, gk} {
			if err := g.d.Zero(z); err != nil {
				t.Fatal(err)
			}
		}
		if err := ops.ToBF16(gq, bq, T*qd); err != nil {
			t.Fatal(err)
		}
		if err := ops.ToBF16(gk, bk, T*kvd); err != nil {
			t.Fatal(err)
		}
		gfs, err := NewFlashScratchGivenQK(g.d, T, c.heads, c.kv, c.hd, false)
		if err != nil {
			t.Fatal(err)
		}
		gbs, err := NewFlashScratchGivenQK(g.d, T, c.heads, c.kv, c.hd, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := ops.FlashAttention(gfs, g.poisoned(T*qd), g.poisoned(T*c.heads), bq, bk, bv, bst, scale); err == nil {
			t.Error("a given-q/k scratch without its copies (UseQK) was accepted")
		}
		gout, glse, gdsum := g.poisoned(T*qd), g.poisoned(T*c.heads), g.poisoned(T*c.heads)
		gdq, gdk, gdv := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd)
		for _, s := range []*FlashScratch{gfs, gbs} {
			if err := s.UseQK(gq, gk); err != nil {
				t.Fatal(err)
			}
		}
		if err := ops.FlashAttention(gfs, gout, glse, Buffer{}, Buffer{}, bv, bst, scale); err != nil {
			t.Fatal(err)
		}
		if err := ops.FlashAttentionBackward(gbs, gdq, gdk, gdv, gdsum, bdo, gout, glse, Buffer{}, Buffer{}, bv, bst, ben, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := gfs.UseQKV(gq, gk, gq); err == nil {
			t.Error("UseQKV on a scratch that makes its own copy of v was accepted")
		}
		gfs.Free()
		gbs.Free()
		for _, x := range []struct {
			what string
			a, b Buffer
			n    int
		}{{"out", bout, gout, (T*qd + 1) / 2}, {"lse", blse, glse, T * c.heads}, {"dq", bdq, gdq, T * qd}, {"dk", bdk, gdk, T * kvd}, {"dv (bf16)", bdv, gdv, (T*kvd + 1) / 2}} {
			sameBits(t, fmt.Sprintf("%s %s, q and k copies given", name, x.what), g.f32(x.b, x.n), g.f32(x.a, x.n))
		}
		// With v's bf16 copy given too (the bf16 mode's v product writes
		// it, [FlashPad(T), kv·hd] with zero pad rows): the forward's and
		// the backward's row-major v are it, the same bits.
		gv := g.poisoned(FlashPad(T) * kvd / 2)
		if err := g.d.Zero(gv); err != nil {
			t.Fatal(err)
		}
		if err := ops.ToBF16(gv, bv, T*kvd); err != nil {
			t.Fatal(err)
		}
		vfs, err := NewFlashScratchGivenQKV(g.d, T, c.heads, c.kv, c.hd, false)
		if err != nil {
			t.Fatal(err)
		}
		vbs, err := NewFlashScratchGivenQKV(g.d, T, c.heads, c.kv, c.hd, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := vfs.UseQK(gq, gk); err != nil {
			t.Fatal(err)
		}
		if err := ops.FlashAttention(vfs, g.poisoned(T*qd), g.poisoned(T*c.heads), Buffer{}, Buffer{}, bv, bst, scale); err == nil {
			t.Error("a given-v scratch without its copy of v (UseQKV) was accepted")
		}
		if err := vfs.UseQKV(gq, gk, Buffer{Ptr: gv.Ptr, Size: int64(T * kvd * 2)}); err == nil && FlashPad(T) > T {
			t.Error("UseQKV took a copy of v without its pad rows")
		}
		vout, vlse, vdsum := g.poisoned(T*qd), g.poisoned(T*c.heads), g.poisoned(T*c.heads)
		vdq, vdk, vdv := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd)
		for _, s := range []*FlashScratch{vfs, vbs} {
			if err := s.UseQKV(gq, gk, gv); err != nil {
				t.Fatal(err)
			}
		}
		if err := ops.FlashAttention(vfs, vout, vlse, Buffer{}, Buffer{}, Buffer{}, bst, scale); err != nil {
			t.Fatal(err)
		}
		if err := ops.FlashAttentionBackward(vbs, vdq, vdk, vdv, vdsum, bdo, vout, vlse, Buffer{}, Buffer{}, Buffer{}, bst, ben, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		vfs.Free()
		vbs.Free()
		for _, x := range []struct {
			what string
			a, b Buffer
			n    int
		}{{"out", bout, vout, (T*qd + 1) / 2}, {"lse", blse, vlse, T * c.heads}, {"dq", bdq, vdq, T * qd}, {"dk", bdk, vdk, T * kvd}, {"dv (bf16)", bdv, vdv, (T*kvd + 1) / 2}} {
			sameBits(t, fmt.Sprintf("%s %s, q, k and v copies given", name, x.what), g.f32(x.b, x.n), g.f32(x.a, x.n))
		}
		// With dO's bf16 copy given as well (the bf16 mode's o product
		// writes it, rounding its float32 sums once): no dO of the
		// backward's own, the same bits, the two passes and stored dS.
		gdo := g.poisoned(FlashPad(T) * qd / 2)
		if err := g.d.Zero(gdo); err != nil {
			t.Fatal(err)
		}
		if err := ops.ToBF16(gdo, bdo, T*qd); err != nil {
			t.Fatal(err)
		}
		if err := bs.UseDO(gdo); err == nil {
			t.Error("UseDO on a scratch that makes its own copy of dO was accepted")
		}
		for _, stored := range []bool{false, true} {
			dbs, err := NewFlashBackwardGiven(g.d, T, c.heads, c.kv, c.hd)
			if err != nil {
				t.Fatal(err)
			}
			if err := dbs.UseQKV(gq, gk, gv); err != nil {
				t.Fatal(err)
			}
			ddq, ddk, ddv, ddsum := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd), g.poisoned(T*c.heads)
			if err := ops.FlashAttentionBackward(dbs, ddq, ddk, ddv, ddsum, Buffer{}, bout, blse, Buffer{}, Buffer{}, Buffer{}, bst, ben, scale); err == nil {
				t.Error("a given-dO backward without its copy (UseDO) was accepted")
			}
			if err := dbs.UseDO(Buffer{Ptr: gdo.Ptr, Size: int64(T * qd * 2)}); err == nil && FlashPad(T) > T {
				t.Error("UseDO took a copy of dO without its pad rows")
			}
			if err := dbs.UseDO(gdo); err != nil {
				t.Fatal(err)
			}
			if stored {
				if err := dbs.StoreScores(seqEnd); err != nil {
					t.Fatal(err)
				}
			}
			if err := ops.FlashAttentionBackward(dbs, ddq, ddk, ddv, ddsum, Buffer{}, bout, blse, Buffer{}, Buffer{}, Buffer{}, bst, ben, scale); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			dbs.Free()
			for _, x := range []struct {
				what string
				a, b Buffer
				n    int
			}{{"dsum", bdsum, ddsum, T * c.heads}, {"dq", bdq, ddq, T * qd}, {"dk", bdk, ddk, T * kvd}, {"dv (bf16)", bdv, ddv, (T*kvd + 1) / 2}} {
				sameBits(t, fmt.Sprintf("%s %s, q, k, v and dO copies given (stored dS %v)", name, x.what, stored), g.f32(x.a, x.n), g.f32(x.b, x.n))
			}
		}
		// v as a column span of wider rows (UseQKVRows: the training
		// engine's q, k and v in one matrix), dv16 written so too: the
		// same bits, nothing written outside dv's columns.
		{
			ld, off, pad := qd+kvd+2*c.hd, qd, FlashPad(T)
			v16 := g.u16(gv, pad*kvd)
			wide := make([]uint16, pad*ld)
			for r := 0; r < pad; r++ {
				copy(wide[r*ld+off:r*ld+off+kvd], v16[r*kvd:(r+1)*kvd])
			}
			bwide := bufOf(g, wide)
			vspan := BF16Rows(bwide, off, pad*ld-off)
			wfs, err := NewFlashScratchGivenQKV(g.d, T, c.heads, c.kv, c.hd, false)
			if err != nil {
				t.Fatal(err)
			}
			wbs, err := NewFlashBackwardGiven(g.d, T, c.heads, c.kv, c.hd)
			if err != nil {
				t.Fatal(err)
			}
			if err := wfs.UseQKVRows(gq, gk, vspan, kvd-1); err == nil {
				t.Error("UseQKVRows took rows narrower than v")
			}
			if err := wfs.UseQKVRows(gq, gk, BF16Rows(bwide, off, (pad-1)*ld), ld); err == nil {
				t.Error("UseQKVRows took a span short of the last row")
			}
			for _, s := range []*FlashScratch{wfs, wbs} {
				if err := s.UseQKVRows(gq, gk, vspan, ld); err != nil {
					t.Fatal(err)
				}
			}
			if err := wbs.UseDO(gdo); err != nil {
				t.Fatal(err)
			}
			wout, wlse, wdsum := g.poisoned(T*qd), g.poisoned(T*c.heads), g.poisoned(T*c.heads)
			wdq, wdk := g.poisoned(T*qd), g.poisoned(T*kvd)
			wdv := g.poisoned((T*ld + 1) / 2)
			before := g.u16(wdv, T*ld)
			if err := ops.FlashAttention(wfs, wout, wlse, Buffer{}, Buffer{}, Buffer{}, bst, scale); err != nil {
				t.Fatal(err)
			}
			if err := ops.FlashAttentionBackward(wbs, wdq, wdk, BF16Rows(wdv, off, T*ld-off), wdsum, Buffer{}, wout, wlse, Buffer{}, Buffer{}, Buffer{}, bst, ben, scale); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			wfs.Free()
			wbs.Free()
			for _, x := range []struct {
				what string
				a, b Buffer
				n    int
			}{{"out", bout, wout, (T*qd + 1) / 2}, {"lse", blse, wlse, T * c.heads}, {"dq", bdq, wdq, T * qd}, {"dk", bdk, wdk, T * kvd}} {
				sameBits(t, fmt.Sprintf("%s %s, v's rows %d apart", name, x.what, ld), g.f32(x.a, x.n), g.f32(x.b, x.n))
			}
			got, want := g.u16(wdv, T*ld), g.u16(bdv, T*kvd)
			for r := 0; r < T; r++ {
				for j := 0; j < ld; j++ {
					w := before[r*ld+j]
					if j >= off && j < off+kvd {
						w = want[r*kvd+j-off]
					}
					if got[r*ld+j] != w {
						t.Fatalf("%s dv, rows %d apart: row %d column %d: %#04x, want %#04x", name, ld, r, j, got[r*ld+j], w)
					}
				}
			}
		}
		// The backward with one stage of shared memory (each tile's copy
		// waited for before its products), both copy paths: the same
		// arithmetic in the same order as the pipelined kernels, so the
		// same bits.
		if ops.FlashBackwardSingle {
			t.Fatal("KEEL_FLASH_BWD=single: the test compares the pipelined backward with the single-stage one")
		}
		// sameBackward runs o's backward and checks it against the default
		// pipelined one's, bit for bit.
		sameBackward := func(o *Ops, what string) {
			sdq, sdk, sdv, sdsum := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd), g.poisoned(T*c.heads)
			if err := o.FlashAttentionBackward(bs, sdq, sdk, sdv, sdsum, bdo, bout, blse, bq, bk, bv, bst, ben, scale); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			for _, x := range []struct {
				what string
				a, b Buffer
				n    int
			}{{"dsum", bdsum, sdsum, T * c.heads}, {"dq", bdq, sdq, T * qd}, {"dk", bdk, sdk, T * kvd}, {"dv (bf16)", bdv, sdv, (T*kvd + 1) / 2}} {
				sameBits(t, fmt.Sprintf("%s %s, %s", name, x.what, what), g.f32(x.a, x.n), g.f32(x.b, x.n))
			}
		}
		for _, plainCopies := range []bool{false, true} {
			single := narrow()
			single.FlashBackwardSingle, single.FlashPlainCopies = true, plainCopies
			sameBackward(single, fmt.Sprintf("pipelined backward against one stage (plain copies %v)", plainCopies))
		}
		// The dK/dV pass with 32-query tiles (K from shared memory at head
		// size 128), both copy paths: the same products in the same order,
		// so the same bits.
		for _, plainCopies := range []bool{false, true} {
			wkv := narrow()
			wkv.FlashDKVWide, wkv.FlashPlainCopies = true, plainCopies
			if !wkv.fitsShared(flashBackwardShared(c.hd, true, true)) {
				t.Logf("sm_%d: no room for the 32-query dK/dV pass's shared memory at head size %d (TestFlashSharedFallback checks the fallback)", g.d.Arch, c.hd)
				break
			}
			sameBackward(wkv, fmt.Sprintf("dK/dV 32-query tiles against 16 (plain copies %v)", plainCopies))
		}
		// The backward from stored dS (StoreScores, FlashDQStored), both
		// copy paths: D's pass, the dK/dV pass storing dS and the dQ pass
		// reading it give the two passes' bits. dS's tiles start as NaN,
		// so a tile the dQ pass reads but the dK/dV pass did not write
		// shows.
		for _, plainCopies := range []bool{false, true} {
			so := narrow()
			so.FlashPlainCopies = plainCopies
			if !so.fitsShared(flashBackwardShared(c.hd, true, true)) {
				t.Logf("sm_%d: no room for the 32-query dK/dV pass, which stores dS, at head size %d", g.d.Arch, c.hd)
				break
			}
			if err := bs.StoreScores(seqEnd); err != nil {
				t.Fatal(err)
			}
			nan := make([]uint32, bs.ds.Size/4)
			for i := range nan {
				nan[i] = 0x7fc00000 | 0x7fc0
			}
			if err := Upload(g.d, bs.ds, nan); err != nil {
				t.Fatal(err)
			}
			sameBackward(so, fmt.Sprintf("stored dS (plain copies %v)", plainCopies))
			bs.freeScores()
		}
		// The tiles in FlashOrder's order (UseOrder): which block takes a
		// tile changes, not the tile's arithmetic, so each forward and
		// backward gives its bits without the order. The outputs start as
		// NaN: a tile no block took shows.
		{
			ord, err := FlashOrder(seqEnd)
			if err != nil {
				t.Fatal(err)
			}
			bord := bufOf(g, ord)
			ofs, err := NewFlashScratch(g.d, T, c.heads, c.kv, c.hd, false)
			if err != nil {
				t.Fatal(err)
			}
			obs, err := NewFlashScratch(g.d, T, c.heads, c.kv, c.hd, true)
			if err != nil {
				t.Fatal(err)
			}
			if err := ofs.UseOrder(Buffer{Ptr: bord.Ptr, Size: bord.Size - 4}); err == nil {
				t.Error("UseOrder took an order short of its last tile")
			}
			for _, s := range []*FlashScratch{ofs, obs} {
				if err := s.UseOrder(bord); err != nil {
					t.Fatal(err)
				}
			}
			// Each kernel with the heads one after another but for the last
			// (tail 1) or the last two, or all side by side (0: the
			// default; 2 at two heads or KV heads too).
			tails := map[string]int{"narrow": 1, "wide": 2, "wideq": 1, "two passes": 1, "32-query dK/dV": 1, "stored dS": 2, "one stage": 0}
			for _, fwd := range []string{"narrow", "wide", "wideq"} {
				o := narrow()
				o.FlashWide, o.FlashWideQ, o.FlashOrderTail = fwd == "wide", fwd == "wideq", tails[fwd]
				var outs [2][2]Buffer
				for i, s := range []*FlashScratch{fs, ofs} {
					outs[i] = [2]Buffer{g.poisoned(T * qd), g.poisoned(T * c.heads)}
					if err := o.FlashAttention(s, outs[i][0], outs[i][1], bq, bk, bv, bst, scale); err != nil {
						t.Fatal(err)
					}
				}
				if err := g.d.Sync(); err != nil {
					t.Fatal(err)
				}
				sameBits(t, fmt.Sprintf("%s %s forward's out, tiles in FlashOrder's order (tail %d)", name, fwd, tails[fwd]), g.f32(outs[1][0], (T*qd+1)/2), g.f32(outs[0][0], (T*qd+1)/2))
				sameBits(t, fmt.Sprintf("%s %s forward's lse, tiles in FlashOrder's order (tail %d)", name, fwd, tails[fwd]), g.f32(outs[1][1], T*c.heads), g.f32(outs[0][1], T*c.heads))
			}
			for _, bwd := range []string{"two passes", "32-query dK/dV", "stored dS", "one stage"} {
				o := narrow()
				o.FlashDKVWide, o.FlashOrderTail = bwd == "32-query dK/dV" || bwd == "stored dS", tails[bwd]
				o.FlashBackwardSingle = bwd == "one stage"
				if o.FlashDKVWide && !o.fitsShared(flashBackwardShared(c.hd, true, true)) {
					continue
				}
				var outs [2][4]Buffer
				for i, s := range []*FlashScratch{bs, obs} {
					if bwd == "stored dS" {
						if err := s.StoreScores(seqEnd); err != nil {
							t.Fatal(err)
						}
					}
					outs[i] = [4]Buffer{g.poisoned(T * qd), g.poisoned(T * kvd), g.poisoned(T * kvd), g.poisoned(T * c.heads)}
					if err := o.FlashAttentionBackward(s, outs[i][0], outs[i][1], outs[i][2], outs[i][3], bdo, bout, blse, bq, bk, bv, bst, ben, scale); err != nil {
						t.Fatal(err)
					}
				}
				if err := g.d.Sync(); err != nil {
					t.Fatal(err)
				}
				bs.freeScores()
				obs.freeScores()
				for k, x := range []struct {
					what string
					n    int
				}{{"dq", T * qd}, {"dk", T * kvd}, {"dv (bf16)", (T*kvd + 1) / 2}, {"dsum", T * c.heads}} {
					sameBits(t, fmt.Sprintf("%s %s %s, tiles in FlashOrder's order (tail %d)", name, bwd, x.what, tails[bwd]), g.f32(outs[1][k], x.n), g.f32(outs[0][k], x.n))
				}
			}
			ofs.Free()
			obs.Free()
		}
		// The wide forward (128 query rows a block, the next tile's copy
		// in flight), both copy paths: the same bits as each other, and
		// within rounding of the narrow one's (checked against float64
		// below, with its backward from the wide forward's lse).
		wout, wlse := g.poisoned(T*qd), g.poisoned(T*c.heads)
		for i, plainCopies := range []bool{false, true} {
			wide := narrow()
			wide.FlashWide, wide.FlashPlainCopies = true, plainCopies
			o, l := wout, wlse
			if i == 1 {
				o, l = g.poisoned(T*qd), g.poisoned(T*c.heads)
			}
			if err := wide.FlashAttention(fs, o, l, bq, bk, bv, bst, scale); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			if i == 1 {
				sameBits(t, name+" wide out, cp.async against plain copies", g.f32(o, (T*qd+1)/2), g.f32(wout, (T*qd+1)/2))
				sameBits(t, name+" wide lse, cp.async against plain copies", g.f32(l, T*c.heads), g.f32(wlse, T*c.heads))
			}
		}
		closeTo(t, name+" wide lse against narrow", g.f32(wlse, T*c.heads), g.f32(blse, T*c.heads), 1e-4)
		// The wide forward with Q in shared memory, both copy paths: where
		// it folds 64 keys at a time (head sizes 32 and 64) the narrow
		// forward's arithmetic row for row, so its bits; at head size 128
		// (16 keys at a time) within rounding, against float64 below.
		qout := g.poisoned(T * qd)
		for i, plainCopies := range []bool{false, true} {
			wq := narrow()
			wq.FlashWideQ, wq.FlashPlainCopies = true, plainCopies
			o, l := g.poisoned(T*qd), g.poisoned(T*c.heads)
			if i == 0 {
				o = qout
			}
			if err := wq.FlashAttention(fs, o, l, bq, bk, bv, bst, scale); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			what := fmt.Sprintf("%s Q in shared memory (plain copies %v)", name, plainCopies)
			if c.hd < 128 {
				sameBits(t, what+" out against narrow", g.f32(o, (T*qd+1)/2), g.f32(bout, (T*qd+1)/2))
				sameBits(t, what+" lse against narrow", g.f32(l, T*c.heads), g.f32(blse, T*c.heads))
			} else {
				closeTo(t, what+" lse against narrow", g.f32(l, T*c.heads), g.f32(blse, T*c.heads), 1e-4)
			}
			if i == 1 {
				sameBits(t, what+" out, cp.async against plain copies", g.f32(o, (T*qd+1)/2), g.f32(qout, (T*qd+1)/2))
			}
		}
		wdq, wdk, wdv := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd)
		if err := ops.FlashAttentionBackward(bs, wdq, wdk, wdv, bdsum, bdo, wout, wlse, bq, bk, bv, bst, ben, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		fs.Free()
		bs.Free()
		for _, x := range []struct {
			what string
			got  Buffer
			want []float64
			bf16 bool // the forward's output and dv, in bf16
		}{{"out", bout, out, true}, {"dq", bdq, dq, false}, {"dk", bdk, dk, false}, {"dv", bdv, dv, true},
			{"wide out", wout, out, true}, {"out, Q in shared memory", qout, out, true}, {"dq after the wide forward", wdq, dq, false}, {"dk after the wide forward", wdk, dk, false}, {"dv after the wide forward", wdv, dv, true}} {
			got := g.f32(x.got, len(x.want))
			if x.bf16 {
				got = g.bf16(x.got, len(x.want))
			}
			e := normRelErr(got, x.want)
			t.Logf("%s %s: |got - float64| / |float64| = %.2e", name, x.what, e)
			if !(e < 1e-2) {
				t.Errorf("%s %s: relative error %.3g, want under 1e-2", name, x.what, e)
			}
		}
	}
	if _, err := NewFlashScratch(g.d, 1, 4, 2, 96, false); err == nil {
		t.Error("head_dim 96 accepted: flash.cu has no kernels for it")
	}
	if _, err := NewFlashScratch(g.d, 0, 4, 2, 64, true); err == nil {
		t.Error("a scratch of no rows accepted")
	}
}

// normRelErr is |got - want| / |want| in the Euclidean norm, or |got| for
// a want of zeros (a lone token's dq); NaN (a value never written) makes
// it NaN.
func normRelErr(got []float32, want []float64) float64 {
	var d, n float64
	for i, w := range want {
		e := float64(got[i]) - w
		d += e * e
		n += w * w
	}
	if n == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / n)
}

// TestDeviceGemmBF16: cuBLASLt's bf16 products, in the three layouts of a
// linear layer (row-major X·Wᵀ, dY·W and dYᵀ·X through the column-major
// mapping the training engine uses), against float64 over the
// bf16-rounded operands.
func TestDeviceGemmBF16(t *testing.T) {
	g := newGPU(t)
	blas, err := g.d.Blas()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(10, 10))
	toBF16 := func(x []float32) Buffer { return bf16Buf(g, x) }
	for _, s := range []struct{ M, N, K int }{{1, 8, 16}, {70, 33, 64}, {256, 1024, 512}} {
		M, N, K := s.M, s.N, s.K
		x, w, dy := randF32(r, M*K, 1), randF32(r, N*K, 1), randF32(r, M*N, 1)
		xr, wr, dyr := roundBF16(x), roundBF16(w), roundBF16(dy)
		bx, bw, bdy := toBF16(x), toBF16(w), toBF16(dy)
		name := fmt.Sprintf("bf16 %dx%dx%d", M, N, K)

		// Y[M,N] = X·Wᵀ: column-major Yᶜ (N×M) = (Wᶜ)ᵀ·Xᶜ.
		y := g.poisoned(M * N)
		if err := blas.GemmBF16(true, false, N, M, K, bw, K, bx, K, y, N, false); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		want, bound := gemmRef(make([]float32, M*N), xr, wr, M, N, K, K, 1, 1, K, N, false)
		withinBound(t, name+" forward", g.f32(y, M*N), want, bound)

		// dX[M,K] += dY·W: dXᶜ (K×M) = Wᶜ·dYᶜ.
		dx0 := randF32(r, M*K, 1)
		dx := bufOf(g, dx0)
		if err := blas.GemmBF16(false, false, K, M, N, bw, K, bdy, N, dx, K, true); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		want, bound = gemmRef(dx0, dyr, wr, M, K, N, N, 1, K, 1, K, true)
		withinBound(t, name+" input grad", g.f32(dx, M*K), want, bound)

		// dW[N,K] += dYᵀ·X: dWᶜ (K×N) = Xᶜ·(dYᶜ)ᵀ.
		dw0 := randF32(r, N*K, 1)
		dw := bufOf(g, dw0)
		if err := blas.GemmBF16(false, true, K, N, M, bx, K, bdy, N, dw, K, true); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		want, bound = gemmRef(dw0, dyr, xr, N, K, M, 1, N, K, 1, K, true)
		withinBound(t, name+" weight grad", g.f32(dw, N*K), want, bound)
	}
}

// TestDeviceBF16LinearBack: BF16Linear.Back, which rounds dy once for both
// products, gives BackX's and BackW's bits, on strided operands and a
// weight inside a larger arena, accumulating into dx and dW.
func TestDeviceBF16LinearBack(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(12, 1))
	const rows, in, out, ldx, lddy, off = 37, 48, 40, 50, 41, 24
	arena := bufOf(g, randF32(r, off+out*in+8, 1))
	l, err := NewBF16Linear(NewOps(g.d), arena, off+out*in+8)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Free()
	w := arena.Floats(off, out*in)
	x, dy := bufOf(g, randF32(r, rows*ldx, 1)), bufOf(g, randF32(r, rows*lddy, 1))
	dx0, dw0 := randF32(r, rows*in, 1), randF32(r, out*in, 1)
	dx1, dw1, dx2, dw2 := bufOf(g, dx0), bufOf(g, dw0), bufOf(g, dx0), bufOf(g, dw0)
	if err := l.Back(dx1, dw1, dy, x, w, rows, in, out, in, lddy, ldx, true); err != nil {
		t.Fatal(err)
	}
	if err := l.BackX(dx2, dy, w, rows, in, out, in, lddy, true); err != nil {
		t.Fatal(err)
	}
	if err := l.BackW(dw2, dy, x, rows, in, out, lddy, ldx); err != nil {
		t.Fatal(err)
	}
	if err := g.d.Sync(); err != nil {
		t.Fatal(err)
	}
	a, b := g.f32(dx1, rows*in), g.f32(dx2, rows*in)
	if relErr := normRelErr(a, f32to64(dx0)); relErr == 0 {
		t.Fatal("Back left dx unchanged")
	}
	sameBits(t, "Back's dx against BackX's", a, b)
	sameBits(t, "Back's dW against BackW's", g.f32(dw1, out*in), g.f32(dw2, out*in))
}

// TestDeviceLinearMany: LinearMany, which rounds (bf16) or quantises (fp8,
// fp4) its input once for several weights, gives each Linear's bits (and
// the float32 Ops' too), on a strided input and outputs with their own row
// strides.
func TestDeviceLinearMany(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(13, 2))
	const rows, in, ldx = 21, 40, 44
	outs := []int{24, 8, 16}
	var mats []Matrix
	off := 4
	for _, o := range outs {
		mats = append(mats, Matrix{Off: off, Rows: o, Cols: in})
		off += o*in + 4
	}
	arena := bufOf(g, randF32(r, off, 1))
	x := bufOf(g, randF32(r, rows*ldx, 1))
	ops := NewOps(g.d)
	bl, err := NewBF16Linear(ops, arena, off)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Free()
	f8, err := NewQuantLinear(ops, arena, off, mats, FormatFP8)
	if err != nil {
		t.Fatal(err)
	}
	defer f8.Free()
	f4, err := NewQuantLinear(ops, arena, off, mats, FormatFP4)
	if err != nil {
		t.Fatal(err)
	}
	defer f4.Free()
	for _, c := range []struct {
		name string
		p    interface {
			Linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error
			LinearMany(x Buffer, rows, in, ldx int, ps ...Product) error
		}
	}{{"fp32", ops}, {"bf16", bl}, {"fp8", f8}, {"fp4", f4}} {
		var many, one []Product
		for i, m := range mats {
			ld := m.Rows + i // a row stride of its own
			w := arena.Floats(m.Off, m.Rows*in)
			many = append(many, Product{Y: g.poisoned(rows * ld), W: w, Out: m.Rows, LdY: ld})
			one = append(one, Product{Y: g.poisoned(rows * ld), W: w, Out: m.Rows, LdY: ld})
		}
		if err := c.p.LinearMany(x, rows, in, ldx, many...); err != nil {
			t.Fatal(err)
		}
		for _, p := range one {
			if err := c.p.Linear(p.Y, x, p.W, rows, in, p.Out, p.LdY, ldx); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		for i := range many {
			a, b := g.f32(many[i].Y, rows*many[i].LdY), g.f32(one[i].Y, rows*one[i].LdY)
			for r := 0; r < rows; r++ {
				for o := 0; o < many[i].Out; o++ {
					if v := a[r*many[i].LdY+o]; v != v {
						t.Fatalf("%s product %d: row %d column %d not written", c.name, i, r, o)
					}
				}
			}
			sameBits(t, fmt.Sprintf("%s product %d: LinearMany against Linear", c.name, i), a, b)
		}
	}
	if err := f8.LinearMany(x, rows, in, ldx, Product{Y: g.poisoned(rows * 8), W: arena.Floats(0, 8*in), Out: 8, LdY: 8}); err == nil {
		t.Error("fp8: a weight that is not one of the quantised matrices was accepted")
	}
	linearManyMerged(t, g, r)
}

// linearManyMerged: matrices back to back in the arena whose outputs are
// neighbouring column spans of one matrix (q, k and v of a layer) take one
// cuBLASLt product in bf16, fp8 and fp4 (mergeProducts), with each
// output what its own product gives (bit for bit on the emulator; on a
// card cuBLASLt may pick another algorithm for the wider shape, so within
// float32 rounding of the sums).
func linearManyMerged(t *testing.T, g *gpu, r *rand.Rand) {
	const rows, in, ldx = 19, 40, 44
	outs := []int{24, 8, 16}
	const ld = 24 + 8 + 16 + 3
	var mats []Matrix
	off := 4
	for _, o := range outs {
		mats = append(mats, Matrix{Off: off, Rows: o, Cols: in})
		off += o * in
	}
	arena := bufOf(g, randF32(r, off+4, 1))
	x := bufOf(g, randF32(r, rows*ldx, 1))
	ops := NewOps(g.d)
	blas, err := g.d.Blas()
	if err != nil {
		t.Fatal(err)
	}
	bl, err := NewBF16Linear(ops, arena, off+4)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Free()
	f8, err := NewQuantLinear(ops, arena, off+4, mats, FormatFP8)
	if err != nil {
		t.Fatal(err)
	}
	defer f8.Free()
	f4, err := NewQuantLinear(ops, arena, off+4, mats, FormatFP4)
	if err != nil {
		t.Fatal(err)
	}
	defer f4.Free()
	calls := func() int64 {
		blas.mu.Lock()
		defer blas.mu.Unlock()
		return blas.calls
	}
	for _, c := range []struct {
		name string
		p    interface {
			Linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error
			LinearMany(x Buffer, rows, in, ldx int, ps ...Product) error
		}
	}{{"bf16", bl}, {"fp8", f8}, {"fp4", f4}} {
		y := g.poisoned(rows * ld)
		var many []Product
		col := 0
		for _, m := range mats {
			many = append(many, Product{Y: y.Floats(col, rows*ld-col), W: arena.Floats(m.Off, m.Rows*in), Out: m.Rows, LdY: ld})
			col += m.Rows
		}
		before := calls()
		if err := c.p.LinearMany(x, rows, in, ldx, many...); err != nil {
			t.Fatal(err)
		}
		if n := calls() - before; n != 1 {
			t.Errorf("%s: q, k and v back to back took %d products, want 1", c.name, n)
		}
		got := g.f32(y, rows*ld)
		col = 0
		for i, m := range mats {
			one := g.poisoned(rows * m.Rows)
			if err := c.p.Linear(one, x, many[i].W, rows, in, m.Rows, m.Rows, ldx); err != nil {
				t.Fatal(err)
			}
			want := g.f32(one, rows*m.Rows)
			for r := range rows {
				for o := range m.Rows {
					a, b := got[r*ld+col+o], want[r*m.Rows+o]
					if d := math.Abs(float64(a) - float64(b)); !(d <= 1e-5*(1+math.Abs(float64(b)))) {
						t.Fatalf("%s: matrix %d row %d column %d: %v merged, %v alone", c.name, i, r, o, a, b)
					}
				}
			}
			col += m.Rows
		}
		for r := range rows {
			for o := col; o < ld; o++ {
				if v := got[r*ld+o]; v == v {
					t.Fatalf("%s: row %d column %d, past the outputs, written", c.name, r, o)
				}
			}
		}
	}
}

func f32to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// TestDeviceFP8 checks the fp8 emulation: the per-row e4m3 quantisation is
// kernels.QuantizeE4M3Rows' bit for bit (values and scales, across
// magnitudes that reach the subnormal and saturating paths, an all-zero
// row and a row with a NaN), and QuantLinear's product is the product of
// the quantised operands, scaled, within float32 summation error.
func TestDeviceFP8(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(13, 13))
	const rows, cols, ld = 9, 300, 310
	src := make([]float32, rows*ld)
	for i := range src {
		src[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(30)-15))
	}
	for j := 0; j < cols; j++ {
		src[3*ld+j] = 0 // an all-zero row
	}
	src[5*ld+7] = float32(math.NaN())
	// Row 6: its largest magnitude is 448·2⁻³, so its scale is 2⁻³ and
	// x/scale is exact: ties and edges of the e4m3 grid, in scale units
	// (each with its rounding): 1.0625 → 1 and 1.1875 → 1.25 (ties to
	// even), 3·2⁻¹⁰ → 2⁻⁸ and 15·2⁻¹⁰ → 2⁻⁶ (subnormal ties, the second
	// into the normal range), 400 → 384 and 432 → 448, -0, a float32
	// subnormal.
	edges := []float32{448, 1.0625, 1.1875, 3 * 0x1p-10, 15 * 0x1p-10, 400, 432, float32(math.Copysign(0, -1)), 0x1p-140, -1.0625}
	for j := range cols {
		src[6*ld+j] = 0
	}
	for j, v := range edges {
		src[6*ld+j] = v * 0x1p-3
	}
	dst := bufOf(g, make([]uint16, rows*cols))
	sc := bufOf(g, make([]float32, rows)) // not NaN: a row whose scale is NaN must write it
	ops := NewOps(g.d)
	if err := ops.QuantE4M3Rows(dst, sc, bufOf(g, src), rows, cols, ld); err != nil {
		t.Fatal(err)
	}
	if err := g.d.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]uint16, rows*cols)
	if err := Download(g.d, got, dst); err != nil {
		t.Fatal(err)
	}
	gotS := g.f32(sc, rows)
	want, wantS := make([]kernels.BF16, rows*cols), make([]float32, rows)
	kernels.QuantizeE4M3Rows(want, wantS, src, rows, cols, ld)
	for i := range want {
		w := uint16(want[i])
		nan := w&0x7f80 == 0x7f80 && w&0x7f != 0
		if got[i] != w && !(nan && got[i]&0x7f80 == 0x7f80 && got[i]&0x7f != 0) {
			t.Fatalf("e4m3 value %d: %#x, want %#x", i, got[i], w)
		}
	}
	for i := range wantS {
		if math.Float32bits(gotS[i]) != math.Float32bits(wantS[i]) && !(math.IsNaN(float64(gotS[i])) && math.IsNaN(float64(wantS[i]))) {
			t.Fatalf("scale of row %d: %v, want %v", i, gotS[i], wantS[i])
		}
	}
	for j, w := range []float32{448, 1, 1.25, 0x1p-8, 0x1p-6, 384, 448} {
		var b [1]kernels.BF16
		kernels.ToBF16(b[:], []float32{w})
		if got[6*cols+j] != uint16(b[0]) {
			t.Errorf("edge %d (%v): %#x, want %v", j, edges[j], got[6*cols+j], w)
		}
	}
	if wantS[6] != 0x1p-3 {
		t.Errorf("the edge row's scale is %v, not 2⁻³: the test's premise is wrong", wantS[6])
	}
	// The same values as e4m3 bytes (quant_e4m3_rows8, the float8
	// product's operand), and every e4m3 value's bf16 back to its byte
	// (bf16_e4m3), NaN to S.1111.111.
	codes := bufOf(g, make([]uint8, rows*cols))
	if err := ops.Launch("convert.cu", "quant_e4m3_rows8", Dim3{X: rows}, block256, codes, sc, bufOf(g, src), cols, int64(ld)); err != nil {
		t.Fatal(err)
	}
	gotCodes := make([]uint8, rows*cols)
	if err := Download(g.d, gotCodes, codes); err != nil {
		t.Fatal(err)
	}
	for i, c := range gotCodes {
		v := e4m3Value(c)
		var b [1]kernels.BF16
		kernels.ToBF16(b[:], []float32{v})
		nan := got[i]&0x7f80 == 0x7f80 && got[i]&0x7f != 0
		if nan != (c&0x7f == 0x7f) || !nan && uint16(b[0]) != got[i] {
			t.Fatalf("e4m3 byte %d: %#x (%v), the bf16 copy %#x", i, c, v, got[i])
		}
	}
	all := make([]uint16, 256)
	for c := range all {
		var b [1]kernels.BF16
		kernels.ToBF16(b[:], []float32{e4m3Value(uint8(c))})
		all[c] = uint16(b[0])
	}
	back := bufOf(g, make([]uint8, 256))
	if err := ops.Launch("convert.cu", "bf16_e4m3", elemGrid(256), block256, back, bufOf(g, all), int64(256)); err != nil {
		t.Fatal(err)
	}
	gotBack := make([]uint8, 256)
	if err := Download(g.d, gotBack, back); err != nil {
		t.Fatal(err)
	}
	for c, b := range gotBack {
		if want := uint8(c); b != want && !(c&0x7f == 0x7f && b == want) {
			t.Fatalf("e4m3 %#x (%v) through bf16: %#x", c, e4m3Value(uint8(c)), b)
		}
	}

	// The product: y = X·Wᵀ for a weight W [out, in] inside an arena.
	// The product y = X·Wᵀ for a weight W [out, in] inside an arena, with
	// X's rows wider than in and y's wider than out (as for gate and up);
	// then the weights change and Stale makes the next product use them.
	// Emulated on the bf16 product, and (KEEL_FP8_GEMM=1) on cuBLASLt's
	// float8 product where the card has one: the same numbers but for how
	// the sums are added (on the emulator, the same bits). The float8
	// product's shape keeps cuBLASLt's rules for it (16-byte rows); the
	// emulated one also runs a shape that breaks them.
	x := randF32(r, 37*100, 1)
	bx := bufOf(g, x)
	for _, c := range []struct {
		n, ldy int
		fp8    []bool
	}{{70, 75, []bool{false}}, {80, 84, []bool{false, true}}} {
		w0, w1 := randF32(r, c.n*96, 0.05), randF32(r, c.n*96, 0.05)
		var emulated [2][]float32
		for _, fp8 := range c.fp8 {
			t.Setenv("KEEL_FP8_GEMM", map[bool]string{false: "0", true: "1"}[fp8])
			testQuantLinearFP8(t, g, ops, x, bx, c.n, c.ldy, w0, w1, fp8, &emulated)
		}
	}
	// A shape cuBLASLt's float8 product refuses (a leading dimension of 24
	// bytes, as the emulator holds the library to its rules): emulated,
	// with the same results, the other shapes still on float8.
	if g.d.Emulated {
		const M, N, K = 5, 8, 24
		x, w := randF32(r, M*K, 1), randF32(r, N*K, 0.1)
		ba := bufOf(g, w)
		y := [2]Buffer{g.poisoned(M * N), g.poisoned(M * N)}
		for i, env := range []string{"0", "1"} {
			t.Setenv("KEEL_FP8_GEMM", env)
			fl, err := NewQuantLinear(ops, ba, len(w), []Matrix{{Off: 0, Rows: N, Cols: K}}, FormatFP8)
			if err != nil {
				t.Fatal(err)
			}
			if err := fl.Linear(y[i], bufOf(g, x), ba, M, K, N, N, K); err != nil {
				t.Fatal(err)
			}
			if want := i; fl.Refused() != want {
				t.Errorf("KEEL_FP8_GEMM=%s: %d shapes refused, want %d", env, fl.Refused(), want)
			}
			fl.Free()
		}
		sameBits(t, "a refused float8 shape, emulated", g.f32(y[1], M*N), g.f32(y[0], M*N))
	}
}

// testQuantLinearFP8 is TestDeviceFP8's product y = X·Wᵀ, 37 rows of 96
// inputs (X's rows 100 apart) to n outputs (y's rows ldy apart), W w0 and
// then w1 after Stale; fp8 says whether KEEL_FP8_GEMM is set. emulated
// holds the emulated products' outputs, which the float8 ones match bit
// for bit on the emulator; on a card they are held to the float32 bound
// widened for the tensor cores' float8 sums (some 14 bits, moved into
// float32 every so often: 2^10 times float32's rounding).
func testQuantLinearFP8(t *testing.T, g *gpu, ops *Ops, x []float32, bx Buffer, N, ldy int, w0, w1 []float32, fp8 bool, emulated *[2][]float32) {
	const M, K, ldx = 37, 96, 100
	w := w0
	arena := append(make([]float32, 5), w...) // the weight at offset 5
	ba := bufOf(g, arena)
	fl, err := NewQuantLinear(ops, ba, len(arena), []Matrix{{Off: 5, Rows: N, Cols: K}}, FormatFP8)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Free()
	for round := 0; round < 2; round++ {
		if round == 1 {
			w = w1
			if err := Upload(g.d, ba.Floats(5, N*K), w); err != nil {
				t.Fatal(err)
			}
			fl.Stale()
		}
		y := g.poisoned(M * ldy)
		if err := fl.Linear(y, bx, ba.Floats(5, N*K), M, K, N, ldy, ldx); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		qx, sx := make([]kernels.BF16, M*K), make([]float32, M)
		qw, sw := make([]kernels.BF16, N*K), make([]float32, N)
		kernels.QuantizeE4M3Rows(qx, sx, x, M, K, ldx)
		kernels.QuantizeE4M3Rows(qw, sw, w, N, K, K)
		fx, fw := make([]float32, M*K), make([]float32, N*K)
		kernels.FromBF16(fx, qx)
		kernels.FromBF16(fw, qw)
		ref, bound := gemmRef(make([]float32, M*N), fx, fw, M, N, K, K, 1, 1, K, N, false)
		gy := g.f32(y, M*ldy)
		got := make([]float32, M*N)
		widen := 1.0
		if fl.FP8GEMM() && !g.d.Emulated {
			widen = 1024
		}
		for i := 0; i < M; i++ {
			copy(got[i*N:(i+1)*N], gy[i*ldy:])
			for j := 0; j < N; j++ {
				ref[i*N+j] = float32(float64(ref[i*N+j]) * float64(sw[j]) * float64(sx[i]))
				bound[i*N+j] = widen*bound[i*N+j]*float64(sx[i])*float64(sw[j]) + 4*0x1p-24*math.Abs(float64(ref[i*N+j]))
			}
		}
		withinBound(t, fmt.Sprintf("fp8 product %d×%d (float8 GEMM %v), round %d", N, K, fl.FP8GEMM(), round), got, ref, bound)
		if want := fp8 && g.d.Arch >= 89; fl.FP8GEMM() != want {
			t.Fatalf("KEEL_FP8_GEMM %v on sm_%d: float8 products %v", fp8, g.d.Arch, fl.FP8GEMM())
		}
		if fl.Refused() != 0 {
			t.Errorf("cuBLASLt has no float8 product of %d outputs from %d inputs (rows %d floats apart)", N, K, ldy)
		}
		if !fp8 {
			emulated[round] = got
		} else if g.d.Emulated {
			sameBits(t, fmt.Sprintf("the float8 product against the emulated one, round %d", round), got, emulated[round])
		}
	}
	if fp8 {
		t.Logf("float8 products on sm_%d: %v, %d shapes refused", g.d.Arch, fl.FP8GEMM(), fl.Refused())
	}
}

// e4m3Value widens a float8 e4m3 byte: 4 exponent bits (bias 7), 3
// mantissa bits, subnormals below 2⁻⁶, S.1111.111 NaN.
func e4m3Value(c uint8) float32 {
	e, m := int(c>>3&15), float64(c&7)
	v := math.Ldexp(1+m/8, e-7)
	switch {
	case e == 15 && m == 7:
		v = math.NaN()
	case e == 0:
		v = math.Ldexp(m, -9)
	}
	if c&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// TestDeviceNVFP4: the fp4 weight quantiser is kernels.PackNVFP4's: the
// values it makes times the row's scale are kernels.FakeQuantNVFP4Rows'
// bit for bit, over rows of mixed magnitudes whose width is not a multiple
// of the 16-input block, an all-zero row and a row holding an Inf.
func TestDeviceNVFP4(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(14, 14))
	const rows, cols, ld = 7, 203, 210
	src := make([]float32, rows*ld)
	for i := range src {
		src[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(24)-12))
	}
	for j := 0; j < cols; j++ {
		src[2*ld+j] = 0
	}
	src[4*ld+100] = float32(math.Inf(1))
	dst := bufOf(g, make([]uint16, rows*cols))
	sc := bufOf(g, make([]float32, rows))
	if err := NewOps(g.d).Launch("convert.cu", FormatFP4, Dim3{X: rows}, block256, dst, sc, bufOf(g, src), cols, int64(ld)); err != nil {
		t.Fatal(err)
	}
	if err := g.d.Sync(); err != nil {
		t.Fatal(err)
	}
	q := make([]uint16, rows*cols)
	if err := Download(g.d, q, dst); err != nil {
		t.Fatal(err)
	}
	s := g.f32(sc, rows)
	want := append([]float32(nil), src...)
	kernels.FakeQuantNVFP4Rows(want, rows, cols, ld)
	for i := 0; i < rows; i++ {
		for j := 0; j < cols; j++ {
			got := math.Float32frombits(uint32(q[i*cols+j])<<16) * s[i]
			w := want[i*ld+j]
			if math.Float32bits(got) != math.Float32bits(w) && !(math.IsNaN(float64(got)) && math.IsNaN(float64(w))) {
				t.Fatalf("row %d col %d (%v): %v, want %v", i, j, src[i*ld+j], got, w)
			}
		}
	}
}

// TestDeviceBF16Output: a bf16 product written in bf16 (Product.Y16; the
// gate and up projections side by side, as the bf16 training mode keeps
// them) is the float32 product rounded to bf16, within one bf16 step where
// the two outputs' algorithms add in other orders (none on the emulator);
// every element written; refused where the products have no bf16 output
// or with an addend. And SwiGLU's forward and backward from a bf16 gu give
// the float32-input kernels' bits over the widened values.
func TestDeviceBF16Output(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(17, 4))
	const rows, in, n = 21, 40, 24 // n: each of the two products' outputs
	arena := bufOf(g, randF32(r, 4+2*n*in, 1))
	wg, wu := arena.Floats(4, n*in), arena.Floats(4+n*in, n*in)
	x := bufOf(g, randF32(r, rows*in, 1))
	ops := NewOps(g.d)
	bl, err := NewBF16Linear(ops, arena, 4+2*n*in)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Free()
	nan16 := make([]uint16, rows*2*n)
	for i := range nan16 {
		nan16[i] = 0x7fc1
	}
	gu16 := bufOf(g, nan16)
	if err := bl.LinearMany(x, rows, in, in, Product{Y: gu16, W: wg, Out: n, LdY: 2 * n, Y16: true},
		Product{Y: BF16Rows(gu16, n, rows*2*n-n), W: wu, Out: n, LdY: 2 * n, Y16: true}); err != nil {
		t.Fatal(err)
	}
	gu := g.poisoned(rows * 2 * n)
	if err := bl.LinearMany(x, rows, in, in, Product{Y: gu, W: wg, Out: n, LdY: 2 * n},
		Product{Y: gu.Floats(n, rows*2*n-n), W: wu, Out: n, LdY: 2 * n}); err != nil {
		t.Fatal(err)
	}
	got := make([]uint16, rows*2*n)
	if err := Download(g.d, got, gu16); err != nil {
		t.Fatal(err)
	}
	want := g.f32(gu, rows*2*n)
	steps := 0
	for i, h := range got {
		w := kernels.BF16FromFloat32(want[i])
		if h == 0x7fc1 {
			t.Fatalf("element %d (row %d, column %d) not written", i, i/(2*n), i%(2*n))
		}
		if d := int(h) - int(w); d != 0 {
			if d < -1 || d > 1 || g.d.Emulated {
				t.Fatalf("element %d: bf16 %#04x, the float32 product %g rounds to %#04x", i, h, want[i], uint16(w))
			}
			steps++
		}
	}
	t.Logf("%d of %d elements one bf16 step from the rounded float32 product", steps, len(got))
	if err := bl.LinearMany(x, rows, in, in, Product{Y: gu16, W: wg, Out: n, LdY: 2 * n, Y16: true, Add: gu}); err == nil {
		t.Error("a bf16 output with an addend was accepted")
	}
	if err := ops.LinearMany(x, rows, in, in, Product{Y: gu16, W: wg, Out: n, LdY: 2 * n, Y16: true}); err == nil {
		t.Error("the float32 products accepted a bf16 output")
	}

	// SwiGLU from the bf16 gu: the same bits as from its widened values.
	wide := make([]float32, len(got))
	for i, h := range got {
		wide[i] = kernels.BF16(h).Float32()
	}
	guw, da := bufOf(g, wide), bufOf(g, randF32(r, rows*n, 1))
	a16, a16w := bufOf(g, make([]uint16, rows*n)), bufOf(g, make([]uint16, rows*n))
	d16, d16w := bufOf(g, make([]uint16, rows*2*n)), bufOf(g, make([]uint16, rows*2*n))
	for _, err := range []error{ops.SwiGLUBF16From16(a16, gu16, rows, n), ops.SwiGLUBF16(a16w, guw, rows, n),
		ops.SwiGLUBackBF16From16(d16, da, gu16, rows, n), ops.SwiGLUBackBF16(d16w, da, guw, rows, n)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		what string
		a, b Buffer
		n    int
	}{{"SwiGLU", a16, a16w, rows * n}, {"SwiGLU's backward", d16, d16w, rows * 2 * n}} {
		x, y := make([]uint16, c.n), make([]uint16, c.n)
		if err := Download(g.d, x, c.a); err != nil {
			t.Fatal(err)
		}
		if err := Download(g.d, y, c.b); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("%s from bf16 gu, element %d: %#04x, from its widened values %#04x", c.what, i, x[i], y[i])
			}
		}
	}
	// The same over rows whose bf16 gu the kernels take two elements at a
	// time (n not a multiple of 8, or gu 4 bytes off 16-byte alignment)
	// and eight (n = 40, aligned; n = 2056, two chunks of a block's
	// threads a row).
	for _, c := range []struct{ n, off int }{{22, 0}, {40, 2}, {40, 0}, {2056, 0}} {
		const rows = 5
		h := make([]uint16, c.off+rows*2*c.n)
		wide := make([]float32, rows*2*c.n)
		for i := range wide {
			b := kernels.BF16FromFloat32(4 * (r.Float32() - 0.5))
			h[c.off+i], wide[i] = uint16(b), b.Float32()
		}
		gu16 := BF16Rows(bufOf(g, h), c.off, rows*2*c.n)
		guw, da := bufOf(g, wide), bufOf(g, randF32(r, rows*c.n, 1))
		a16, a16w := bufOf(g, make([]uint16, rows*c.n)), bufOf(g, make([]uint16, rows*c.n))
		d16, d16w := bufOf(g, make([]uint16, rows*2*c.n)), bufOf(g, make([]uint16, rows*2*c.n))
		for _, err := range []error{ops.SwiGLUBF16From16(a16, gu16, rows, c.n), ops.SwiGLUBF16(a16w, guw, rows, c.n),
			ops.SwiGLUBackBF16From16(d16, da, gu16, rows, c.n), ops.SwiGLUBackBF16(d16w, da, guw, rows, c.n)} {
			if err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(g.u16(a16, rows*c.n), g.u16(a16w, rows*c.n)) || !slices.Equal(g.u16(d16, rows*2*c.n), g.u16(d16w, rows*2*c.n)) {
			t.Fatalf("n %d, gu %d elements off: SwiGLU from bf16 gu differs from its widened values'", c.n, c.off)
		}
	}
}

// TestFlashSharedFallback: a card that gives a block less shared memory
// than the forward with Q in shared memory needs at head size 128 (sm_86
// and sm_89: 99 KiB, against 102) runs the narrow forward instead, its bits,
// and the pipelined backward, which fits (the 32-query dK/dV pass's 69
// KiB too since session 25: the same bits as the 16-query one). On keel's
// CUDA emulator as an sm_86 card; on a GPU, the attribute is read.
func TestFlashSharedFallback(t *testing.T) {
	if d := deviceForTest(t); d.SharedPerBlock < 48<<10 || (!d.Emulated && d.Arch >= 90 && d.SharedPerBlock < 227<<10) {
		t.Fatalf("%v: %d bytes of shared memory a block", d, d.SharedPerBlock)
	} else if !d.Emulated {
		return
	}
	t.Setenv("KEEL_CUDA_EMU_ARCH", "86")
	g := newGPU(t)
	if g.d.SharedPerBlock != 99<<10 || g.d.Arch != 86 {
		t.Fatalf("the emulator as sm_86: %v, %d bytes of shared memory a block", g.d, g.d.SharedPerBlock)
	}
	r := rand.New(rand.NewPCG(5, 8))
	lens, heads, kv, hd := []int{40, 90}, 2, 1, 128
	_, T, seqStart, seqEnd := packSeqs(lens)
	qd, kvd := heads*hd, kv*hd
	bq, bk, bv := bufOf(g, randF32(r, T*qd, 1)), bufOf(g, randF32(r, T*kvd, 1)), bufOf(g, randF32(r, T*kvd, 1))
	bdo, bst, ben := bufOf(g, randF32(r, T*qd, 1)), bufOf(g, seqStart), bufOf(g, seqEnd)
	scale := float32(1 / math.Sqrt(float64(hd)))
	fs, err := NewFlashScratch(g.d, T, heads, kv, hd, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Free()
	bs, err := NewFlashScratch(g.d, T, heads, kv, hd, true)
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Free()
	run := func(o *Ops) []Buffer {
		out, lse, dsum := g.poisoned(T*qd), g.poisoned(T*heads), g.poisoned(T*heads)
		dq, dk, dv := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd)
		if err := o.FlashAttention(fs, out, lse, bq, bk, bv, bst, scale); err != nil {
			t.Fatal(err)
		}
		if err := o.FlashAttentionBackward(bs, dq, dk, dv, dsum, bdo, out, lse, bq, bk, bv, bst, ben, scale); err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		return []Buffer{out, lse, dq, dk, dv}
	}
	wq := NewOps(g.d)
	wq.FlashWide, wq.FlashWideQ, wq.FlashDKVWide = false, true, true // the 32-query dK/dV pass: its 69 KiB fit
	narrow := NewOps(g.d)
	narrow.FlashWide, narrow.FlashWideQ, narrow.FlashDKVWide = false, false, false
	got, want := run(wq), run(narrow)
	for i, n := range []int{(T*qd + 1) / 2, T * heads, T * qd, T * kvd, (T*kvd + 1) / 2} {
		sameBits(t, fmt.Sprintf("output %d, Q in shared memory asked for on sm_86", i), g.f32(got[i], n), g.f32(want[i], n))
	}
}

// TestDeviceBlasTune: a plan times cuBLASLt's candidate algorithms the
// first time its product runs outside a recording and keeps one that
// runs (the emulator offers three, the third refused by cublasLtMatmul);
// a plan first used while a graph records is timed by its next product
// outside one; products of new shapes timed while another goroutine
// records do not deadlock; without KEEL_BLAS_TUNE=1 the heuristic's first
// stays. The product that is timed accumulates into its output exactly
// once (the timing writes a scratch output).
func TestDeviceBlasTune(t *testing.T) {
	t.Setenv("KEEL_BLAS_TUNE", "1")
	g := newGPU(t)
	blas, err := g.d.Blas()
	if err != nil {
		t.Fatal(err)
	}
	blas.tableDir = t.TempDir() // every shape timed here, none taken from an earlier run's table
	const M, N, K = 33, 48, 64
	r := rand.New(rand.NewPCG(14, 3))
	toBF16 := func(x []float32) Buffer { return bf16Buf(g, x) }
	xf, wf := randF32(r, M*K, 1), randF32(r, N*K, 1)
	x, w := toBF16(xf), toBF16(wf)
	// The emulator's algorithms are "keel-emu" and a number.
	emulated := false
	count := func() (tuned int64, untimed int) {
		blas.mu.Lock()
		defer blas.mu.Unlock()
		for _, p := range blas.plans {
			emulated = emulated || string(p.algo[:8]) == "keel-emu"
			if p.cands != nil {
				untimed++
			}
			if emulated && p.algo[8] == 2 {
				t.Error("a plan kept the algorithm cublasLtMatmul refuses")
			}
		}
		return blas.tuned, untimed
	}
	ops := NewOps(g.d)
	if ops.GraphsAvailable() {
		defer ops.CloseGraphs()
		y := g.poisoned(M * N)
		gr, err := ops.Capture(func() error { return ops.gemmBF16(blas, true, false, N, M, K, w, K, x, K, y, N, false) })
		if err != nil {
			t.Fatal(err)
		}
		gr.Close()
		if tuned, untimed := count(); tuned != 0 || (emulated && untimed != 1) {
			t.Fatalf("after a recording: %d plans timed, %d waiting, want 0 and 1", tuned, untimed)
		}
	}
	// The product that times the candidates accumulates into its output
	// once: Y += X·Wᵀ.
	y0 := randF32(r, M*N, 1)
	y := bufOf(g, y0)
	if err := blas.GemmBF16(true, false, N, M, K, w, K, x, K, y, N, true); err != nil {
		t.Fatal(err)
	}
	if err := g.d.Sync(); err != nil {
		t.Fatal(err)
	}
	if tuned, untimed := count(); untimed != 0 || (emulated && tuned != 1) {
		t.Fatalf("after a product: %d plans timed, %d waiting, want 1 and 0", tuned, untimed)
	}
	want, bound := gemmRef(y0, roundBF16(xf), roundBF16(wf), M, N, K, K, 1, 1, K, N, true)
	withinBound(t, "the timed product", g.f32(y, M*N), want, bound)
	// A product of a new shape while another goroutine records (an async
	// rollout beside the trainer) waits for its timing.
	if ops.GraphsAvailable() {
		recording, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		y1 := g.poisoned(M * N)
		go func() {
			gr, err := ops.Capture(func() error {
				close(recording)
				<-release
				return ops.Add(y1, y1, M*N)
			})
			if err == nil {
				gr.Close()
			}
			done <- err
		}()
		<-recording
		y2 := g.poisoned(M * N)
		err := blas.GemmBF16(true, false, N, M-1, K, w, K, x, K, y2, N, false)
		tuned, untimed := count()
		close(release)
		if err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if emulated && (tuned != 1 || untimed != 1) {
			t.Fatalf("a product beside a recording: %d plans timed, %d waiting, want 1 and 1", tuned, untimed)
		}
		if err := blas.GemmBF16(true, false, N, M-1, K, w, K, x, K, y2, N, false); err != nil {
			t.Fatal(err)
		}
		if tuned, untimed := count(); untimed != 0 || (emulated && tuned != 2) {
			t.Fatalf("after the recording: %d plans timed, %d waiting, want 2 and 0", tuned, untimed)
		}
	}

	// Products of new shapes timed while another goroutine records graphs
	// of products over and over (an async rollout's beside the trainer's,
	// through one Device): each waits for the other, neither forever. The
	// shapes are large enough that a recording starts during a timing.
	if ops.GraphsAvailable() {
		const bm, bn, bk = 96, 384, 256
		bx, bw := toBF16(randF32(r, bm*bk, 1)), toBF16(randF32(r, bn*bk, 1))
		done, timed := make(chan error, 2), make(chan struct{})
		stop := time.After(time.Minute)
		go func() {
			defer close(timed)
			for i := range 6 {
				y := g.poisoned(bm * bn)
				if err := blas.GemmBF16(true, false, bn-i, bm, bk, bw, bk, bx, bk, y, bn, false); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		go func() {
			for {
				select {
				case <-timed:
					done <- nil
					return
				default:
				}
				y := g.poisoned(M * N)
				gr, err := ops.Capture(func() error { return ops.gemmBF16(blas, true, false, N, M, K, w, K, x, K, y, N, false) })
				if err != nil {
					done <- err
					return
				}
				gr.Close()
			}
		}()
		for range 2 {
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-stop:
				// Out at once, with every goroutine's stack: a panic or
				// t.Fatal would run the deferred CloseGraphs and the
				// device's cleanup, which wait on the deadlocked ones.
				stacks := make([]byte, 1<<20)
				stacks = stacks[:runtime.Stack(stacks, true)]
				fmt.Fprintf(os.Stderr, "TestDeviceBlasTune: timing beside recordings: deadlocked\n%s", stacks)
				os.Exit(2)
			}
		}
	}

	t.Setenv("KEEL_BLAS_TUNE", "")
	g2 := newGPU(t)
	b2, err := g2.d.Blas()
	if err != nil {
		t.Fatal(err)
	}
	x2, w2, y2 := bufOf(g2, randF32(r, M*K/2, 1)), bufOf(g2, randF32(r, N*K/2, 1)), g2.poisoned(M*N)
	if err := b2.GemmBF16(true, false, N, M, K, w2, K, x2, K, y2, N, false); err != nil {
		t.Fatal(err)
	}
	if b2.tuned != 0 || len(b2.plans) != 1 {
		t.Errorf("KEEL_BLAS_TUNE unset: %d plans timed of %d", b2.tuned, len(b2.plans))
	}
}
