package cuda

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
)

// nvrtcForTest loads NVRTC or skips, unless KEEL_REQUIRE_NVRTC is set (CI
// installs Debian's libnvrtc11.2 and sets it, so that a kernel that does
// not compile fails CI rather than a scarce GPU run).
func nvrtcForTest(t *testing.T) *NVRTC {
	t.Helper()
	n, err := LoadNVRTC()
	if err != nil {
		if os.Getenv("KEEL_REQUIRE_NVRTC") != "" && !errors.Is(err, ErrNoCUDA) {
			t.Fatalf("KEEL_REQUIRE_NVRTC is set but NVRTC does not load: %v", err)
		}
		t.Skipf("NVRTC not installed, kernels not compiled (Debian: apt-get install libnvrtc11.2 from non-free): %v", err)
	}
	return n
}

// realNVRTC is nvrtcForTest for the checks that a kernel compiles for a
// GPU, which the emulator's NVRTC (g++ underneath) cannot make.
func realNVRTC(t *testing.T) *NVRTC {
	t.Helper()
	n := nvrtcForTest(t)
	if n.Emulated {
		t.Skipf("%s is the CUDA emulator's NVRTC: compiling for a GPU needs NVIDIA's", n.Path)
	}
	return n
}

// TestEveryKernelCompiles compiles each embedded source for Ampere and
// Hopper, as machine code and as PTX, with warnings shown.
func TestEveryKernelCompiles(t *testing.T) {
	n := realNVRTC(t)
	t.Logf("NVRTC %s from %s, architectures %v", n.Version(), n.Path, n.Archs)
	names := SourceNames()
	if len(names) < 4 {
		t.Fatalf("only %d kernel sources embedded: %v", len(names), names)
	}
	for _, name := range names {
		src, err := Source(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range []Target{{80, CodeCUBIN}, {90, CodeCUBIN}, {80, CodePTX}} {
			img, log, err := n.Compile(src, name, tg, KernelOptions...)
			if err != nil {
				t.Errorf("%v", err)
				continue
			}
			if strings.TrimSpace(log) != "" {
				t.Errorf("%s for %s: compiler warnings:\n%s", name, tg, log)
			}
			if len(img) < 100 {
				t.Errorf("%s for %s: %d-byte image", name, tg, len(img))
			}
			if tg.Code == CodePTX && !strings.Contains(string(img), ".target sm_80") {
				t.Errorf("%s: PTX does not target sm_80", name)
			}
		}
	}
}

// TestCompileErrorNamesSourceAndLine: a broken kernel's error carries
// NVRTC's log with the file name and the line in that file (the prelude's
// lines are not counted).
func TestCompileErrorNamesSourceAndLine(t *testing.T) {
	n := realNVRTC(t)
	prelude, err := kernelFS.ReadFile("kernels/prelude.cuh")
	if err != nil {
		t.Fatal(err)
	}
	src := string(prelude) + "\n#line 1 \"broken.cu\"\n" + "extern \"C\" __global__ void k(float* x) {\n  x[0] = y;\n}\n"
	_, _, err = n.Compile(src, "broken.cu", Target{90, CodeCUBIN})
	var ce *CompileError
	if !errors.As(err, &ce) {
		t.Fatalf("want a CompileError, got %v", err)
	}
	if !strings.Contains(err.Error(), "broken.cu(2)") || !strings.Contains(err.Error(), "identifier \"y\" is undefined") {
		t.Errorf("error does not point at broken.cu line 2: %v", err)
	}
}

func TestSourceUnknownName(t *testing.T) {
	_, err := Source("nope.cu")
	if err == nil || !strings.Contains(err.Error(), "rows.cu") {
		t.Errorf("unknown source: %v (want the list of sources)", err)
	}
	if _, err := Source("prelude.cuh"); err == nil {
		t.Error("the prelude is not a kernel source")
	}
}

func TestTargetChoice(t *testing.T) {
	n := &NVRTC{Major: 11, Minor: 8, Archs: []int{35, 50, 60, 70, 75, 80, 86, 89, 90}}
	for _, c := range []struct {
		arch int
		want string
	}{{90, "sm_90"}, {80, "sm_80"}, {100, "compute_90"}, {120, "compute_90"}, {87, "compute_86"}} {
		got, err := n.Target(c.arch)
		if err != nil || got.String() != c.want {
			t.Errorf("Target(%d) = %v, %v; want %s", c.arch, got, err, c.want)
		}
	}
	if _, err := n.Target(30); err == nil || !strings.Contains(err.Error(), "3.0") {
		t.Errorf("Target(30): %v", err)
	}
}

// TestKernelsDoNotSpill compiles every kernel for Ampere and Hopper with
// ptxas's resource report: a kernel whose registers spill to local memory
// (a register array indexed at run time, say) or that needs a stack frame
// fails here, not as a slow kernel on a GPU. Every kernel must have its
// report line, all zeros.
func TestKernelsDoNotSpill(t *testing.T) {
	n := realNVRTC(t)
	report := regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	registers := regexp.MustCompile(`Compiling entry function '(\w+)'[^\n]*\n(?:[^\n]*\n)*?[^\n]*Used (\d+) registers`)
	for _, name := range SourceNames() {
		src, err := Source(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, arch := range []int{80, 90} {
			_, log, err := n.Compile(src, name, Target{arch, CodeCUBIN}, append(KernelOptions, "--ptxas-options=-v")...)
			if err != nil {
				t.Fatal(err)
			}
			entries := strings.Count(log, "Compiling entry function")
			lines := report.FindAllStringSubmatch(log, -1)
			if entries == 0 || len(lines) != entries {
				t.Errorf("%s for sm_%d: %d entry functions, %d resource reports in ptxas's log:\n%s", name, arch, entries, len(lines), log)
				continue
			}
			// Each report follows its entry function's line: name it.
			entry := regexp.MustCompile(`Compiling entry function '(\w+)'`).FindAllStringSubmatch(log, -1)
			for i, m := range lines {
				if m[1] != "0" || m[2] != "0" || m[3] != "0" {
					t.Errorf("%s %s for sm_%d: %s", name, entry[i][1], arch, m[0])
				}
			}
			if arch == 90 { // registers decide occupancy: say them
				for _, m := range registers.FindAllStringSubmatch(log, -1) {
					t.Logf("%s %s for sm_90: %s registers", name, m[1], m[2])
				}
			}
		}
	}
}
