package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// The bf16 GEMM runs its tasks on long-lived worker goroutines instead of
// starting goroutines per call: the rollout engine decodes one token at a
// time with small GEMMs, where spawning costs show and must not allocate.

// bf16Tasks hands out task indices 0..n-1 of one job to the caller and to
// helper workers.
type bf16Tasks struct {
	n    int
	next atomic.Int64
	wg   sync.WaitGroup
}

// run executes tasks 0..n-1 of j on the calling goroutine and up to
// GOMAXPROCS-1 helpers, returning when all are done.
func (t *bf16Tasks) run(j *bf16Job, n int) {
	t.n = n
	t.next.Store(0)
	helpers := min(runtime.GOMAXPROCS(0), n) - 1
	if helpers > 0 {
		bf16Pool.ensure(helpers)
		t.wg.Add(helpers)
		for range helpers {
			bf16Pool.work <- j
		}
	}
	t.work(j)
	if helpers > 0 {
		t.wg.Wait()
	}
}

// work claims and runs tasks until none are left.
func (t *bf16Tasks) work(j *bf16Job) {
	s := getBF16Scratch()
	for {
		i := int(t.next.Add(1)) - 1
		if i >= t.n {
			break
		}
		j.runTask(i, s)
	}
	putBF16Scratch(s)
}

// bf16WorkerPool is the set of helper goroutines.
type bf16WorkerPool struct {
	mu      sync.Mutex
	started int
	work    chan *bf16Job
}

var bf16Pool = &bf16WorkerPool{work: make(chan *bf16Job, 256)}

// ensure starts workers until at least n exist. Workers wait on the
// channel when idle and cost nothing then.
func (p *bf16WorkerPool) ensure(n int) {
	p.mu.Lock()
	for p.started < n {
		p.started++
		go func() {
			for j := range p.work {
				j.tasks.work(j)
				j.tasks.wg.Done()
			}
		}()
	}
	p.mu.Unlock()
}

// Free lists (not sync.Pool, which the GC empties) keep jobs and scratch
// buffers across calls so that steady-state GEMMs do not allocate.
var (
	bf16FreeMu      sync.Mutex
	bf16FreeJobs    []*bf16Job
	bf16FreeScratch []*bf16Scratch
)

func getBF16Job() *bf16Job {
	bf16FreeMu.Lock()
	defer bf16FreeMu.Unlock()
	if n := len(bf16FreeJobs); n > 0 {
		j := bf16FreeJobs[n-1]
		bf16FreeJobs = bf16FreeJobs[:n-1]
		return j
	}
	return new(bf16Job)
}

func putBF16Job(j *bf16Job) {
	bf16FreeMu.Lock()
	bf16FreeJobs = append(bf16FreeJobs, j)
	bf16FreeMu.Unlock()
}

func getBF16Scratch() *bf16Scratch {
	bf16FreeMu.Lock()
	defer bf16FreeMu.Unlock()
	if n := len(bf16FreeScratch); n > 0 {
		s := bf16FreeScratch[n-1]
		bf16FreeScratch = bf16FreeScratch[:n-1]
		return s
	}
	return new(bf16Scratch)
}

func putBF16Scratch(s *bf16Scratch) {
	bf16FreeMu.Lock()
	bf16FreeScratch = append(bf16FreeScratch, s)
	bf16FreeMu.Unlock()
}
