package serve

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// genJob is one prompt of a request, sampled n times.
type genJob struct {
	prompt []int32
	n      int
	sp     rollout.Sampling
}

// choice is one sample as the server answers it: its tokens (a final
// stop token excluded from text), log-probabilities, finish reason and,
// from the engine, routes and weight version.
type choice struct {
	job, index int // prompt and sample within it
	ids        []int32
	lps        []float32
	tlps       []float32
	top        [][]rollout.TokenLogProb
	finish     string
	routes     *model.Routes
	version    int64
	// versions[t] is the weight version that sampled ids[t], set only
	// when an in-place weight update switched the sequence (nil: all of
	// version).
	versions []int64
	// Text state: the text of ids[:nText] (a stop token excluded, cut at
	// a stop string), and how much of it was already streamed. A request
	// that streams or has stop strings builds it token by token
	// (extendText); any other gets it decoded once, when finished.
	text     string
	sent     int
	stopped  bool // cut at a stop string
	nText    int  // tokens whose text is part of text
	finished bool
	// Built token by token: buf holds text; ends[k] is the length of
	// text once token k's is part of it; tokens from nText on wait for
	// the rest of a UTF-8 character, and ids[prefix:nText] are the tokens
	// added last, decoded again with the next ones (see extendText).
	buf    strings.Builder
	ends   []int
	prefix int
	// Streamed log-probabilities: of tokens [0, lpSent), whose text was
	// sent; lpOff is the completions text_offset of token lpSent.
	lpSent int
	lpOff  int
	echoed bool // completions' echo: the prompt was sent
}

// tokEvent is one sampled token, from the scheduler's goroutine.
type tokEvent struct {
	choice  int
	tok     int32
	lp      float32
	tlp     float32
	top     []rollout.TokenLogProb
	version int64
}

// tokenQueue carries tokens from the scheduler's goroutine (OnToken,
// which must never block) to the handler's: a slice that grows with the
// tokens not yet taken, and a signal that some are waiting. Its memory
// follows the tokens produced, not the budget a request asks for.
type tokenQueue struct {
	mu     sync.Mutex
	events []tokEvent
	ready  chan struct{} // capacity 1: tokens are waiting
}

func (q *tokenQueue) push(ev tokEvent) {
	q.mu.Lock()
	q.events = append(q.events, ev)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default: // already signalled
	}
}

// take returns the waiting tokens, keeping spare (the slice take returned
// before, now handled) to queue the next ones in.
func (q *tokenQueue) take(spare []tokEvent) []tokEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	evs := q.events
	clear(spare)
	q.events = spare[:0]
	return evs
}

// generation runs jobs on the scheduler at once, applies stop strings,
// and calls onToken (may be nil) on the handler's goroutine after each
// token with the choice it changed. It returns the choices in job-major
// order.
type generation struct {
	s        *Server
	jobs     []genJob
	stopStrs []string
	maxStop  int // bytes of the longest stop string
	topN     int
	choices  []*choice
	// tokens: the choices follow the tokens as they come (a stream, or
	// stop strings to find); else the engine's samples are taken whole.
	tokens bool
	// idle, if set, is called when no token is waiting (a stream flushes).
	idle func()
}

func (s *Server) newGeneration(jobs []genJob, stopStrs []string, topN int) *generation {
	g := &generation{s: s, jobs: jobs, stopStrs: stopStrs, topN: topN}
	for _, st := range stopStrs {
		g.maxStop = max(g.maxStop, len(st))
	}
	for j, jb := range jobs {
		for i := range jb.n {
			g.choices = append(g.choices, &choice{job: j, index: i})
		}
	}
	return g
}

// run samples every job; onToken hears of every token once its choice's
// text state is updated. An error of any job is returned (the others are
// cancelled).
func (g *generation) run(ctx context.Context, onToken func(c *choice, ev tokEvent)) error {
	ctx, cancelCause := context.WithCancelCause(ctx)
	cancelAll := func() { cancelCause(context.Canceled) }
	defer cancelAll()
	unregister := g.s.register(cancelCause)
	defer unregister()
	g.tokens = onToken != nil || len(g.stopStrs) > 0
	q := &tokenQueue{ready: make(chan struct{}, 1)}
	results, cancels, first := g.start(ctx, q)
	handle := func(ev tokEvent) {
		c := g.choices[ev.choice]
		if c.stopped {
			return
		}
		if len(c.ids) == 0 {
			// The sample's version, should its job end on stop strings
			// before the engine's sample (which says it) comes back.
			c.version = ev.version
		}
		c.ids = append(c.ids, ev.tok)
		c.lps = append(c.lps, ev.lp)
		c.tlps = append(c.tlps, ev.tlp)
		if g.topN > 0 {
			c.top = append(c.top, ev.top)
		}
		g.updateText(c)
		if onToken != nil {
			onToken(c, ev)
		}
		if c.stopped && g.allStopped(c.job, first[c.job]) {
			cancels[c.job]() // every sample of the job is done: free the slots
		}
	}
	var batch []tokEvent
	drain := func() {
		batch = q.take(batch)
		for _, ev := range batch {
			handle(ev)
		}
	}
	var firstErr error
	for left := len(g.jobs); left > 0; {
		select {
		case <-q.ready:
			drain()
			if g.idle != nil {
				g.idle()
			}
		case r := <-results:
			left--
			// OnToken is not called after Do returns: the job's tokens
			// are all queued.
			drain()
			if r.err != nil {
				if g.allStopped(r.job, first[r.job]) && ctx.Err() == nil {
					continue // cancelled by us: every sample hit a stop string
				}
				if firstErr == nil {
					firstErr = r.err
					cancelAll()
				}
				continue
			}
			for _, smp := range r.samples {
				g.finish(g.choices[first[r.job]+smp.Index], smp)
			}
		}
	}
	if cause := context.Cause(ctx); firstErr != nil && (cause == errAborted || cause == errShutdown) {
		return cause
	}
	return firstErr
}

// jobResult is a job's samples from the scheduler, or its error.
type jobResult struct {
	job     int
	samples []rollout.Sample
	err     error
}

// start submits every job to the scheduler, each on its own goroutine
// and context (a child of ctx), its tokens pushed to q when the choices
// follow the tokens. It returns the channel of their results, their
// cancel functions, and the index of each job's first choice.
func (g *generation) start(ctx context.Context, q *tokenQueue) (chan jobResult, []context.CancelFunc, []int) {
	results := make(chan jobResult, len(g.jobs))
	cancels := make([]context.CancelFunc, len(g.jobs))
	first := make([]int, len(g.jobs))
	for j, jb := range g.jobs {
		if j > 0 {
			first[j] = first[j-1] + g.jobs[j-1].n
		}
		jctx, cancel := context.WithCancel(ctx)
		cancels[j] = cancel
		base := first[j]
		sp := jb.sp
		sp.TopLogProbs = g.topN
		req := rollout.Request{Prompt: jb.prompt, N: jb.n, Sampling: sp}
		if g.tokens {
			req.OnToken = func(index int, t rollout.Token) {
				q.push(tokEvent{choice: base + index, tok: t.ID, lp: t.LogProb, tlp: t.TruncLogProb, top: slices.Clone(t.Top), version: t.Version})
			}
		}
		go func() {
			smp, err := g.s.sched.Do(jctx, req)
			results <- jobResult{job: j, samples: smp, err: err}
		}()
	}
	return results, cancels, first
}

var (
	// errAborted ends the generations in flight when pause_generation
	// asks for mode abort (SGLang's default), or when a paused server
	// shuts down (Drain).
	errAborted = errors.New("aborted by pause_generation")
	// errShutdown ends them when a shutdown's drain timed out (Abort).
	errShutdown = errors.New("the server is shutting down")
)

// register records a generation's cancel function for aborts, returning
// its removal.
func (s *Server) register(cancel context.CancelCauseFunc) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextGen++
	id := s.nextGen
	if s.inflight == nil {
		s.inflight = map[int64]context.CancelCauseFunc{}
	}
	s.inflight[id] = cancel
	return func() {
		s.mu.Lock()
		delete(s.inflight, id)
		s.mu.Unlock()
	}
}

// abortAll cancels every generation in flight with cause.
func (s *Server) abortAll(cause error) int { return len(s.abortIDs(cause)) }

// abortIDs cancels every generation in flight with cause and returns
// their ids (for waitGone).
func (s *Server) abortIDs(cause error) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int64, 0, len(s.inflight))
	for id, c := range s.inflight {
		c(cause)
		ids = append(ids, id)
	}
	return ids
}

// waitGone waits, at most timeout, until the generations ids have ended,
// and reports whether they did. An aborted generation ends once the
// scheduler has dropped its sequences at its next step boundary, which
// a paused scheduler reaches too: after that Stats no longer counts them.
// (It polls: an admin call's wait of a few milliseconds.)
func (s *Server) waitGone(ids []int64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		left := 0
		for _, id := range ids {
			if _, ok := s.inflight[id]; ok {
				left++
			}
		}
		s.mu.Unlock()
		if left == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *generation) allStopped(job, first int) bool {
	for i := range g.jobs[job].n {
		if !g.choices[first+i].stopped {
			return false
		}
	}
	return true
}

// textIDs is how many of c's tokens have text: all but a final stop
// token of its job (the engine ends a sample at its first).
func (g *generation) textIDs(c *choice) int {
	n := len(c.ids)
	if n > 0 && slices.Contains(g.jobs[c.job].sp.Stop, c.ids[n-1]) {
		n--
	}
	return n
}

// updateText adds c's new token to its text; a stop string cuts the text
// before it and stops the choice.
func (g *generation) updateText(c *choice) { g.extendText(c, false) }

// extendText adds the text of c's tokens from nText on, with work that
// does not grow with the text (the old way decoded every id and searched
// the whole text at every token: quadratic).
//
// It decodes only the new tokens and those added last (ids[prefix:]), so
// that decoders that join tokens (with spaces, or bytes into characters)
// render the boundary as decoding every id does, and keeps the new part.
// While that ends inside a UTF-8 character (U+FFFD), the tokens wait for
// the rest of it, unless final (the sample is done: the text ends as
// decoding every id ends it). A new stop string match ends in the new
// part, so only the last len(longest stop)-1 bytes before it are searched
// with it.
func (g *generation) extendText(c *choice, final bool) {
	end := g.textIDs(c)
	if end <= c.nText {
		return
	}
	dec := g.s.tok.DecodeLenient
	head, all := dec(c.ids[c.prefix:c.nText]), dec(c.ids[c.prefix:end])
	if !final && strings.HasSuffix(all, "\uFFFD") {
		return
	}
	old := c.buf.Len()
	c.buf.WriteString(all[min(len(head), len(all)):])
	c.text = c.buf.String()
	for k := c.nText + 1; k <= end; k++ {
		e := len(c.text)
		if k < end {
			// Tokens that waited for the rest of a character end where
			// decoding up to them does (with U+FFFD): rare, and few.
			e = min(e, old+len(dec(c.ids[c.prefix:k]))-len(head))
		}
		if n := len(c.ends); n > 0 {
			e = max(e, c.ends[n-1])
		}
		c.ends = append(c.ends, e)
	}
	c.prefix, c.nText = c.nText, end
	if len(g.stopStrs) == 0 {
		return
	}
	from := max(0, old-(g.maxStop-1))
	cut := -1
	for _, st := range g.stopStrs {
		if i := strings.Index(c.text[from:], st); i >= 0 && (cut < 0 || from+i < cut) {
			cut = from + i
		}
	}
	if cut < 0 {
		return
	}
	c.text = c.text[:cut]
	// Keep the tokens whose text lies wholly before the cut.
	k := sort.SearchInts(c.ends, cut+1)
	c.ids, c.lps, c.tlps = c.ids[:k], c.lps[:k], c.tlps[:k]
	if c.top != nil {
		c.top = c.top[:k]
	}
	c.ends, c.nText = c.ends[:k], k
	c.stopped, c.finished, c.finish = true, true, "stop"
}

// finish takes the engine's sample for c unless a stop string ended it.
func (g *generation) finish(c *choice, smp rollout.Sample) {
	c.routes, c.version, c.versions = smp.Routes, smp.Version, smp.TokenVersions
	if c.stopped {
		if c.versions != nil {
			c.versions = c.versions[:len(c.ids)]
		}
		return
	}
	// Following tokens, c already holds these (every token was handled
	// before Do returned).
	c.ids, c.lps, c.tlps = smp.Tokens, smp.LogProbs, smp.TruncLogProbs
	if smp.TopLogProbs != nil {
		c.top = smp.TopLogProbs
	}
	c.finish, c.finished = smp.Finish, true
	if g.tokens {
		g.extendText(c, true) // a character left incomplete at the end
		return
	}
	c.nText = g.textIDs(c)
	c.text = g.s.tok.DecodeLenient(c.ids[:c.nText])
}

// streamable is the part of c's text that can be sent now: all of it
// once finished, else up to a possible start of a stop string. (Text
// holds only complete characters until the choice is finished.)
func (g *generation) streamable(c *choice) string {
	t := c.text
	if c.finished {
		return t[c.sent:]
	}
	end := len(t)
	for _, st := range g.stopStrs {
		for k := min(len(st)-1, end); k > 0; k-- {
			if strings.HasSuffix(t[:end], st[:k]) {
				end -= k
				break
			}
		}
	}
	if end < c.sent {
		return ""
	}
	return t[c.sent:end]
}

// streamableLP is the range [lo, hi) of c's tokens whose log-probabilities
// can be streamed now: those not yet streamed whose text was all sent (a
// token held back as a possible start of a stop string comes with its
// text, a token cut by a stop string never comes). It marks them sent.
func (g *generation) streamableLP(c *choice) (lo, hi int) {
	lo, hi = c.lpSent, c.nText
	for hi > lo && c.ends[hi-1] > c.sent {
		hi--
	}
	c.lpSent = hi
	return lo, hi
}
