package kernels

import (
	"runtime"
	"sync"
)

// shared is the one worker pool behind Gemm, GemmBatch, the bf16 GEMM and
// ParallelFor:
// an engine's step is a stream of short row loops and products, and two
// pools (one for each) woke and polled against each other, costing a
// good part of the second thread. It is sized to GOMAXPROCS and rebuilt
// when that changes. A call that finds it busy (a nested call, or a
// concurrent one from another goroutine) runs on its own goroutine(s)
// instead.
var shared struct {
	mu   sync.Mutex // held by the call using the pool
	pool *Pool
	bufs []gemmBuf // per worker: packing space

	// The current call's work, read by the method values below (bound
	// once, so calls allocate nothing).
	prob      gemmProblem
	batch     []gemmProblem
	par       func(lo, hi int)
	bfJob     *bf16Job
	bfChunks  int
	bfScratch []bf16Scratch // per worker: the bf16 GEMM's prepared rows of A
	fnItems   func(w, lo, hi int)
	fnBatch   func(w, lo, hi int)
	fnParFor  func(w, lo, hi int)
	fnBF16    func(w, lo, hi int)
}

func init() {
	shared.fnItems = func(w, lo, hi int) {
		for it := lo; it < hi; it++ {
			shared.prob.runItem(it, &shared.bufs[w])
		}
	}
	shared.fnBatch = func(w, lo, hi int) {
		for i := lo; i < hi; i++ {
			shared.batch[i].serial(&shared.bufs[w])
		}
	}
	shared.fnParFor = func(_, lo, hi int) { shared.par(lo, hi) }
	shared.fnBF16 = func(w, lo, hi int) {
		for t := lo; t < hi; t++ {
			shared.bfJob.runTask(t, shared.bfChunks, &shared.bfScratch[w])
		}
	}
}

// acquireShared locks the shared pool for the caller and returns it, or
// returns nil when it is busy or only one thread is allowed; a non-nil
// result must be given back with releaseShared.
func acquireShared() *Pool {
	nw := runtime.GOMAXPROCS(0)
	if nw == 1 || !shared.mu.TryLock() {
		return nil
	}
	if shared.pool == nil || shared.pool.Workers() != nw {
		if shared.pool != nil {
			shared.pool.Close()
		}
		shared.pool = NewPool(nw)
		shared.bufs = make([]gemmBuf, nw)
	}
	return shared.pool
}

// releaseShared drops the current call's references and unlocks the pool.
func releaseShared() {
	shared.prob = gemmProblem{}
	clear(shared.batch)
	shared.batch = shared.batch[:0]
	shared.par = nil
	shared.bfJob = nil
	shared.mu.Unlock()
}
