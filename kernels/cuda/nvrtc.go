package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// NVRTC is the CUDA runtime compiler, loaded from a shared library. It
// needs no GPU, so kernels compile on any machine that has the library
// (CI installs Debian's libnvrtc11.2 to compile every kernel).
type NVRTC struct {
	// Path is the file (or soname) that was loaded.
	Path string
	// Major and Minor are NVRTC's version: that of the CUDA release it
	// came with.
	Major, Minor int
	// Archs are the compute capabilities it compiles for (90 for sm_90).
	Archs []int

	// Emulated is true for the NVRTC of keel's CUDA emulator
	// (tools/cudaemu), which builds kernels for the CPU: it accepts what
	// g++ accepts, so the checks that a kernel compiles for a GPU need the
	// real one.
	Emulated bool

	mu sync.Mutex // NVRTC 11 is not documented as safe for concurrent use

	version           func(major, minor *int32) int32
	numSupportedArchs func(n *int32) int32
	supportedArchs    func(archs *int32) int32
	createProgram     func(prog *uintptr, src, name string, numHeaders int32, headers, includeNames unsafe.Pointer) int32
	compileProgram    func(prog uintptr, numOptions int32, options unsafe.Pointer) int32
	destroyProgram    func(prog *uintptr) int32
	programLogSize    func(prog uintptr, size *uintptr) int32
	programLog        func(prog uintptr, log *byte) int32
	ptxSize           func(prog uintptr, size *uintptr) int32
	ptx               func(prog uintptr, out *byte) int32
	cubinSize         func(prog uintptr, size *uintptr) int32
	cubin             func(prog uintptr, out *byte) int32
	errorString       func(res int32) string
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *NVRTC
	nvrtcErr  error
)

// LoadNVRTC loads NVRTC once per process (see searchDirs for where it is
// looked for) and returns it, or a *LibraryError naming where it looked.
func LoadNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() { nvrtcLib, nvrtcErr = loadNVRTC(searchDirs(os.Getenv)) })
	return nvrtcLib, nvrtcErr
}

func loadNVRTC(dirs []string) (*NVRTC, error) {
	h, path, err := load(libNVRTC, dirs)
	if err != nil {
		return nil, err
	}
	n := &NVRTC{Path: path, Emulated: hasSymbol(h, emulatorMark)}
	syms := []struct {
		fn   any
		name string
	}{
		{&n.version, "nvrtcVersion"},
		{&n.numSupportedArchs, "nvrtcGetNumSupportedArchs"},
		{&n.supportedArchs, "nvrtcGetSupportedArchs"},
		{&n.createProgram, "nvrtcCreateProgram"},
		{&n.compileProgram, "nvrtcCompileProgram"},
		{&n.destroyProgram, "nvrtcDestroyProgram"},
		{&n.programLogSize, "nvrtcGetProgramLogSize"},
		{&n.programLog, "nvrtcGetProgramLog"},
		{&n.ptxSize, "nvrtcGetPTXSize"},
		{&n.ptx, "nvrtcGetPTX"},
		{&n.cubinSize, "nvrtcGetCUBINSize"},
		{&n.cubin, "nvrtcGetCUBIN"},
		{&n.errorString, "nvrtcGetErrorString"},
	}
	for _, s := range syms {
		if err := register(s.fn, h, s.name); err != nil {
			return nil, fmt.Errorf("cuda: %s: %w", path, err)
		}
	}
	var major, minor int32
	if r := n.version(&major, &minor); r != 0 {
		return nil, fmt.Errorf("cuda: %s: nvrtcVersion: %s", path, n.errorString(r))
	}
	n.Major, n.Minor = int(major), int(minor)
	var count int32
	if r := n.numSupportedArchs(&count); r != 0 || count <= 0 || count > 1024 {
		return nil, fmt.Errorf("cuda: %s: nvrtcGetNumSupportedArchs: %d architectures (result %d)", path, count, r)
	}
	archs := make([]int32, count)
	if r := n.supportedArchs(&archs[0]); r != 0 {
		return nil, fmt.Errorf("cuda: %s: nvrtcGetSupportedArchs: %s", path, n.errorString(r))
	}
	for _, a := range archs {
		n.Archs = append(n.Archs, int(a))
	}
	return n, nil
}

func missingSymbol(name string, err error) error {
	return fmt.Errorf("missing symbol %s (library too old?): %w", name, err)
}

// Version is NVRTC's version as "major.minor".
func (n *NVRTC) Version() string { return fmt.Sprintf("%d.%d", n.Major, n.Minor) }

// Supports reports whether NVRTC compiles for compute capability arch.
func (n *NVRTC) Supports(arch int) bool {
	for _, a := range n.Archs {
		if a == arch {
			return true
		}
	}
	return false
}

// Target chooses what to compile for a device of compute capability arch:
// machine code for that architecture when NVRTC knows it; otherwise PTX for
// the newest architecture NVRTC knows below it, which the driver compiles
// at load time (a GPU newer than the compiler). It fails for a device older
// than every architecture NVRTC supports.
func (n *NVRTC) Target(arch int) (Target, error) {
	if n.Supports(arch) {
		return Target{Arch: arch, Code: CodeCUBIN}, nil
	}
	best := 0
	for _, a := range n.Archs {
		if a <= arch && a > best {
			best = a
		}
	}
	if best == 0 {
		return Target{}, fmt.Errorf("cuda: NVRTC %s does not compile for compute capability %d.%d (it supports %v)", n.Version(), arch/10, arch%10, n.Archs)
	}
	return Target{Arch: best, Code: CodePTX}, nil
}

// Code is the form of a compiled module.
type Code int

const (
	// CodeCUBIN is machine code for one architecture (sm_XX).
	CodeCUBIN Code = iota
	// CodePTX is the virtual ISA (compute_XX), compiled by the driver at
	// load time.
	CodePTX
)

func (c Code) String() string {
	if c == CodePTX {
		return "ptx"
	}
	return "cubin"
}

// Target is what a kernel source compiles to: an architecture (compute
// capability times ten, 90 for Hopper) and a code form.
type Target struct {
	Arch int
	Code Code
}

func (t Target) String() string {
	if t.Code == CodePTX {
		return fmt.Sprintf("compute_%d", t.Arch)
	}
	return fmt.Sprintf("sm_%d", t.Arch)
}

// CompileError is a kernel that NVRTC rejected, with NVRTC's log.
type CompileError struct {
	Name   string // the source's name, e.g. "rmsnorm.cu"
	Target Target
	Log    string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("cuda: %s does not compile for %s:\n%s", e.Name, e.Target, strings.TrimSpace(e.Log))
}

// Compile compiles the CUDA C source src (named name in messages) for t
// with extra NVRTC options, returning the module image (CUBIN or PTX) and
// NVRTC's log (warnings). Every compile uses C++17 and never fast math
// (approximate division, flushed denormals): a kernel's bits must not
// depend on flags a user could not see.
func (n *NVRTC) Compile(src, name string, t Target, options ...string) (image []byte, log string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var prog uintptr
	if r := n.createProgram(&prog, src, name, 0, nil, nil); r != 0 {
		return nil, "", fmt.Errorf("cuda: nvrtcCreateProgram %s: %s", name, n.errorString(r))
	}
	defer n.destroyProgram(&prog)
	opts := append([]string{"--gpu-architecture=" + t.String(), "-std=c++17"}, options...)
	cOpts := newCStrings(opts)
	r := n.compileProgram(prog, int32(len(opts)), cOpts.ptr())
	runtime.KeepAlive(cOpts)
	log = n.log(prog)
	if r != 0 {
		return nil, log, &CompileError{Name: name, Target: t, Log: n.errorString(r) + "\n" + log}
	}
	size, get := n.cubinSize, n.cubin
	if t.Code == CodePTX {
		size, get = n.ptxSize, n.ptx
	}
	var sz uintptr
	if r := size(prog, &sz); r != 0 || sz == 0 {
		return nil, log, fmt.Errorf("cuda: %s: %s size: result %d, %d bytes", name, t.Code, r, sz)
	}
	image = make([]byte, sz)
	if r := get(prog, &image[0]); r != 0 {
		return nil, log, fmt.Errorf("cuda: %s: getting %s: %s", name, t.Code, n.errorString(r))
	}
	// A PTX image ends with its NUL, which cuModuleLoadData needs.
	return image, log, nil
}

func (n *NVRTC) log(prog uintptr) string {
	var sz uintptr
	if n.programLogSize(prog, &sz) != 0 || sz <= 1 {
		return ""
	}
	b := make([]byte, sz)
	if n.programLog(prog, &b[0]) != 0 {
		return ""
	}
	return strings.TrimRight(string(b), "\x00")
}

// cStrings is an array of NUL-terminated strings for a C char**, held in
// Go memory, which does not move; the caller keeps it alive over the call.
type cStrings struct {
	bufs [][]byte
	ptrs []*byte
}

func newCStrings(ss []string) *cStrings {
	c := &cStrings{}
	for _, s := range ss {
		b := append([]byte(s), 0)
		c.bufs = append(c.bufs, b)
		c.ptrs = append(c.ptrs, &b[0])
	}
	return c
}

func (c *cStrings) ptr() unsafe.Pointer {
	if len(c.ptrs) == 0 {
		return nil
	}
	return unsafe.Pointer(&c.ptrs[0])
}
