package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// flashRun is one forward and backward of flash.cu's attention and what
// they wrote, read back: out and dv as their bf16 bits.
type flashRun struct {
	out, dv     []uint16
	lse, dq, dk []float32
}

// runFlash runs ops' forward and backward on q, k, v and dout.
func runFlash(g *gpu, ops *Ops, q, k, v, dout []float32, seqStart, seqEnd []int32, heads, kv, hd int) flashRun {
	g.t.Helper()
	T := len(seqStart)
	qd, kvd := heads*hd, kv*hd
	bq, bk, bv, bdo := bufOf(g, q), bufOf(g, k), bufOf(g, v), bufOf(g, dout)
	bst, ben := bufOf(g, seqStart), bufOf(g, seqEnd)
	bout, blse, bdsum := g.poisoned(T*qd), g.poisoned(T*heads), g.poisoned(T*heads)
	bdq, bdk, bdv := g.poisoned(T*qd), g.poisoned(T*kvd), g.poisoned(T*kvd)
	fs, err := NewFlashScratch(g.d, T, heads, kv, hd, false)
	if err != nil {
		g.t.Fatal(err)
	}
	defer fs.Free()
	bs, err := NewFlashScratch(g.d, T, heads, kv, hd, true)
	if err != nil {
		g.t.Fatal(err)
	}
	defer bs.Free()
	scale := float32(1 / math.Sqrt(float64(hd)))
	if err := ops.FlashAttention(fs, bout, blse, bq, bk, bv, bst, scale); err != nil {
		g.t.Fatal(err)
	}
	if err := ops.FlashAttentionBackward(bs, bdq, bdk, bdv, bdsum, bdo, bout, blse, bq, bk, bv, bst, ben, scale); err != nil {
		g.t.Fatal(err)
	}
	if err := g.d.Sync(); err != nil {
		g.t.Fatal(err)
	}
	return flashRun{out: g.u16(bout, T*qd), lse: g.f32(blse, T*heads), dq: g.f32(bdq, T*qd), dk: g.f32(bdk, T*kvd),
		dv: g.u16(bdv, T*kvd)}
}

// isNaN reports whether x is a NaN: a float32, or bf16 bits.
func isNaN[E uint16 | float32](x E) bool {
	switch v := any(x).(type) {
	case uint16:
		return v&0x7f80 == 0x7f80 && v&0x7f != 0
	default:
		f := v.(float32)
		return f != f
	}
}

// sameRows checks rows lo..hi-1 (width numbers each) of got and want bit
// for bit. A NaN fails: the buffers start poisoned with NaN, and a row
// left unwritten in both runs must not pass as the same.
func sameRows[E uint16 | float32](t *testing.T, what string, got, want []E, width, lo, hi int) {
	t.Helper()
	for i := lo * width; i < hi*width; i++ {
		if got[i] != want[i] || isNaN(got[i]) {
			t.Fatalf("%s: row %d column %d = %v, want %v bit for bit", what, i/width, i%width, got[i], want[i])
		}
	}
}

// eachRowMoved checks that each of rows lo..hi-1 (width numbers each)
// differs somewhere between got and want: the rows that see a changed
// key must show it, or a mask that drops a key (a row's own, say) would
// pass the invariance checks.
func eachRowMoved[E uint16 | float32](t *testing.T, what string, got, want []E, width, lo, hi int) {
	t.Helper()
	for r := lo; r < hi; r++ {
		if slices.Equal(got[r*width:(r+1)*width], want[r*width:(r+1)*width]) {
			t.Fatalf("%s: row %d did not change", what, r)
		}
	}
}

// TestDeviceFlashCausal checks flash.cu's masks exactly. A row's output,
// log-sum-exp and dq depend only on the keys and values of its own
// sequence up to it, and a key's dk and dv only on the queries and output
// gradients of its sequence from it on: a masked score's exponential is
// exactly 0, so changing everything else must leave them bit for bit. The
// kernels skip the mask on tiles wholly inside every row's keys; a tile
// taken for such one key too early shows here as a changed row, where
// the comparison with float64 (TestDeviceFlashAttention) can miss one
// key among hundreds. Cuts at and beside the tiles' edges (16 to 128
// rows), in a sequence after another, for each forward; and each
// sequence changed whole, the others the same (a sequence starting 22
// rows into a 32-query dK/dV tile below T among them). The other way round, each
// row after a cut must change (its own key changed), and each key before
// it: a mask that drops a row's own key fails here or, for dq, against
// float64 in TestDeviceFlashAttention.
func TestDeviceFlashCausal(t *testing.T) {
	g := newGPU(t)
	r := rand.New(rand.NewPCG(5, 9))
	for _, c := range []struct {
		lens          []int
		heads, kv, hd int
	}{{[]int{37, 200}, 2, 1, 128}, {[]int{150, 40}, 2, 1, 64}, {[]int{3, 100}, 2, 2, 32}} {
		starts, T, seqStart, seqEnd := packSeqs(c.lens)
		qd, kvd := c.heads*c.hd, c.kv*c.hd
		q, k, v, dout := randF32(r, T*qd, 1), randF32(r, T*kvd, 1), randF32(r, T*kvd, 1), randF32(r, T*qd, 1)
		// The longest sequence is cut.
		s := 0
		for i, l := range c.lens {
			if l > c.lens[s] {
				s = i
			}
		}
		s0, s1 := starts[s], starts[s]+c.lens[s]
		for _, fwd := range []string{"narrow", "wide", "wideq"} {
			ops := NewOps(g.d)
			// The 16-query dK/dV pass here; the 32-query one (the default)
			// is checked against the same cuts below.
			ops.FlashWide, ops.FlashWideQ, ops.FlashDKVWide = fwd == "wide", fwd == "wideq", false
			base := runFlash(g, ops, q, k, v, dout, seqStart, seqEnd, c.heads, c.kv, c.hd)
			// Every row of one sequence changed, q, k, v and dout: the other
			// sequences' rows the same, each way round.
			for _, inside := range []bool{true, false} {
				q2, k2, v2, d2 := slices.Clone(q), slices.Clone(k), slices.Clone(v), slices.Clone(dout)
				for i := 0; i < T; i++ {
					if (i >= s0 && i < s1) == inside {
						for x := i * qd; x < (i+1)*qd; x++ {
							q2[x], d2[x] = float32(r.NormFloat64()), float32(r.NormFloat64())
						}
						for x := i * kvd; x < (i+1)*kvd; x++ {
							k2[x], v2[x] = float32(r.NormFloat64()), float32(r.NormFloat64())
						}
					}
				}
				got := runFlash(g, ops, q2, k2, v2, d2, seqStart, seqEnd, c.heads, c.kv, c.hd)
				lo, hi := s0, s1 // the rows that must not move
				if inside {
					lo, hi = 0, s0
				}
				for pass := 0; pass < 2; pass++ {
					name := fmt.Sprintf("%v %s forward, sequence %d changed: %v rows %d..%d", c, fwd, s, inside, lo, hi-1)
					sameRows(t, name+": out", got.out, base.out, qd, lo, hi)
					sameRows(t, name+": lse", got.lse, base.lse, c.heads, lo, hi)
					sameRows(t, name+": dq", got.dq, base.dq, qd, lo, hi)
					sameRows(t, name+": dk", got.dk, base.dk, kvd, lo, hi)
					sameRows(t, name+": dv", got.dv, base.dv, kvd, lo, hi)
					if !inside {
						break
					}
					lo, hi = s1, T
				}
			}
			for _, cut := range []int{0, 15, 16, 31, 32, 63, 64, 127, 128, 129, 160} {
				if s0+cut >= s1 {
					continue
				}
				name := fmt.Sprintf("%v %s forward, cut at row %d of the sequence", c, fwd, cut)
				// Keys and values outside s0..s0+cut changed: rows s0..s0+cut
				// the same.
				k2, v2 := slices.Clone(k), slices.Clone(v)
				for j := 0; j < T; j++ {
					if j < s0 || j > s0+cut {
						for x := j * kvd; x < (j+1)*kvd; x++ {
							k2[x], v2[x] = float32(r.NormFloat64()), float32(r.NormFloat64())
						}
					}
				}
				got := runFlash(g, ops, q, k2, v2, dout, seqStart, seqEnd, c.heads, c.kv, c.hd)
				sameRows(t, name+": out", got.out, base.out, qd, s0, s0+cut+1)
				sameRows(t, name+": lse", got.lse, base.lse, c.heads, s0, s0+cut+1)
				sameRows(t, name+": dq", got.dq, base.dq, qd, s0, s0+cut+1)
				// Each row after the cut sees a changed key, its own among them.
				eachRowMoved(t, name+": out after the cut", got.out, base.out, qd, s0+cut+1, s1)
				eachRowMoved(t, name+": dq after the cut", got.dq, base.dq, qd, s0+cut+1, s1)
				if fwd != "wideq" {
					continue // the backward is the same kernels after each forward
				}
				// Queries and output gradients outside s0+cut..s1-1 changed:
				// the keys s0+cut.. of the sequence the same dk and dv, with
				// the dK/dV pass's 16- and 32-query tiles.
				q2, d2 := slices.Clone(q), slices.Clone(dout)
				for i := 0; i < T; i++ {
					if i < s0+cut || i >= s1 {
						for x := i * qd; x < (i+1)*qd; x++ {
							q2[x], d2[x] = float32(r.NormFloat64()), float32(r.NormFloat64())
						}
					}
				}
				for _, wide := range []bool{false, true} {
					o := NewOps(g.d)
					o.FlashDKVWide = wide
					n := fmt.Sprintf("%s, dK/dV 32-query tiles %v", name, wide)
					b := base
					if wide {
						b = runFlash(g, o, q, k, v, dout, seqStart, seqEnd, c.heads, c.kv, c.hd)
					}
					got = runFlash(g, o, q2, k, v, d2, seqStart, seqEnd, c.heads, c.kv, c.hd)
					sameRows(t, n+": dk", got.dk, b.dk, kvd, s0+cut, s1)
					sameRows(t, n+": dv", got.dv, b.dv, kvd, s0+cut, s1)
					// Each key before the cut sees a changed query, its own row's.
					eachRowMoved(t, n+": dk before the cut", got.dk, b.dk, kvd, s0, s0+cut)
				}
			}
		}
	}
}
