package cuda

import "testing"

// TestDecodeSplits: the splits of a decoding step's keys by rows (no GPU
// needed): none from 2048 warps up, up to 16 for a few rows, and
// DecodeSplitFloats's scratch enough for every row count, grouped or a
// warp per head.
func TestDecodeSplits(t *testing.T) {
	defer func(w int) { decodeSplitWarps = w }(decodeSplitWarps)
	decodeSplitWarps = 2048 // the default, whatever KEEL_DECODE_SPLIT_WARPS says
	grouped, perHead := &Ops{}, &Ops{DecodePerHead: true}
	for _, c := range []struct{ rows, heads, kv, want int }{
		{256, 16, 8, 1}, {64, 16, 8, 4}, {100, 16, 8, 3}, {8, 16, 8, 16}, {1, 16, 8, 16}, {2048, 32, 4, 1}, {150, 10, 2, 2}, {300, 10, 2, 1},
	} {
		if got := grouped.DecodeSplits(c.rows, c.heads, c.kv); got != c.want {
			t.Errorf("%d rows of %d heads on %d KV heads: %d splits, want %d", c.rows, c.heads, c.kv, got, c.want)
		}
	}
	if got := perHead.DecodeSplits(64, 16, 8); got != 2 {
		t.Errorf("a warp per head, 64 rows of 16 heads: %d splits, want 2", got)
	}
	if got := (&Ops{DecodeNoSplit: true}).DecodeSplits(1, 16, 8); got != 1 {
		t.Errorf("KEEL_DECODE_SPLIT=0: %d splits, want 1", got)
	}
	for _, c := range []struct{ heads, kv, hd int }{{16, 8, 128}, {32, 4, 128}, {10, 2, 64}, {9, 1, 16}} {
		room := DecodeSplitFloats(4096, c.heads, c.kv, c.hd)
		for _, o := range []*Ops{grouped, perHead} {
			for rows := 1; rows <= 4096; rows++ {
				s := o.DecodeSplits(rows, c.heads, c.kv)
				if s > 1 && rows*s*c.heads*(c.hd+2) > room {
					t.Fatalf("%+v, per head %v: %d rows in %d splits need %d floats, DecodeSplitFloats gives %d",
						c, o.DecodePerHead, rows, s, rows*s*c.heads*(c.hd+2), room)
				}
			}
		}
		if small := DecodeSplitFloats(4, c.heads, c.kv, c.hd); small > room || small != 4*grouped.DecodeSplits(4, c.heads, c.kv)*c.heads*(c.hd+2) {
			t.Errorf("%+v: scratch for 4 rows %d floats (for 4096: %d)", c, small, room)
		}
	}
}

// TestSplitDraw: the split draw below the multiprocessor count only, and
// the two settings that override it (no GPU needed).
func TestSplitDraw(t *testing.T) {
	h200 := &Device{SMs: 132}
	for _, c := range []struct {
		o    *Ops
		rows int
		want bool
	}{
		{&Ops{Dev: h200}, 1, true}, {&Ops{Dev: h200}, 64, true}, {&Ops{Dev: h200}, 131, true},
		{&Ops{Dev: h200}, 132, false}, {&Ops{Dev: h200}, 256, false},
		{&Ops{Dev: h200, DrawNoSplit: true}, 64, false}, {&Ops{Dev: h200, DrawSplitAlways: true}, 256, true},
		{&Ops{Dev: h200, DrawNoSplit: true, DrawSplitAlways: true}, 1, false},
	} {
		if got := c.o.splitDraw(c.rows); got != c.want {
			t.Errorf("%d rows, no split %v, always %v: split %v, want %v", c.rows, c.o.DrawNoSplit, c.o.DrawSplitAlways, got, c.want)
		}
	}
}
