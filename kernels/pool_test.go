package kernels

import (
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// checkLoop runs one loop and checks that every index in [0, n) was
// visited exactly once, by a worker in range, never by two chunks with
// the same worker index at once.
func checkLoop(t *testing.T, p *Pool, n int, run func(fn func(w, lo, hi int))) {
	t.Helper()
	visits := make([]atomic.Int32, n)
	busy := make([]atomic.Int32, p.Workers())
	var bad atomic.Int32
	run(func(w, lo, hi int) {
		if w < 0 || w >= p.Workers() || lo < 0 || hi > n || lo >= hi {
			bad.Store(1)
			return
		}
		if busy[w].Add(1) != 1 {
			bad.Store(2)
		}
		for i := lo; i < hi; i++ {
			visits[i].Add(1)
		}
		time.Sleep(time.Duration(lo%3) * time.Microsecond)
		busy[w].Add(-1)
	})
	if b := bad.Load(); b != 0 {
		t.Fatalf("n=%d: bad chunk (%d)", n, b)
	}
	for i := range visits {
		if v := visits[i].Load(); v != 1 {
			t.Fatalf("n=%d: index %d visited %d times", n, i, v)
		}
	}
}

func TestPool(t *testing.T) {
	for _, workers := range []int{1, 2, 3, 8} {
		p := NewPool(workers)
		for _, n := range []int{0, 1, 2, 7, 100, 1000} {
			checkLoop(t, p, n, func(fn func(w, lo, hi int)) { p.Run(n, fn) })
			for _, grain := range []int{1, 3, 1000} {
				checkLoop(t, p, n, func(fn func(w, lo, hi int)) { p.RunGrain(n, grain, fn) })
			}
		}
		bounds := []int{0, 5, 6, 40, 41, 100}
		checkLoop(t, p, 100, func(fn func(w, lo, hi int)) {
			p.RunChunks(bounds, func(w, lo, hi int) {
				for c := 0; c+1 < len(bounds); c++ {
					if lo == bounds[c] && hi != bounds[c+1] {
						t.Errorf("chunk [%d, %d) is not one of the given ones", lo, hi)
					}
				}
				fn(w, lo, hi)
			})
		})
		p.Close()
	}
}

// A pool whose helpers have parked (idle longer than parkAfter) wakes them
// for the next loop, and they take part again.
func TestPoolWakesParkedHelpers(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for round := 0; round < 3; round++ {
		time.Sleep(3 * parkAfter)
		var byHelper atomic.Int32
		// Chunks that wait long enough for a woken helper to claim some.
		p.RunGrain(64, 1, func(w, lo, hi int) {
			if w == 1 {
				byHelper.Add(1)
			}
			time.Sleep(200 * time.Microsecond)
		})
		if byHelper.Load() == 0 {
			t.Fatalf("round %d: the parked helper ran no chunk of 64", round)
		}
	}
}

// ParallelFor and Gemm share one pool: a Gemm or a ParallelFor inside a
// ParallelFor chunk (the pool is busy) still covers everything and gives
// the same bits, and a change of GOMAXPROCS rebuilds the pool.
func TestSharedPoolNestedAndResized(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	r := rand.New(rand.NewPCG(21, 22))
	c := newGemmCase(r, false, true, 300, 96, 200, false)
	want := c.full()
	for _, procs := range []int{2, 3, 2} {
		runtime.GOMAXPROCS(procs)
		const n = 64
		var hits [n]atomic.Int32
		var bad atomic.Int32
		ParallelFor(n, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				ParallelFor(4, func(a, b int) { hits[i].Add(int32(b - a)) })
			}
			if lo == 0 && sameBits(want, c.full()) >= 0 {
				bad.Store(1)
			}
		})
		if bad.Load() != 0 {
			t.Fatalf("GOMAXPROCS %d: a Gemm nested in ParallelFor gave other bits", procs)
		}
		for i := range hits {
			if h := hits[i].Load(); h != 4 {
				t.Fatalf("GOMAXPROCS %d: inner loop %d covered %d of 4", procs, i, h)
			}
		}
		if got := c.full(); sameBits(want, got) >= 0 {
			t.Fatalf("GOMAXPROCS %d: Gemm on the shared pool gave other bits", procs)
		}
		if shared.pool == nil || shared.pool.Workers() != procs {
			t.Fatalf("GOMAXPROCS %d: shared pool of %v workers", procs, shared.pool)
		}
	}
}
