package cuda

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
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
	for _, bad := range [][]int32{{1, 1}, {2, 3}, {0}, {2, 2, 1}, {2, 3, 3}} {
		if _, err := FlashOrder(bad); err == nil {
			t.Errorf("sequence ends %v accepted", bad)
		}
	}
}

// scheduledTile is flash.cu's scheduled: the tile and head block b of a
// grid of nx tiles by ny heads takes with order and tail.
func scheduledTile(order []int32, tail, nx, ny, b int) (tile, head int) {
	if bulk := (ny - tail) * nx; b < bulk {
		return int(order[b%nx]), b / nx
	} else {
		return int(order[(b-bulk)/tail]), ny - tail + (b-bulk)%tail
	}
}

// TestFlashOrderMakespan models flash.cu's grids on a GPU of 132
// multiprocessors taking two blocks each (an H100 or H200 at the head
// size 128 kernels' registers): blocks start in launch order as slots
// free, and a block takes its tiles' work (keys or queries it sees) plus
// two tiles' of its own. Over 8 sequences of 2048 tokens and one of 4096
// (16 query heads, 8 KV heads), each sequence's tiles from its last
// (heaviest_first, the order before FlashOrder, a head's grid after
// another's) end the forward and the dK/dV pass more than 10% past an
// even share of the work; FlashOrder's order, every head's tiles side by
// side, ends within 2% of it, and within 3.5% with the heads one after
// another but for the last few (KEEL_FLASH_ORDER=headwise), whose blocks
// at work together read fewer sequences' and heads' keys and values (the
// log counts them).
func TestFlashOrderMakespan(t *testing.T) {
	const heads, kv = 16, 8
	dflt, headwise := &Ops{Dev: &Device{SMs: 132}}, &Ops{Dev: &Device{SMs: 132}, FlashOrderHeadwise: true}
	slots := 2 * dflt.Dev.SMs
	// makespan is when the last block ends; even, the work over the slots;
	// window, the median over the grid of the (sequence, head group) pairs
	// among slots consecutive blocks (those at work together, roughly):
	// whose keys and values (or queries and dO) the L2 cache serves.
	type block struct {
		work float64
		pair [2]int
	}
	makespan := func(blocks []block) (end, even float64, window int) {
		free := make([]float64, slots) // when each slot frees
		for _, b := range blocks {
			i := slices.Index(free, slices.Min(free))
			free[i] += b.work
			end = max(end, free[i])
			even += b.work / float64(slots)
		}
		var windows []int
		for s := 0; s+slots <= len(blocks); s += slots / 4 {
			seen := map[[2]int]bool{}
			for _, b := range blocks[s : s+slots] {
				seen[b.pair] = true
			}
			windows = append(windows, len(seen))
		}
		if len(windows) > 0 {
			slices.Sort(windows)
			window = windows[len(windows)/2]
		}
		return end, even, window
	}
	for _, c := range []struct{ seqs, L int }{{8, 2048}, {1, 4096}} {
		var ends []int32
		for s := range c.seqs {
			for range c.L {
				ends = append(ends, int32((s+1)*c.L))
			}
		}
		T := len(ends)
		order, err := FlashOrder(ends)
		if err != nil {
			t.Fatal(err)
		}
		start := func(i int) int { return i / c.L * c.L }
		n64, n128 := (T+63)/64, (T+127)/128
		for _, k := range []struct {
			name        string
			rows, ny    int
			keys        bool
			order       []int32
			fromLast    bool // the old order: heaviest_first
			perTileWork float64
			group       int // heads a K/V (or, for keys, a Q/dO read) serves
		}{{"forward (128-row tiles)", 128, heads, false, order[n64 : n64+n128], true, 64, heads / kv},
			{"dQ pass", 64, heads, false, order[:n64], true, 32, heads / kv},
			{"dK/dV pass", 64, kv, true, order[n64+n128:], false, 32, 1}} {
			nx := (T + k.rows - 1) / k.rows
			work := func(x int) float64 {
				last := min(T, (x+1)*k.rows) - 1
				if k.keys {
					return 2 * float64(int(ends[last])-x*k.rows) / k.perTileWork // two query heads a KV head
				}
				return float64(last+1-start(x*k.rows)) / k.perTileWork
			}
			at := func(x, y int) block { return block{work(x) + 2, [2]int{x * k.rows / c.L, y / k.group}} }
			var old []block
			for y := range k.ny {
				for bx := range nx {
					x := bx
					if k.fromLast {
						x = nx - 1 - bx
					}
					old = append(old, at(x, y))
				}
			}
			oe, even, ow := makespan(old)
			if k.name != "dQ pass" && oe <= 1.1*even {
				t.Errorf("%d x %d, %s: the old order ends only %.1f%% past an even share", c.seqs, c.L, k.name, 100*(oe/even-1))
			}
			line := fmt.Sprintf("%d x %d, %s: each sequence's tiles from its last %.1f%% past an even share (%d pairs at once, the median)", c.seqs, c.L, k.name, 100*(oe/even-1), ow)
			for _, v := range []struct {
				name  string
				o     *Ops
				bound float64
			}{{"FlashOrder's", dflt, 1.02}, {"headwise", headwise, 1.035}} {
				tail := v.o.flashTail(nx, k.ny)
				var blocks []block
				for b := range nx * k.ny {
					blocks = append(blocks, at(scheduledTile(k.order, tail, nx, k.ny, b)))
				}
				ne, _, nw := makespan(blocks)
				line += fmt.Sprintf("; %s (the last %d heads side by side) %.1f%% (%d pairs)", v.name, tail, 100*(ne/even-1), nw)
				if ne > v.bound*even {
					t.Errorf("%d x %d, %s: %s order ends %.1f%% past an even share", c.seqs, c.L, k.name, v.name, 100*(ne/even-1))
				}
			}
			t.Log(line)
		}
	}
}

// TestProfileFirstCallsApart: KEEL_CUDA_PROFILE's table keeps each row's
// first call out of its mean and share (a plan or a lazily loaded image
// would swamp a row of few calls) and shows it in a column of its own.
func TestProfileFirstCallsApart(t *testing.T) {
	p := &profile{start: time.Now(), rows: map[string]*profileRow{}}
	p.add("product", 100*time.Millisecond) // the first call: a plan and a module load
	for range 3 {
		p.add("product", 200*time.Microsecond)
	}
	p.add("kernel", 50*time.Microsecond)
	p.add("kernel", 600*time.Microsecond)
	p.add("once", time.Millisecond)
	var b strings.Builder
	p.write(&b, "a GPU")
	out := b.String()
	t.Logf("\n%s", out)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`0\.001 s after each row's first call, and 0\.101 s in first calls`),
		regexp.MustCompile(`(?m)^ *kernel +1 +0\.60 +600\.0 +50\.0% +50\.0 *$`),
		regexp.MustCompile(`(?m)^ *product +3 +0\.60 +200\.0 +50\.0% +100000\.0 *$`),
		regexp.MustCompile(`(?m)^ *once +0 +0\.00 +- +0\.0% +1000\.0 *$`),
	} {
		if !want.MatchString(out) {
			t.Errorf("the table does not match %q", want)
		}
	}
}
