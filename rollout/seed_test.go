package rollout

import "testing"

// The seed functions are pinned: changing one changes every sample of
// every seed, and the remote client derives its seeds with them.
func TestSeedFunctions(t *testing.T) {
	// SplitMix64's reference outputs (Vigna's splitmix64.c seeded with 0:
	// the state advances by 0x9e3779b97f4a7c15 before each output).
	for _, tc := range []struct{ x, want uint64 }{
		{0, 0xe220a8397b1dcdaf},
		{0x9e3779b97f4a7c15, 0x6e789e6aa1b965f4},
		{0x3c6ef372fe94f82a, 0x06c45d188009454f}, // twice the increment, mod 2^64,
	} {
		if got := Splitmix64(tc.x); got != tc.want {
			t.Errorf("Splitmix64(%#x) = %#x, want %#x", tc.x, got, tc.want)
		}
	}
	// Sample j's stream key, as admit has always derived it.
	for j, want := range []uint64{0x5cc60547776902ba, 0x41f9d639c82caba3, 0x30883360cc68d7b1} {
		if got := SampleStream(j); got != want {
			t.Errorf("SampleStream(%d) = %#x, want %#x", j, got, want)
		}
	}
	if got := PromptSeed(77, 0); got != 77 {
		t.Errorf("PromptSeed(77, 0) = %d, want 77 (prompt 0 of a call is the one-prompt call)", got)
	}
	if got, want := PromptSeed(0, 1), uint64(0xe220a8397b1dcdaf^0x910a2dec89025cc1); got != want {
		t.Errorf("PromptSeed(0, 1) = %#x, want %#x", got, want)
	}
}

// Truncated: top-k or top-p below 1, unless greedy.
func TestSamplingTruncated(t *testing.T) {
	for _, tc := range []struct {
		sp   Sampling
		want bool
	}{
		{Sampling{Temperature: 1}, false},
		{Sampling{Temperature: 1, TopP: 1}, false},
		{Sampling{Temperature: 1, TopK: 5}, true},
		{Sampling{Temperature: 0.7, TopP: 0.9}, true},
		{Sampling{Temperature: 0, TopK: 5, TopP: 0.9}, false},
	} {
		if got := tc.sp.Truncated(); got != tc.want {
			t.Errorf("%+v: Truncated() = %v, want %v", tc.sp, got, tc.want)
		}
	}
}
