package kernels

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Pool is a set of worker goroutines for a stream of short parallel loops,
// such as an engine's forward step: a few dozen loops back to back, tens
// of microseconds each. Handing each loop to helpers that sleep between
// loops, or to several pools at once, costs more than the loops themselves
// (with two threads, the rollout engine's decode step once ran no faster
// than with one). So a Pool's helpers poll for the next loop without
// sleeping while loops keep coming, and park only after parkAfter without
// one (the end of a Generate call, of a training step).
//
// A loop is cut into chunks that the caller and the helpers claim in
// order as they become free. The caller waits only for chunks that a
// helper has claimed: a helper that is slow to notice a loop (its thread
// lost the processor on a shared machine) is not waited for, and finds
// nothing left to do. Allocates nothing per loop when given a function
// value created once (a method value stored in the engine), which keeps a
// decode step free of heap allocations.
//
// A Pool runs one loop at a time: Run and its variants must not be called
// concurrently, nor from inside a loop of the same Pool.
type Pool struct {
	n int

	// cur describes the current loop. start writes it before publishing
	// the loop's generation in state, and only once every chunk of the
	// previous loop has finished; a helper reads it only after claiming a
	// chunk (a compare-and-swap on state), so never while it is rewritten.
	cur poolLoop
	// state packs the loop's generation (bits 40-63), its chunk count
	// (bits 20-39) and the next chunk to claim (bits 0-19).
	state atomic.Uint64
	done  atomic.Int64 // chunks of the current loop finished
	gen   uint64

	parked []atomic.Bool   // per helper: asleep on its wake channel
	wake   []chan struct{} // per helper, buffered 1
	quit   atomic.Bool
}

// poolLoop is one call of Run.
type poolLoop struct {
	fn       func(w, lo, hi int)
	n, grain int
	bounds   []int // RunChunks: chunk c is [bounds[c], bounds[c+1])
}

const (
	stateChunkBits = 20
	maxChunks      = 1<<stateChunkBits - 1
	genMask        = 1<<24 - 1
)

// parkAfter is how long an idle helper polls for the next loop before it
// parks. Between the steps of a rollout or a training step the caller only
// does bookkeeping, far shorter than this; after them the helpers park.
const parkAfter = 2 * time.Millisecond

// NewPool starts a pool of n workers: the calling goroutine of each loop
// and n-1 helpers (n < 1 means 1).
func NewPool(n int) *Pool {
	n = max(1, n)
	p := &Pool{n: n, parked: make([]atomic.Bool, n), wake: make([]chan struct{}, n)}
	for w := 1; w < n; w++ {
		p.wake[w] = make(chan struct{}, 1)
		go p.helper(w)
	}
	return p
}

// chunksPerWorker is how many pieces of a loop each worker gets on
// average when Run chooses the grain: enough to rebalance, few enough that
// claiming costs nothing.
const chunksPerWorker = 4

// Workers returns the number of workers, the bound on the w passed to a
// loop's function.
func (p *Pool) Workers() int { return p.n }

// Run calls fn(w, lo, hi) on contiguous chunks covering [0, n) and returns
// when all are done. Index w (< Workers) identifies the goroutine running
// a chunk, for per-worker scratch: no two chunks with the same w run at
// once. Results must not depend on the chunking.
func (p *Pool) Run(n int, fn func(w, lo, hi int)) {
	p.RunGrain(n, max(1, n/(chunksPerWorker*p.n)), fn)
}

// RunGrain is Run with chunks of grain indices (the last may be shorter).
func (p *Pool) RunGrain(n, grain int, fn func(w, lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1, (n+maxChunks-1)/maxChunks)
	chunks := (n + grain - 1) / grain
	if p.n == 1 || chunks == 1 {
		fn(0, 0, n)
		return
	}
	p.start(poolLoop{fn: fn, n: n, grain: grain}, chunks)
}

// RunChunks is Run with given chunks: [bounds[c], bounds[c+1]) for c in
// [0, len(bounds)-1), claimed in increasing order.
func (p *Pool) RunChunks(bounds []int, fn func(w, lo, hi int)) {
	chunks := len(bounds) - 1
	if chunks <= 0 {
		return
	}
	if p.n == 1 || chunks == 1 {
		for c := 0; c < chunks; c++ {
			fn(0, bounds[c], bounds[c+1])
		}
		return
	}
	if chunks > maxChunks {
		panic("kernels: Pool.RunChunks: too many chunks")
	}
	p.start(poolLoop{fn: fn, bounds: bounds}, chunks)
}

// start runs loop l of chunks chunks on the caller and the helpers.
func (p *Pool) start(l poolLoop, chunks int) {
	p.gen = (p.gen + 1) & genMask
	p.cur = l
	p.done.Store(0)
	p.state.Store(p.gen<<40 | uint64(chunks)<<stateChunkBits)
	for w := 1; w < p.n; w++ {
		if p.parked[w].CompareAndSwap(true, false) {
			p.wake[w] <- struct{}{}
		}
	}
	p.drain(0, p.gen)
	for spins := 0; p.done.Load() < int64(chunks); spins++ {
		if spins >= 64 {
			runtime.Gosched()
		}
	}
	p.cur = poolLoop{} // drop the references
}

// drain claims and runs chunks of loop gen until none is left.
func (p *Pool) drain(w int, gen uint64) {
	for {
		v := p.state.Load()
		next, chunks := int(v&maxChunks), int(v>>stateChunkBits&maxChunks)
		if v>>40 != gen || next >= chunks {
			return
		}
		if !p.state.CompareAndSwap(v, v+1) {
			continue
		}
		// A claimed chunk keeps run from returning, so cur stays this
		// loop's until the chunk is done.
		l := &p.cur
		if l.bounds != nil {
			l.fn(w, l.bounds[next], l.bounds[next+1])
		} else {
			lo := next * l.grain
			l.fn(w, lo, min(lo+l.grain, l.n))
		}
		p.done.Add(1)
	}
}

// helper is helper goroutine w: it polls state for a new loop, runs its
// share, and parks on its wake channel after parkAfter of idleness.
func (p *Pool) helper(w int) {
	var seen uint64 // generation last drained
	for {
		var idleSince time.Time
		for spins := 0; ; spins++ {
			if p.quit.Load() {
				return
			}
			if g := p.state.Load() >> 40; g != seen {
				seen = g
				break
			}
			if spins < 64 {
				continue
			}
			runtime.Gosched()
			if spins%256 != 0 {
				continue
			}
			if idleSince.IsZero() {
				idleSince = time.Now()
				continue
			}
			if time.Since(idleSince) < parkAfter {
				continue
			}
			// Park, unless a loop was published meanwhile (start wakes
			// only helpers it sees parked).
			p.parked[w].Store(true)
			if p.state.Load()>>40 != seen || p.quit.Load() {
				if !p.parked[w].CompareAndSwap(true, false) {
					<-p.wake[w] // start saw us parked and sent a wake-up
				}
			} else {
				<-p.wake[w]
			}
			idleSince = time.Time{}
			spins = 0
		}
		p.drain(w, seen)
	}
}

// Close stops the pool's helpers; the pool must not be used afterwards.
func (p *Pool) Close() {
	p.quit.Store(true)
	for w := 1; w < p.n; w++ {
		if p.parked[w].CompareAndSwap(true, false) {
			p.wake[w] <- struct{}{}
		}
	}
}
