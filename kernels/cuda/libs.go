package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// A library is one of the shared libraries keel uses: what it is for a
// person reading an error, and its sonames, newest first. The sonames are
// those of the CUDA releases keel is known to work with; a newer major
// version is found through KEEL_CUDA_LIBS naming its file.
type library struct {
	what  string
	names []string
	// companions are loaded (RTLD_GLOBAL) from the same folder before
	// the library itself, when present there: NVRTC finds its builtins
	// library through the loader, which does not search the folder of a
	// library opened by full path.
	companions []string
}

var (
	libDriver = library{what: "the CUDA driver", names: []string{"libcuda.so.1", "libcuda.so"}}
	libNVRTC  = library{what: "NVRTC (the CUDA runtime compiler)",
		names:      []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"},
		companions: []string{"libnvrtc-builtins.so.13.*", "libnvrtc-builtins.so.12.*", "libnvrtc-builtins.so.11.*", "libnvrtc-builtins.so"}}
	libCublasLt = library{what: "cuBLASLt", names: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"}}
)

// ErrNoCUDA is what every loader returns in a build without CUDA support
// (an OS other than Linux, or a build with -tags nocuda, which gives a
// fully static binary).
var ErrNoCUDA = errors.New("no CUDA support in this build")

// LibraryError says that a library could not be loaded: what was looked
// for, in which folders, and why each file found there failed to load.
type LibraryError struct {
	What     string   // e.g. "NVRTC (the CUDA runtime compiler)"
	Names    []string // the sonames looked for
	Dirs     []string // the folders searched, in order
	Failures []string // "path: loader error", for files that exist but did not load
}

func (e *LibraryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cuda: %s not found: looked for %s in %s and the loader's default paths",
		e.What, strings.Join(e.Names, ", "), strings.Join(e.Dirs, ", "))
	for _, f := range e.Failures {
		fmt.Fprintf(&b, "; %s", f)
	}
	b.WriteString("; set KEEL_CUDA_LIBS to the folder that holds it (or LD_LIBRARY_PATH)")
	return b.String()
}

// searchDirs lists the folders searched for CUDA's libraries, in order:
// KEEL_CUDA_LIBS, LD_LIBRARY_PATH, the CUDA toolkit (CUDA_HOME, CUDA_PATH,
// /usr/local/cuda and versioned installs, newest first), the driver's
// usual homes (containers mount it in /usr/local/nvidia), and the lib
// folders of NVIDIA's pip wheels (a PyTorch install carries NVRTC and
// cuBLAS there) in the active virtual or conda environment, the system's
// and the user's Python, and virtual environments under /opt. Folders
// that do not exist are left out; none appears twice.
func searchDirs(getenv func(string) string) []string {
	var dirs []string
	seen := map[string]bool{}
	add := func(ds ...string) {
		for _, d := range ds {
			if d == "" {
				continue
			}
			d = filepath.Clean(d)
			if seen[d] {
				continue
			}
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				continue
			}
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	add(filepath.SplitList(getenv("KEEL_CUDA_LIBS"))...)
	add(filepath.SplitList(getenv("LD_LIBRARY_PATH"))...)
	for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if h := getenv(v); h != "" {
			add(filepath.Join(h, "lib64"), filepath.Join(h, "lib"), filepath.Join(h, "targets", "x86_64-linux", "lib"))
		}
	}
	add("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
	add(newestFirst(glob("/usr/local/cuda-*/lib64"))...)
	add("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib")
	var sites []string
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if p := getenv(v); p != "" {
			sites = append(sites, glob(filepath.Join(p, "lib", "python3*", "site-packages"))...)
		}
	}
	sites = append(sites, glob("/usr/local/lib/python3*/dist-packages")...)
	sites = append(sites, glob("/usr/local/lib/python3*/site-packages")...)
	sites = append(sites, glob("/usr/lib/python3*/dist-packages")...)
	if h := getenv("HOME"); h != "" {
		sites = append(sites, glob(filepath.Join(h, ".local", "lib", "python3*", "site-packages"))...)
	}
	sites = append(sites, glob("/opt/*/.venv/lib/python3*/site-packages")...)
	sites = append(sites, glob("/opt/conda/lib/python3*/site-packages")...)
	for _, s := range sites {
		// nvidia/cu13/lib (CUDA 13 wheels, newest release first), then
		// nvidia/cuda_nvrtc/lib, nvidia/cublas/lib (CUDA 12 wheels).
		add(newestFirst(glob(filepath.Join(s, "nvidia", "cu[0-9]*", "lib")))...)
		add(glob(filepath.Join(s, "nvidia", "*", "lib"))...)
	}
	return dirs
}

func glob(pattern string) []string {
	m, _ := filepath.Glob(pattern)
	return m
}

// newestFirst sorts paths so that higher version numbers come first
// (cuda-12.10 before cuda-12.9): reverse order, digits compared as
// numbers.
func newestFirst(paths []string) []string {
	sort.SliceStable(paths, func(i, j int) bool { return versionLess(paths[j], paths[i]) })
	return paths
}

// versionLess compares a and b as strings whose runs of digits compare as
// numbers: "cuda-12.10" > "cuda-12.9".
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitsPrefix(a), digitsPrefix(b)
		if da != "" && db != "" {
			na, nb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitsPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// load opens lib: the first of its sonames found in dirs, in the order of
// dirs, then each soname through the loader's own search (ld.so.cache).
// It returns the handle and the path or soname that was opened.
func load(lib library, dirs []string) (uintptr, string, error) {
	if loadDisabled != nil {
		return 0, "", fmt.Errorf("cuda: %s not loaded: %w", lib.what, loadDisabled)
	}
	e := &LibraryError{What: lib.what, Names: lib.names, Dirs: dirs}
	for _, d := range dirs {
		for _, n := range lib.names {
			p := filepath.Join(d, n)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			loadCompanions(lib, d)
			h, err := dlopen(p)
			if err == nil {
				return h, p, nil
			}
			e.Failures = append(e.Failures, fmt.Sprintf("%s: %v", p, err))
		}
	}
	for _, n := range lib.names {
		if h, err := dlopen(n); err == nil {
			return h, n, nil
		}
	}
	return 0, "", e
}

// loadCompanions opens lib's companion libraries found in dir, ignoring
// failures: the library's own load reports what is missing.
func loadCompanions(lib library, dir string) {
	for _, pat := range lib.companions {
		for _, p := range newestFirst(glob(filepath.Join(dir, pat))) {
			if _, err := dlopen(p); err == nil {
				return
			}
		}
	}
}
