// Package cuda is keel's GPU device layer: the CUDA driver API, NVRTC and
// cuBLASLt loaded at run time as shared libraries through purego, without
// cgo, so keel builds with no C compiler and no CUDA, and the same binary
// runs on machines with and without a GPU. keel's kernels are CUDA C
// sources embedded in the binary and compiled by NVRTC for the device's
// architecture at first use, then cached on disk (Cache): nothing
// generated is checked in, and a new GPU needs no rebuild.
//
// On a machine without a driver every entry point returns an error that
// names what was looked for and where (LibraryError), never a panic.
package cuda

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed kernels/*.cu kernels/prelude.cuh
var kernelFS embed.FS

// KernelOptions are the NVRTC options every kernel source is compiled
// with, beyond the target and C++17. --fmad=false keeps a*b + c two
// roundings, as the CPU kernels compute it unless they call a fused
// multiply-add (the kernels call fmaf where the CPU fuses); no option
// changes results otherwise (no fast math: division and sqrt are IEEE).
var KernelOptions = []string{"-default-device", "--fmad=false"}

// SourceNames lists the embedded kernel sources ("rows.cu", ...), sorted.
func SourceNames() []string {
	ents, _ := fs.ReadDir(kernelFS, "kernels")
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cu") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

// Source returns the kernel source name as NVRTC compiles it: the shared
// prelude, then the file, whose lines keep their numbers in NVRTC's
// messages.
func Source(name string) (string, error) {
	body, err := kernelFS.ReadFile("kernels/" + name)
	if err != nil || !strings.HasSuffix(name, ".cu") {
		return "", fmt.Errorf("cuda: no kernel source %q (have %s)", name, strings.Join(SourceNames(), ", "))
	}
	prelude, err := kernelFS.ReadFile("kernels/prelude.cuh")
	if err != nil {
		return "", err
	}
	return string(prelude) + fmt.Sprintf("\n#line 1 %q\n", name) + string(body), nil
}
