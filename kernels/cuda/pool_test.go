package cuda

import (
	"errors"
	"math"
	"testing"
)

// fakeMemory is a device's allocator in the Pool tests: addresses that
// never repeat, a memory limit, and a record of what is live.
type fakeMemory struct {
	next        uint64
	limit, used int64
	live        map[uint64]int64
	allocs      []int64 // the sizes asked of the device, in order
	frees       int
}

var errFakeOOM = errors.New("fake device: out of memory")

func newFakePool(limit int64) (*Pool, *fakeMemory) {
	f := &fakeMemory{next: 1 << 20, limit: limit, live: map[uint64]int64{}}
	p := &Pool{owned: map[uint64]handed{}, oom: func(err error) bool { return errors.Is(err, errFakeOOM) },
		alloc: func(n int64) (Buffer, error) {
			if f.used+n > f.limit {
				return Buffer{}, errFakeOOM
			}
			f.used += n
			f.allocs = append(f.allocs, n)
			b := Buffer{Ptr: f.next, Size: n}
			f.live[b.Ptr] = n
			f.next += uint64(n) + 4096
			return b, nil
		},
		free: func(b Buffer) error {
			n, ok := f.live[b.Ptr]
			if !ok {
				return errors.New("fake device: freeing what is not allocated")
			}
			delete(f.live, b.Ptr)
			f.used -= n
			f.frees++
			return nil
		}}
	return p, f
}

const mib = 1 << 20

func TestPoolReuse(t *testing.T) {
	p, f := newFakePool(1 << 40)
	must := func(b Buffer, err error) Buffer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := must(p.Alloc(10 * mib))
	if a.Size != 10*mib || f.allocs[0] != 10*mib {
		t.Fatalf("10 MiB: buffer %d bytes, device asked %v", a.Size, f.allocs)
	}
	p.Free(a)
	if f.frees != 0 || p.Cached() != 10*mib {
		t.Fatalf("a free went to the device (%d) or was not cached (%d bytes)", f.frees, p.Cached())
	}
	// A request a little smaller takes it, with its own size.
	b := must(p.Alloc(9*mib + 3))
	if b.Ptr != a.Ptr || b.Size != 9*mib+3 || len(f.allocs) != 1 || p.Cached() != 0 {
		t.Fatalf("9 MiB after a 10 MiB free: %+v, device allocations %v, cached %d", b, f.allocs, p.Cached())
	}
	p.Free(b)
	// Far smaller, or larger: new allocations (a small request does not
	// hold a large buffer).
	c := must(p.Alloc(mib))
	d := must(p.Alloc(11 * mib))
	if c.Ptr == a.Ptr || d.Ptr == a.Ptr || len(f.allocs) != 3 {
		t.Fatalf("1 MiB and 11 MiB took the cached 10 MiB buffer (device allocations %v)", f.allocs)
	}
	// Requests round to 512 bytes below 2 MiB, else to 2 MiB.
	if f.allocs[1] != mib || f.allocs[2] != 12*mib {
		t.Errorf("allocation sizes %v, want 1 MiB and 12 MiB after the first", f.allocs)
	}
	e := must(p.Alloc(100))
	if f.allocs[3] != 512 || e.Size != 100 {
		t.Errorf("100 bytes: device asked %d, buffer %d", f.allocs[3], e.Size)
	}
	// The best fit of several cached buffers.
	p.Free(d) // 12 MiB
	p.Free(c) // 1 MiB
	x := must(p.Alloc(9 * mib))
	if x.Ptr != a.Ptr {
		t.Errorf("9 MiB with 1, 10 and 12 MiB cached: got %#x, want the 10 MiB buffer %#x", x.Ptr, a.Ptr)
	}
	if s := p.Stats(); s.Allocs != 4 || s.Reuses != 2 || s.Cached != 13*mib {
		t.Errorf("stats %+v, want 4 allocations, 2 reuses, 13 MiB cached", s)
	}
	// A buffer the Pool did not hand out is freed on the device.
	foreign, _ := p.alloc(512)
	p.Free(foreign)
	if f.frees != 1 {
		t.Errorf("a foreign buffer's free: %d device frees, want 1", f.frees)
	}
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
	if f.frees != 3 || p.Cached() != 0 || len(f.live) != 2 || f.live[x.Ptr] == 0 || f.live[e.Ptr] == 0 {
		t.Errorf("after Release: %d device frees (want 3), %d cached, live %v (want the two handed out)", f.frees, p.Cached(), f.live)
	}
}

// On running out of memory the Pool frees what it caches and tries again;
// a request that cannot fit at all still fails with the device's error.
func TestPoolOutOfMemory(t *testing.T) {
	p, f := newFakePool(32 * mib)
	a, err := p.Alloc(24 * mib)
	if err != nil {
		t.Fatal(err)
	}
	p.Free(a)
	b, err := p.Alloc(16 * mib) // 24 MiB cached is too large to serve it, and 24 + 16 > 32
	if err != nil {
		t.Fatalf("16 MiB with 24 MiB cached in 32 MiB: %v", err)
	}
	if f.frees != 1 || p.Cached() != 0 || f.used != 16*mib {
		t.Errorf("device frees %d (want 1), cached %d, used %d", f.frees, p.Cached(), f.used)
	}
	if _, err := p.Alloc(20 * mib); !errors.Is(err, errFakeOOM) {
		t.Errorf("20 MiB beside 16 MiB in 32 MiB: %v, want the device's out-of-memory error", err)
	}
	p.Free(b)
}

// InUse counts the bytes asked for by the buffers handed out and not
// freed, Held their capacities (the Pool's rounding, or the larger cached
// buffer a request reuses), each with its peak since ResetPeak, with
// caching on and off; a foreign buffer's free changes neither.
func TestPoolPeak(t *testing.T) {
	for _, off := range []bool{false, true} {
		p, _ := newFakePool(1 << 40)
		p.off = off
		// What the Pool holds for a request of n: its class when caching,
		// and a's 4 MiB buffer for c's 3 MiB.
		class := func(n int64) int64 {
			if off {
				return n
			}
			return poolClass(n)
		}
		reused := class(3 * mib)
		if !off {
			reused = 4 * mib
		}
		check := func(what string, inUse, peak, held, peakHeld int64) {
			t.Helper()
			if s := p.Stats(); s.InUse != inUse || s.Peak != peak || s.Held != held || s.PeakHeld != peakHeld {
				t.Errorf("off=%v, %s: in use %d, peak %d, held %d, peak held %d; want %d, %d, %d, %d", off, what,
					s.InUse, s.Peak, s.Held, s.PeakHeld, inUse, peak, held, peakHeld)
			}
		}
		a, _ := p.Alloc(3*mib + 1)
		b, _ := p.Alloc(100)
		both := class(3*mib+1) + class(100)
		check("two buffers", 3*mib+101, 3*mib+101, both, both)
		p.Free(a)
		check("one freed", 100, 3*mib+101, class(100), both)
		p.ResetPeak()
		check("peak reset", 100, 100, class(100), class(100))
		c, _ := p.Alloc(3 * mib)
		if !off && c.Ptr != a.Ptr {
			t.Errorf("3 MiB after a 3 MiB + 1 free: a new buffer")
		}
		check("reuse", 3*mib+100, 3*mib+100, class(100)+reused, class(100)+reused)
		foreign, _ := p.alloc(512)
		p.Free(foreign)
		p.Free(b)
		p.Free(c)
		check("all freed", 0, 3*mib+100, 0, class(100)+reused)
	}
}

// Turned off (KEEL_CUDA_POOL=0) or exact (the emulator), the Pool keeps
// the device's behaviour where it must.
func TestPoolOffAndExact(t *testing.T) {
	p, f := newFakePool(1 << 40)
	p.off = true
	a, _ := p.Alloc(10 * mib)
	p.Free(a)
	if len(f.allocs) != 1 || f.allocs[0] != 10*mib || f.frees != 1 || p.Cached() != 0 {
		t.Errorf("off: allocations %v, frees %d, cached %d", f.allocs, f.frees, p.Cached())
	}
	p, f = newFakePool(1 << 40)
	p.exact = true
	a, _ = p.Alloc(10*mib + 1)
	p.Free(a)
	b, _ := p.Alloc(10 * mib)
	c, _ := p.Alloc(10*mib + 1)
	if f.allocs[0] != 10*mib+1 || b.Ptr == a.Ptr || c.Ptr != a.Ptr {
		t.Errorf("exact: allocations %v; a smaller request took the buffer (%v) or the same size did not (%v)", f.allocs, b.Ptr == a.Ptr, c.Ptr != a.Ptr)
	}
}

// TestDevicePoolPoison: on the emulator a reused buffer reads as NaN, as
// a fresh allocation does, so a kernel that reads what it never wrote
// still fails the device tests.
func TestDevicePoolPoison(t *testing.T) {
	g := newGPU(t)
	if !g.d.Emulated {
		t.Skip("the emulator's poisoning (a GPU reuses buffers as they are)")
	}
	p := NewPool(g.d)
	defer p.Release()
	a, err := p.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := Upload(g.d, a, make([]float32, 1024)); err != nil {
		t.Fatal(err)
	}
	p.Free(a)
	b, err := p.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Free(b)
	if b.Ptr != a.Ptr {
		t.Fatal("the same size was not reused")
	}
	for i, v := range g.f32(b, 1024) {
		if !math.IsNaN(float64(v)) {
			t.Fatalf("reused element %d = %g, want NaN", i, v)
		}
	}
}
