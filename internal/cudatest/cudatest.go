// Package cudatest opens the GPU for tests of the GPU engines: a test
// skips, saying why, on a machine without one, unless KEEL_REQUIRE_CUDA is
// set (the GPU check script sets it), where a missing GPU fails it.
package cudatest

import (
	"errors"
	"os"
	"testing"

	kc "github.com/keel-rl/keel/kernels/cuda"
)

// Device opens GPU 0 for t and closes it when t ends.
func Device(t testing.TB) *kc.Device {
	t.Helper()
	d, err := kc.Open(0)
	if err != nil {
		var le *kc.LibraryError
		if os.Getenv("KEEL_REQUIRE_CUDA") == "" && (errors.As(err, &le) || errors.Is(err, kc.ErrNoDevice) || errors.Is(err, kc.ErrNoCUDA)) {
			t.Skipf("no GPU: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
