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
