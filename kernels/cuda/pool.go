package cuda

import (
	"cmp"
	"os"
	"slices"
	"sync"
)

// Memory is where device buffers come from: a Device (cuMemAlloc and
// cuMemFree) or a Pool over one.
type Memory interface {
	Alloc(n int64) (Buffer, error)
	Free(b Buffer) error
	Device() *Device
}

// Device returns d: a Device is the Memory that allocates and frees at
// once.
func (d *Device) Device() *Device { return d }

// Pool keeps the buffers freed through it for later allocations of about
// their size, as PyTorch's caching allocator does. A training step
// allocates its activations and scratch (hundreds of buffers, gigabytes
// at the shapes practitioners train) and frees them the next step, and
// each cuMemAlloc and cuMemFree is a call into the driver that maps or
// unmaps memory, where a Device's Free first waits for the whole device
// (cuMemFree does not promise to): a Pool makes the steps after the first
// allocate nothing.
//
// A buffer freed into the Pool may still be read or written by work
// queued on the default stream; the Pool hands it out again at once,
// and whatever its next owner issues on the default stream runs after
// that work (stream order). So every user of one Pool issues its work on
// the default stream, as the training engine does (not a graph's stream).
//
// KEEL_CUDA_POOL=0 turns caching off (each Alloc and Free goes to the
// device): the A/B that tools/gpu/check.sh times.
type Pool struct {
	dev *Device
	// The device's calls, replaceable in tests.
	alloc func(n int64) (Buffer, error)
	free  func(b Buffer) error
	oom   func(err error) bool
	off   bool
	// On keel's CUDA emulator: a request reuses only a buffer of its exact
	// size, and reused memory is set to 0xff bytes (NaN as floats), so
	// that the emulator's checks still see a read of memory never written
	// and a write past a buffer's end (its fault page follows the
	// allocation).
	exact  bool
	poison func(b Buffer) error

	mu     sync.Mutex
	cached []Buffer          // by capacity, ascending; Size is the capacity
	owned  map[uint64]handed // every buffer handed out, by address
	stats  PoolStats
}

// PoolStats counts a Pool's work.
type PoolStats struct {
	Allocs, Reuses, Frees int   // device allocations, allocations served from the cache, cached buffers freed on the device
	Cached                int64 // bytes held for reuse now
	// InUse is the bytes asked for by the buffers handed out and not yet
	// freed, and Peak the most InUse has been since the Pool was made or
	// ResetPeak was called: what a step's activations and scratch take,
	// which train/memplan's plan counts. Held and PeakHeld are the same
	// for the buffers' capacities: the device memory behind them (a
	// request rounded up to the Pool's class, or served by a cached buffer
	// up to a quarter larger).
	InUse, Peak, Held, PeakHeld int64
}

// NewPool returns an empty Pool over d.
func NewPool(d *Device) *Pool {
	p := &Pool{dev: d, alloc: d.Alloc, free: d.Free, oom: IsOutOfMemory, off: os.Getenv("KEEL_CUDA_POOL") == "0",
		owned: map[uint64]handed{}}
	if d.Emulated {
		p.exact = true
		p.poison = func(b Buffer) error {
			return d.do(func() error { return d.drv.check(d.drv.memsetD8(b.Ptr, 0xff, uint64(b.Size)), "cuMemsetD8") })
		}
	}
	return p
}

// Device returns the device the Pool allocates on.
func (p *Pool) Device() *Device { return p.dev }

// class is what the Pool allocates for a request of n bytes.
func (p *Pool) class(n int64) int64 {
	if p.exact {
		return n
	}
	return poolClass(n)
}

// poolClass rounds a request up to a multiple of 512 bytes below 2 MiB,
// else of 2 MiB (the driver's own page for large allocations).
func poolClass(n int64) int64 {
	g := int64(512)
	if n >= 2<<20 {
		g = 2 << 20
	}
	return (n + g - 1) / g * g
}

// fits says whether a cached buffer of capacity c serves a request of n
// bytes: not smaller, and at most a quarter (and one class step) larger,
// so that a step whose tokens vary a little reuses the last step's
// buffers while a small request does not take a large buffer.
func fits(c, n int64) bool { return c >= n && c <= poolClass(n+n/4) }

// bySize orders the cached buffers by capacity (their Size).
func bySize(b Buffer, n int64) int { return cmp.Compare(b.Size, n) }

// Alloc returns a buffer of n bytes (its Size is n): a cached one when one
// fits, else a new allocation. When the device is out of memory, the
// cached buffers are freed and the allocation tried again.
func (p *Pool) Alloc(n int64) (Buffer, error) {
	if n <= 0 {
		return p.alloc(n)
	}
	if p.off {
		b, err := p.alloc(n)
		if err == nil {
			p.mu.Lock()
			p.hand(b.Ptr, n, n)
			p.mu.Unlock()
		}
		return b, err
	}
	p.mu.Lock()
	i, _ := slices.BinarySearchFunc(p.cached, n, bySize)
	if i < len(p.cached) && (fits(p.cached[i].Size, n) && !p.exact || p.cached[i].Size == n) {
		b := p.cached[i]
		p.cached = slices.Delete(p.cached, i, i+1)
		p.stats.Cached -= b.Size
		p.stats.Reuses++
		p.hand(b.Ptr, b.Size, n)
		p.mu.Unlock()
		if p.poison != nil {
			if err := p.poison(b); err != nil {
				return Buffer{}, err
			}
		}
		return Buffer{Ptr: b.Ptr, Size: n}, nil
	}
	p.mu.Unlock()
	c := p.class(n)
	b, err := p.alloc(c)
	if err != nil && p.oom(err) && p.Cached() > 0 {
		if rerr := p.Release(); rerr != nil {
			return Buffer{}, rerr
		}
		b, err = p.alloc(c)
	}
	if err != nil {
		return Buffer{}, err
	}
	p.mu.Lock()
	p.stats.Allocs++
	p.hand(b.Ptr, c, n)
	p.mu.Unlock()
	return Buffer{Ptr: b.Ptr, Size: n}, nil
}

// Free keeps b for reuse. A buffer the Pool did not hand out is freed on
// the device.
func (p *Pool) Free(b Buffer) error {
	if b.Ptr == 0 {
		return nil
	}
	p.mu.Lock()
	h, ok := p.owned[b.Ptr]
	if ok {
		delete(p.owned, b.Ptr)
		p.stats.InUse -= h.asked
		p.stats.Held -= h.capacity
	}
	c := h.capacity
	if !ok || p.off {
		p.mu.Unlock()
		return p.free(b)
	}
	b.Size = c
	i, _ := slices.BinarySearchFunc(p.cached, c, bySize)
	p.cached = slices.Insert(p.cached, i, b)
	p.stats.Cached += c
	p.mu.Unlock()
	return nil
}

// handed is a buffer the Pool handed out: its capacity, and the bytes
// asked for.
type handed struct{ capacity, asked int64 }

// hand records the buffer at ptr of capacity c handed out for a request
// of n bytes; p.mu is held.
func (p *Pool) hand(ptr uint64, c, n int64) {
	p.owned[ptr] = handed{c, n}
	p.stats.InUse += n
	p.stats.Peak = max(p.stats.Peak, p.stats.InUse)
	p.stats.Held += c
	p.stats.PeakHeld = max(p.stats.PeakHeld, p.stats.Held)
}

// ResetPeak sets Stats().Peak and PeakHeld to the bytes in use and held
// now, so that the next ones are the most from here on.
func (p *Pool) ResetPeak() {
	p.mu.Lock()
	p.stats.Peak, p.stats.PeakHeld = p.stats.InUse, p.stats.Held
	p.mu.Unlock()
}

// Release frees every cached buffer on the device (the buffers handed out
// stay valid).
func (p *Pool) Release() error {
	p.mu.Lock()
	cached := p.cached
	p.cached = nil
	p.stats.Cached = 0
	p.stats.Frees += len(cached)
	p.mu.Unlock()
	var first error
	for _, b := range cached {
		if err := p.free(b); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Cached returns the bytes the Pool holds for reuse: device memory that
// MemInfo counts as used but the Pool's next allocations can have.
func (p *Pool) Cached() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats.Cached
}

// Stats returns the Pool's counts.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}
