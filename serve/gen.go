package serve

import (
	"context"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

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
	// Text state: the text of ids (stop token excluded, cut at a stop
	// string), and how much of it was already streamed.
	text     string
	sent     int
	stopped  bool // cut at a stop string
	nText    int  // tokens whose text is part of text
	finished bool
	// Streamed log-probabilities: of tokens [0, lpSent), whose text was
	// sent; lpOff is the completions text_offset of token lpSent.
	lpSent int
	lpOff  int
	echoed bool // completions' echo: the prompt was sent
}

// tokEvent is one sampled token, from the scheduler's goroutine.
type tokEvent struct {
	choice int
	tok    int32
	lp     float32
	tlp    float32
	top    []rollout.TokenLogProb
}

// generation runs jobs on the scheduler at once, applies stop strings,
// and calls onToken (may be nil) on the handler's goroutine after each
// token with the choice it changed. It returns the choices in job-major
// order.
type generation struct {
	s        *Server
	jobs     []genJob
	stopStrs []string
	stopIDs  map[int32]bool
	topN     int
	choices  []*choice
	// idle, if set, is called when no token is waiting (a stream flushes).
	idle func()
}

func (s *Server) newGeneration(jobs []genJob, stopStrs []string, topN int) *generation {
	g := &generation{s: s, jobs: jobs, stopStrs: stopStrs, topN: topN, stopIDs: map[int32]bool{}}
	for j, jb := range jobs {
		for _, id := range jb.sp.Stop {
			g.stopIDs[id] = true
		}
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
	total := 0
	for _, jb := range g.jobs {
		total += jb.n * jb.sp.MaxNewTokens
	}
	events := make(chan tokEvent, total+1) // never full: OnToken must not block
	type result struct {
		job     int
		samples []rollout.Sample
		err     error
	}
	results := make(chan result, len(g.jobs))
	cancels := make([]context.CancelFunc, len(g.jobs))
	first := make([]int, len(g.jobs)) // index of each job's first choice
	for j, jb := range g.jobs {
		if j > 0 {
			first[j] = first[j-1] + g.jobs[j-1].n
		}
		jctx, cancel := context.WithCancel(ctx)
		cancels[j] = cancel
		base := first[j]
		sp := jb.sp
		sp.TopLogProbs = g.topN
		req := rollout.Request{Prompt: jb.prompt, N: jb.n, Sampling: sp,
			OnToken: func(index int, t rollout.Token) {
				events <- tokEvent{choice: base + index, tok: t.ID, lp: t.LogProb, tlp: t.TruncLogProb, top: slices.Clone(t.Top)}
			}}
		go func() {
			smp, err := g.s.sched.Do(jctx, req)
			results <- result{job: j, samples: smp, err: err}
		}()
	}
	handle := func(ev tokEvent) {
		c := g.choices[ev.choice]
		if c.stopped {
			return
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
	var firstErr error
	for left := len(g.jobs); left > 0; {
		select {
		case ev := <-events:
			handle(ev)
			if g.idle != nil && len(events) == 0 {
				g.idle()
			}
		case r := <-results:
			left--
			// OnToken is not called after Do returns: the job's events
			// are all queued.
			for drained := false; !drained; {
				select {
				case ev := <-events:
					handle(ev)
				default:
					drained = true
				}
			}
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
	if firstErr != nil && errors.Is(context.Cause(ctx), errAborted) {
		return errAborted
	}
	return firstErr
}

// errAborted ends the generations in flight when pause_generation asks
// for mode abort (SGLang's default).
var errAborted = errors.New("aborted by pause_generation")

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

// abortAll cancels every generation in flight with errAborted.
func (s *Server) abortAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.inflight {
		c(errAborted)
	}
	return len(s.inflight)
}

func (g *generation) allStopped(job, first int) bool {
	for i := range g.jobs[job].n {
		if !g.choices[first+i].stopped {
			return false
		}
	}
	return true
}

// updateText recomputes c's text after a new token: a stop token adds no
// text; a stop string cuts the text before it and stops the choice.
func (g *generation) updateText(c *choice) {
	ids := c.ids
	if n := len(ids); n > 0 && g.stopIDs[ids[n-1]] {
		ids = ids[:n-1]
	}
	text := g.s.tok.DecodeLenient(ids)
	c.nText = len(ids)
	if len(g.stopStrs) > 0 {
		cut := -1
		for _, st := range g.stopStrs {
			if i := strings.Index(text, st); i >= 0 && (cut < 0 || i < cut) {
				cut = i
			}
		}
		if cut >= 0 {
			text = text[:cut]
			// Keep the tokens whose text lies wholly before the cut.
			k := len(ids)
			for k > 0 && len(g.s.tok.DecodeLenient(ids[:k])) > cut {
				k--
			}
			c.ids, c.lps, c.tlps = c.ids[:k], c.lps[:k], c.tlps[:k]
			if c.top != nil {
				c.top = c.top[:k]
			}
			c.nText = k
			c.stopped, c.finished, c.finish = true, true, "stop"
		}
	}
	c.text = text
}

// finish takes the engine's sample for c unless a stop string ended it.
func (g *generation) finish(c *choice, smp rollout.Sample) {
	c.routes, c.version = smp.Routes, smp.Version
	if c.stopped {
		return
	}
	c.ids, c.lps, c.tlps = smp.Tokens, smp.LogProbs, smp.TruncLogProbs
	if smp.TopLogProbs != nil {
		c.top = smp.TopLogProbs
	}
	c.finish, c.finished = smp.Finish, true
	g.updateText(c)
}

// streamable is the part of c's text that can be sent now: all of it
// once finished, else up to an incomplete UTF-8 character or a possible
// start of a stop string.
func (g *generation) streamable(c *choice) string {
	t := c.text
	if c.finished {
		return t[c.sent:]
	}
	end := len(t)
	if strings.HasSuffix(t, string(utf8.RuneError)) {
		end -= len(string(utf8.RuneError))
	}
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
	for hi > lo && len(g.s.tok.DecodeLenient(c.ids[:hi])) > c.sent {
		hi--
	}
	c.lpSent = hi
	return lo, hi
}
