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

// Larger skips t (a subtest on a larger model) under -short: on the CUDA
// emulator (tools/cudaemu) every launch runs on one CPU core, and the tiny
// models cover the same code in a minute less (test.sh -short). CI and
// the GPU check script run without -short.
func Larger(t *testing.T, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s: larger model, run without -short", what)
	}
}
