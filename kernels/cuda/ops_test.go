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
