package rollout

import (
	"runtime"
	"sync"
)

// workers is a small persistent goroutine pool for the row-parallel parts
// of a forward step. Unlike kernels.ParallelFor it allocates nothing per
// call when given a function value created once (a method value stored in
// the engine), which keeps a decode step free of heap allocations.
type workers struct {
	n    int
	jobs chan job
	wg   sync.WaitGroup
}

// job is one contiguous chunk [lo, hi) of a parallel loop, run by worker w.
type job struct {
	fn        func(w, lo, hi int)
	w, lo, hi int
}

func newWorkers() *workers {
	p := &workers{n: max(1, runtime.GOMAXPROCS(0)), jobs: make(chan job, 64)}
	for i := 1; i < p.n; i++ {
		go func() {
			for j := range p.jobs {
				j.fn(j.w, j.lo, j.hi)
				p.wg.Done()
			}
		}()
	}
	return p
}

// run calls fn(w, lo, hi) on contiguous chunks of [0, n), chunk w on
// worker w (w < p.n), and returns when all are done. Results must not
// depend on the chunking.
func (p *workers) run(n int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	w := min(p.n, n)
	p.wg.Add(w - 1)
	for i := 1; i < w; i++ {
		p.jobs <- job{fn: fn, w: i, lo: n * i / w, hi: n * (i + 1) / w}
	}
	fn(0, 0, n/w)
	p.wg.Wait()
}

// close stops the pool's goroutines.
func (p *workers) close() { close(p.jobs) }
