package rollout

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/keel-rl/keel/model"
)

// Request is one prompt served by a Scheduler, with its own settings.
type Request struct {
	Prompt []int32
	N      int // samples of the prompt (>= 1)
	// Sampling applies to this request alone. Sample j draws from the
	// random stream Generate gives (Seed, prompt 0, sample j), so a request
	// gets exactly the samples Generate([][]int32{Prompt}, N, Sampling)
	// gives, whatever it shares the engine with.
	Sampling Sampling
	// OnToken, if non-nil, is called on the scheduler's goroutine after each
	// token is sampled for sample `index` (0..N-1), with the token, its
	// LogProbs and TruncLogProbs entries and its top alternatives.
	// It must return quickly (it runs inside the decode loop) and must not
	// call the Scheduler's blocking methods (Do, Pause, UpdateWeights,
	// Close), which wait for that loop. It is not called after Do returns.
	OnToken func(index int, t Token)
}

// SchedulerStats is a snapshot of a Scheduler for metrics.
type SchedulerStats struct {
	Waiting       int   // requests queued, none of their samples started yet
	Running       int   // sequences in the engine's slots
	Steps         int64 // forward steps taken
	PromptTokens  int64 // prompt rows computed (those shared within a request are not)
	SampledTokens int64 // tokens sampled
	LastStepRows  int   // token rows of the last forward step
}

// Scheduler serves requests that arrive at different times, each with its
// own sampling settings, on one Engine: its loop goroutine decodes every
// running sequence of every request in the same forward steps (continuous
// batching across requests, as Generate does within a call), so a server
// keeps the engine's slots full instead of running one call at a time.
// Rows do not interact (the kernels are batch invariant) and each sample
// has its own random stream, so a request's samples are bit for bit those
// Generate would give it alone. Its methods are safe for concurrent use.
type Scheduler struct {
	e *Engine
	g *gen // the loop's slots and queue: touched only by the loop goroutine

	mu       sync.Mutex
	wake     sync.Cond  // broadcast on every change of the fields below
	inbox    []*request // accepted by Do, not yet seen by the loop
	live     []*request // handed to g: queued there or running
	updates  []*weightUpdate
	paused   int
	stepping bool // a forward step is running (without mu held)
	closed   bool
	version  int64
	stats    SchedulerStats
	loops    int64 // iterations of the loop, for the test that it does not spin
	exited   chan struct{}
}

// request is a Request in flight: its group in the loop's gen, and how Do
// and the loop hand it over.
type request struct {
	group
	ctx      context.Context // once done, the loop drops the request at a step boundary
	finished bool            // every sample is done (group.out is complete)
	err      error           // the backend's failure that ended the request
	done     chan struct{}   // closed by the loop once finished or dropped
}

// weightUpdate is an UpdateWeights call waiting for the loop.
type weightUpdate struct {
	m       *model.Model
	version int64
	inPlace bool // switch the sequences in flight (UpdateWeightsInPlace)
	err     error
	done    chan struct{}
}

// ErrClosed is Do's and UpdateWeights' error after Close.
var ErrClosed = errors.New("rollout: scheduler closed")

// NewScheduler starts the loop goroutine that owns e from now on (nothing
// else may call e's methods until Close). Generate must not run on e
// meanwhile: the scheduler keeps sequences in e's slots between steps.
func NewScheduler(e *Engine) *Scheduler {
	s := &Scheduler{e: e, g: e.slotsGen(), version: e.Version(), exited: make(chan struct{})}
	s.wake.L = &s.mu
	go s.loop()
	return s
}

// Do queues r and blocks until its N samples are finished (ordered by Index,
// Prompt field 0), or ctx is done: then its sequences are dropped at the next
// step boundary, their slots freed, and Do returns ctx.Err() (the samples,
// if the step that ended with ctx done finished them). Invalid requests
// (empty prompt, ids outside the vocabulary, prompt too long for MaxLen, bad
// sampling settings: the same checks as Generate's) return an error at once
// without disturbing other requests. If a forward step fails (the engine's
// backend reports an error, or the last weight update failed to load),
// every request in flight ends with that error.
func (s *Scheduler) Do(ctx context.Context, r Request) ([]Sample, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := s.e.checkSampling(r.N, r.Sampling); err != nil {
		return nil, err
	}
	if err := s.e.checkPrompt(0, r.Prompt); err != nil {
		return nil, err
	}
	req := &request{ctx: ctx, done: make(chan struct{})}
	req.group = group{prompt: slices.Clone(r.Prompt), n: r.N, pol: newPolicy(r.Sampling),
		onToken: r.OnToken, left: r.N, out: make([]Sample, r.N)}
	s.mu.Lock()
	err := ctx.Err()
	if s.closed {
		err = ErrClosed
	}
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.inbox = append(s.inbox, req)
	s.wake.Broadcast()
	s.mu.Unlock()

	select {
	case <-req.done:
		if req.err != nil {
			return nil, req.err
		}
		return req.out, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.wake.Broadcast() // the loop may be waiting (paused)
	s.mu.Unlock()
	<-req.done // the loop drops it at the next step boundary
	if req.err != nil {
		return nil, req.err // a failed step ended it: say so, not the cancellation
	}
	if req.finished {
		return req.out, nil // it finished before the loop saw the cancellation
	}
	return nil, ctx.Err()
}

// Pause returns once no forward step is running and none will start: queued
// and in-flight requests wait (keeping their KV cache) until Continue. It
// lends the machine to other work (a training step) without losing the
// decoding state. Pauses nest: each needs its Continue.
func (s *Scheduler) Pause() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.exited // Close finishes what is in flight; then nothing runs
		return
	}
	s.paused++
	for s.stepping {
		s.wake.Wait()
	}
	s.mu.Unlock()
}

// Continue ends a Pause (a Continue without one does nothing).
func (s *Scheduler) Continue() {
	s.mu.Lock()
	if s.paused > 0 {
		s.paused--
		s.wake.Broadcast()
	}
	s.mu.Unlock()
}

// UpdateWeights waits until no sequence is in flight (new requests are held
// in the queue meanwhile, in-flight ones finish), loads m's weights with
// e.UpdateWeights(m, version), then resumes: every sample comes entirely from
// one weight version, reported in Sample.Version, and so does every request
// (one whose first sample has started finishes before the update). A model
// of another configuration is refused at once.
func (s *Scheduler) UpdateWeights(m *model.Model, version int64) error {
	return s.update(&weightUpdate{m: m, version: version, done: make(chan struct{})})
}

// UpdateWeightsInPlace loads m's weights at the next step boundary without
// waiting for the sequences in flight (partial rollouts), even while the
// scheduler is paused: they continue on the new weights, each with its
// KV cache recomputed under them first (as Engine.GenerateSwitching
// does), and their samples say which version sampled each token
// (Sample.TokenVersions).
func (s *Scheduler) UpdateWeightsInPlace(m *model.Model, version int64) error {
	return s.update(&weightUpdate{m: m, version: version, inPlace: true, done: make(chan struct{})})
}

// update hands u to the loop and waits for it.
func (s *Scheduler) update(u *weightUpdate) error {
	if err := s.e.checkModel(u.m); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.updates = append(s.updates, u)
	s.wake.Broadcast()
	s.mu.Unlock()
	<-u.done
	return u.err
}

// Version returns the weight version the engine holds (the last
// UpdateWeights applied).
func (s *Scheduler) Version() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Stats returns a snapshot of the queue, the running sequences and the
// work done so far.
func (s *Scheduler) Stats() SchedulerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Waiting += len(s.inbox)
	return st
}

// Close stops the loop after the requests already accepted finish (a
// paused scheduler continues for them), then gives the engine back to the
// caller; Do and UpdateWeights after Close return ErrClosed. Close may be
// called more than once.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	s.paused = 0
	s.wake.Broadcast()
	s.mu.Unlock()
	<-s.exited
}

// loop is the scheduler's goroutine. It holds mu except while it runs a
// forward step or loads weights, and waits on wake when it has nothing to
// do.
func (s *Scheduler) loop() {
	defer close(s.exited)
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		s.loops++
		s.boundary()
		switch {
		case len(s.updates) > 0 && (s.g.drained() || s.updates[0].inPlace):
			s.applyUpdate()
		case s.paused == 0 && s.g.busy():
			s.stepping = true
			s.mu.Unlock()
			s.g.admit()
			err := s.g.step()
			s.mu.Lock()
			s.stepping = false
			if err != nil {
				s.fail(err)
			}
			s.stats.Steps++
			s.stats.PromptTokens = int64(s.g.promptRows)
			s.stats.SampledTokens = int64(s.g.sampled)
			s.stats.LastStepRows = s.e.batch.Rows()
			s.wake.Broadcast() // for Pause
		case s.closed && len(s.live) == 0 && len(s.updates) == 0:
			return
		default:
			s.wake.Wait()
		}
	}
}

// boundary is the work between two forward steps: requests the last step
// finished are handed back, those whose context is done dropped (freeing
// their slots),
// new ones queued (held from starting while a weight update waits), and
// the stats refreshed.
func (s *Scheduler) boundary() {
	g := s.g
	s.live = slices.DeleteFunc(s.live, func(r *request) bool {
		switch {
		case r.left == 0:
			r.finished = true
		case r.ctx.Err() != nil:
			g.drop(&r.group)
		default:
			return false
		}
		close(r.done)
		return true
	})
	for _, r := range s.inbox {
		if r.ctx.Err() != nil {
			close(r.done)
			continue
		}
		g.queue = append(g.queue, &r.group)
		s.live = append(s.live, r)
	}
	clear(s.inbox)
	s.inbox = s.inbox[:0]
	g.hold = len(s.updates) > 0
	s.stats.Running = g.running()
	s.stats.Waiting = 0
	for _, r := range s.live {
		if r.next == 0 {
			s.stats.Waiting++
		}
	}
}

// fail ends every request handed to the loop with err, a forward step's
// failure (their sequences' state in the backend is lost): their slots are
// freed, and Do returns err.
func (s *Scheduler) fail(err error) {
	for _, r := range s.live {
		s.g.drop(&r.group)
		r.err = err
		close(r.done)
	}
	clear(s.live)
	s.live = s.live[:0]
}

// applyUpdate loads the first waiting weight update, with mu released (no
// sequence is in flight, or the update switches those in flight; none
// starts while updates wait, and only the loop touches its gen).
func (s *Scheduler) applyUpdate() {
	u := s.updates[0]
	s.mu.Unlock()
	if u.inPlace {
		u.err = s.g.switchWeights(&Switch{Model: u.m, Version: u.version})
	} else {
		u.err = s.e.UpdateWeights(context.Background(), u.m, u.version)
	}
	s.mu.Lock()
	s.updates[0] = nil
	s.updates = s.updates[1:]
	s.version = s.e.Version()
	close(u.done)
}
