package kernels

import "sync"

// run runs tasks 0..chunks-1 of the job's current phase on the package's
// shared Pool (the float32 GEMMs' and ParallelFor's), or on the caller
// alone when there is one task or the pool is busy (a nested or
// concurrent call). j's fields must not change during the run.
func (j *bf16Job) run(chunks int) {
	if chunks > 1 {
		if pool := acquireShared(); pool != nil {
			shared.bfJob, shared.bfChunks = j, chunks
			if len(shared.bfScratch) != pool.Workers() {
				shared.bfScratch = make([]bf16Scratch, pool.Workers())
			}
			pool.RunGrain(chunks, 1, shared.fnBF16)
			releaseShared()
			return
		}
	}
	s := getBF16Scratch()
	for t := 0; t < chunks; t++ {
		j.runTask(t, chunks, s)
	}
	putBF16Scratch(s)
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
