package kernels

import (
	"runtime"
	"sync"
)

// ParallelFor splits [0, n) into at most GOMAXPROCS contiguous chunks and
// runs fn on each chunk concurrently, returning when all are done. Callers
// must make each index's work independent of the chunking, so results do not
// depend on GOMAXPROCS.
func ParallelFor(n int, fn func(lo, hi int)) {
	workers := runtime.GOMAXPROCS(0)
	if workers > n {
		workers = n
	}
	if workers <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
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
