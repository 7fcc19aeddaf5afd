package cuda

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// driver holds the CUDA driver API's entry points keel uses, bound once
// per process from libcuda.
type driver struct {
	path     string
	emulated bool // keel's CUDA emulator (tools/cudaemu)

	init              func(flags uint32) int32
	driverGetVersion  func(v *int32) int32
	deviceGetCount    func(n *int32) int32
	deviceGet         func(dev *int32, ordinal int32) int32
	deviceGetName     func(name *byte, n int32, dev int32) int32
	deviceGetAttr     func(v *int32, attr int32, dev int32) int32
	deviceTotalMem    func(bytes *uint64, dev int32) int32
	primaryCtxRetain  func(ctx *uintptr, dev int32) int32
	primaryCtxRelease func(dev int32) int32
	ctxSetCurrent     func(ctx uintptr) int32
	ctxSynchronize    func() int32
	memAlloc          func(ptr *uint64, bytes uint64) int32
	memFree           func(ptr uint64) int32
	memGetInfo        func(free, total *uint64) int32
	memcpyHtoD        func(dst uint64, src unsafe.Pointer, bytes uint64) int32
	memcpyDtoH        func(dst unsafe.Pointer, src uint64, bytes uint64) int32
	memcpyDtoD        func(dst, src uint64, bytes uint64) int32
	memsetD8          func(dst uint64, v uint8, n uint64) int32
	moduleLoadData    func(mod *uintptr, image unsafe.Pointer) int32
	moduleUnload      func(mod uintptr) int32
	moduleGetFunction func(fn *uintptr, mod uintptr, name string) int32
	funcSetAttribute  func(fn uintptr, attr int32, v int32) int32
	launchKernel      func(fn uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) int32
	eventCreate       func(ev *uintptr, flags uint32) int32
	eventRecord       func(ev uintptr, stream uintptr) int32
	eventSynchronize  func(ev uintptr) int32
	eventElapsed      func(ms *float32, start, end uintptr) int32
	eventDestroy      func(ev uintptr) int32
	getErrorName      func(res int32, s **byte) int32
	getErrorString    func(res int32, s **byte) int32

	// Streams and graphs (Ops.Capture); graphs is false where the driver
	// lacks one of them (before CUDA 11.4), and Capture then refuses.
	graphs           bool
	streamCreate     func(s *uintptr, flags uint32) int32
	streamDestroy    func(s uintptr) int32
	streamWaitEvent  func(s, ev uintptr, flags uint32) int32
	beginCapture     func(s uintptr, mode int32) int32
	endCapture       func(s uintptr, g *uintptr) int32
	graphInstantiate func(exec *uintptr, g uintptr, flags uint64) int32
	graphLaunch      func(exec, s uintptr) int32
	graphExecDestroy func(exec uintptr) int32
	graphDestroy     func(g uintptr) int32
}

var (
	driverOnce sync.Once
	driverLib  *driver
	driverErr  error
)

func loadDriver() (*driver, error) {
	driverOnce.Do(func() { driverLib, driverErr = bindDriver(searchDirs(os.Getenv)) })
	return driverLib, driverErr
}

func bindDriver(dirs []string) (*driver, error) {
	h, path, err := load(libDriver, dirs)
	if err != nil {
		return nil, err
	}
	d := &driver{path: path, emulated: hasSymbol(h, emulatorMark)}
	syms := []struct {
		fn   any
		name string
	}{
		{&d.init, "cuInit"},
		{&d.driverGetVersion, "cuDriverGetVersion"},
		{&d.deviceGetCount, "cuDeviceGetCount"},
		{&d.deviceGet, "cuDeviceGet"},
		{&d.deviceGetName, "cuDeviceGetName"},
		{&d.deviceGetAttr, "cuDeviceGetAttribute"},
		{&d.deviceTotalMem, "cuDeviceTotalMem_v2"},
		{&d.primaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{&d.primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.ctxSetCurrent, "cuCtxSetCurrent"},
		{&d.ctxSynchronize, "cuCtxSynchronize"},
		{&d.memAlloc, "cuMemAlloc_v2"},
		{&d.memFree, "cuMemFree_v2"},
		{&d.memGetInfo, "cuMemGetInfo_v2"},
		{&d.memcpyHtoD, "cuMemcpyHtoD_v2"},
		{&d.memcpyDtoH, "cuMemcpyDtoH_v2"},
		{&d.memcpyDtoD, "cuMemcpyDtoD_v2"},
		{&d.memsetD8, "cuMemsetD8_v2"},
		{&d.moduleLoadData, "cuModuleLoadData"},
		{&d.moduleUnload, "cuModuleUnload"},
		{&d.moduleGetFunction, "cuModuleGetFunction"},
		{&d.funcSetAttribute, "cuFuncSetAttribute"},
		{&d.launchKernel, "cuLaunchKernel"},
		{&d.eventCreate, "cuEventCreate"},
		{&d.eventRecord, "cuEventRecord"},
		{&d.eventSynchronize, "cuEventSynchronize"},
		{&d.eventElapsed, "cuEventElapsedTime"},
		{&d.eventDestroy, "cuEventDestroy_v2"},
		{&d.getErrorName, "cuGetErrorName"},
		{&d.getErrorString, "cuGetErrorString"},
	}
	for _, s := range syms {
		if err := register(s.fn, h, s.name); err != nil {
			return nil, fmt.Errorf("cuda: %s: %w", path, err)
		}
	}
	d.graphs = true
	for _, s := range []struct {
		fn   any
		name string
	}{
		{&d.streamCreate, "cuStreamCreate"},
		{&d.streamDestroy, "cuStreamDestroy_v2"},
		{&d.streamWaitEvent, "cuStreamWaitEvent"},
		{&d.beginCapture, "cuStreamBeginCapture_v2"},
		{&d.endCapture, "cuStreamEndCapture"},
		{&d.graphInstantiate, "cuGraphInstantiateWithFlags"},
		{&d.graphLaunch, "cuGraphLaunch"},
		{&d.graphExecDestroy, "cuGraphExecDestroy"},
		{&d.graphDestroy, "cuGraphDestroy"},
	} {
		if register(s.fn, h, s.name) != nil {
			d.graphs = false
		}
	}
	if r := d.init(0); r != 0 {
		if r == errNoDevice {
			return nil, fmt.Errorf("%w (cuInit: %s)", ErrNoDevice, d.errorText(r))
		}
		return nil, fmt.Errorf("cuda: cuInit (driver %s): %s", path, d.errorText(r))
	}
	return d, nil
}

// emulatorMark is the symbol the libraries of keel's CUDA emulator
// (tools/cudaemu) define, and no NVIDIA library does.
const emulatorMark = "keel_cuda_emulator"

// The driver's result codes keel tells apart.
const (
	errNoDevice    = 100 // CUDA_ERROR_NO_DEVICE
	errOutOfMemory = 2   // CUDA_ERROR_OUT_OF_MEMORY
)

// ErrNoDevice is returned when the driver loads but sees no GPU.
var ErrNoDevice = errors.New("cuda: no CUDA device")

// Error is a driver call that failed.
type Error struct {
	Call string // the call and what it was asked, e.g. "cuMemAlloc(1.0 GiB)"
	Code int    // the CUresult
	Text string // the driver's name and description of the code
}

func (e *Error) Error() string { return fmt.Sprintf("cuda: %s: %s", e.Call, e.Text) }

// IsOutOfMemory reports whether err is a device allocation that failed for
// want of memory.
func IsOutOfMemory(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == errOutOfMemory
}

func (d *driver) errorText(r int32) string {
	var name, desc *byte
	d.getErrorName(r, &name)
	d.getErrorString(r, &desc)
	n, s := goString(name), goString(desc)
	if n == "" {
		return fmt.Sprintf("CUDA error %d", r)
	}
	return n + ": " + s
}

func (d *driver) check(r int32, call string, args ...any) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: fmt.Sprintf(call, args...), Code: int(r), Text: d.errorText(r)}
}

// goString copies the NUL-terminated C string at p.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0 && len(b) < 1<<16; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// DriverVersion is the CUDA version the installed driver supports, as
// major*1000 + minor*10 (12080 for 12.8), or an error when no driver loads.
func DriverVersion() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var v int32
	if err := d.check(d.driverGetVersion(&v), "cuDriverGetVersion"); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceCount is how many CUDA devices the driver sees.
func DeviceCount() (int, error) {
	d, err := loadDriver()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := d.check(d.deviceGetCount(&n), "cuDeviceGetCount"); err != nil {
		return 0, err
	}
	return int(n), nil
}

func gib(n uint64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// ParseDevice reads a device name as recipes give it: "cuda" or "cuda:N"
// is GPU 0 or N; "cpu" and "" are the CPU (-1).
func ParseDevice(name string) (int, error) {
	switch {
	case name == "" || name == "cpu":
		return -1, nil
	case name == "cuda":
		return 0, nil
	case strings.HasPrefix(name, "cuda:"):
		n, err := strconv.Atoi(name[len("cuda:"):])
		if err != nil || n < 0 {
			return 0, fmt.Errorf("device %q: want cpu, cuda or cuda:N with N a GPU number", name)
		}
		return n, nil
	}
	return 0, fmt.Errorf("device %q: want cpu, cuda or cuda:N", name)
}
