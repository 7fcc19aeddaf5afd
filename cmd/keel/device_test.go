package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/keel-rl/keel/kernels/cuda"
)

// TestDeviceCommand: keel device reports each library, compiles the
// kernels into the cache (the second time from it), and fails, naming
// what is missing, on a machine that cannot run on a GPU.
func TestDeviceCommand(t *testing.T) {
	t.Setenv("KEEL_CACHE_DIR", t.TempDir())
	_, derr := cuda.DriverVersion()
	args, names := []string{"--arch", "80"}, cuda.SourceNames()
	if derr == nil {
		// A GPU (or the CUDA emulator, whose compiler takes a minute
		// for them all): two small sources.
		names = []string{"convert.cu", "optim.cu"}
		args = append(args, "--sources", strings.Join(names, ","))
	}
	var out bytes.Buffer
	err := runDevice(args, &out)
	t.Logf("keel device:\n%s", out.String())
	for _, want := range []string{"driver", "cuBLASLt", "NVRTC"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output does not mention %s", want)
		}
	}
	_, nerr := cuda.LoadNVRTC()
	if derr != nil && (err == nil || !strings.Contains(err.Error(), "missing: the CUDA driver")) {
		t.Errorf("without a driver: error %v, want it to name the driver", err)
	}
	if nerr != nil {
		return
	}
	n := len(names)
	arch := "sm_80"
	if derr == nil {
		arch = "sm_" // the GPU's own
	}
	if !strings.Contains(out.String(), fmt.Sprintf("%d sources for %s", n, arch)) || !strings.Contains(out.String(), "(0 from the cache") {
		t.Errorf("first run: kernels not compiled for %s", arch)
	}
	out.Reset()
	runDevice(args, &out)
	if !strings.Contains(out.String(), fmt.Sprintf("(%d from the cache", n)) {
		t.Errorf("second run did not use the cache:\n%s", out.String())
	}
	if derr == nil {
		// What keel device compiled is what a run on the GPU loads.
		d, err := cuda.Open(0)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for _, name := range names {
			if m, err := d.Module(name); err != nil || !m.CacheHit {
				t.Errorf("%s after keel device: error %v, from the cache %v", name, err, err == nil && m.CacheHit)
			}
		}
	}
	if err := runDevice([]string{"--sources", "rows.cu,nope.cu"}, &out); err == nil || !strings.Contains(err.Error(), `"nope.cu"`) {
		t.Errorf("--sources naming no source: error %v, want it named", err)
	}
	if derr != nil {
		if err := runDevice([]string{"--arch", "20"}, &out); err == nil || !strings.Contains(err.Error(), "2.0") {
			t.Errorf("--arch 20: %v", err)
		}
	}
}
