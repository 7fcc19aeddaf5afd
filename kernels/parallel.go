package kernels

import (
	"runtime"
	"sync"
)

// ParallelFor splits [0, n) into at most GOMAXPROCS contiguous chunks and
// runs fn on each chunk concurrently, returning when all are done. Callers
// must make each index's work independent of the chunking, so results do not
// depend on GOMAXPROCS.
//
// The chunks run on the package's shared Pool (the GEMMs' too), whose
// helpers poll for the next loop while loops keep coming: the engines call
// ParallelFor for every row operation of every layer, and a freshly started
// or parked goroutine starts tens of microseconds late, as long as the work
// itself. A nested or concurrent call, which finds the pool busy, starts
// its own goroutines instead.
func ParallelFor(n int, fn func(lo, hi int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	if p := acquireShared(); p != nil {
		shared.par = fn
		p.RunGrain(n, (n+workers-1)/workers, shared.fnParFor)
		releaseShared()
		return
	}
	// The shared pool is busy (a nested or concurrent call): goroutines of
	// its own.
	var wg sync.WaitGroup
	wg.Add(workers - 1)
	for w := 1; w < workers; w++ {
		lo, hi := n*w/workers, n*(w+1)/workers
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	fn(0, n/workers)
	wg.Wait()
}
