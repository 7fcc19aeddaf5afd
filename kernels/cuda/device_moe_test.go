package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// randRoutes returns tokens × k distinct experts each, drawn so that the
// experts below hot are chosen far more often than the rest (some experts
// get many rows, more than a row tile, and some none).
func randRoutes(r *rand.Rand, tokens, E, k, hot int) []int32 {
	ids := make([]int32, tokens*k)
	for t := 0; t < tokens; t++ {
		seen := map[int32]bool{}
		for s := 0; s < k; s++ {
			var e int32
			for {
				if r.IntN(4) > 0 {
					e = int32(r.IntN(hot))
				} else {
					e = int32(r.IntN(E))
				}
				if !seen[e] {
					break
				}
			}
			seen[e] = true
			ids[t*k+s] = e
		}
	}
	return ids
}

// newGroups allocates a grouping for pairs pairs over E experts.
func newGroups(g *gpu, pairs, E int) *MoEGroups {
	gr := &MoEGroups{}
	for _, s := range gr.Layout(pairs, E) {
		*s.B = bufOf(g, make([]int32, max(s.Words, 1)))
	}
	return gr
}

// wantTiles is the tile map moe_group_offsets writes: each expert's row
// tiles in order, then -1.
func wantTiles(off []int, n int) []int32 {
	var tiles []int32
	for e := 0; e+1 < len(off); e++ {
		for t := 0; t*moeTile < off[e+1]-off[e]; t++ {
			tiles = append(tiles, int32(e), int32(t))
		}
	}
	for len(tiles) < 2*n {
		tiles = append(tiles, -1)
	}
	return tiles
}

// roundOperand rounds v to bf16: the bits for the device, and their values.
func roundOperand(v []float32) ([]uint16, []float32) {
	h, f := make([]uint16, len(v)), make([]float32, len(v))
	for i, a := range v {
		b := kernels.BF16FromFloat32(a)
		h[i], f[i] = uint16(b), b.Float32()
	}
	return h, f
}

func (g *gpu) i32(b Buffer, n int) []int32 {
	g.t.Helper()
	out := make([]int32, n)
	if err := Download(g.d, out, b); err != nil {
		g.t.Fatal(err)
	}
	return out
}

// TestDeviceMoEGroup: the device's grouping of (token, slot) pairs by
// expert is model.GroupByExpert's (offsets, rows, tokens), with the tile
// map the grouped products read; over pair counts below, at and across
// chunks, experts with no pairs and experts with more than a tile.
func TestDeviceMoEGroup(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(31, 7))
	ops := NewOps(g.d)
	for _, c := range []struct{ T, E, k, hot int }{{1, 8, 2, 8}, {128, 16, 2, 16}, {300, 128, 8, 12}, {37, 64, 4, 3}, {700, 4, 1, 1}} {
		ids := randRoutes(r, c.T, c.E, c.k, c.hot)
		R := len(ids)
		gr := newGroups(g, R+5, c.E) // room for more pairs than grouped
		if err := ops.MoEGroup(gr, bufOf(g, ids), R, c.k); err != nil {
			t.Fatal(err)
		}
		off, row, tok := model.GroupByExpert(ids, c.E, c.k)
		gotOff := g.i32(gr.Off, c.E+1)
		for e := range gotOff {
			if int(gotOff[e]) != off[e] {
				t.Fatalf("T=%d E=%d k=%d: off[%d] = %d, want %d", c.T, c.E, c.k, e, gotOff[e], off[e])
			}
		}
		gotRow, gotTok := g.i32(gr.Row, R), g.i32(gr.Tok, R)
		for j := range row {
			if gotRow[j] != row[j] || gotTok[j] != tok[j] {
				t.Fatalf("T=%d E=%d k=%d: pair %d: row %d tok %d, want %d and %d", c.T, c.E, c.k, j, gotRow[j], gotTok[j], row[j], tok[j])
			}
		}
		n := groupTiles(R, c.E)
		want, got := wantTiles(off, n), g.i32(gr.Tiles, 2*n)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("T=%d E=%d k=%d: tiles[%d] = %d, want %d", c.T, c.E, c.k, i, got[i], want[i])
			}
		}
	}
	if err := ops.MoEGroup(newGroups(g, 4, 8), Buffer{}, 5, 1); err == nil {
		t.Error("grouping more pairs than the grouping holds: no error")
	}
}

// TestDeviceGemmGrouped: the grouped float32 product is Ops.Gemm over each
// expert's rows, bit for bit (gate and up side by side: the weights
// strided as in the arena); the bf16 product on the tensor cores is
// within float32 rounding of the float64 product of the bf16 operands,
// with 16-byte copies (cp.async and plain) and element by element (K not
// a multiple of 8), and a token's rows are the same bits grouped alone.
func TestDeviceGemmGrouped(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(5, 19))
	for _, c := range []struct {
		T, E, k, hot, N, K int
		rows               []int // each expert's rows (one slot a token), in a shuffled order; nil: random routes
	}{{150, 8, 2, 2, 70, 48, nil}, {40, 16, 4, 16, 64, 96, nil}, {90, 6, 2, 3, 33, 45, nil},
		// Every count of 16-row slabs the few-row warps skip or take, and
		// each side of a 64-row tile.
		{244, 8, 1, 0, 40, 40, []int{1, 16, 17, 33, 48, 64, 65, 0}}} {
		var ids []int32
		if c.rows == nil {
			ids = randRoutes(r, c.T, c.E, c.k, c.hot)
		} else {
			for e, n := range c.rows {
				for range n {
					ids = append(ids, int32(e))
				}
			}
			r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		}
		R, N, K, E := len(ids), c.N, c.K, c.E
		stride := N*K + 3*K // experts' weights apart as in the arena (another matrix between)
		ops := NewOps(g.d)
		gr := newGroups(g, R, E)
		if err := ops.MoEGroup(gr, bufOf(g, ids), R, c.k); err != nil {
			t.Fatal(err)
		}
		off, _, _ := model.GroupByExpert(ids, E, c.k)
		x := randF32(r, R*K, 1)
		w := randF32(r, E*stride, 0.2)
		bx, bw := bufOf(g, x), bufOf(g, w)
		ldc := N + 3
		// float32: the same bits as the product per expert.
		y := g.poisoned(R * ldc)
		if err := ops.GemmGrouped(gr, R, y, bx, bw, N, K, K, ldc, stride, false); err != nil {
			t.Fatal(err)
		}
		ref := g.poisoned(R * ldc)
		for e := 0; e < E; e++ {
			if n := off[e+1] - off[e]; n > 0 {
				g.gemm(ref.Floats(off[e]*ldc, n*ldc), bx.Floats(off[e]*K, n*K), bw.Floats(e*stride, N*K), n, N, K, K, 1, 1, K, ldc, false)
			}
		}
		got, want := g.f32(y, R*ldc), g.f32(ref, R*ldc)
		for i := 0; i < R; i++ {
			sameBits(t, "gemm_f32_grouped", got[i*ldc:i*ldc+N], want[i*ldc:i*ldc+N])
		}

		// bf16: against float64 over the rounded operands.
		x16, xr := roundOperand(x)
		w16, wr := roundOperand(w)
		bx16, bw16 := bufOf(g, x16), bufOf(g, w16)
		// Both copy paths, and both warp layouts (32 x 32, and the
		// few-row warps' 16-row slabs): the same bits.
		var first []float32
		for _, v := range []struct {
			plain bool
			few   int8
		}{{false, -1}, {true, -1}, {false, 1}, {true, 1}} {
			ops.FlashPlainCopies, ops.groupedFew = v.plain, v.few
			y16 := g.poisoned(R * ldc)
			if err := ops.GemmGroupedBF16(gr, R, y16, bx16, bw16, N, K, K, ldc, stride, false); err != nil {
				t.Fatal(err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			got := g.f32(y16, R*ldc)
			if first == nil {
				first = got
			} else {
				for i := 0; i < R; i++ {
					sameBits(t, fmt.Sprintf("gemm_bf16_grouped, plain copies %v, few-row warps %v, against cp.async and 32 x 32 warps", v.plain, v.few > 0), got[i*ldc:i*ldc+N], first[i*ldc:i*ldc+N])
				}
			}
			for e := 0; e < E; e++ {
				n := off[e+1] - off[e]
				if n == 0 {
					continue
				}
				want, bound := gemmRef(make([]float32, n*N), xr[off[e]*K:(off[e]+n)*K], wr[e*stride:e*stride+N*K], n, N, K, K, 1, 1, K, N, false)
				for i := 0; i < n; i++ {
					withinBound(t, "gemm_bf16_grouped", got[(off[e]+i)*ldc:(off[e]+i)*ldc+N], want[i*N:(i+1)*N], bound[i*N:(i+1)*N])
				}
			}
		}
		// With a bf16 output (both warp layouts): the float32 output
		// rounded, bit for bit, the columns past N and between rows
		// untouched (NaN-filled).
		ops.FlashPlainCopies = false
		for _, few := range []int8{-1, 1} {
			ops.groupedFew = few
			c16 := make([]uint16, R*ldc)
			for i := range c16 {
				c16[i] = 0x7fc1
			}
			y16 := bufOf(g, c16)
			if err := ops.GemmGroupedBF16To16(gr, R, y16, bx16, bw16, N, K, K, ldc, stride); err != nil {
				t.Fatal(err)
			}
			if err := ops.GemmGroupedBF16To16(gr, R, y16, bx16, bw16, N, K, K, ldc, 0); err == nil {
				t.Error("gemm_bf16_grouped_c16 with experts overlapping in their weights was accepted")
			}
			for i, h := range g.u16(y16, R*ldc) {
				want := uint16(0x7fc1)
				if i%ldc < N {
					want = uint16(kernels.BF16FromFloat32(first[i]))
				}
				if h != want {
					t.Fatalf("gemm_bf16_grouped_c16 %v (few-row warps %v), element %d (row %d, column %d): %#04x, want %#04x", c, few > 0, i, i/ldc, i%ldc, h, want)
				}
			}
		}
		ops.groupedFew = 0
		// Batch invariance: token 1's k pairs grouped alone.
		one := ids[c.k : 2*c.k]
		_, rowOne, _ := model.GroupByExpert(one, E, c.k)
		_, rowAll, _ := model.GroupByExpert(ids, E, c.k)
		xOne := make([]uint16, c.k*K)
		for s := 0; s < c.k; s++ {
			copy(xOne[int(rowOne[s])*K:], x16[int(rowAll[c.k+s])*K:int(rowAll[c.k+s]+1)*K])
		}
		g1 := newGroups(g, c.k, E)
		if err := ops.MoEGroup(g1, bufOf(g, one), c.k, c.k); err != nil {
			t.Fatal(err)
		}
		y1 := g.poisoned(c.k * N)
		if err := ops.GemmGroupedBF16(g1, c.k, y1, bufOf(g, xOne), bw16, N, K, K, N, stride, false); err != nil {
			t.Fatal(err)
		}
		alone := g.f32(y1, c.k*N)
		for s := 0; s < c.k; s++ {
			a, b := int(rowOne[s]), int(rowAll[c.k+s])
			sameBits(t, "gemm_bf16_grouped, a token alone against in the batch", alone[a*N:(a+1)*N], first[b*ldc:b*ldc+N])
		}
	}
}

// TestDeviceGemmGroupedBack: the grouped products' gradients. float32:
// the input's gradient and the weights' (accumulated into what is there)
// are LinearBackX's and LinearBackW's over each expert's rows, bit for
// bit. bf16: within float32 rounding of the float64 products of the bf16
// operands, the weights read transposed (16 bytes at a time, and element
// by element where K is odd).
func TestDeviceGemmGroupedBack(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(8, 3))
	for _, c := range []struct{ T, E, k, hot, N, K int }{{150, 8, 2, 2, 70, 48}, {40, 16, 4, 16, 64, 96}, {90, 6, 2, 3, 33, 45}} {
		ids := randRoutes(r, c.T, c.E, c.k, c.hot)
		R, N, K, E := len(ids), c.N, c.K, c.E
		stride := N*K + 3*K
		ops := NewOps(g.d)
		gr := newGroups(g, R, E)
		if err := ops.MoEGroup(gr, bufOf(g, ids), R, c.k); err != nil {
			t.Fatal(err)
		}
		off, _, _ := model.GroupByExpert(ids, E, c.k)
		dy, x := randF32(r, R*N, 1), randF32(r, R*K, 1)
		w, dx0, dw0 := randF32(r, E*stride, 0.2), randF32(r, R*K, 1), randF32(r, E*stride, 1)
		bdy, bx, bw := bufOf(g, dy), bufOf(g, x), bufOf(g, w)

		// float32 against the products per expert.
		gotX, wantX := bufOf(g, dx0), bufOf(g, dx0)
		gotW, wantW := bufOf(g, dw0), bufOf(g, dw0)
		if err := ops.GemmGroupedBackX(gr, R, gotX, bdy, bw, N, K, N, K, stride, true); err != nil {
			t.Fatal(err)
		}
		if err := ops.GemmGroupedBackW(gr, gotW, bdy, bx, N, K, N, K, stride); err != nil {
			t.Fatal(err)
		}
		for e := 0; e < E; e++ {
			n := off[e+1] - off[e]
			if n == 0 {
				continue
			}
			dyE, xE := bdy.Floats(off[e]*N, n*N), bx.Floats(off[e]*K, n*K)
			if err := ops.LinearBackX(wantX.Floats(off[e]*K, n*K), dyE, bw.Floats(e*stride, N*K), n, K, N, K, N, true); err != nil {
				t.Fatal(err)
			}
			if err := ops.LinearBackW(wantW.Floats(e*stride, N*K), dyE, xE, n, K, N, N, K); err != nil {
				t.Fatal(err)
			}
		}
		sameBits(t, "gemm_f32_grouped, the input's gradient", g.f32(gotX, R*K), g.f32(wantX, R*K))
		sameBits(t, "gemm_f32_grouped_dw", g.f32(gotW, E*stride), g.f32(wantW, E*stride))

		// bf16 against float64 over the rounded operands.
		dy16, dyr := roundOperand(dy)
		x16, xr := roundOperand(x)
		w16, wr := roundOperand(w)
		bdy16, bx16, bw16 := bufOf(g, dy16), bufOf(g, x16), bufOf(g, w16)
		var firstX, firstW []float32
		for _, plain := range []bool{false, true} {
			ops.FlashPlainCopies = plain
			gx, gw := bufOf(g, dx0), bufOf(g, dw0)
			if err := ops.GemmGroupedBF16BackX(gr, R, gx, bdy16, bw16, N, K, N, K, stride, true); err != nil {
				t.Fatal(err)
			}
			if err := ops.GemmGroupedBF16BackW(gr, gw, bdy16, bx16, N, K, N, K, stride); err != nil {
				t.Fatal(err)
			}
			gotX, gotW := g.f32(gx, R*K), g.f32(gw, E*stride)
			if firstX == nil {
				firstX, firstW = gotX, gotW
			} else {
				sameBits(t, "gemm_bf16_grouped_dx, plain copies against cp.async", gotX, firstX)
				sameBits(t, "gemm_bf16_grouped_dw, plain copies against cp.async", gotW, firstW)
			}
			for e := 0; e < E; e++ {
				n, o := off[e+1]-off[e], off[e]
				wantX, bound := gemmRef(dx0[o*K:(o+n)*K], dyr[o*N:(o+n)*N], wr[e*stride:e*stride+N*K], n, K, N, N, 1, K, 1, K, true)
				withinBound(t, "gemm_bf16_grouped_dx", gotX[o*K:(o+n)*K], wantX, bound)
				if n == 0 {
					sameBits(t, "gemm_bf16_grouped_dw of an expert without rows", gotW[e*stride:e*stride+N*K], dw0[e*stride:e*stride+N*K])
					continue
				}
				wantW, bound := gemmRef(dw0[e*stride:e*stride+N*K], dyr[o*N:(o+n)*N], xr[o*K:(o+n)*K], N, K, n, 1, N, K, 1, K, true)
				withinBound(t, "gemm_bf16_grouped_dw", gotW[e*stride:e*stride+N*K], wantW, bound)
			}
		}
	}
}

// TestDeviceQuantGrouped: the fp8 and fp4 products of every expert over
// its grouped rows in one grouped launch are QuantLinear's per-expert
// products (the same quantisation and scales; the sums within float32
// rounding of each other), with an expert's gate and up projections as
// one product of adjacent matrices; a product over matrices that are not
// adjacent is refused.
func TestDeviceQuantGrouped(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(2, 9))
	const E, k, T, H, I = 6, 2, 70, 40, 24
	stride := 3 * I * H
	n := 5*H + E*stride // something before the experts, then gate, up, down of each
	arena := randF32(r, n, 0.3)
	var mats []Matrix
	for e := 0; e < E; e++ {
		o := 5*H + e*stride
		mats = append(mats, Matrix{Off: o, Rows: I, Cols: H}, Matrix{Off: o + I*H, Rows: I, Cols: H}, Matrix{Off: o + 2*I*H, Rows: H, Cols: I})
	}
	barena := bufOf(g, arena)
	ids := randRoutes(r, T, E, k, 3)
	R := len(ids)
	off, _, _ := model.GroupByExpert(ids, E, k)
	ops := NewOps(g.d)
	gr := newGroups(g, R, E)
	if err := ops.MoEGroup(gr, bufOf(g, ids), R, k); err != nil {
		t.Fatal(err)
	}
	bx := bufOf(g, randF32(r, R*H, 1))
	for _, format := range []string{FormatFP8, FormatFP4} {
		q, err := NewQuantLinear(ops, barena, n, mats, format)
		if err != nil {
			t.Fatal(err)
		}
		y := g.poisoned(R * 2 * I)
		gateUp := barena.Floats(5*H, (E-1)*stride+2*I*H)
		if err := q.Grouped(gr, R, y, bx, gateUp, 2*I, H, H, 2*I, stride); err != nil {
			t.Fatal(err)
		}
		want := g.poisoned(R * 2 * I)
		for e := 0; e < E; e++ {
			m := off[e+1] - off[e]
			if m == 0 {
				continue
			}
			o := 5*H + e*stride
			yw := want.Floats(off[e]*2*I, m*2*I)
			if err := q.LinearMany(bx.Floats(off[e]*H, m*H), m, H, H, Product{Y: yw, W: barena.Floats(o, I*H), Out: I, LdY: 2 * I},
				Product{Y: yw.Floats(I, m*2*I-I), W: barena.Floats(o+I*H, I*H), Out: I, LdY: 2 * I}); err != nil {
				t.Fatal(err)
			}
		}
		closeTo(t, format+" grouped gate and up", g.f32(y, R*2*I), g.f32(want, R*2*I), 1e-5)
		// The down projections are not followed by another expert's rows
		// of the same width: N past one matrix is refused.
		down := barena.Floats(5*H+2*I*H, (E-1)*stride+H*I)
		if err := q.Grouped(gr, R, y, bx, down, 2*H, I, H, 2*H, stride); err == nil {
			t.Errorf("%s: a grouped product over matrices that are not adjacent: no error", format)
		}
		q.Free()
	}
}

// TestDeviceMoECombine: the MoE block's combination and its backward from
// the experts' outputs in bf16 (the bf16 training mode's) are the
// float32 kernels' bits over the widened values (the backward's dy
// rounded to bf16); the float32 combination against a float64 reference
// over its slots.
func TestDeviceMoECombine(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(9, 4))
	for _, c := range []struct{ T, k, H int }{{1, 1, 3}, {7, 2, 64}, {33, 8, 300}} {
		R := c.T * c.k
		yg, resid, dout := randF32(r, R*c.H, 1), randF32(r, c.T*c.H, 1), randF32(r, c.T*c.H, 1)
		gates := randF32(r, R, 1)
		row := make([]int32, R)
		for i, p := range r.Perm(R) {
			row[i] = int32(p)
		}
		y16, yw := roundOperand(yg)
		bres, bg, brow, bdo := bufOf(g, resid), bufOf(g, gates), bufOf(g, row), bufOf(g, dout)
		ops := NewOps(g.d)
		name := fmt.Sprintf("%d tokens, %d slots, H %d", c.T, c.k, c.H)

		want, got := g.poisoned(c.T*c.H), g.poisoned(c.T*c.H)
		if err := ops.MoECombine(want, bres, bufOf(g, yw), bg, brow, c.T, c.k, c.H); err != nil {
			t.Fatal(err)
		}
		if err := ops.MoECombine16(got, bres, bufOf(g, y16), bg, brow, c.T, c.k, c.H); err != nil {
			t.Fatal(err)
		}
		w32 := g.f32(want, c.T*c.H)
		sameBits(t, name+": combined from bf16", g.f32(got, c.T*c.H), w32)
		ref := make([]float32, c.T*c.H)
		for tk := 0; tk < c.T; tk++ {
			for j := 0; j < c.H; j++ {
				var acc float64
				for s := 0; s < c.k; s++ {
					acc += float64(gates[tk*c.k+s]) * float64(yw[int(row[tk*c.k+s])*c.H+j])
				}
				ref[tk*c.H+j] = float32(float64(resid[tk*c.H+j]) + acc)
			}
		}
		closeTo(t, name+": combined against float64", w32, ref, 1e-5)

		// The backward from bf16 outputs writes dy in bf16: the float32
		// kernel's dy rounded, and its gates' gradient, bit for bit.
		dyW, dgW := g.poisoned(R*c.H), g.poisoned(R)
		dy16, dg16 := g.poisoned((R*c.H+1)/2), g.poisoned(R)
		g.launch("moe.cu", "moe_combine_bwd", c.T, 256, dyW, dgW, bdo, bufOf(g, yw), bg, brow, c.k, c.H)
		g.launch("moe.cu", "moe_combine_bwd_y16", c.T, 256, dy16, dg16, bdo, bufOf(g, y16), bg, brow, c.k, c.H)
		want16 := make([]kernels.BF16, R*c.H)
		kernels.ToBF16(want16, g.f32(dyW, R*c.H))
		for i, h := range g.u16(dy16, R*c.H) {
			if h != uint16(want16[i]) {
				t.Fatalf("%s: dy16[%d] %#04x, the float32 dy rounded %#04x", name, i, h, uint16(want16[i]))
			}
		}
		sameBits(t, name+": gates' gradient from bf16", g.f32(dg16, R), g.f32(dgW, R))
	}
}
