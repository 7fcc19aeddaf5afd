package cuda

import (
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
	for _, c := range []struct{ T, E, k, hot, N, K int }{{150, 8, 2, 2, 70, 48}, {40, 16, 4, 16, 64, 96}, {90, 6, 2, 3, 33, 45}} {
		ids := randRoutes(r, c.T, c.E, c.k, c.hot)
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
		x16, w16 := make([]uint16, len(x)), make([]uint16, len(w))
		xr, wr := make([]float32, len(x)), make([]float32, len(w))
		for i, v := range x {
			b := kernels.BF16FromFloat32(v)
			x16[i], xr[i] = uint16(b), b.Float32()
		}
		for i, v := range w {
			b := kernels.BF16FromFloat32(v)
			w16[i], wr[i] = uint16(b), b.Float32()
		}
		bx16, bw16 := bufOf(g, x16), bufOf(g, w16)
		var first []float32
		for _, plain := range []bool{false, true} {
			ops.FlashPlainCopies = plain
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
					sameBits(t, "gemm_bf16_grouped, plain copies against cp.async", got[i*ldc:i*ldc+N], first[i*ldc:i*ldc+N])
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
