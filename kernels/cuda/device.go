package cuda

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Device is one GPU with keel's context on it (the device's primary
// context, which other libraries on the same GPU share). Its methods may
// be called from any goroutine: each call makes the context current on
// the OS thread it runs on. Work is issued on the default stream, in
// order; Sync waits for it.
type Device struct {
	Ordinal int
	Name    string
	// Arch is the compute capability times ten: 90 for Hopper.
	Arch int
	// SMs is the number of multiprocessors.
	SMs int
	// Memory is the device's memory in bytes.
	Memory int64
	// Driver is the driver's CUDA version (12080 for 12.8).
	Driver int
	// SharedPerBlock is the most shared memory, in bytes, a block may use
	// once its kernel opts in (Function.SetMaxDynamicShared): 227 KiB on
	// Hopper, 163 on the A100, 99 on sm_86 and sm_89 cards. Kernels whose
	// pipelined form needs more fall back to a smaller one.
	SharedPerBlock int
	// Emulated is true on keel's CUDA emulator (tools/cudaemu), which runs
	// the kernels on the CPU to test them: its timings are no GPU's.
	Emulated bool

	drv   *driver
	ctx   uintptr
	cache *Cache

	mu      sync.Mutex
	modules map[string]*Module
	nvrtc   *NVRTC
	blas    *Blas
	closed  atomic.Bool
	prof    *profile // KEEL_CUDA_PROFILE=1
}

// recording is held by Ops.Capture while a stream records a graph
// (exclusively) and around every synchronisation of a context (shared):
// the driver refuses a cuCtxSynchronize while any stream of the context
// records, whichever thread asks, and the recording is lost. So one
// goroutine's Sync or Free (the trainer's) waits for another's recording
// (an async rollout's decoding step) to end. The process's, not a
// Device's: the trainer and the rollout open Devices of their own on one
// GPU's primary context.
var recording sync.RWMutex

// Device attributes (CUdevice_attribute).
const (
	attrMultiprocessors  = 16
	attrCCMajor          = 75
	attrCCMinor          = 76
	attrSharedBlockOptin = 97 // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
)

// Open opens GPU ordinal (0 for the first). It fails with a *LibraryError
// when no driver is installed, ErrNoDevice when the driver sees no GPU,
// and a clear error for an ordinal it does not have.
func Open(ordinal int) (*Device, error) {
	drv, err := loadDriver()
	if err != nil {
		return nil, err
	}
	var n int32
	if err := drv.check(drv.deviceGetCount(&n), "cuDeviceGetCount"); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, ErrNoDevice
	}
	if ordinal < 0 || ordinal >= int(n) {
		return nil, fmt.Errorf("cuda: device %d: the driver sees %d device(s), 0 to %d", ordinal, n, n-1)
	}
	var dev int32
	if err := drv.check(drv.deviceGet(&dev, int32(ordinal)), "cuDeviceGet(%d)", ordinal); err != nil {
		return nil, err
	}
	d := &Device{Ordinal: ordinal, drv: drv, modules: map[string]*Module{}, Emulated: drv.emulated, prof: newProfile()}
	name := make([]byte, 256)
	if err := drv.check(drv.deviceGetName(&name[0], int32(len(name)), dev), "cuDeviceGetName"); err != nil {
		return nil, err
	}
	d.Name = goString(&name[0])
	var major, minor, sms, shared, ver int32
	var mem uint64
	for _, q := range []struct {
		v    *int32
		attr int32
	}{{&major, attrCCMajor}, {&minor, attrCCMinor}, {&sms, attrMultiprocessors}, {&shared, attrSharedBlockOptin}} {
		if err := drv.check(drv.deviceGetAttr(q.v, q.attr, dev), "cuDeviceGetAttribute(%d)", q.attr); err != nil {
			return nil, err
		}
	}
	if err := drv.check(drv.deviceTotalMem(&mem, dev), "cuDeviceTotalMem"); err != nil {
		return nil, err
	}
	if err := drv.check(drv.driverGetVersion(&ver), "cuDriverGetVersion"); err != nil {
		return nil, err
	}
	d.Arch, d.SMs, d.Memory, d.Driver, d.SharedPerBlock = int(major*10+minor), int(sms), int64(mem), int(ver), int(shared)
	if err := drv.check(drv.primaryCtxRetain(&d.ctx, dev), "cuDevicePrimaryCtxRetain(%d)", ordinal); err != nil {
		return nil, err
	}
	if dir, err := DefaultCacheDir(); err == nil {
		d.cache = &Cache{Dir: dir, Notice: CompileNotice}
	}
	return d, nil
}

// String names the device for run headers and benchmark rows.
func (d *Device) String() string {
	return fmt.Sprintf("%s (sm_%d, %d SMs, %s, CUDA driver %d.%d)", d.Name, d.Arch, d.SMs,
		gib(uint64(d.Memory)), d.Driver/1000, d.Driver%1000/10)
}

// do runs f with the device's context current on a locked OS thread.
func (d *Device) do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if d.closed.Load() {
		return fmt.Errorf("cuda: device %d is closed", d.Ordinal)
	}
	if err := d.drv.check(d.drv.ctxSetCurrent(d.ctx), "cuCtxSetCurrent"); err != nil {
		return err
	}
	return f()
}

// Close releases the modules loaded and the context. Buffers still
// allocated are freed with the context.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil
	}
	err := d.doSynced(func(err error) error {
		if d.blas != nil {
			d.blas.close()
			d.drv.memFree(d.blas.ws.Ptr)
			d.blas = nil
		}
		for _, m := range d.modules {
			d.drv.moduleUnload(m.handle)
		}
		return err
	})
	d.modules = nil
	d.closed.Store(true)
	if d.prof != nil && len(d.prof.rows) > 0 {
		d.prof.write(os.Stderr, d.String())
	}
	var dev int32
	if e := d.drv.check(d.drv.deviceGet(&dev, int32(d.Ordinal)), "cuDeviceGet"); e == nil {
		if e := d.drv.check(d.drv.primaryCtxRelease(dev), "cuDevicePrimaryCtxRelease"); err == nil {
			err = e
		}
	}
	return err
}

// Sync waits for all work issued on the device and returns the first
// error a kernel raised (an illegal address, say).
func (d *Device) Sync() error {
	return d.doSynced(func(err error) error { return err })
}

// doSynced synchronises the context, then runs f with the
// synchronisation's error, the context current, and no graph being
// recorded (see recording).
func (d *Device) doSynced(f func(syncErr error) error) error {
	recording.RLock()
	defer recording.RUnlock()
	return d.do(func() error { return f(d.drv.check(d.drv.ctxSynchronize(), "cuCtxSynchronize")) })
}

// MemInfo returns the device's free and total memory in bytes.
func (d *Device) MemInfo() (free, total int64, err error) {
	var f, t uint64
	err = d.do(func() error { return d.drv.check(d.drv.memGetInfo(&f, &t), "cuMemGetInfo") })
	return int64(f), int64(t), err
}

// Buffer is device memory: an address and a size in bytes.
type Buffer struct {
	Ptr  uint64
	Size int64
}

// Alloc allocates n bytes of device memory (plain cuMemAlloc, never
// managed memory). IsOutOfMemory tells a failure for want of memory.
func (d *Device) Alloc(n int64) (Buffer, error) {
	if n <= 0 {
		return Buffer{}, fmt.Errorf("cuda: Alloc(%d bytes): size must be positive", n)
	}
	var p uint64
	t0 := time.Now()
	err := d.do(func() error { return d.drv.check(d.drv.memAlloc(&p, uint64(n)), "cuMemAlloc(%s)", gib(uint64(n))) })
	if d.prof != nil { // the profile's table shows what allocations cost the host
		d.prof.add("cuMemAlloc (host time)", time.Since(t0))
	}
	return Buffer{Ptr: p, Size: n}, err
}

// Free releases b, after the work issued so far (which may use it) is
// done: cuMemFree does not promise to wait for it.
func (d *Device) Free(b Buffer) error {
	if b.Ptr == 0 {
		return nil
	}
	t0 := time.Now()
	err := d.doSynced(func(err error) error {
		if err != nil {
			return err
		}
		return d.drv.check(d.drv.memFree(b.Ptr), "cuMemFree")
	})
	if d.prof != nil {
		d.prof.add("cuMemFree with its device sync (host time)", time.Since(t0))
	}
	return err
}

// Zero sets b's bytes to 0.
func (d *Device) Zero(b Buffer) error {
	return d.do(func() error { return d.drv.check(d.drv.memsetD8(b.Ptr, 0, uint64(b.Size)), "cuMemsetD8") })
}

// Upload copies the host slice src (any element type) into b at byte
// offset 0; it fails when src is larger than b.
func Upload[T any](d *Device, b Buffer, src []T) error {
	n := int64(len(src)) * int64(unsafe.Sizeof(*new(T)))
	if n > b.Size {
		return fmt.Errorf("cuda: Upload of %d bytes into a %d-byte buffer", n, b.Size)
	}
	if n == 0 {
		return nil
	}
	err := d.do(func() error {
		return d.drv.check(d.drv.memcpyHtoD(b.Ptr, unsafe.Pointer(&src[0]), uint64(n)), "cuMemcpyHtoD(%d bytes)", n)
	})
	runtime.KeepAlive(src)
	return err
}

// Download copies the start of b into the host slice dst.
func Download[T any](d *Device, dst []T, b Buffer) error {
	n := int64(len(dst)) * int64(unsafe.Sizeof(*new(T)))
	if n > b.Size {
		return fmt.Errorf("cuda: Download of %d bytes from a %d-byte buffer", n, b.Size)
	}
	if n == 0 {
		return nil
	}
	err := d.do(func() error {
		return d.drv.check(d.drv.memcpyDtoH(unsafe.Pointer(&dst[0]), b.Ptr, uint64(n)), "cuMemcpyDtoH(%d bytes)", n)
	})
	runtime.KeepAlive(dst)
	return err
}

// Copy copies n bytes from src to dst on the device.
func (d *Device) Copy(dst, src Buffer, n int64) error {
	if n > dst.Size || n > src.Size {
		return fmt.Errorf("cuda: Copy of %d bytes between buffers of %d and %d", n, src.Size, dst.Size)
	}
	return d.do(func() error { return d.drv.check(d.drv.memcpyDtoD(dst.Ptr, src.Ptr, uint64(n)), "cuMemcpyDtoD") })
}

// Module is a loaded kernel source: its functions can be launched.
type Module struct {
	Name   string
	Target Target
	// CacheHit says the image came from the on-disk cache.
	CacheHit bool
	handle   uintptr
	dev      *Device
}

// Module compiles (or takes from the cache) and loads one of keel's
// embedded kernel sources by name ("rows.cu"), once per device.
func (d *Device) Module(name string) (*Module, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m, ok := d.modules[name]; ok {
		return m, nil
	}
	img, t, hit, err := d.build(name)
	if err != nil {
		return nil, err
	}
	m := &Module{Name: name, Target: t, CacheHit: hit, dev: d}
	err = d.do(func() error {
		return d.drv.check(d.drv.moduleLoadData(&m.handle, unsafe.Pointer(&img[0])), "cuModuleLoadData(%s, %s)", name, t)
	})
	runtime.KeepAlive(img)
	if err != nil {
		return nil, err
	}
	d.modules[name] = m
	return m, nil
}

// build returns source name's image for d, from d's kernel cache or
// compiled into it: the one place the key of a device's images is made,
// so that Precompile fills the entries Module reads. d.mu is held.
func (d *Device) build(name string) (img []byte, t Target, hit bool, err error) {
	src, err := Source(name)
	if err != nil {
		return nil, t, false, err
	}
	if d.nvrtc == nil {
		if d.nvrtc, err = LoadNVRTC(); err != nil {
			return nil, t, false, err
		}
	}
	if t, err = d.nvrtc.Target(d.Arch); err != nil {
		return nil, t, false, err
	}
	img, hit, err = d.cache.Build(d.nvrtc, BuildKey{Name: name, Source: src, Options: KernelOptions, Target: t, Driver: d.Driver})
	return img, t, hit, err
}

// Precompile compiles the embedded kernel sources names (every one when
// none is named) for d into its kernel cache without loading them, so
// that a run's first use of each takes it from the cache (keel device
// does this for a new machine). It returns how many were in the cache
// already.
func (d *Device) Precompile(names ...string) (hits int, err error) {
	if len(names) == 0 {
		names = SourceNames()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, name := range names {
		_, _, hit, err := d.build(name)
		if err != nil {
			return hits, err
		}
		if hit {
			hits++
		}
	}
	return hits, nil
}

// Function is one kernel of a module.
type Function struct {
	Name   string
	handle uintptr
	dev    *Device
}

// Function looks up the kernel name (an extern "C" __global__ function).
func (m *Module) Function(name string) (*Function, error) {
	f := &Function{Name: name, dev: m.dev}
	err := m.dev.do(func() error {
		return m.dev.drv.check(m.dev.drv.moduleGetFunction(&f.handle, m.handle, name), "cuModuleGetFunction(%s in %s)", name, m.Name)
	})
	return f, err
}

// SetMaxDynamicShared lets f launch with up to n bytes of dynamic shared
// memory (above the default 48 KiB).
func (f *Function) SetMaxDynamicShared(n int) error {
	const attrMaxDynamicShared = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	return f.dev.do(func() error {
		return f.dev.drv.check(f.dev.drv.funcSetAttribute(f.handle, attrMaxDynamicShared, int32(n)), "cuFuncSetAttribute(%s, shared %d)", f.Name, n)
	})
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z int }

// dims returns the shape for the driver, a dimension left at 0 being 1.
func (d Dim3) dims() (uint32, uint32, uint32, error) {
	x, y, z := max(d.X, 1), max(d.Y, 1), max(d.Z, 1)
	if d.X < 0 || d.Y < 0 || d.Z < 0 || x > math.MaxInt32 || y > 65535 || z > 65535 {
		return 0, 0, 0, fmt.Errorf("cuda: launch shape %v out of range", d)
	}
	return uint32(x), uint32(y), uint32(z), nil
}

// Launch runs f over grid × block with shared bytes of dynamic shared
// memory on the default stream, without waiting. Each argument is a
// Buffer (its address), an int (passed as int32), an int32, uint32,
// int64, uint64, float32 or float64, in the kernel's parameter order. A
// grid whose X is 0 (no rows to do) launches nothing; Y and Z left at 0
// are 1.
func (f *Function) Launch(grid, block Dim3, shared int, args ...any) error {
	return f.launchOn(0, grid, block, shared, args...)
}

// launchOn is Launch on stream (0: the default stream).
func (f *Function) launchOn(stream uintptr, grid, block Dim3, shared int, args ...any) error {
	if grid.X == 0 {
		return nil
	}
	gx, gy, gz, err := grid.dims()
	if err != nil {
		return err
	}
	bx, by, bz, err := block.dims()
	if err != nil {
		return err
	}
	// Each argument sits in an 8-byte slot of Go heap memory (which does
	// not move); the driver reads each parameter's size from the kernel.
	slots := make([]uint64, len(args))
	ptrs := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case Buffer:
			slots[i] = v.Ptr
		case int:
			if v < math.MinInt32 || v > math.MaxInt32 {
				return fmt.Errorf("cuda: %s argument %d: %d does not fit an int32", f.Name, i, v)
			}
			*(*int32)(unsafe.Pointer(&slots[i])) = int32(v)
		case int32:
			*(*int32)(unsafe.Pointer(&slots[i])) = v
		case uint32:
			*(*uint32)(unsafe.Pointer(&slots[i])) = v
		case int64:
			*(*int64)(unsafe.Pointer(&slots[i])) = v
		case uint64:
			slots[i] = v
		case float32:
			*(*float32)(unsafe.Pointer(&slots[i])) = v
		case float64:
			*(*float64)(unsafe.Pointer(&slots[i])) = v
		default:
			return fmt.Errorf("cuda: %s argument %d: unsupported type %T", f.Name, i, a)
		}
		ptrs[i] = unsafe.Pointer(&slots[i])
	}
	var params unsafe.Pointer
	if len(ptrs) > 0 {
		params = unsafe.Pointer(&ptrs[0])
	}
	launch := func() error {
		return f.dev.drv.check(f.dev.drv.launchKernel(f.handle, gx, gy, gz, bx, by, bz, uint32(shared), stream, params, nil),
			"cuLaunchKernel(%s, grid %v, block %v, shared %d)", f.Name, grid, block, shared)
	}
	err = f.dev.do(func() error {
		if f.dev.prof != nil && stream == 0 {
			return f.dev.prof.time(f.dev, f.Name, launch)
		}
		return launch()
	})
	runtime.KeepAlive(slots)
	runtime.KeepAlive(ptrs)
	return err
}

// Timer measures device time between two points on the default stream
// with CUDA events: the way to time asynchronous work.
type Timer struct {
	start, end uintptr
	dev        *Device
}

// NewTimer creates a timer's two events.
func (d *Device) NewTimer() (*Timer, error) {
	t := &Timer{dev: d}
	err := d.do(func() error {
		if err := d.drv.check(d.drv.eventCreate(&t.start, 0), "cuEventCreate"); err != nil {
			return err
		}
		return d.drv.check(d.drv.eventCreate(&t.end, 0), "cuEventCreate")
	})
	return t, err
}

// Start records the start event.
func (t *Timer) Start() error {
	return t.dev.do(func() error { return t.dev.drv.check(t.dev.drv.eventRecord(t.start, 0), "cuEventRecord") })
}

// Stop records the end event, waits for it and returns the milliseconds
// since Start.
func (t *Timer) Stop() (float64, error) {
	var ms float32
	err := t.dev.do(func() error {
		if err := t.dev.drv.check(t.dev.drv.eventRecord(t.end, 0), "cuEventRecord"); err != nil {
			return err
		}
		if err := t.dev.drv.check(t.dev.drv.eventSynchronize(t.end), "cuEventSynchronize"); err != nil {
			return err
		}
		return t.dev.drv.check(t.dev.drv.eventElapsed(&ms, t.start, t.end), "cuEventElapsedTime")
	})
	return float64(ms), err
}

// Close destroys the events.
func (t *Timer) Close() {
	t.dev.do(func() error {
		t.dev.drv.eventDestroy(t.start)
		t.dev.drv.eventDestroy(t.end)
		return nil
	})
}
