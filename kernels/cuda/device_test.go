package cuda

// Kernels against the CPU kernels, on the GPU. These tests skip on a
// machine without one (unless KEEL_REQUIRE_CUDA is set, as the GPU check
// script sets it) and are built here into a test binary that the GPU
// machine runs (tools/gpu/check.sh).

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"testing"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/train"
)

func deviceForTest(t *testing.T) *Device {
	t.Helper()
	d, err := Open(0)
	if err != nil {
		var le *LibraryError
		if os.Getenv("KEEL_REQUIRE_CUDA") == "" && (errors.As(err, &le) || errors.Is(err, ErrNoDevice) || errors.Is(err, ErrNoCUDA)) {
			t.Skipf("no GPU: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// gpu wraps a device for the tests: buffers from host slices, launches
// that fail the test, and results back.
type gpu struct {
	t   *testing.T
	d   *Device
	all []Buffer
}

func newGPU(t *testing.T) *gpu {
	g := &gpu{t: t, d: deviceForTest(t)}
	t.Cleanup(func() {
		for _, b := range g.all {
			g.d.Free(b)
		}
	})
	return g
}

func bufOf[T any](g *gpu, src []T) Buffer {
	g.t.Helper()
	var zero T
	size := int64(len(src)) * int64(sizeOf(zero))
	b, err := g.d.Alloc(max(size, 8))
	if err != nil {
		g.t.Fatal(err)
	}
	g.all = append(g.all, b)
	if err := Upload(g.d, b, src); err != nil {
		g.t.Fatal(err)
	}
	return b
}

func sizeOf(v any) int {
	switch v.(type) {
	case float64, int64, uint64:
		return 8
	case uint16:
		return 2
	default:
		return 4
	}
}

// poisoned is a float32 buffer of n NaNs: an element a kernel should
// write and does not stays NaN and fails the comparison.
func (g *gpu) poisoned(n int) Buffer {
	p := make([]float32, n)
	for i := range p {
		p[i] = float32(math.NaN())
	}
	return bufOf(g, p)
}

func (g *gpu) launch(module, fn string, grid, block int, args ...any) {
	g.t.Helper()
	g.launch2D(module, fn, Dim3{X: grid}, block, args...)
}

// launch2D is launch with a two-dimensional grid.
func (g *gpu) launch2D(module, fn string, grid Dim3, block int, args ...any) {
	g.t.Helper()
	m, err := g.d.Module(module)
	if err != nil {
		g.t.Fatal(err)
	}
	f, err := m.Function(fn)
	if err != nil {
		g.t.Fatal(err)
	}
	if err := f.Launch(grid, Dim3{X: block}, 0, args...); err != nil {
		g.t.Fatal(err)
	}
	if err := g.d.Sync(); err != nil {
		g.t.Fatalf("%s: %v", fn, err)
	}
}

func (g *gpu) f32(b Buffer, n int) []float32 {
	g.t.Helper()
	out := make([]float32, n)
	if err := Download(g.d, out, b); err != nil {
		g.t.Fatal(err)
	}
	return out
}

// bf16 reads n bf16 values of b, widened.
func (g *gpu) bf16(b Buffer, n int) []float32 {
	out := make([]float32, n)
	for i, v := range g.u16(b, n) {
		out[i] = kernels.BF16(v).Float32()
	}
	return out
}

func (g *gpu) u16(b Buffer, n int) []uint16 {
	g.t.Helper()
	out := make([]uint16, n)
	if err := Download(g.d, out, b); err != nil {
		g.t.Fatal(err)
	}
	return out
}

func randF32(r *rand.Rand, n int, scale float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64()) * scale
	}
	return x
}

// closeTo checks got against want elementwise: |got-want| <= tol*(1+|want|),
// NaN never passing.
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range got {
		g, w := float64(got[i]), float64(want[i])
		e := math.Abs(g-w) / (1 + math.Abs(w))
		if math.IsNaN(g) || math.IsNaN(e) {
			t.Fatalf("%s[%d] = NaN (want %g): not written?", what, i, w)
		}
		if e > worst {
			worst, at = e, i
		}
	}
	if worst > tol {
		t.Errorf("%s: error %.3g at %d (got %g, want %g) above %g", what, worst, at, got[at], want[at], tol)
	}
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %g, want %g bit for bit", what, i, got[i], want[i])
		}
	}
}

// shapes are the row lengths the row kernels are checked on: one element,
// odd sizes under and over a block, and long rows.
var shapes = []int{1, 7, 129, 1000, 4096, 5000}

// TestDeviceSumChunks: sum_chunks adds each column's chunks in its fixed
// order (each of 8 warps an eighth of the chunks in turn, the eighths in
// turn, after the output when accumulating), bit for bit against that
// order on the host, at chunk counts that take its 16-load steps and its
// remainders.
func TestDeviceSumChunks(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(4, 4))
	for _, c := range []struct{ chunks, n int }{{1, 5}, {7, 33}, {129, 64}, {200, 40}, {1000, 31}} {
		parts, prev := randF32(r, c.chunks*c.n, 1), randF32(r, c.n, 1)
		for _, acc := range []int{0, 1} {
			want := make([]float32, c.n)
			per := (c.chunks + 7) / 8
			for j := range want {
				t0 := float32(0)
				if acc == 1 {
					t0 = prev[j]
				}
				for w := 0; w < 8; w++ {
					v := float32(0)
					for k := w * per; k < min(c.chunks, (w+1)*per); k++ {
						v += parts[k*c.n+j]
					}
					t0 += v
				}
				want[j] = t0
			}
			out := bufOf(g, prev)
			g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, out, bufOf(g, parts), c.chunks, c.n, acc)
			sameBits(t, fmt.Sprintf("sum_chunks %d chunks of %d, acc %d", c.chunks, c.n, acc), g.f32(out, c.n), want)
		}
	}
}

func TestDeviceRMSNorm(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(1, 1))
	for _, n := range shapes {
		// 300 rows: 38 chunks, so every warp of sum_chunks adds some.
		for _, rows := range []int{1, 3, 70, 300} {
			if rows == 300 && n > 129 {
				continue
			}
			x, w, dy := randF32(r, rows*n, 1), randF32(r, n, 1), randF32(r, rows*n, 1)
			const eps = 1e-6
			y, inv := make([]float32, rows*n), make([]float32, rows)
			dx, dw := make([]float32, rows*n), make([]float32, n)
			for i := 0; i < rows; i++ {
				inv[i] = kernels.RMSNorm(y[i*n:(i+1)*n], x[i*n:(i+1)*n], w, eps)
				kernels.RMSNormBackward(dx[i*n:(i+1)*n], dw, dy[i*n:(i+1)*n], x[i*n:(i+1)*n], w, inv[i])
			}
			bx, bw, bdy := bufOf(g, x), bufOf(g, w), bufOf(g, dy)
			by, binv := g.poisoned(rows*n), g.poisoned(rows)
			g.launch("rows.cu", "rmsnorm_fwd", rows, 256, by, binv, bx, bw, n, 1, int64(n), float32(eps))
			name := fmt.Sprintf("rows %d × %d", rows, n)
			closeTo(t, name+" y", g.f32(by, rows*n), y, 1e-5)
			closeTo(t, name+" inv", g.f32(binv, rows), inv, 1e-6)
			chunks := (rows + NormChunk - 1) / NormChunk
			bdx, bpart, bdw := g.poisoned(rows*n), g.poisoned(chunks*n), g.poisoned(n)
			g.launch("rows.cu", "rmsnorm_bwd", chunks, 256, bdx, bpart, bdy, bx, bw, binv, rows, n, 1, int64(n), 0)
			g.launch("rows.cu", "sum_chunks", (n+31)/32, 256, bdw, bpart, chunks, n, 0)
			closeTo(t, name+" dx", g.f32(bdx, rows*n), dx, 1e-5)
			// dw sums rows terms in float32, in another order than the CPU
			// kernel's: its rounding grows with the rows.
			closeTo(t, name+" dw", g.f32(bdw, n), dw, 1e-5*max(1, float64(rows)/64))
			// Accumulating, with dx's bf16 rounding written too: dx the
			// plain kernel's bits, dx16 their rounding.
			plain, both, b16 := bufOf(g, dy), bufOf(g, dy), g.poisoned((rows*n+1)/2)
			g.launch("rows.cu", "rmsnorm_bwd", chunks, 256, plain, bpart, bdy, bx, bw, binv, rows, n, 1, int64(n), 1)
			g.launch("rows.cu", "rmsnorm_bwd_dx16", chunks, 256, both, b16, bpart, bdy, bx, bw, binv, rows, n, 1, int64(n), 1)
			got := g.f32(both, rows*n)
			sameBits(t, name+" dx alongside its bf16 copy", got, g.f32(plain, rows*n))
			want16 := make([]kernels.BF16, rows*n)
			kernels.ToBF16(want16, got)
			for i, h := range g.u16(b16, rows*n) {
				if h != uint16(want16[i]) {
					t.Fatalf("%s: dx16[%d] %#04x, dx rounded %#04x", name, i, h, uint16(want16[i]))
				}
			}
		}
	}
}

// TestDeviceRMSNormWarp: the backward of short rows a warp each (q_norm's
// and k_norm's heads) against the CPU kernel: rows alone and per head
// inside wider rows, across warps and chunks, n at its bound; in place
// (dx = dy, as the engine calls it) and accumulating into dx.
func TestDeviceRMSNormWarp(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(1, 9))
	for _, c := range []struct{ rows, n, per, stride int }{
		{1, 7, 1, 7}, {70, 129, 1, 129}, {300, 128, 1, 128}, {257, 256, 1, 256}, {16 * 40, 64, 16, 16*64 + 3}, {3 * 37, 32, 3, 3*32 + 5},
	} {
		tokens := c.rows / c.per
		x, w, dy := randF32(r, tokens*c.stride, 1), randF32(r, c.n, 1), randF32(r, tokens*c.stride, 1)
		inv := make([]float32, c.rows)
		dx, dw := make([]float32, len(dy)), make([]float32, c.n)
		at := func(row int) int { return row/c.per*c.stride + row%c.per*c.n }
		for i := 0; i < c.rows; i++ {
			o := at(i)
			inv[i] = kernels.RMSNorm(make([]float32, c.n), x[o:o+c.n], w, 1e-6)
			kernels.RMSNormBackward(dx[o:o+c.n], dw, dy[o:o+c.n], x[o:o+c.n], w, inv[i])
		}
		bx, bw, binv := bufOf(g, x), bufOf(g, w), bufOf(g, inv)
		chunks := (c.rows + 255) / 256
		name := fmt.Sprintf("%d rows of %d, %d a group of %d", c.rows, c.n, c.per, c.stride)
		for _, mode := range []string{"apart", "in place", "accumulating"} {
			bdy := bufOf(g, dy)
			bdx, a := bufOf(g, make([]float32, len(dy))), 0 // the gaps between head rows stay 0
			want := append([]float32(nil), dx...)
			switch mode {
			case "in place":
				bdx = bdy
				for i := range want { // the gaps keep dy's values
					want[i] = dy[i]
				}
				for i := 0; i < c.rows; i++ {
					copy(want[at(i):at(i)+c.n], dx[at(i):at(i)+c.n])
				}
			case "accumulating":
				pre := randF32(r, len(dy), 1)
				bdx, a = bufOf(g, pre), 1
				for i := range want {
					want[i] = pre[i]
				}
				for i := 0; i < c.rows; i++ {
					for j := 0; j < c.n; j++ {
						want[at(i)+j] += dx[at(i)+j]
					}
				}
			}
			bpart, bdw := g.poisoned(chunks*c.n), g.poisoned(c.n)
			pre := g.f32(bdx, len(dy)) // dx before, for the variant below
			g.launch("rows.cu", "rmsnorm_bwd_warp", chunks, 256, bdx, bpart, bdy, bx, bw, binv, c.rows, c.n, c.per, int64(c.stride), a)
			g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, bdw, bpart, chunks, c.n, 0)
			closeTo(t, name+" dx "+mode, g.f32(bdx, len(dy)), want, 1e-5)
			closeTo(t, name+" dw "+mode, g.f32(bdw, c.n), dw, 1e-5)
			if mode == "in place" {
				continue // dx is dy there: the variant below would read what it wrote
			}
			// With dx's bf16 rounding written too (laid out as dx; the
			// gaps untouched): dx and dw the plain kernel's bits.
			vdx, v16 := bufOf(g, pre), bufOf(g, make([]uint16, len(dy)))
			vpart, vdw := g.poisoned(chunks*c.n), g.poisoned(c.n)
			g.launch("rows.cu", "rmsnorm_bwd_warp_dx16", chunks, 256, vdx, v16, vpart, bdy, bx, bw, binv, c.rows, c.n, c.per, int64(c.stride), a)
			g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, vdw, vpart, chunks, c.n, 0)
			got := g.f32(vdx, len(dy))
			sameBits(t, name+" dx alongside its bf16 copy, "+mode, got, g.f32(bdx, len(dy)))
			sameBits(t, name+" dw alongside dx's bf16 copy, "+mode, g.f32(vdw, c.n), g.f32(bdw, c.n))
			h16 := g.u16(v16, len(dy))
			for i := 0; i < c.rows; i++ {
				for j := at(i); j < at(i)+c.n; j++ {
					if want := uint16(kernels.BF16FromFloat32(got[j])); h16[j] != want {
						t.Fatalf("%s %s: dx16[%d] %#04x, dx rounded %#04x", name, mode, j, h16[j], want)
					}
					h16[j] = 0
				}
			}
			if slices.ContainsFunc(h16, func(h uint16) bool { return h != 0 }) {
				t.Errorf("%s %s: dx16 written outside the rows", name, mode)
			}
		}
	}
}

// TestDeviceNormRopeBackBF16: norm_rope_bwd_bf16 (the bf16 mode's q and k
// backward through RoPE and the head norm, rounded for the products) is
// rope_rows with the negated sines, rmsnorm_bwd_warp in place and the
// rounding to bf16, bit for bit, the weight gradient too; per-head rows of
// several sizes (a half-row under a warp at 32), rows past a chunk's end.
func TestDeviceNormRopeBackBF16(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(3, 11))
	for _, c := range []struct{ rows, n, per int }{
		{16 * 40, 128, 16}, {8 * 33, 64, 8}, {3 * 37, 32, 3}, {1, 2, 1}, {300, 256, 1},
	} {
		stride, tokens, half := c.per*c.n, c.rows/c.per, c.n/2
		const maxPos = 50
		x, w, dy := randF32(r, tokens*stride, 1), randF32(r, c.n, 1), randF32(r, tokens*stride, 1)
		inv := make([]float32, c.rows)
		for i := range inv {
			inv[i] = 0.5 + r.Float32()
		}
		cos, nsin := randF32(r, maxPos*half, 1), randF32(r, maxPos*half, 1)
		pos := make([]int32, tokens)
		for i := range pos {
			pos[i] = int32(r.IntN(maxPos))
		}
		bx, bw, binv, bcos, bsin, bpos := bufOf(g, x), bufOf(g, w), bufOf(g, inv), bufOf(g, cos), bufOf(g, nsin), bufOf(g, pos)
		chunks := (c.rows + 255) / 256
		name := fmt.Sprintf("%d rows of %d, %d a token", c.rows, c.n, c.per)

		ref := bufOf(g, dy)
		g.launch("rows.cu", "rope_rows", tokens, 256, ref, bcos, bsin, bpos, c.per, c.n, int64(stride))
		rpart, rdw := g.poisoned(chunks*c.n), g.poisoned(c.n)
		g.launch("rows.cu", "rmsnorm_bwd_warp", chunks, 256, ref, rpart, ref, bx, bw, binv, c.rows, c.n, c.per, int64(stride), 0)
		g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, rdw, rpart, chunks, c.n, 0)
		want16 := make([]kernels.BF16, tokens*stride)
		kernels.ToBF16(want16, g.f32(ref, tokens*stride))

		bdy := bufOf(g, dy)
		b16, part, dw := g.poisoned((tokens*stride+1)/2), g.poisoned(chunks*c.n), g.poisoned(c.n)
		g.launch("rows.cu", "norm_rope_bwd_bf16", chunks, 256, b16, part, bdy, bx, bw, binv, bcos, bsin, bpos, c.rows, c.n, c.per, int64(stride), int64(stride))
		g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, dw, part, chunks, c.n, 0)
		for i, v := range g.u16(b16, tokens*stride) {
			if v != uint16(want16[i]) {
				t.Fatalf("%s: dx %d: %#04x, the three kernels' %#04x", name, i, v, uint16(want16[i]))
			}
		}
		sameBits(t, name+" dw", g.f32(dw, c.n), g.f32(rdw, c.n))
		sameBits(t, name+" dy unchanged", g.f32(bdy, len(dy)), dy)

		// With x in bf16 (the bf16 mode's q and k as their products wrote
		// them): the bits of the float32 kernel over the widened x.
		x16, xw := roundOperand(x)
		w16, wpart, wdw := g.poisoned((tokens*stride+1)/2), g.poisoned(chunks*c.n), g.poisoned(c.n)
		g.launch("rows.cu", "norm_rope_bwd_bf16", chunks, 256, w16, wpart, bdy, bufOf(g, xw), bw, binv, bcos, bsin, bpos, c.rows, c.n, c.per, int64(stride), int64(stride))
		g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, wdw, wpart, chunks, c.n, 0)
		h16, hpart, hdw := g.poisoned((tokens*stride+1)/2), g.poisoned(chunks*c.n), g.poisoned(c.n)
		g.launch("rows.cu", "norm_rope_bwd_bf16_x16", chunks, 256, h16, hpart, bdy, bufOf(g, x16), bw, binv, bcos, bsin, bpos, c.rows, c.n, c.per, int64(stride), int64(stride))
		g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, hdw, hpart, chunks, c.n, 0)
		if !slices.Equal(g.u16(h16, tokens*stride), g.u16(w16, tokens*stride)) {
			t.Errorf("%s: dx from bf16 x is not the bits of the widened x's", name)
		}
		sameBits(t, name+" dw from bf16 x", g.f32(hdw, c.n), g.f32(wdw, c.n))

		// x and dx16 as column spans of wider rows (the training engine's
		// q, k and v in one matrix, ldx apart), dy's rows stride apart:
		// the same bits, and nothing written outside the span.
		ldx := stride + 2*c.n + 2
		xs := make([]uint16, tokens*ldx)
		for tk := 0; tk < tokens; tk++ {
			copy(xs[tk*ldx+c.n:tk*ldx+c.n+stride], x16[tk*stride:(tk+1)*stride])
		}
		bxs := bufOf(g, xs)
		s16, spart, sdw := g.poisoned((tokens*ldx+1)/2), g.poisoned(chunks*c.n), g.poisoned(c.n)
		before := g.u16(s16, tokens*ldx)
		g.launch("rows.cu", "norm_rope_bwd_bf16_x16", chunks, 256, BF16Rows(s16, c.n, tokens*ldx-c.n), spart, bdy, BF16Rows(bxs, c.n, tokens*ldx-c.n),
			bw, binv, bcos, bsin, bpos, c.rows, c.n, c.per, int64(stride), int64(ldx))
		g.launch("rows.cu", "sum_chunks", (c.n+31)/32, 256, sdw, spart, chunks, c.n, 0)
		got, want := g.u16(s16, tokens*ldx), g.u16(h16, tokens*stride)
		for tk := 0; tk < tokens; tk++ {
			for j := 0; j < ldx; j++ {
				w := before[tk*ldx+j]
				if j >= c.n && j < c.n+stride {
					w = want[tk*stride+j-c.n]
				}
				if got[tk*ldx+j] != w {
					t.Fatalf("%s, rows %d apart: token %d column %d: %#04x, want %#04x", name, ldx, tk, j, got[tk*ldx+j], w)
				}
			}
		}
		sameBits(t, name+" dw, rows apart", g.f32(sdw, c.n), g.f32(hdw, c.n))
	}
}

// TestDeviceRMSNormWarpRows: the warp-a-row RMSNorm forward kernels
// (rmsnorm_fwd_w*, rmsnorm_fwd_bf16_w*, Ops.RMSNorm and RMSNormBF16's
// default) are the block-a-row kernels' bits: y, inv and the bf16
// rounding, at each kernel's row lengths and their edges, a row alone and
// 8 rows a block with a partial last block, and per-head rows inside
// wider token rows (per, stride); rows past 2,048 take the block kernels.
func TestDeviceRMSNormWarpRows(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(11, 11))
	ops, block := NewOps(g.d), NewOps(g.d)
	ops.NormBlockRows, block.NormBlockRows = false, true
	const eps = 1e-6
	for _, n := range []int{1, 31, 64, 128, 255, 256, 257, 1000, 1024, 1025, 2047, 2048} {
		for _, rows := range []int{1, 8, 13} {
			x, w := randF32(r, rows*n, 2), randF32(r, n, 1)
			bx, bw := bufOf(g, x), bufOf(g, w)
			name := fmt.Sprintf("%d rows of %d", rows, n)
			wy, winv, by, binv := g.poisoned(rows*n), g.poisoned(rows), g.poisoned(rows*n), g.poisoned(rows)
			if err := ops.RMSNorm(wy, winv, bx, bw, rows, n, eps); err != nil {
				t.Fatal(err)
			}
			if err := block.RMSNorm(by, binv, bx, bw, rows, n, eps); err != nil {
				t.Fatal(err)
			}
			w16, b16 := g.poisoned((rows*n+1)/2), g.poisoned((rows*n+1)/2)
			winv16 := g.poisoned(rows)
			if err := ops.RMSNormBF16(w16, winv16, bx, bw, rows, n, eps); err != nil {
				t.Fatal(err)
			}
			if err := block.RMSNormBF16(b16, Buffer{}, bx, bw, rows, n, eps); err != nil {
				t.Fatal(err)
			}
			sameBits(t, name+" y", g.f32(wy, rows*n), g.f32(by, rows*n))
			sameBits(t, name+" inv", g.f32(winv, rows), g.f32(binv, rows))
			sameBits(t, name+" bf16 inv", g.f32(winv16, rows), g.f32(binv, rows))
			if rows*n%2 == 0 {
				sameBits(t, name+" bf16 y", g.f32(w16, rows*n/2), g.f32(b16, rows*n/2))
			}
			want16 := make([]kernels.BF16, rows*n)
			kernels.ToBF16(want16, g.f32(by, rows*n))
			for i, v := range g.u16(w16, rows*n) {
				if v != uint16(want16[i]) {
					t.Fatalf("%s: bf16 y[%d] = %#04x, the float32 kernel's rounded %#04x", name, i, v, uint16(want16[i]))
				}
			}
		}
	}
	// Per-head rows (q_norm's shape): 3 tokens of 5 heads of 128 inside
	// token rows of 700, through the kernels directly.
	const tokens, heads, hd, stride = 3, 5, 128, 700
	x, w := randF32(r, tokens*stride, 2), randF32(r, hd, 1)
	bx, bw := bufOf(g, x), bufOf(g, w)
	wy, by := bufOf(g, make([]float32, tokens*stride)), bufOf(g, make([]float32, tokens*stride))
	winv, binv := g.poisoned(tokens*heads), g.poisoned(tokens*heads)
	g.launch("rows.cu", "rmsnorm_fwd_w8", (tokens*heads+7)/8, 256, wy, winv, bx, bw, hd, heads, int64(stride), float32(eps), tokens*heads)
	g.launch("rows.cu", "rmsnorm_fwd", tokens*heads, 256, by, binv, bx, bw, hd, heads, int64(stride), float32(eps))
	sameBits(t, "per-head rows y", g.f32(wy, tokens*stride), g.f32(by, tokens*stride))
	sameBits(t, "per-head rows inv", g.f32(winv, tokens*heads), g.f32(binv, tokens*heads))
	if ops.normWarpPer(2049) != 0 || ops.normWarpPer(2048) != 64 || ops.normWarpPer(256) != 8 || ops.normWarpPer(257) != 32 || block.normWarpPer(8) != 0 {
		t.Errorf("normWarpPer: %d %d %d %d %d", ops.normWarpPer(2049), ops.normWarpPer(2048), ops.normWarpPer(256), ops.normWarpPer(257), block.normWarpPer(8))
	}
}

// TestDeviceRMSNormBackChunks: the RMSNorm backward a warp a chunk
// (rmsnorm_bwd_c32, rmsnorm_bwd_dx16_c32, NormBackKernel's choice for rows
// of 257 to 1,024) is the block kernels' bits: dx written and accumulated
// (and in place over dy), its bf16 rounding, and every chunk's
// weight-gradient partials, with partial chunks and partial blocks.
func TestDeviceRMSNormBackChunks(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(12, 12))
	ops, block := NewOps(g.d), NewOps(g.d)
	ops.NormBlockRows, block.NormBlockRows = false, true
	for _, n := range []int{257, 300, 1000, 1024} {
		for _, rows := range []int{1, 8, 13, 70} {
			x, w, dy, dx0 := randF32(r, rows*n, 1), randF32(r, n, 1), randF32(r, rows*n, 1), randF32(r, rows*n, 1)
			inv := make([]float32, rows)
			for i := range inv {
				inv[i] = kernels.RMSNorm(make([]float32, n), x[i*n:(i+1)*n], w, 1e-6)
			}
			bx, bw, bdy, binv := bufOf(g, x), bufOf(g, w), bufOf(g, dy), bufOf(g, inv)
			chunks := (rows + NormChunk - 1) / NormChunk
			for _, acc := range []int{0, 1} {
				for _, dx16 := range []bool{false, true} {
					for _, inPlace := range []bool{false, true} {
						if inPlace && acc == 1 {
							continue
						}
						name := fmt.Sprintf("%d rows of %d, acc %d, dx16 %v, in place %v", rows, n, acc, dx16, inPlace)
						run := func(o *Ops) ([]float32, []uint16, []float32) {
							dx, part, d16 := bufOf(g, dx0), g.poisoned(chunks*n), g.poisoned((rows*n+1)/2)
							dyb := bdy
							if inPlace {
								dx = bufOf(g, dy)
								dyb = dx
							}
							kernel, grid, blk := o.NormBackKernel(n, chunks, dx16)
							args := []any{dx, part, dyb, bx, bw, binv, rows, n, 1, int64(n), acc}
							if dx16 {
								args = append([]any{dx, d16}, args[1:]...)
							}
							g.launch2D("rows.cu", kernel, grid, int(blk.X), args...)
							var h []uint16
							if dx16 {
								h = g.u16(d16, rows*n)
							}
							return g.f32(dx, rows*n), h, g.f32(part, chunks*n)
						}
						wdx, w16, wpart := run(ops)
						bdx, b16, bpart := run(block)
						sameBits(t, name+" dx", wdx, bdx)
						sameBits(t, name+" partials", wpart, bpart)
						if !slices.Equal(w16, b16) {
							t.Errorf("%s: dx16 differs", name)
						}
					}
				}
			}
		}
	}
	// Rows inside wider token rows (per, stride): 14 rows of 300, two a
	// token 640 apart.
	{
		const rows, n, per, stride = 14, 300, 2, 640
		tokens := rows / per
		x, w, dy := randF32(r, tokens*stride, 1), randF32(r, n, 1), randF32(r, tokens*stride, 1)
		inv := make([]float32, rows)
		for i := range inv {
			inv[i] = 0.5 + r.Float32()
		}
		bx, bw, binv := bufOf(g, x), bufOf(g, w), bufOf(g, inv)
		chunks := (rows + NormChunk - 1) / NormChunk
		run := func(o *Ops) ([]float32, []float32) {
			dx, part := bufOf(g, dy), g.poisoned(chunks*n) // in place over dy
			kernel, grid, blk := o.NormBackKernel(n, chunks, false)
			g.launch2D("rows.cu", kernel, grid, int(blk.X), dx, part, dx, bx, bw, binv, rows, n, per, int64(stride), 0)
			return g.f32(dx, tokens*stride), g.f32(part, chunks*n)
		}
		wdx, wpart := run(ops)
		bdx, bpart := run(block)
		sameBits(t, "per-head rows dx", wdx, bdx)
		sameBits(t, "per-head rows partials", wpart, bpart)
	}
	if k, _, _ := ops.NormBackKernel(1024, 1, true); k != "rmsnorm_bwd_dx16_c32" {
		t.Errorf("rows of 1,024 take %s", k)
	}
	if k, _, _ := ops.NormBackKernel(1025, 1, false); k != "rmsnorm_bwd" {
		t.Errorf("rows of 1,025 take %s", k)
	}
}

// TestDeviceBatchInvariance: a row's results alone and inside a batch of
// 70 are the same bits (the contract the exact rollout rests on).
func TestDeviceBatchInvariance(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(2, 2))
	const n, rows, V = 1000, 70, 3001
	x, w := randF32(r, rows*n, 1), randF32(r, n, 1)
	bx, bw := bufOf(g, x), bufOf(g, w)
	by, binv := g.poisoned(rows*n), g.poisoned(rows)
	g.launch("rows.cu", "rmsnorm_fwd", rows, 256, by, binv, bx, bw, n, 1, int64(n), float32(1e-6))
	all := g.f32(by, rows*n)
	one := bufOf(g, x[37*n:38*n])
	by1, binv1 := g.poisoned(n), g.poisoned(1)
	g.launch("rows.cu", "rmsnorm_fwd", 1, 256, by1, binv1, one, bw, n, 1, int64(n), float32(1e-6))
	sameBits(t, "rmsnorm row 37", g.f32(by1, n), all[37*n:38*n])

	z := randF32(r, rows*V, 3)
	bz := bufOf(g, z)
	g.launch("head.cu", "logsoftmax_rows", rows, 256, bz, Buffer{}, V, float32(0.7))
	allz := g.f32(bz, rows*V)
	bz1 := bufOf(g, z[5*V:6*V])
	g.launch("head.cu", "logsoftmax_rows", 1, 256, bz1, Buffer{}, V, float32(0.7))
	sameBits(t, "logsoftmax row 5", g.f32(bz1, V), allz[5*V:6*V])
}

func TestDeviceSwiGLU(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(3, 3))
	for _, n := range shapes {
		rows := 5
		gu, da := randF32(r, rows*2*n, 2), randF32(r, rows*n, 1)
		a, dgu := make([]float32, rows*n), make([]float32, rows*2*n)
		for i := 0; i < rows; i++ {
			o := i * 2 * n
			kernels.SwiGLU(a[i*n:(i+1)*n], gu[o:o+n], gu[o+n:o+2*n])
			kernels.SwiGLUBackward(dgu[o:o+n], dgu[o+n:o+2*n], gu[o:o+n], gu[o+n:o+2*n], da[i*n:(i+1)*n])
		}
		bgu, bda := bufOf(g, gu), bufOf(g, da)
		// 64 blocks (at most one chunk of a row each here) and 3 (each
		// block walking chunks across rows).
		for _, blocks := range []int{64, 3} {
			ba, bdgu := g.poisoned(rows*n), g.poisoned(rows*2*n)
			g.launch("rows.cu", "swiglu_fwd", blocks, 256, ba, bgu, int64(rows), n)
			g.launch("rows.cu", "swiglu_bwd", blocks, 256, bdgu, bda, bgu, int64(rows), n)
			closeTo(t, fmt.Sprintf("swiglu n=%d, %d blocks", n, blocks), g.f32(ba, rows*n), a, 1e-6)
			closeTo(t, fmt.Sprintf("swiglu backward n=%d, %d blocks", n, blocks), g.f32(bdgu, rows*2*n), dgu, 1e-6)
		}
	}
}

func TestDeviceNormRope(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(4, 4))
	for _, c := range []struct{ T, heads, hd int }{{1, 1, 2}, {7, 16, 128}, {33, 9, 64}} {
		stride := c.heads*c.hd + 3 // heads inside a wider row
		raw, w := randF32(r, c.T*stride, 1), randF32(r, c.hd, 1)
		pos := make([]int32, c.T)
		for i := range pos {
			pos[i] = int32(r.IntN(500))
		}
		cos, sin := model.RopeTables(c.hd, 1e6, 512)
		half := c.hd / 2
		out, inv := make([]float32, c.T*c.heads*c.hd), make([]float32, c.T*c.heads)
		for i := 0; i < c.T; i++ {
			p := int(pos[i])
			kernels.NormRopeHeads(out[i*c.heads*c.hd:], raw[i*stride:], c.heads, w, cos[p*half:(p+1)*half], sin[p*half:(p+1)*half], 1e-6, inv[i*c.heads:])
		}
		bout, binv := g.poisoned(len(out)), g.poisoned(len(inv))
		bcos, bsin, bpos := bufOf(g, cos), bufOf(g, sin), bufOf(g, pos)
		g.launch("rows.cu", "norm_rope_fwd", c.T, 256, bout, binv, bufOf(g, raw), bufOf(g, w), bcos, bsin, bpos, c.heads, c.hd, int64(stride), float32(1e-6))
		name := fmt.Sprintf("norm+rope %v", c)
		closeTo(t, name, g.f32(bout, len(out)), out, 1e-5)
		closeTo(t, name+" inv", g.f32(binv, len(inv)), inv, 1e-6)
		// In bf16, padded for flash.cu: the float32 kernel's output
		// rounded, bit for bit, and zero pad rows (over a NaN-filled
		// buffer), the same inverse RMS.
		width, pad := c.heads*c.hd, FlashPad(c.T)
		nan16 := make([]uint16, pad*width)
		for i := range nan16 {
			nan16[i] = 0x7fc1
		}
		bout16, binv16 := bufOf(g, nan16), g.poisoned(len(inv))
		ops := NewOps(g.d)
		if err := ops.NormRopeBF16(bout16, binv16, bufOf(g, raw), bufOf(g, w), bcos, bsin, bpos, c.T, c.heads, c.hd, stride, 1e-6); err != nil {
			t.Fatal(err)
		}
		got16 := make([]uint16, pad*width)
		if err := Download(g.d, got16, bout16); err != nil {
			t.Fatal(err)
		}
		f32out := g.f32(bout, len(out))
		for i, h := range got16 {
			want := uint16(0)
			if i < len(f32out) {
				want = uint16(kernels.BF16FromFloat32(f32out[i]))
			}
			if h != want {
				t.Fatalf("%s bf16 element %d (row %d): %#04x, want %#04x", name, i, i/width, h, want)
			}
		}
		sameBits(t, name+" bf16 inv", g.f32(binv16, len(inv)), g.f32(binv, len(inv)))
		// From raw in bf16 (as the bf16 mode's products write q and k):
		// bit for bit the kernel over the widened values, pad rows zero.
		raw16, rawW := roundOperand(raw)
		wide16, wideInv := bufOf(g, nan16), g.poisoned(len(inv))
		if err := ops.NormRopeBF16(wide16, wideInv, bufOf(g, rawW), bufOf(g, w), bcos, bsin, bpos, c.T, c.heads, c.hd, stride, 1e-6); err != nil {
			t.Fatal(err)
		}
		from16, from16Inv := bufOf(g, nan16), g.poisoned(len(inv))
		if err := ops.NormRopeBF16From16(from16, from16Inv, bufOf(g, raw16), bufOf(g, w), bcos, bsin, bpos, c.T, c.heads, c.hd, stride, 1e-6); err != nil {
			t.Fatal(err)
		}
		if got, want := g.u16(from16, pad*width), g.u16(wide16, pad*width); !slices.Equal(got, want) {
			t.Errorf("%s from bf16 raw: not the bits of the widened values", name)
		}
		sameBits(t, name+" from bf16 raw, inv", g.f32(from16Inv, len(inv)), g.f32(wideInv, len(inv)))

		// The backward's rotation: RoPE with negated sines, in place.
		d := randF32(r, c.T*stride, 1)
		want := append([]float32(nil), d...)
		neg := make([]float32, len(sin))
		for i, v := range sin {
			neg[i] = -v
		}
		for i := 0; i < c.T; i++ {
			p := int(pos[i])
			kernels.RoPEHeads(want[i*stride:], c.heads, cos[p*half:(p+1)*half], neg[p*half:(p+1)*half])
		}
		bd := bufOf(g, d)
		g.launch("rows.cu", "rope_rows", c.T, 256, bd, bcos, bufOf(g, neg), bpos, c.heads, c.hd, int64(stride))
		closeTo(t, name+" rope backward", g.f32(bd, len(d)), want, 1e-6)
	}
}

func TestDeviceHead(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(5, 5))
	for _, V := range []int{2, 257, 1000, 151936} {
		for _, temp := range []float32{1, 0.6} {
			rows := 6
			z := randF32(r, rows*V, 4)
			// Row 3 rises all the way (every value a new maximum: the
			// online sums rescale at each), row 4 is one spike (entropy
			// near 0).
			for j := 0; j < V; j++ {
				z[3*V+j] = float32(j) * 20 / float32(V)
				z[4*V+j] = -3
			}
			z[4*V+V/2] = 40
			logp := append([]float32(nil), z...)
			ent := make([]float32, rows)
			for i := 0; i < rows; i++ {
				row := logp[i*V : (i+1)*V]
				if temp != 1 {
					for j := range row {
						row[j] /= temp
					}
				}
				kernels.LogSoftmax(row, row)
				var h float64
				for _, v := range row {
					h -= math.Exp(float64(v)) * float64(v)
				}
				ent[i] = float32(h)
			}
			bz := bufOf(g, z)
			g.launch("head.cu", "logsoftmax_rows", rows, 256, bz, Buffer{}, V, temp)
			name := fmt.Sprintf("V=%d temp=%g", V, temp)
			closeTo(t, name+" log-softmax", g.f32(bz, rows*V), logp, 2e-6)
			bh := g.poisoned(rows)
			g.launch("head.cu", "entropy_rows", rows, 256, bh, bz, V)
			closeTo(t, name+" entropy", g.f32(bh, rows), ent, 1e-5)

			// The gather and the backward are checked against references
			// built from the GPU's own log-softmax and entropy: the two
			// engines' exp differ in the last bit, which a log-sum-exp can
			// carry into a whole row.
			glogp, gent := g.f32(bz, rows*V), g.f32(bh, rows)
			targets := make([]int32, rows)
			cl, ch := randF32(r, rows, 1), randF32(r, rows, 0.1)
			for i := range targets {
				targets[i] = int32(r.IntN(V))
			}
			targets[rows-1], cl[rows-1] = -1, 0 // the last row has no next token
			cl[2], ch[2] = 0, 0                 // a row without coefficients
			blp := g.poisoned(rows)
			g.launch("head.cu", "gather_rows", 1, 256, blp, bz, bufOf(g, targets), rows, V)
			wantLP := make([]float32, rows)
			for i, tg := range targets {
				if tg >= 0 {
					wantLP[i] = glogp[i*V+int(tg)]
				}
			}
			sameBits(t, name+" gather", g.f32(blp, rows), wantLP)
			// The three in one launch (the training forward's head): the
			// same bits, with the entropy and without.
			for _, entropy := range []int{1, 0} {
				fz, flp, fh := bufOf(g, z), g.poisoned(rows), g.poisoned(rows)
				g.launch("head.cu", "logsoftmax_stats_rows", rows, 256, fz, flp, fh, bufOf(g, targets), V, temp, entropy)
				sameBits(t, name+" fused log-softmax", g.f32(fz, rows*V), glogp)
				sameBits(t, name+" fused gather", g.f32(flp, rows), wantLP)
				if entropy == 1 {
					sameBits(t, name+" fused entropy", g.f32(fh, rows), gent)
				} else if h := g.f32(fh, rows); !math.IsNaN(float64(h[0])) {
					t.Errorf("%s: the fused head wrote an entropy (%v) it was not asked for", name, h[0])
				}
			}

			// The logits' gradient in float64.
			want := make([]float32, rows*V)
			for i := 0; i < rows; i++ {
				row := glogp[i*V : (i+1)*V]
				for j, zv := range row {
					p := math.Exp(float64(zv))
					d := -float64(cl[i])*p - float64(ch[i])*p*(float64(zv)+float64(gent[i]))
					if int32(j) == targets[i] {
						d += float64(cl[i])
					}
					want[i*V+j] = float32(d / float64(temp))
				}
			}
			bdz := g.poisoned(rows * V)
			bcl, bch, btg := bufOf(g, cl), bufOf(g, ch), bufOf(g, targets)
			g.launch("head.cu", "head_bwd", rows, 256, bdz, bz, bcl, bch, btg, V, temp)
			closeTo(t, name+" head backward", g.f32(bdz, rows*V), want, 4e-6)
			// The bf16 mode's one-read head: head_stats_bf16's log-sum-exp,
			// target log-prob and entropy against float64 over the same
			// tempered logits, and head_grad_bf16_saved's gradient from
			// them against float64 given those statistics, within the bf16
			// rounding of its output.
			at := func(i, j int) float32 {
				if temp != 1 {
					return z[i*V+j] / temp
				}
				return z[i*V+j]
			}
			wantLSE, wantLP16, wantH := make([]float32, rows), make([]float32, rows), make([]float32, rows)
			for i := 0; i < rows; i++ {
				mx := math.Inf(-1)
				for j := 0; j < V; j++ {
					mx = math.Max(mx, float64(at(i, j)))
				}
				var s, t float64
				for j := 0; j < V; j++ {
					d := float64(at(i, j)) - mx
					s += math.Exp(d)
					t += math.Exp(d) * d
				}
				l := mx + math.Log(s)
				wantLSE[i], wantH[i] = float32(l), float32(math.Log(s)-t/s)
				if tg := targets[i]; tg >= 0 {
					wantLP16[i] = float32(float64(at(i, int(tg))) - l)
				}
			}
			slse, slp, sh := g.poisoned(rows), g.poisoned(rows), g.poisoned(rows)
			g.launch("head.cu", "head_stats_bf16", rows, 256, bufOf(g, z), slse, slp, sh, btg, V, temp)
			closeTo(t, name+" one-read log-sum-exp", g.f32(slse, rows), wantLSE, 1e-6)
			closeTo(t, name+" one-read log-prob", g.f32(slp, rows), wantLP16, 1e-6)
			closeTo(t, name+" one-read entropy", g.f32(sh, rows), wantH, 2e-6)
			glse, gh := g.f32(slse, rows), g.f32(sh, rows)
			g16 := g.poisoned((rows*V + 1) / 2)
			g.launch("head.cu", "head_grad_bf16_saved", rows, 256, g16, bufOf(g, z), slse, sh, bcl, bch, btg, V, temp)
			got16 := g.u16(g16, rows*V)
			for i := 0; i < rows; i++ {
				for j := 0; j < V; j++ {
					zv := float64(at(i, j) - glse[i])
					p := math.Exp(zv)
					w := -float64(cl[i])*p - float64(ch[i])*p*(zv+float64(gh[i]))
					if int32(j) == targets[i] {
						w += float64(cl[i])
					}
					w /= float64(temp)
					got := float64(kernels.BF16(got16[i*V+j]).Float32())
					slack := math.Abs(w)/256 + 1e-6*(math.Abs(float64(cl[i]))+math.Abs(float64(ch[i]))*(1+math.Abs(zv)+math.Abs(float64(gh[i]))))
					if !(math.Abs(got-w) <= slack) {
						t.Fatalf("%s: bf16 head gradient [%d,%d] = %g, want %g (float64 from the saved statistics)", name, i, j, got, w)
					}
				}
			}
			// Four logits a load (V a multiple of 4, rows 16-byte aligned)
			// against the scalar loop (the logits a float off that
			// alignment): the same bits.
			if V%4 == 0 {
				zoff := bufOf(g, append([]float32{0}, z...)).Floats(1, rows*V)
				s16 := g.poisoned(rows * V / 2)
				g.launch("head.cu", "head_grad_bf16_saved", rows, 256, s16, zoff, slse, sh, bcl, bch, btg, V, temp)
				sameBits(t, name+" bf16 head gradient, four logits a load against one", g.f32(g16, rows*V/2), g.f32(s16, rows*V/2))
			}
		}
	}
}

// TestDeviceAdamW: the GPU's AdamW step is the CPU kernel's bit for bit
// (both use correctly rounded float32 fused multiply-adds, sqrt and
// division), and the gradient norm agrees to float64 rounding.
func TestDeviceAdamW(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(6, 6))
	const n = 100003
	p, grad := randF32(r, n, 0.02), randF32(r, n, 1e-3)
	m, v := randF32(r, n, 1e-4), randF32(r, n, 1e-4)
	for i := range v {
		v[i] *= v[i]
	}
	s := kernels.AdamWStep{GradScale: 0.7, Decay: 1 - 3e-4*0.01, Beta1: 0.9, OneMinusB1: 0.1, Beta2: 0.999, OneMinusB2: 0.001,
		StepSize: float32(3e-4 / (1 - math.Pow(0.9, 3))), InvSqrtBC2: float32(1 / math.Sqrt(1-math.Pow(0.999, 3))), Eps: 1e-8}
	bp, bg, bm, bv := bufOf(g, p), bufOf(g, grad), bufOf(g, m), bufOf(g, v)
	g.launch("optim.cu", "adamw", 128, 256, bp, bg, bm, bv, int64(n), s.GradScale, s.Decay, s.Beta1, s.OneMinusB1, s.Beta2, s.OneMinusB2, s.StepSize, s.InvSqrtBC2, s.Eps)
	kernels.AdamW(p, grad, m, v, s)
	sameBits(t, "adamw p", g.f32(bp, n), p)
	sameBits(t, "adamw m", g.f32(bm, n), m)
	sameBits(t, "adamw v", g.f32(bv, n), v)

	nb := (n + 8191) / 8192
	part, err := g.d.Alloc(int64(nb) * 8)
	if err != nil {
		t.Fatal(err)
	}
	g.all = append(g.all, part)
	out := bufOf(g, []float64{math.NaN()})
	g.launch("optim.cu", "sumsq_blocks", nb, 256, part, bg, int64(n))
	g.launch("optim.cu", "sum_f64", 1, 256, out, part, nb)
	got := make([]float64, 1)
	if err := Download(g.d, got, out); err != nil {
		t.Fatal(err)
	}
	var want float64
	for _, x := range grad {
		want += float64(x) * float64(x)
	}
	if math.Abs(got[0]-want) > 1e-12*want {
		t.Errorf("sum of squares %v, want %v", got[0], want)
	}
}

func TestDeviceConvertAndEmbed(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(7, 7))
	x := randF32(r, 4099, 10)
	// Infinity, a tie that rounds to even (down), a tie that rounds to
	// even (up) and a value just above a tie.
	x[0], x[1], x[2], x[3] = float32(math.Inf(1)), 0x1.01p0, 0x1.03p0, 0x1.0101p0
	bx := bufOf(g, x)
	bb := bufOf(g, make([]uint16, len(x)))
	g.launch("convert.cu", "f32_to_bf16", 16, 256, bb, bx, int64(len(x)))
	got := make([]uint16, len(x))
	if err := Download(g.d, got, bb); err != nil {
		t.Fatal(err)
	}
	want := make([]kernels.BF16, len(x))
	kernels.ToBF16(want, x)
	for i := range got {
		if got[i] != uint16(want[i]) {
			t.Fatalf("bf16[%d] of %g = %#x, want %#x", i, x[i], got[i], want[i])
		}
	}
	// Rows out of a wider matrix (ld > cols) into contiguous bf16 rows.
	const nr, cols, ld = 7, 300, 333
	wide := randF32(r, nr*ld, 5)
	b2 := bufOf(g, make([]uint16, nr*cols))
	g.launch("convert.cu", "f32_to_bf16_2d", nr, 256, b2, bufOf(g, wide), cols, int64(ld))
	got2 := make([]uint16, nr*cols)
	if err := Download(g.d, got2, b2); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nr; i++ {
		want2 := make([]kernels.BF16, cols)
		kernels.ToBF16(want2, wide[i*ld:i*ld+cols])
		for j := range want2 {
			if got2[i*cols+j] != uint16(want2[j]) {
				t.Fatalf("f32_to_bf16_2d row %d col %d = %#x, want %#x", i, j, got2[i*cols+j], want2[j])
			}
		}
	}
	// Contiguous rows rounded into the rows of a wider matrix, nothing
	// else written.
	narrow := randF32(r, nr*cols, 5)
	b3 := g.poisoned((nr*ld + 1) / 2)
	before3 := g.u16(b3, nr*ld)
	g.launch("convert.cu", "f32_to_bf16_2d_out", nr, 256, b3, bufOf(g, narrow), cols, int64(ld))
	got3 := g.u16(b3, nr*ld)
	for i := 0; i < nr; i++ {
		for j := 0; j < ld; j++ {
			want := before3[i*ld+j]
			if j < cols {
				want = uint16(kernels.BF16FromFloat32(narrow[i*cols+j]))
			}
			if got3[i*ld+j] != want {
				t.Fatalf("f32_to_bf16_2d_out row %d col %d = %#x, want %#x", i, j, got3[i*ld+j], want)
			}
		}
	}
	// And back: the bf16 rows of a wider matrix widened into contiguous
	// float32 rows, exactly.
	wide16 := make([]uint16, nr*ld)
	for i := range wide16 {
		wide16[i] = uint16(kernels.BF16FromFloat32(wide[i]))
	}
	f2 := g.poisoned(nr * cols)
	g.launch("convert.cu", "bf16_to_f32_2d", nr, 256, f2, bufOf(g, wide16), cols, int64(ld))
	gotf := g.f32(f2, nr*cols)
	for i := 0; i < nr; i++ {
		for j := 0; j < cols; j++ {
			if w := kernels.BF16(wide16[i*ld+j]).Float32(); math.Float32bits(gotf[i*cols+j]) != math.Float32bits(w) {
				t.Fatalf("bf16_to_f32_2d row %d col %d = %g, want %g", i, j, gotf[i*cols+j], w)
			}
		}
	}

	back := g.poisoned(len(x))
	g.launch("convert.cu", "bf16_to_f32", 16, 256, back, bb, int64(len(x)))
	wantBack := make([]float32, len(x))
	kernels.FromBF16(wantBack, want)
	sameBits(t, "bf16 to f32", g.f32(back, len(x)), wantBack)

	// Embedding: gather, and the backward grouped by token.
	const V, H, T = 50, 33, 40
	table := randF32(r, V*H, 1)
	tokens := make([]int32, T)
	for i := range tokens {
		tokens[i] = int32(r.IntN(10)) // repeats
	}
	bxe := g.poisoned(T * H)
	btok := bufOf(g, tokens)
	g.launch("convert.cu", "embed_fwd", T, 256, bxe, bufOf(g, table), btok, H)
	wantX := make([]float32, T*H)
	for i, tk := range tokens {
		copy(wantX[i*H:(i+1)*H], table[int(tk)*H:])
	}
	sameBits(t, "embedding", g.f32(bxe, T*H), wantX)
	dx := randF32(r, T*H, 1)
	dtable := randF32(r, V*H, 1)
	wantD := append([]float32(nil), dtable...)
	for i, tk := range tokens {
		for j := 0; j < H; j++ {
			wantD[int(tk)*H+j] += dx[i*H+j]
		}
	}
	var uniq, offs, rows []int32
	for tk := int32(0); tk < V; tk++ {
		start := len(rows)
		for i, x := range tokens {
			if x == tk {
				rows = append(rows, int32(i))
			}
		}
		if len(rows) > start {
			uniq = append(uniq, tk)
			offs = append(offs, int32(start))
		}
	}
	offs = append(offs, int32(len(rows)))
	bd := bufOf(g, dtable)
	g.launch("convert.cu", "embed_bwd", len(uniq), 256, bd, bufOf(g, dx), bufOf(g, uniq), bufOf(g, offs), bufOf(g, rows), H)
	sameBits(t, "embedding backward", g.f32(bd, V*H), wantD)
}

// TestDeviceModuleCache: a second device handle loads the modules from
// the on-disk cache.
func TestDeviceModuleCache(t *testing.T) {
	t.Setenv("KEEL_CACHE_DIR", t.TempDir())
	d := deviceForTest(t)
	t.Logf("device: %v", d)
	m, err := d.Module("rows.cu")
	if err != nil {
		t.Fatal(err)
	}
	if m.CacheHit {
		t.Error("first load hit an empty cache")
	}
	d2, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	m2, err := d2.Module("rows.cu")
	if err != nil || !m2.CacheHit {
		t.Errorf("second load: hit %v, %v", m2 != nil && m2.CacheHit, err)
	}
	free, total, err := d.MemInfo()
	if err != nil || free <= 0 || free > total {
		t.Errorf("MemInfo = %d, %d, %v", free, total, err)
	}
	if _, err := d.Alloc(total * 2); !IsOutOfMemory(err) {
		t.Errorf("allocating twice the device's memory: %v, want out of memory", err)
	}
}

// TestDeviceMoERoute: the device's expert choice and gates are
// model.TopK's and GateWeights' bit for bit (ties to the lower expert, a
// NaN below every number, replayed rows taken as given), and its router
// gradient is train.RouterBackRow's.
func TestDeviceMoERoute(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(12, 12))
	for _, c := range []struct{ T, E, k int }{{1, 8, 2}, {37, 128, 8}, {5, 16, 4}, {3, 1000, 40}} {
		T, E, k := c.T, c.E, c.k
		probs := make([]float32, T*E)
		for tk := 0; tk < T; tk++ {
			row := probs[tk*E : (tk+1)*E]
			var sum float32
			for e := range row {
				row[e] = float32(math.Exp(r.NormFloat64()))
				sum += row[e]
			}
			for e := range row {
				row[e] /= sum
			}
		}
		// A tie inside the top k: token 0's largest probability twice.
		best := 0
		for e := 1; e < E; e++ {
			if probs[e] > probs[best] {
				best = e
			}
		}
		probs[(best+1)%E] = probs[best]
		if T > 2 {
			// NaNs in a live token: at expert 0 (where the scan starts)
			// and in the middle.
			probs[2*E], probs[2*E+E/2] = float32(math.NaN()), float32(math.NaN())
		}
		if k > 32 {
			// More NaNs than numbers among token 0's top k (the lower NaN
			// first), and +0 beside -0 (equal: the lower expert first), in
			// a row of 1000 experts (the device's taken mask past bit 3).
			row := probs[:E]
			for e := range row {
				row[e] = float32(math.NaN())
				if e%97 == 0 { // 11 zeros, alternately -0 and +0
					row[e] = float32(math.Copysign(0, float64(e%2)-0.5))
				}
			}
			row[500], row[999] = 0.5, 0.5 // then 27 NaNs, the lowest experts first
		}
		replay := make([]int32, T*k)
		for tk := range T {
			replay[tk*k] = -1
			if tk%3 == 1 { // every third token replays experts 0, E-1, E-2, ...
				replay[tk*k] = 0
				for s := 1; s < k; s++ {
					replay[tk*k+s] = int32(E - s)
				}
			}
		}
		bp := bufOf(g, probs)
		// The probability mass per expert, float64 in token order.
		bps := bufOf(g, make([]float64, E))
		g.launch("moe.cu", "moe_psum", (E+127)/128, 128, bps, bp, T, E)
		gotPS := make([]float64, E)
		if err := Download(g.d, gotPS, bps); err != nil {
			t.Fatal(err)
		}
		for e := 0; e < E; e++ {
			var want float64
			for tk := 0; tk < T; tk++ {
				want += float64(probs[tk*E+e])
			}
			if math.IsNaN(want) != math.IsNaN(gotPS[e]) || (!math.IsNaN(want) && math.Float64bits(gotPS[e]) != math.Float64bits(want)) {
				t.Fatalf("psum[%d] = %v, want %v", e, gotPS[e], want)
			}
		}
		for _, withReplay := range []bool{false, true} {
			for _, norm := range []bool{true, false} {
				minus := make([]int32, T*k)
				for i := range minus {
					minus[i] = -1
				}
				bids, bgates := bufOf(g, minus), g.poisoned(T*k)
				rep := Buffer{}
				if withReplay {
					rep = bufOf(g, replay)
				}
				if err := NewOps(g.d).MoERoute(bids, bgates, bp, rep, T, E, k, norm); err != nil {
					t.Fatal(err)
				}
				if err := g.d.Sync(); err != nil {
					t.Fatal(err)
				}
				ids := make([]int32, T*k)
				if err := Download(g.d, ids, bids); err != nil {
					t.Fatal(err)
				}
				gates := g.f32(bgates, T*k)
				wantIDs, wantG := make([]int32, T*k), make([]float32, T*k)
				for tk := 0; tk < T; tk++ {
					w := wantIDs[tk*k : (tk+1)*k]
					if withReplay && replay[tk*k] >= 0 {
						copy(w, replay[tk*k:(tk+1)*k])
					} else {
						model.TopK(w, probs[tk*E:(tk+1)*E])
					}
					model.GateWeights(wantG[tk*k:(tk+1)*k], probs[tk*E:(tk+1)*E], w, norm)
				}
				name := fmt.Sprintf("T %d E %d k %d norm %v replay %v", T, E, k, norm, withReplay)
				for i := range ids {
					if ids[i] != wantIDs[i] {
						t.Fatalf("%s: expert %d = %d, want %d", name, i, ids[i], wantIDs[i])
					}
				}
				for i := range gates {
					if math.IsNaN(float64(wantG[i])) != math.IsNaN(float64(gates[i])) ||
						(!math.IsNaN(float64(wantG[i])) && math.Float32bits(gates[i]) != math.Float32bits(wantG[i])) {
						t.Fatalf("%s: gate %d = %v, want %v", name, i, gates[i], wantG[i])
					}
				}

				// The router's gradient.
				dg, aux := randF32(r, T*k, 1), randF32(r, E, 0.01)
				want := make([]float32, T*E)
				for tk := 0; tk < T; tk++ {
					train.RouterBackRow(want[tk*E:(tk+1)*E], probs[tk*E:(tk+1)*E], wantG[tk*k:(tk+1)*k], wantIDs[tk*k:(tk+1)*k], dg[tk*k:(tk+1)*k], aux, norm)
				}
				bds := g.poisoned(T * E)
				n := 0
				if norm {
					n = 1
				}
				g.launch("moe.cu", "router_bwd", (T+127)/128, 128, bds, bp, bgates, bids, bufOf(g, dg), bufOf(g, aux), T, E, k, n)
				got := g.f32(bds, T*E)
				for i := range got {
					if math.IsNaN(float64(want[i])) {
						if !math.IsNaN(float64(got[i])) {
							t.Fatalf("%s: router gradient %d = %v, want NaN (token 2's NaN)", name, i, got[i])
						}
						got[i], want[i] = 0, 0
					}
				}
				sameBits(t, name+" router gradient", got, want)
			}
		}
	}
}

// TestDeviceDrawTruncated: draw_rows and draw_rows_raw with top-k and
// top-p against rollout.DrawTruncated on the same rows: each cut alone and
// both; a top-k of the whole vocabulary (drawn in probability order);
// equal log-probabilities at the top-k cut, at the top-p cut and across
// a whole row (taken in id order); impossible tokens; a one-hot row; a
// top-p below the largest probability; the extremes of the uniform;
// greedy and host rows beside them. A draw may differ only where a cut or
// the draw lies within rounding of a boundary (NearTruncBoundary), and
// the truncated log-probability only by the rounding of the kept total.
func TestDeviceDrawTruncated(t *testing.T) {
	g := newGPU(t)
	ops := NewOps(g.d)
	r := rand.New(rand.NewPCG(11, 11))
	inf := float32(math.Inf(-1))
	near := 0
	for _, V := range []int{7, 2000, 151936} {
		const rows = 18
		raw := randF32(r, rows*V, 3)
		temps := make([]float32, rows)
		u := make([]float64, rows)
		topK := make([]int32, rows)
		topP := make([]float64, rows)
		topN := make([]int32, rows)
		for i := 0; i < rows; i++ {
			row := raw[i*V : (i+1)*V]
			temps[i], u[i] = 1, r.Float64()
			topN[i] = []int32{0, 1, 5, TopMax}[i%4] // reported beside the draw
			switch i {
			case 0:
				topK[i] = 5
			case 1:
				topP[i] = 0.9
			case 2:
				topK[i], topP[i] = 50, 0.5
			case 3: // the whole vocabulary, in probability order
				topK[i] = int32(V)
			case 4: // one value everywhere: ids in order
				for j := range row {
					row[j] = 0.25
				}
				topK[i] = 3
			case 5, 6: // ties across the top-k and the top-p cuts
				for j := range row {
					row[j] -= 10
				}
				for j := 0; j < V; j += 2 {
					row[j] = 2.5
				}
				if i == 5 {
					topK[i] = int32(V/2 - V/4 + 1)
				} else {
					topP[i] = 0.3
				}
			case 7: // one token
				for j := range row {
					row[j] = inf
				}
				row[V/3] = 0
				topP[i] = 0.9
			case 8: // a third of the tokens impossible
				for j := range row {
					if j%3 == 1 {
						row[j] = inf
					}
				}
				topP[i] = 0.99
			case 9: // greedy: the cut changes nothing
				temps[i], topK[i] = 0, 5
			case 10:
				u[i], topP[i] = 0, 0.7
			case 11:
				u[i], topK[i] = math.Nextafter(1, 0), 4
			case 12: // left to the host
				u[i], topK[i] = -1, 3
			case 13: // below the largest probability: only the top token
				row[V-1] = 20
				topP[i] = 1e-3
			case 14, 15: // a temperature other than 1 (only draw_rows_raw divides by it)
				temps[i], topK[i], topP[i] = 0.7, 20, 0.95
			case 16: // both cuts among equal values: the shorter is kept
				for j := range row {
					row[j] = -1
				}
				topK[i], topP[i] = int32(V/2+1), 0.3
			case 17: // a log-prob of exactly 0 ranks first
				row[V-1] = 40
				topK[i] = 1
			}
		}
		z := slices.Clone(raw)
		for i := 0; i < rows; i++ {
			kernels.LogSoftmax(z[i*V:(i+1)*V], z[i*V:(i+1)*V])
		}
		d := Draws{U: bufOf(g, u), Temps: bufOf(g, temps), TopK: bufOf(g, topK), TopP: bufOf(g, topP), TopN: bufOf(g, topN)}
		for _, rawRows := range []bool{false, true} {
			d.Tok, d.LP, d.TLP = bufOf(g, make([]int32, rows)), g.poisoned(rows), g.poisoned(rows)
			d.TopTok, d.TopLP = bufOf(g, make([]int32, rows*TopMax)), g.poisoned(rows*TopMax)
			var err error
			if rawRows {
				err = ops.DrawRowsRaw(d, bufOf(g, raw), rows, V)
			} else {
				err = ops.DrawRows(d, bufOf(g, z), rows, V)
			}
			if err != nil {
				t.Fatal(err)
			}
			got := make([]int32, rows)
			if err := Download(g.d, got, d.Tok); err != nil {
				t.Fatal(err)
			}
			glp, gtlp := g.f32(d.LP, rows), g.f32(d.TLP, rows)
			topTok := make([]int32, rows*TopMax)
			if err := Download(g.d, topTok, d.TopTok); err != nil {
				t.Fatal(err)
			}
			topLP := g.f32(d.TopLP, rows*TopMax)
			for i := 0; i < rows; i++ {
				name := fmt.Sprintf("V=%d row %d (raw %v, top-k %d, top-p %v, u %v)", V, i, rawRows, topK[i], topP[i], u[i])
				gotTop, gotTopLP := topTok[i*TopMax:(i+1)*TopMax], topLP[i*TopMax:(i+1)*TopMax]
				if u[i] < 0 {
					if got[i] != 0 || !math.IsNaN(float64(glp[i])) || !math.IsNaN(float64(gtlp[i])) || !math.IsNaN(float64(gotTopLP[0])) {
						t.Errorf("%s: the host's row written: token %d, log-probs %v %v", name, got[i], glp[i], gtlp[i])
					}
					continue
				}
				row := z[i*V : (i+1)*V]
				tol := 4e-7 * (1 + math.Abs(float64(row[got[i]])))
				if rawRows { // the row's log-softmax at its temperature, from float64's log-sum-exp
					row, _ = logSoftmaxF64(raw[i*V:(i+1)*V], temps[i])
					tol = 4e-6 * (1 + math.Abs(float64(raw[i*V])))
				}
				// The most probable tokens: exact rows, those of sorting the
				// row; raw rows, those of sorting the logits at the row's
				// temperature (which the kernel's log-sum-exp, subtracted,
				// may tie but not reorder: the same set, in the order of
				// the log-probs reported, ties by id).
				n := min(int(topN[i]), V)
				rank := row
				if rawRows {
					tp := temps[i]
					if tp == 0 {
						tp = 1
					}
					rank = make([]float32, V)
					for j, v := range raw[i*V : (i+1)*V] {
						rank[j] = v / tp // the kernel's division
					}
				}
				wantTop := topOf(rank, n)
				sameSet := slices.Equal(gotTop[:n], wantTop)
				if rawRows {
					sortedGot := slices.Clone(gotTop[:n])
					slices.Sort(sortedGot)
					sortedWant := slices.Clone(wantTop)
					slices.Sort(sortedWant)
					sameSet = slices.Equal(sortedGot, sortedWant)
					for j := 1; j < n && sameSet; j++ {
						a, b := gotTopLP[j-1], gotTopLP[j]
						sameSet = a > b || (a == b && gotTop[j-1] < gotTop[j])
					}
				}
				if !sameSet {
					t.Errorf("%s: top %d tokens %v, want %v", name, n, gotTop[:n], wantTop)
				} else {
					for j, id := range gotTop[:n] {
						if math.Abs(float64(gotTopLP[j]-row[id])) > tol {
							t.Errorf("%s: top token %d log-prob %v, want %v", name, id, gotTopLP[j], row[id])
						}
					}
				}
				if n < TopMax && !math.IsNaN(float64(gotTopLP[n])) {
					t.Errorf("%s: %d top tokens asked, entry %d written", name, n, n)
				}
				if got[i] < 0 || int(got[i]) >= V || row[got[i]] == inf {
					t.Fatalf("%s: token %d", name, got[i])
				}
				if !rawRows && math.Float32bits(glp[i]) != math.Float32bits(row[got[i]]) {
					t.Errorf("%s: log-prob %v, z at token %d is %v", name, glp[i], got[i], row[got[i]])
				}
				if temps[i] == 0 {
					if want, _ := rollout.DrawRow(row, 0, 0); got[i] != want || gtlp[i] != glp[i] {
						t.Errorf("%s: greedy token %d (truncated log-prob %v), want %d", name, got[i], gtlp[i], want)
					}
					continue
				}
				want, _, wtlp := rollout.DrawTruncated(row, u[i], int(topK[i]), topP[i])
				if got[i] != want {
					if !rollout.NearTruncBoundary(row, u[i], int(topK[i]), topP[i]) {
						t.Errorf("%s: device drew %d (%v), DrawTruncated %d (%v)", name, got[i], row[got[i]], want, row[want])
					}
					near++
					continue
				}
				if math.Abs(float64(gtlp[i]-wtlp)) > tol {
					t.Errorf("%s: token %d, truncated log-prob %v, want %v", name, got[i], gtlp[i], wtlp)
				}
				if !rawRows && math.Abs(float64(glp[i]-row[got[i]])) > tol {
					t.Errorf("%s: log-prob %v, want %v", name, glp[i], row[got[i]])
				}
			}
		}
	}
	t.Logf("%d draws differ from DrawTruncated's within rounding of a boundary", near)
	if near > 2 {
		t.Errorf("%d draws differ within rounding of a boundary: more than chance", near)
	}
}

// topOf returns the n largest entries' ids of z, the largest first, the
// lower id first among equal values (-0 equal to 0), by sorting.
func topOf(z []float32, n int) []int32 {
	ids := make([]int32, len(z))
	for i := range ids {
		ids[i] = int32(i)
	}
	sort.SliceStable(ids, func(a, b int) bool { return z[ids[a]] > z[ids[b]] })
	return ids[:n]
}

// logSoftmaxF64 is the log-softmax of logits at temperature temp (0
// meaning 1) through float64's log-sum-exp, rounded once to float32 (and
// returned beside it).
func logSoftmaxF64(logits []float32, temp float32) ([]float32, float32) {
	if temp == 0 {
		temp = 1
	}
	out := make([]float32, len(logits))
	m := math.Inf(-1)
	for j, v := range logits {
		out[j] = v / temp
		m = math.Max(m, float64(out[j]))
	}
	var s float64
	for _, v := range out {
		s += math.Exp(float64(v) - m)
	}
	l := float32(m + math.Log(s))
	for j := range out {
		out[j] -= l
	}
	return out, l
}

// TestDeviceDrawRows: draw_rows against rollout.DrawRow on the same
// log-softmax rows: vocabularies of one partial-sum block, a few, and
// Qwen3's 151,936 (each warp sums many blocks); rows with tokens of
// probability 0 (-inf), mass only in the last block, a one-hot row; greedy
// rows with ties (the lowest id wins); rows left to the host untouched.
// A draw may differ only where the uniform lies within rounding of a
// boundary between two tokens (the partial sums add in another order).
func TestDeviceDrawRows(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(9, 9))
	inf := float32(math.Inf(-1))
	for _, V := range []int{7, 2000, 151936} {
		const rows = 12
		z := randF32(r, rows*V, 3)
		raw := make([]float32, rows*V) // each row's logits before its log-softmax
		temps := make([]float32, rows)
		u := make([]float64, rows)
		for i := 0; i < rows; i++ {
			row := z[i*V : (i+1)*V]
			temps[i], u[i] = 1, r.Float64()
			switch i {
			case 1: // a third of the tokens impossible
				for j := range row {
					if j%3 == 0 {
						row[j] = inf
					}
				}
			case 2: // all the mass in the last block
				for j := range row[:V-min(V, 300)] {
					row[j] = inf
				}
			case 3: // one token
				for j := range row {
					row[j] = inf
				}
				row[V/2] = 0
			case 4, 5: // greedy, with a tie for the maximum (above every other: randF32's are normal, σ 3)
				temps[i] = 0
				row[V-1], row[V/3] = 40, 40
			case 6: // left to the host
				u[i] = -1
			case 7: // the extremes of the uniform
				u[i] = 0
			case 8:
				u[i] = math.Nextafter(1, 0)
			case 9, 10: // a temperature other than 1 (only draw_rows_raw divides by it)
				temps[i] = 0.7
				for j := range row {
					row[j] += 5 // logits, not log-probs: the log-sum-exp is not 0
				}
			}
			copy(raw[i*V:], row)
			kernels.LogSoftmax(row, row)
		}
		bz, bu, bt := bufOf(g, z), bufOf(g, u), bufOf(g, temps)
		tok := bufOf(g, make([]int32, rows))
		lp, tlp := g.poisoned(rows), g.poisoned(rows)
		off := Draws{U: bu, Temps: bt, TopK: bufOf(g, make([]int32, rows)), TopP: bufOf(g, make([]float64, rows)),
			TopN: bufOf(g, make([]int32, rows))}
		d := off
		d.Tok, d.LP, d.TLP = tok, lp, tlp
		ops := NewOps(g.d)
		if err := ops.DrawRows(d, bz, rows, V); err != nil {
			t.Fatal(err)
		}
		got := make([]int32, rows)
		if err := Download(g.d, got, tok); err != nil {
			t.Fatal(err)
		}
		glp := g.f32(lp, rows)
		sameBits(t, fmt.Sprintf("V=%d untruncated rows' truncated log-probs", V), g.f32(tlp, rows), glp)
		for i := 0; i < rows; i++ {
			row := z[i*V : (i+1)*V]
			if u[i] < 0 {
				if got[i] != 0 || !math.IsNaN(float64(glp[i])) {
					t.Errorf("V=%d row %d (host's): token %d, log-prob %v written", V, i, got[i], glp[i])
				}
				continue
			}
			want, wlp := rollout.DrawRow(row, u[i], temps[i])
			if got[i] < 0 || int(got[i]) >= V || math.Float32bits(glp[i]) != math.Float32bits(row[got[i]]) {
				t.Fatalf("V=%d row %d: token %d, log-prob %v", V, i, got[i], glp[i])
			}
			if got[i] == want {
				continue
			}
			if temps[i] == 0 || row[got[i]] == inf || !rollout.NearDrawBoundary(row, u[i], min(got[i], want)) {
				t.Errorf("V=%d row %d (temperature %v, u %v): device drew %d (%v), DrawRow %d (%v)", V, i, temps[i], u[i], got[i], glp[i], want, wlp)
			}
		}

		// draw_rows_raw from the logits: DrawRow over the log-softmax at
		// the row's temperature (float64's log-sum-exp rounded, which the
		// kernel's may miss by an ulp: draws may differ within rounding of
		// a boundary, log-probs by the ulp), the logits not changed; and
		// logsoftmax_rows_host's rows as LogSoftmaxTemps makes them.
		// Then the split draw (given scratch): chunks of 512 tokens (V=2000
		// in four, the last partial) and of DrawChunkTokens.
		braw := bufOf(g, raw)
		for _, c := range []struct {
			name  string
			chunk int
		}{{"draw_rows_raw", 0}, {"the split draw, chunks of 512", 512}, {"the split draw", DrawChunkTokens}} {
			tok2, lp2 := bufOf(g, make([]int32, rows)), g.poisoned(rows)
			d = off
			d.Tok, d.LP, d.TLP = tok2, lp2, g.poisoned(rows)
			ops.drawChunk, ops.DrawSplitAlways = c.chunk, c.chunk > 0
			if c.chunk > 0 { // scratch: the split draw
				d.Scratch = g.poisoned(drawScratchFloats(rows, V, c.chunk))
			}
			if err := ops.DrawRowsRaw(d, braw, rows, V); err != nil {
				t.Fatal(err)
			}
			sameBits(t, fmt.Sprintf("V=%d %s: untruncated raw rows' truncated log-probs", V, c.name), g.f32(d.TLP, rows), g.f32(lp2, rows))
			got2 := make([]int32, rows)
			if err := Download(g.d, got2, tok2); err != nil {
				t.Fatal(err)
			}
			glp2 := g.f32(lp2, rows)
			for i := 0; i < rows; i++ {
				if u[i] < 0 {
					if got2[i] != 0 || !math.IsNaN(float64(glp2[i])) {
						t.Errorf("V=%d row %d (host's): %s wrote token %d, log-prob %v", V, i, c.name, got2[i], glp2[i])
					}
					continue
				}
				tp := temps[i]
				if tp == 0 {
					tp = 1
				}
				lrow, l32 := logSoftmaxF64(raw[i*V:(i+1)*V], tp)
				want, _ := rollout.DrawRow(lrow, u[i], temps[i])
				if got2[i] < 0 || int(got2[i]) >= V || lrow[got2[i]] == inf || math.Abs(float64(glp2[i]-lrow[got2[i]])) > 2e-6*(1+math.Abs(float64(l32))) {
					t.Fatalf("V=%d row %d (%s): token %d, log-prob %v (from float64's log-sum-exp %v)", V, i, c.name, got2[i], glp2[i], lrow[max(got2[i], 0)])
				}
				if got2[i] != want && (temps[i] == 0 || !rollout.NearDrawBoundary(lrow, u[i], min(got2[i], want))) {
					t.Errorf("V=%d row %d (%s, temperature %v, u %v): device drew %d, DrawRow %d", V, i, c.name, temps[i], u[i], got2[i], want)
				}
			}
			sameBits(t, fmt.Sprintf("V=%d %s: the logits", V, c.name), g.f32(braw, rows*V), raw)
		}
		ops.drawChunk, ops.DrawSplitAlways = 0, false
		if err := ops.LogSoftmaxHostRows(braw, bt, bu, rows, V); err != nil {
			t.Fatal(err)
		}
		host := bufOf(g, raw)
		if err := ops.LogSoftmaxTemps(host, bt, rows, V); err != nil {
			t.Fatal(err)
		}
		gotRows, wantRows := g.f32(braw, rows*V), g.f32(host, rows*V)
		for i := 0; i < rows; i++ {
			w := wantRows[i*V : (i+1)*V]
			if u[i] >= 0 {
				w = raw[i*V : (i+1)*V] // a drawn row is left as it was
			}
			sameBits(t, fmt.Sprintf("V=%d logsoftmax_rows_host row %d", V, i), gotRows[i*V:(i+1)*V], w)
		}
	}
}
