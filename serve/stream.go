package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// streamFormat is what tells the streams of OpenAI's two endpoints apart:
// how a choice's news is rendered, and what goes with it.
type streamFormat[C any] struct {
	first    []C  // choices sent before any token (chat's roles)
	logprobs bool // tokens' log-probabilities go with their text
	usage    bool // a last chunk carries the usage (stream_options.include_usage)
	// prefix, if set, is text put before a choice's new text (completions'
	// echo).
	prefix func(c *choice) string
	// choice renders news of c: its new text, the tokens [lo, hi) whose
	// log-probabilities go with it (none when hi == lo) and its finish
	// reason, once known.
	choice func(c *choice, text string, lo, hi int, finish *string) C
}

// stream runs g and streams its choices as server-sent events: a chunk
// (env with one choice) whenever a choice has news (text that can be
// sent, see streamable; the log-probabilities of its tokens, see
// streamableLP; a stop string's finish), then the text held back and the
// finish reasons, the usage if asked, and [DONE]. A failure before
// anything was sent is returned, for the handler to answer with its
// status; after, it ends the stream as an error event. A client that goes
// away cancels the request's context, and so the generation; one that
// stops reading fails a write (see sseWriteTimeout), which does too.
func stream[C any](w http.ResponseWriter, r *http.Request, g *generation, env openAIResponse[C], f streamFormat[C]) error {
	e := newSSE(w)
	send := func(ch C) {
		env.Choices = []C{ch}
		e.send(env)
	}
	for _, ch := range f.first {
		send(ch)
	}
	e.flush()
	g.idle = e.flush
	news := func(c *choice, text string, finish *string) {
		if f.prefix != nil {
			text = f.prefix(c) + text
		}
		lo, hi := 0, 0
		if f.logprobs {
			lo, hi = g.streamableLP(c)
		}
		if text != "" || hi > lo || finish != nil {
			send(f.choice(c, text, lo, hi, finish))
		}
	}
	err := g.run(r.Context(), func(c *choice, _ tokEvent) {
		delta := g.streamable(c)
		c.sent += len(delta)
		var finish *string
		if c.stopped {
			finish = ptr("stop")
		}
		news(c, delta, finish)
	})
	if err != nil {
		return e.fail(err)
	}
	// What is left: text held back, and the finish reasons.
	for _, c := range g.choices {
		if c.stopped && c.sent == len(c.text) {
			continue
		}
		rest := c.text[min(c.sent, len(c.text)):]
		c.sent = len(c.text)
		news(c, rest, ptr(c.finish))
	}
	if f.usage {
		env.Choices, env.Usage = []C{}, ptr(g.usage())
		e.send(env)
	}
	e.done()
	return nil
}

// sseWriteTimeout bounds each write of a stream: a client that stops
// reading (its receive window full) fails the write, which cancels the
// request's context and so its generation, instead of holding the handler
// and its engine slots forever.
const sseWriteTimeout = 60 * time.Second

// sse writes server-sent events, as OpenAI streams.
type sse struct {
	w        http.ResponseWriter
	rc       *http.ResponseController
	started  bool
	dirty    bool      // written since the last flush
	deadline time.Time // when the write deadline was last pushed ahead
}

func newSSE(w http.ResponseWriter) *sse {
	return &sse{w: w, rc: http.NewResponseController(w)}
}

// alive pushes the write deadline sseWriteTimeout ahead before a write
// (the stream may have waited long, paused, since the last). Tokens come
// in bursts: once a second is enough.
func (e *sse) alive() {
	if now := time.Now(); now.Sub(e.deadline) >= time.Second {
		e.rc.SetWriteDeadline(now.Add(sseWriteTimeout)) // ErrNotSupported without a connection: nothing to bound
		e.deadline = now
	}
}

func (e *sse) start() {
	if e.started {
		return
	}
	e.started = true
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	e.w.WriteHeader(http.StatusOK)
}

// send writes one event; flush sends what was written. Generation calls
// flush when no further token is waiting, so that a burst of tokens (64
// streams advancing in one forward step) costs one write each, not one
// per token.
func (e *sse) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b = encodeError(err) // an error event, never an empty one
	}
	e.start()
	e.alive()
	fmt.Fprintf(e.w, "data: %s\n\n", b)
	e.dirty = true
}

func (e *sse) flush() {
	if e.dirty {
		e.alive()
		e.rc.Flush()
	}
	e.dirty = false
}

// fail ends a stream with a generation's error: returned as an apiError,
// to be answered with its status, before anything was sent; else sent as
// an error event, and nil returned.
func (e *sse) fail(err error) error {
	ae := genError(err)
	if !e.started {
		return ae
	}
	e.send(ae.body())
	e.done()
	return nil
}

func (e *sse) done() {
	e.start()
	e.alive()
	fmt.Fprint(e.w, "data: [DONE]\n\n")
	e.dirty = true
	e.flush()
}
