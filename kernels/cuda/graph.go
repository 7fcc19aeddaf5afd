package cuda

import (
	"errors"
	"fmt"
)

// CUDA graphs: a step that launches the same kernels with the same
// arguments over and over (the rollout's decoding step, some 600 launches
// for a 28-layer model) is recorded once and replayed with one call, so the
// host's cost per launch (the driver's, cuBLASLt's, keel's own) is paid
// once per recording instead of once per step. The kernels read their
// buffers when the graph runs, so a replay sees what was uploaded into
// them since.

// Driver constants of the calls below.
const (
	streamNonBlocking  = 1 // CU_STREAM_NON_BLOCKING
	captureModeRelaxed = 2 // CU_STREAM_CAPTURE_MODE_RELAXED
	eventDisableTiming = 2 // CU_EVENT_DISABLE_TIMING
)

// ErrNoGraphs is Capture's error where graphs cannot be used: a driver
// without them, or a profiled run (KEEL_CUDA_PROFILE), whose timing
// synchronises around every launch. Callers launch directly instead.
var ErrNoGraphs = errors.New("cuda: graphs unavailable")

// graphState is what an Ops needs to record and replay graphs: its own
// stream (non-blocking, so that a recording does not capture, or wait on,
// other engines' work on the default stream), two events that order a
// replay after the default stream's work and that work after the replay,
// and cuBLASLt's workspace for products on the stream.
type graphState struct {
	stream, before, after uintptr
	ws                    Buffer
}

// Graph is a recorded sequence of an Ops' launches, replayed by Launch.
type Graph struct {
	ops  *Ops
	exec uintptr
}

// GraphsAvailable reports whether Capture can record on o's device.
func (o *Ops) GraphsAvailable() bool {
	return o.Dev.drv.graphs && o.Dev.prof == nil
}

// PrepareGraphs makes o's recording stream, events and cuBLASLt
// workspace (BlasWorkspaceBytes) now, once: Capture calls it, and an
// engine that plans its memory calls it where it allocates.
func (o *Ops) PrepareGraphs() error {
	g := &o.graph
	if g.stream != 0 {
		return nil
	}
	if !o.GraphsAvailable() {
		return ErrNoGraphs
	}
	ws, err := o.Dev.Alloc(BlasWorkspaceBytes)
	if err != nil {
		return outOfMemory(o.Dev, "the graphs' cuBLASLt workspace", BlasWorkspaceBytes, err)
	}
	d := o.Dev.drv
	var s, before, after uintptr
	err = o.Dev.do(func() error {
		if err := d.check(d.streamCreate(&s, streamNonBlocking), "cuStreamCreate"); err != nil {
			return err
		}
		if err := d.check(d.eventCreate(&before, eventDisableTiming), "cuEventCreate"); err != nil {
			return err
		}
		return d.check(d.eventCreate(&after, eventDisableTiming), "cuEventCreate")
	})
	if err != nil {
		o.Dev.Free(ws)
		return err
	}
	*g = graphState{stream: s, before: before, after: after, ws: ws}
	return nil
}

// CloseGraphs releases what recording needed (the graphs made stay
// valid until closed; this is for an engine's Close, after them).
func (o *Ops) CloseGraphs() {
	g := &o.graph
	if g.stream == 0 {
		return
	}
	d := o.Dev.drv
	o.Dev.doSynced(func(error) error {
		d.eventDestroy(g.before)
		d.eventDestroy(g.after)
		d.streamDestroy(g.stream)
		return nil
	})
	o.Dev.Free(g.ws)
	*g = graphState{}
}

// Capture records the kernels and cuBLASLt products that f launches
// through o (and its BF16Linear and QuantLinear) into a graph, without
// running them. f must do nothing else on the device: no copy, no
// allocation, no synchronisation, no Free (the driver refuses those during
// a recording, and the emulator says which call it was; a Sync or Free
// would wait for the recording to end); launches through other Ops run as
// usual. Other goroutines' Sync and Free wait until the recording ends.
// ErrNoGraphs where graphs are unavailable.
func (o *Ops) Capture(f func() error) (*Graph, error) {
	if err := o.PrepareGraphs(); err != nil {
		return nil, err
	}
	d, s := o.Dev.drv, o.graph.stream
	// No goroutine synchronises a context while this one records (see
	// recording); f must not either, nor free memory: it would wait for
	// itself.
	recording.Lock()
	defer recording.Unlock()
	if err := o.Dev.do(func() error {
		return d.check(d.beginCapture(s, captureModeRelaxed), "cuStreamBeginCapture")
	}); err != nil {
		return nil, err
	}
	o.stream = s
	ferr := f()
	o.stream = 0
	var g uintptr
	err := o.Dev.do(func() error { return d.check(d.endCapture(s, &g), "cuStreamEndCapture") })
	if ferr != nil || err != nil {
		if g != 0 {
			o.Dev.do(func() error { return d.check(d.graphDestroy(g), "cuGraphDestroy") })
		}
		if ferr != nil {
			return nil, fmt.Errorf("cuda: recording a graph: %w", ferr)
		}
		return nil, err
	}
	gr := &Graph{ops: o}
	err = o.Dev.do(func() error {
		err := d.check(d.graphInstantiate(&gr.exec, g, 0), "cuGraphInstantiateWithFlags")
		d.graphDestroy(g)
		return err
	})
	if err != nil {
		return nil, err
	}
	return gr, nil
}

// Launch replays the graph: after the work issued so far on the default
// stream, and before any issued there later (so the copies around a
// replay need no synchronisation of their own).
func (g *Graph) Launch() error {
	o := g.ops
	d, st := o.Dev.drv, &o.graph
	return o.Dev.do(func() error {
		if err := d.check(d.eventRecord(st.before, 0), "cuEventRecord"); err != nil {
			return err
		}
		if err := d.check(d.streamWaitEvent(st.stream, st.before, 0), "cuStreamWaitEvent"); err != nil {
			return err
		}
		if err := d.check(d.graphLaunch(g.exec, st.stream), "cuGraphLaunch"); err != nil {
			return err
		}
		if err := d.check(d.eventRecord(st.after, st.stream), "cuEventRecord"); err != nil {
			return err
		}
		return d.check(d.streamWaitEvent(0, st.after, 0), "cuStreamWaitEvent")
	})
}

// Close releases the graph.
func (g *Graph) Close() {
	if g == nil || g.exec == 0 {
		return
	}
	d := g.ops.Dev.drv
	g.ops.Dev.do(func() error { return d.check(d.graphExecDestroy(g.exec), "cuGraphExecDestroy") })
	g.exec = 0
}

// gemmBF16 is blas.GemmBF16 on o's stream: with the graphs' workspace
// while Capture records.
func (o *Ops) gemmBF16(blas *Blas, transA, transB bool, m, n, k int, A Buffer, lda int, B Buffer, ldb int, C Buffer, ldc int, acc bool) error {
	return o.gemmBF16Add(blas, transA, transB, m, n, k, A, lda, B, ldb, C, ldc, acc, Buffer{}, false)
}

// gemmBF16Add is gemmBF16 with an addend (Blas.gemmBF16's add).
func (o *Ops) gemmBF16Add(blas *Blas, transA, transB bool, m, n, k int, A Buffer, lda int, B Buffer, ldb int, C Buffer, ldc int, acc bool, add Buffer, out16 bool) error {
	ws := blas.ws
	if o.stream != 0 {
		ws = o.graph.ws
	}
	return blas.gemm(o.stream, ws, transA, transB, m, n, k, A, lda, B, ldb, C, ldc, acc, add, out16, false)
}

// gemmFP8 is blas.GemmFP8 on o's stream: with the graphs' workspace while
// Capture records.
func (o *Ops) gemmFP8(blas *Blas, m, n, k int, A Buffer, lda int, B Buffer, ldb int, C Buffer, ldc int) error {
	ws := blas.ws
	if o.stream != 0 {
		ws = o.graph.ws
	}
	return blas.gemm(o.stream, ws, true, false, m, n, k, A, lda, B, ldb, C, ldc, false, Buffer{}, false, true)
}
