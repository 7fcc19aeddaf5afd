package rollout

import (
	"runtime"
	"testing"
	"unsafe"
)

// bigSlice gives zeroed, writable memory of the asked length, 2 MB aligned
// when mapped on its own (Linux), and frees it; Close may run twice.
func TestBigSlice(t *testing.T) {
	for _, n := range []int{0, 10, 3 << 20, 5<<20 + 7} {
		s, free := bigSlice[float32](n)
		if len(s) != n {
			t.Fatalf("len %d, want %d", len(s), n)
		}
		for i := 0; i < n; i += 4099 {
			if s[i] != 0 {
				t.Fatalf("n=%d: element %d = %v, want 0", n, i, s[i])
			}
			s[i] = float32(i)
		}
		if n >= 1<<20 && runtime.GOOS == "linux" && uintptr(unsafe.Pointer(&s[0]))%(2<<20) != 0 {
			t.Fatalf("n=%d: mapping not aligned to 2 MB", n)
		}
		free()
	}
	m := randomModel(moeConfig(), 1)
	e, err := New(m, Options{Slots: 2, MaxLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	e.Close()
}
