package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The bf16 GEMM runs its tasks on long-lived worker goroutines instead of
// starting goroutines per call: the rollout engine decodes one token at a
// time with small GEMMs, where spawning costs show and must not allocate.
//
// The caller always works on its own tasks and never waits for a helper
// that has not started yet: a helper woken late finds the job finished (or
// reused for a later call, told apart by a generation number) and leaves
// without touching it.

// bf16Tasks hands out the task indices 0..n-1 of one run of a job to the
// caller and to helper workers.
type bf16Tasks struct {
	// state packs the generation (bits 40..63), the task count n (bits
	// 20..39) and the next unclaimed index (bits 0..19). Claims are CAS on
	// the whole word, so a stale helper cannot claim a later run's task.
	state    atomic.Uint64
	done     atomic.Int64
	finished chan struct{} // the last finished task signals the caller
}

const bf16MaxTasks = 1<<20 - 1

// bf16Msg asks a helper to join run gen of job j.
type bf16Msg struct {
	j   *bf16Job
	gen uint64
}

// run executes tasks 0..n-1 of j (n ≤ bf16MaxTasks) on the calling
// goroutine and up to GOMAXPROCS-1 helpers, returning when all are done.
// j's fields must not change during the run.
func (t *bf16Tasks) run(j *bf16Job, n int) {
	if t.finished == nil {
		t.finished = make(chan struct{}, 1)
	}
	t.done.Store(0)
	gen := (t.state.Load()>>40 + 1) & (1<<24 - 1)
	t.state.Store(gen<<40 | uint64(n)<<20) // publishes j's fields
	if helpers := min(runtime.GOMAXPROCS(0), n) - 1; helpers > 0 {
		bf16Pool.ensure(helpers)
		for range helpers {
			bf16Pool.work <- bf16Msg{j, gen}
		}
	}
	t.work(j, gen)
	// The helpers still busy each finish at most one task: poll for a
	// while rather than park, whose wake-up can cost more than the task.
	for deadline := time.Now().Add(bf16Spin); t.done.Load() < int64(n) && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	<-t.finished
}

// claim returns the next task of run gen, or false when there is none.
func (t *bf16Tasks) claim(gen uint64) (task, n int, ok bool) {
	for {
		s := t.state.Load()
		next, cnt := int(s&bf16MaxTasks), int(s>>20&bf16MaxTasks)
		if s>>40 != gen || next >= cnt {
			return 0, 0, false
		}
		if t.state.CompareAndSwap(s, s+1) {
			return next, cnt, true
		}
	}
}

// work claims and runs tasks of run gen until none are left.
func (t *bf16Tasks) work(j *bf16Job, gen uint64) {
	var s *bf16Scratch
	for {
		i, n, ok := t.claim(gen)
		if !ok {
			break
		}
		if s == nil {
			s = getBF16Scratch()
		}
		j.runTask(i, n, s)
		if t.done.Add(1) == int64(n) {
			t.finished <- struct{}{}
		}
	}
	if s != nil {
		putBF16Scratch(s)
	}
}

// bf16WorkerPool is the set of helper goroutines. Idle helpers wait on
// the channel and cost nothing.
type bf16WorkerPool struct {
	mu      sync.Mutex
	started int
	work    chan bf16Msg
}

var bf16Pool = &bf16WorkerPool{work: make(chan bf16Msg, 1024)}

// ensure starts helpers until at least n exist.
func (p *bf16WorkerPool) ensure(n int) {
	p.mu.Lock()
	for p.started < n {
		p.started++
		go p.helper()
	}
	p.mu.Unlock()
}

// bf16Spin is how long a helper keeps polling for the next job before it
// parks. Waking a parked goroutine takes from microseconds to far longer on
// a busy machine, longer than a decode step's GEMM; GEMMs come back to back
// while the engines run, so a helper that just finished one polls briefly
// and is there for the next.
const bf16Spin = 200 * time.Microsecond

// helper runs jobs from the channel until the process ends.
func (p *bf16WorkerPool) helper() {
	for {
		var m bf16Msg
		select {
		case m = <-p.work:
		default:
			got := false
			for deadline := time.Now().Add(bf16Spin); !got && time.Now().Before(deadline); {
				select {
				case m = <-p.work:
					got = true
				default:
					runtime.Gosched()
				}
			}
			if !got {
				m = <-p.work
			}
		}
		m.j.tasks.work(m.j, m.gen)
	}
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
