package cuda

import (
	"slices"
	"testing"
)

// TestScoreLayout: the stored dS's tiles by hand. A key block has a tile
// of 32 queries a head from its first token to its last token's sequence
// end rounded up to 64 (at most the padded rows).
func TestScoreLayout(t *testing.T) {
	for _, c := range []struct {
		lens  []int
		heads int
		want  []int64
	}{
		// 46 tokens, one block: queries 0..63, two tiles a head.
		{[]int{5, 1, 40}, 2, []int64{0, 4}},
		// 204 tokens, padded to 256: block 0 (last token 63, sequence
		// end 130) runs to 192, 6 tiles; block 1 (127, end 130) 64..192, 4;
		// block 2 (191 in the 64-token sequence 130..194) 128..256, 4;
		// block 3 (203, end 204) 192..256, 2.
		{[]int{130, 64, 1, 9}, 1, []int64{0, 6, 10, 14, 16}},
		{[]int{130, 64, 1, 9}, 3, []int64{0, 18, 30, 42, 48}},
		// One 2048-token sequence: block b has (2048 - 64b)/32 tiles.
		{[]int{2048}, 1, func() []int64 {
			off := []int64{0}
			for b := 0; b < 32; b++ {
				off = append(off, off[b]+int64((2048-64*b)/32))
			}
			return off
		}()},
	} {
		_, _, _, ends := packSeqs(c.lens)
		off, err := ScoreLayout(ends, c.heads)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(off, c.want) {
			t.Errorf("ScoreLayout(%v, %d heads) = %v, want %v", c.lens, c.heads, off, c.want)
		}
		n, err := ScoreBytes(ends, c.heads)
		if want := c.want[len(c.want)-1]*4096 + int64(len(c.want))*8; err != nil || n != want {
			t.Errorf("ScoreBytes(%v, %d heads) = %d, %v; want %d", c.lens, c.heads, n, err, want)
		}
	}
	// 2 × 16384 tokens at 16 heads: 2 × 16 × 65,792 tiles of 4 KiB
	// (8 GiB, as FlashDQStored says), and the offsets.
	_, _, _, ends := packSeqs([]int{16384, 16384})
	if n, err := ScoreBytes(ends, 16); err != nil || n != 2*16*65792*4096+513*8 {
		t.Errorf("ScoreBytes(2 × 16384, 16 heads) = %d, %v", n, err)
	}
	for _, bad := range [][]int32{{1, 1}, {3, 2, 3}, {2, 3}, {3, 3, 4}} {
		if _, err := ScoreLayout(bad, 1); err == nil {
			t.Errorf("ScoreLayout(%v) accepted", bad)
		}
	}
}

// TestFlashOrder: the tiles' order for two sequences of 100 and 156
// tokens, worked by hand, and for four of 128 (the sequences'
// tiles interleaved, the heaviest first) and one (each sequence's tiles
// from its last, heaviest_first's order); bad sequence ends are refused.
func TestFlashOrder(t *testing.T) {
	ends := func(lens ...int) []int32 {
		var e []int32
		T := 0
		for _, n := range lens {
			T += n
			for range n {
				e = append(e, int32(T))
			}
		}
		return e
	}
	for _, c := range []struct {
		lens []int
		want []int32
	}{
		// Query tiles of 64: keys seen 64 (0-63), 128 (0-127), 92
		// (100-191), 156 (100-255); of 128: 128, 156. Key blocks: queries
		// that see them 100 (0-99), 192 (64-255), 128, 64.
		{[]int{100, 156}, []int32{3, 1, 2, 0, 1, 0, 1, 2, 0, 3}},
		// Four sequences of two 64-row tiles: each sequence's second tile
		// sees 128 keys, its first 64; one 128-row tile each, all equal;
		// each sequence's first key block is seen by 128 queries.
		{[]int{128, 128, 128, 128}, []int32{1, 3, 5, 7, 0, 2, 4, 6, 0, 1, 2, 3, 0, 2, 4, 6, 1, 3, 5, 7}},
		{[]int{300}, []int32{4, 3, 2, 1, 0, 2, 1, 0, 0, 1, 2, 3, 4}},
	} {
		got, err := FlashOrder(ends(c.lens...))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("lengths %v: order %v, want %v", c.lens, got, c.want)
		}
		if T := len(ends(c.lens...)); len(got) != FlashOrderLen(T) {
			t.Errorf("lengths %v: %d entries, FlashOrderLen says %d", c.lens, len(got), FlashOrderLen(T))
		}
	}
	for _, bad := range [][]int32{{1, 1}, {2, 3}, {0}, {2, 2, 1}} {
		if _, err := FlashOrder(bad); err == nil {
			t.Errorf("sequence ends %v accepted", bad)
		}
	}
}
