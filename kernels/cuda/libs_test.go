package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestSearchDirsOrder lays out a fake CUDA install, a virtual environment
// with NVIDIA's wheels and a user's override, and checks the folders come
// in the documented order, each once, missing ones left out.
func TestSearchDirsOrder(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) string {
		d := filepath.Join(root, p)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	override := mk("override")
	ld := mk("ld")
	cudaHome := mk("cuda-12.8")
	lib64 := mk("cuda-12.8/lib64")
	venv := mk("venv")
	cu13 := mk("venv/lib/python3.12/site-packages/nvidia/cu13/lib")
	nvrtc12 := mk("venv/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib")
	env := map[string]string{
		"KEEL_CUDA_LIBS":  override + string(os.PathListSeparator) + filepath.Join(root, "missing"),
		"LD_LIBRARY_PATH": ld + string(os.PathListSeparator) + override, // override again: listed once
		"CUDA_HOME":       cudaHome,
		"VIRTUAL_ENV":     venv,
	}
	dirs := searchDirs(func(k string) string { return env[k] })
	pos := func(d string) int {
		for i, x := range dirs {
			if x == d {
				return i
			}
		}
		return -1
	}
	order := []string{override, ld, lib64, cu13, nvrtc12}
	for i := range order {
		if pos(order[i]) < 0 {
			t.Fatalf("%s not searched: %v", order[i], dirs)
		}
		if i > 0 && pos(order[i]) < pos(order[i-1]) {
			t.Errorf("%s searched before %s: %v", order[i], order[i-1], dirs)
		}
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		if seen[d] {
			t.Errorf("%s listed twice", d)
		}
		seen[d] = true
		if strings.Contains(d, "missing") {
			t.Errorf("a missing folder is listed: %s", d)
		}
	}
}

func TestNewestFirst(t *testing.T) {
	got := newestFirst([]string{"/usr/local/cuda-11.8", "/usr/local/cuda-12.10", "/usr/local/cuda-12.9", "/usr/local/cuda-12.4"})
	want := []string{"/usr/local/cuda-12.10", "/usr/local/cuda-12.9", "/usr/local/cuda-12.4", "/usr/local/cuda-11.8"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("newestFirst = %v, want %v", got, want)
	}
	if !versionLess("libnvrtc.so.11.2", "libnvrtc.so.12") || versionLess("a10", "a9") || !versionLess("a", "a1") {
		t.Error("versionLess compares digit runs as numbers")
	}
}

// TestMissingLibraryError: a library that is nowhere gives one error that
// names it, the sonames and the folders, with the fix; a file that exists
// but is no library is reported with the loader's reason.
func TestMissingLibraryError(t *testing.T) {
	if loadDisabled != nil {
		t.Skip(loadDisabled)
	}
	dir := t.TempDir()
	bogus := filepath.Join(dir, "libkeel-nothing.so.1")
	if err := os.WriteFile(bogus, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := library{what: "a test library", names: []string{"libkeel-nothing.so.1", "libkeel-nothing.so"}}
	_, _, err := load(lib, []string{dir})
	var le *LibraryError
	if !errors.As(err, &le) {
		t.Fatalf("want a LibraryError, got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"a test library not found", "libkeel-nothing.so.1, libkeel-nothing.so", dir, bogus + ":", "KEEL_CUDA_LIBS"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
}

// TestNoDriverIsAnError: on a machine without the CUDA driver (CI), Open
// and DeviceCount fail with a LibraryError, not a panic; with a driver
// they agree on the count.
func TestNoDriverIsAnError(t *testing.T) {
	n, err := DeviceCount()
	d, oerr := Open(0)
	if err != nil {
		var le *LibraryError
		if !errors.As(err, &le) && !errors.Is(err, ErrNoDevice) && !errors.Is(err, ErrNoCUDA) {
			t.Fatalf("DeviceCount without a device: %v (want a LibraryError or ErrNoDevice)", err)
		}
		if oerr == nil {
			t.Fatal("Open succeeded where DeviceCount failed")
		}
		t.Logf("no GPU here: %v", err)
		return
	}
	if n == 0 && oerr == nil {
		t.Fatal("Open(0) succeeded with no device")
	}
	if n > 0 {
		if oerr != nil {
			t.Fatalf("Open(0) with %d devices: %v", n, oerr)
		}
		defer d.Close()
		if _, err := Open(n); err == nil || !strings.Contains(err.Error(), "sees") {
			t.Errorf("Open(%d) of %d devices: %v", n, n, err)
		}
	}
}
