package rollout

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// workers is a small persistent goroutine pool for the row-parallel parts
// of a forward step. Unlike kernels.ParallelFor it allocates nothing per
// call when given a function value created once (a method value stored in
// the engine), which keeps a decode step free of heap allocations.
//
// A loop is cut into a few chunks per worker that the workers claim in
// order as they become free, rather than one fixed share each: on a
// machine shared with other processes a worker that loses its processor
// for a while no longer holds up the whole step, and uneven rows (long
// and short attention prefixes) balance out.
type workers struct {
	n    int
	wake chan int // worker ids to start on the current loop
	wg   sync.WaitGroup

	// The current loop, set by run before the workers are woken.
	fn           func(w, lo, hi int)
	total, grain int
	next         atomic.Int64
}

func newWorkers() *workers {
	p := &workers{n: max(1, runtime.GOMAXPROCS(0)), wake: make(chan int, 64)}
	for i := 1; i < p.n; i++ {
		go func() {
			for w := range p.wake {
				p.drain(w)
				p.wg.Done()
			}
		}()
	}
	return p
}

// chunksPerWorker is how many pieces of a loop each worker gets on
// average: enough to rebalance, few enough that claiming costs nothing.
const chunksPerWorker = 4

// run calls fn(w, lo, hi) on contiguous chunks covering [0, n), worker w
// (w < p.n) running the chunks it claims one after another, and returns
// when all are done. Results must not depend on the chunking.
func (p *workers) run(n int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	nw := min(p.n, n)
	if nw == 1 {
		fn(0, 0, n)
		return
	}
	p.fn, p.total, p.grain = fn, n, max(1, n/(chunksPerWorker*nw))
	p.next.Store(0)
	p.wg.Add(nw - 1)
	for w := 1; w < nw; w++ {
		p.wake <- w
	}
	p.drain(0)
	p.wg.Wait()
	p.fn = nil
}

// drain runs chunks of the current loop as worker w until none is left.
func (p *workers) drain(w int) {
	g := int64(p.grain)
	for {
		lo := int(p.next.Add(g) - g)
		if lo >= p.total {
			return
		}
		p.fn(w, lo, min(lo+p.grain, p.total))
	}
}

// close stops the pool's goroutines.
func (p *workers) close() { close(p.wake) }
