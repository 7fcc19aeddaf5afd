package kernels

import "testing"

// Prefetch is a hint: it changes nothing, accepts any element type and an
// empty slice, and a slice ending at the end of its backing array is fine
// (prefetch instructions never fault, even on the line past it).
func TestPrefetch(t *testing.T) {
	x := []float32{1, 2, 3}
	Prefetch(x)
	Prefetch(x[:0])
	Prefetch([]BF16(nil))
	big := make([]byte, 1<<20+3)
	Prefetch(big[len(big)-3:])
	Prefetch(big)
	if x[0] != 1 || x[2] != 3 {
		t.Fatal("Prefetch changed its argument")
	}
}
