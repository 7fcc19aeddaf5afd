package cuda

import "testing"

func TestAlignment(t *testing.T) {
	for _, c := range []struct {
		p    uint64
		want uint32
	}{{0x1000, 256}, {0x1004, 4}, {0x1002, 2}, {0x1001, 1}, {0x1040, 64}, {0x1080, 128}, {0, 256}} {
		if got := alignment(c.p); got != c.want {
			t.Errorf("alignment(%#x) = %d, want %d", c.p, got, c.want)
		}
	}
}

func TestCheckHeads(t *testing.T) {
	for _, c := range []struct {
		heads, kv, hd int
		ok            bool
	}{{16, 8, 128, true}, {32, 4, 128, true}, {4, 2, 256, true}, {4, 2, 257, false}, {4, 3, 32, false}, {4, 0, 32, false}, {4, 2, 0, false}} {
		if err := checkHeads(c.heads, c.kv, c.hd); (err == nil) != c.ok {
			t.Errorf("checkHeads(%d, %d, %d) = %v", c.heads, c.kv, c.hd, err)
		}
	}
}

func TestParseDevice(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{{"", -1, true}, {"cpu", -1, true}, {"cuda", 0, true}, {"cuda:2", 2, true}, {"cuda:", 0, false}, {"cuda:-1", 0, false}, {"gpu", 0, false}} {
		got, err := ParseDevice(c.in)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("ParseDevice(%q) = %d, %v", c.in, got, err)
		}
	}
}

// TestBigTiles: the 128-tile GEMM only when its blocks fill the GPU (two a
// multiprocessor); a decoding step's 256 rows on an H100 get 64-tiles.
func TestBigTiles(t *testing.T) {
	for _, c := range []struct {
		M, N, sms int
		want      bool
	}{
		{8192, 1024, 132, true},  // 64 × 8 = 512 blocks
		{256, 2048, 132, false},  // 2 × 16 = 32
		{256, 151936, 132, true}, // 2 × 1187
		{127, 4096, 4, false},    // too few rows for a 128-tile
		{4096, 256, 4, true},     // 32 × 2 = 64 >= 8
		{256, 256, 4, false},     // 4 < 8
		{256, 256, 0, true},      // an unknown count counts as 1
	} {
		if got := bigTiles(c.M, c.N, c.sms); got != c.want {
			t.Errorf("bigTiles(%d, %d, %d) = %v, want %v", c.M, c.N, c.sms, got, c.want)
		}
	}
}

// TestSmallTiles: the 32-tile GEMM where 64-tiles leave multiprocessors
// without a block: a 256-row decoding step's 1024- and 2048-wide products
// on an H100 (64 and 128 blocks for 132), not its 3072-wide ones (192).
func TestSmallTiles(t *testing.T) {
	for _, c := range []struct {
		M, N, sms int
		want      bool
	}{
		{256, 1024, 132, true},
		{256, 2048, 132, true},
		{256, 3072, 132, false},
		{64, 3072, 132, true}, // 48 blocks
		{8192, 1024, 132, false},
		{1, 1, 1, false}, // one block for one multiprocessor
		{1, 1, 2, true},
	} {
		if got := smallTiles(c.M, c.N, c.sms); got != c.want {
			t.Errorf("smallTiles(%d, %d, %d) = %v, want %v", c.M, c.N, c.sms, got, c.want)
		}
	}
}
