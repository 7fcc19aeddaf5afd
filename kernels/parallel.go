package kernels

import (
	"runtime"
	"sync"
	"time"
)

// ParallelFor splits [0, n) into at most GOMAXPROCS contiguous chunks and
// runs fn on each chunk concurrently, returning when all are done. Callers
// must make each index's work independent of the chunking, so results do not
// depend on GOMAXPROCS.
//
// The chunks run on persistent helper goroutines that poll briefly for the
// next call before parking (see gemmSpin): the engines call ParallelFor for
// every row operation of every layer, and a freshly started or parked
// goroutine starts tens of microseconds late, as long as the work itself.
// A nested or concurrent call, which finds the helpers busy, starts its
// own goroutines instead.
func ParallelFor(n int, fn func(lo, hi int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		if n > 0 {
			fn(0, n)
		}
		return
	}
	p := &parWorkers
	if !p.mu.TryLock() {
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
		return
	}
	for p.started < workers-1 {
		p.started++
		go p.helper()
	}
	p.wg.Add(workers - 1)
	for w := 1; w < workers; w++ {
		p.work <- parJob{fn: fn, lo: n * w / workers, hi: n * (w + 1) / workers}
	}
	fn(0, n/workers)
	p.wg.Wait()
	p.mu.Unlock()
}

// parPool is ParallelFor's set of helper goroutines.
type parPool struct {
	mu      sync.Mutex // held by the ParallelFor call using the helpers
	started int
	work    chan parJob
	wg      sync.WaitGroup
}

type parJob struct {
	fn     func(lo, hi int)
	lo, hi int
}

var parWorkers = parPool{work: make(chan parJob, 64)}

func (p *parPool) helper() {
	for {
		j := p.next()
		j.fn(j.lo, j.hi)
		p.wg.Done()
	}
}

// next returns the next chunk, polling for gemmSpin before blocking.
func (p *parPool) next() parJob {
	select {
	case j := <-p.work:
		return j
	default:
	}
	for deadline := time.Now().Add(gemmSpin); time.Now().Before(deadline); {
		select {
		case j := <-p.work:
			return j
		default:
			runtime.Gosched()
		}
	}
	return <-p.work
}
