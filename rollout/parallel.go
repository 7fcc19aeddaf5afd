package rollout

import (
	"runtime"
	"sync/atomic"
	"time"
)

// workers is a small persistent goroutine pool for the row-parallel parts
// of a forward step. Unlike kernels.ParallelFor it allocates nothing per
// call when given a function value created once (a method value stored in
// the engine), which keeps a decode step free of heap allocations.
//
// A loop is cut into a few chunks per worker that the caller and the
// helpers claim in order as they become free. The caller waits only for
// chunks that a helper has claimed: a helper that has not woken yet (its
// thread lost the processor to another process on a shared machine, or
// it is parked) is not waited for, and finds nothing left to do when it
// does wake. So one slow thread no longer holds up a whole decode step,
// and uneven rows (long and short attention prefixes) balance out.
type workers struct {
	n     int
	wake  chan loop
	state atomic.Uint64 // current loop: generation<<32 | next chunk to claim
	done  atomic.Int64  // chunks of the current loop finished
	gen   uint32
}

// loop is one call of run, as handed to the helpers: by value, so a
// helper that wakes late still reads a consistent description of the
// loop it was woken for (and then finds its generation over).
type loop struct {
	fn               func(w, lo, hi int)
	gen              uint32
	w                int // the worker index of whoever runs it
	n, grain, chunks int
}

func newWorkers() *workers {
	p := &workers{n: max(1, runtime.GOMAXPROCS(0)), wake: make(chan loop, 64)}
	for i := 1; i < p.n; i++ {
		go func() {
			for l := range p.wake {
				p.drain(&l)
			}
		}()
	}
	return p
}

// chunksPerWorker is how many pieces of a loop each worker gets on
// average: enough to rebalance, few enough that claiming costs nothing.
const chunksPerWorker = 4

// waitSpin is how long run polls for the helpers' last chunks before it
// sleeps between polls.
const waitSpin = 200 * time.Microsecond

// run calls fn(w, lo, hi) on contiguous chunks covering [0, n) and returns
// when all are done. Index w (< p.n) identifies the goroutine running a
// chunk, for per-worker scratch: no two chunks with the same w run at
// once. Results must not depend on the chunking.
func (p *workers) run(n int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	nw := min(p.n, n)
	if nw == 1 {
		fn(0, 0, n)
		return
	}
	grain := max(1, n/(chunksPerWorker*nw))
	p.gen++
	l := loop{fn: fn, gen: p.gen, n: n, grain: grain, chunks: (n + grain - 1) / grain}
	p.done.Store(0)
	p.state.Store(uint64(l.gen) << 32)
	for w := 1; w < nw; w++ {
		l.w = w
		select {
		case p.wake <- l:
		default: // the helpers are far behind: do not wait for room
		}
	}
	l.w = 0
	p.drain(&l)
	if p.done.Load() == int64(l.chunks) {
		return
	}
	for start := time.Now(); p.done.Load() < int64(l.chunks); {
		if time.Since(start) < waitSpin {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// drain claims and runs chunks of loop l until none is left or the pool
// has moved on to a later loop.
func (p *workers) drain(l *loop) {
	for {
		v := p.state.Load()
		c := int(uint32(v))
		if uint32(v>>32) != l.gen || c >= l.chunks {
			return
		}
		if !p.state.CompareAndSwap(v, v+1) {
			continue
		}
		lo := c * l.grain
		l.fn(l.w, lo, min(lo+l.grain, l.n))
		p.done.Add(1)
	}
}

// close stops the pool's goroutines.
func (p *workers) close() { close(p.wake) }
