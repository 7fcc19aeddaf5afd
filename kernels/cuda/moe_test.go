package cuda

import "testing"

// TestFewRows: the forward grouped products take the few-row warps where
// the experts average fewer than 32 rows (no GPU needed): a decoding step
// of the Qwen3-30B-A3B shape (256 rows × 8 slots over 128 experts, 16
// each) does, a training micro-batch (4,096 tokens: 256 each) does not,
// and the tests' switch overrides both.
func TestFewRows(t *testing.T) {
	for _, c := range []struct {
		pairs, experts int
		few            int8
		want           string
	}{{256 * 8, 128, 0, "_few"}, {4096 * 8, 128, 0, ""}, {32 * 128, 128, 0, ""}, {32*128 - 1, 128, 0, "_few"},
		{1, 128, -1, ""}, {1 << 20, 1, 1, "_few"}} {
		if got := (&Ops{groupedFew: c.few}).fewRows(c.pairs, c.experts); got != c.want {
			t.Errorf("%d pairs over %d experts (switch %d): %q, want %q", c.pairs, c.experts, c.few, got, c.want)
		}
	}
}
