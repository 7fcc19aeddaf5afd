// Package reward takes RL rewards from the user's own program: an HTTP
// endpoint or a command kept running, both speaking the keel-reward/1
// protocol below.
//
// # Protocol keel-reward/1
//
// keel sends a batch of responses to score as one JSON request object:
//
//	{"protocol": "keel-reward/1",
//	 "request": "5f3a9c01d2e4b7a8-42",
//	 "items": [
//	   {"id": "17.0", "row": 17, "task": "arithmetic",
//	    "prompt": "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
//	    "messages": [{"role": "user", "content": "What is 2+3?"}],
//	    "response": "The answer is 5.",
//	    "response_ids": [785, 4226, 374, 220, 20, 13, 151645],
//	    "finish": "stop",
//	    "ground_truth": "5",
//	    "extra": {"index": 17, "split": "train"}}]}
//
// request is a string unique to this request (every try of it gets a new
// one) that the answer must echo back unchanged; it ties each answer to
// its request, so that a stray line on a command's stdout cannot shift
// the answers. id is unique within the request (keel writes "ROW.K": the
// data row and the response's index within the round); row is the data
// row (0-based); prompt is the chat text the policy saw (ChatML,
// generation prompt included) and messages the same prompt as chat
// messages; response is the decoded response without its end token,
// response_ids the sampled token ids (the end token included when the
// response ended with it) and finish why it ended ("stop", or "length"
// at the token budget); ground_truth and task are the row's answer and
// task; extra is the row's extra fields (verl's extra_info), or absent.
//
// The grader answers with one JSON object:
//
//	{"request": "5f3a9c01d2e4b7a8-42",
//	 "rewards": [{"id": "17.0", "reward": 1, "correct": 1, "metrics": {"format_ok": 1}}]}
//
// request is the request's, echoed (required). rewards has exactly one
// entry per item, in any order, matched by id. reward is a finite number
// and required; correct (optional) is a number within [0, 1] that feeds
// the accuracy metrics (when absent, a response is correct when its
// reward is > 0); metrics (optional) are finite numbers per name,
// averaged over the step's responses into the step's metrics as
// reward/ext/NAME. An answer may echo "protocol": when it does it must be
// keel-reward/1. The answer is read strictly: keys are case-sensitive, a
// key the protocol does not define, a null value and anything after the
// object are errors.
//
// Over HTTP the request is the body of a POST (Content-Type
// application/json) and the answer the body of a 200 response; with an API
// key, the request carries "Authorization: Bearer KEY". Redirects are not
// followed. A command reads one request per line on stdin and writes one
// answer per line on stdout (at most 64 MiB), in order, and nothing else:
// a line written while no request is pending, or whose request is not the
// pending one, is an error (the process is restarted and the request
// tried again); its stderr is keel's. One line per batch rather than per
// item: the command sees the same object an HTTP grader does, can score a
// batch at once (a model-based judge batches its own inference), and a
// batch costs one write and one read. The command is started once (in a
// process group of its own, killed as a whole) and kept running across
// steps; if it dies, exceeds the timeout (reading the request or
// answering) or breaks the protocol's order it is killed and started
// again, up to Options.MaxRestarts times in the client's life.
//
// A request that fails (a network error, an HTTP status 408, 429 or 5xx,
// the timeout, a command that died) is retried up to Options.Retries
// times; another HTTP status and a malformed answer (bad JSON, a wrong
// count, a missing or unknown id, a non-finite reward) are not, since a
// grader that answers wrongly does so again. Every error names the data
// row and the field at fault.
package reward

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keel-rl/keel/internal/jsonfix"
)

// Protocol is the version of the protocol this package speaks.
const Protocol = "keel-reward/1"

// Message is one chat message of a prompt.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Item is one response to score, as the request carries it.
type Item struct {
	ID          string          `json:"id"`
	Row         int             `json:"row"`
	Task        string          `json:"task"`
	Prompt      string          `json:"prompt,omitempty"`
	Messages    []Message       `json:"messages,omitempty"`
	Response    string          `json:"response"`
	ResponseIDs []int32         `json:"response_ids"`
	Finish      string          `json:"finish,omitempty"`
	GroundTruth string          `json:"ground_truth"`
	Extra       json.RawMessage `json:"extra,omitempty"`
}

// Request is one batch, the body of a POST or one line to a command.
// Request is unique to each try of it; the answer echoes it.
type Request struct {
	Protocol string `json:"protocol"`
	Request  string `json:"request"`
	Items    []Item `json:"items"`
}

// Answer is the grader's answer to a Request (what a grader writes; keel
// reads answers strictly, see the package documentation).
type Answer struct {
	Protocol string   `json:"protocol,omitempty"`
	Request  string   `json:"request"`
	Rewards  []Scored `json:"rewards"`
}

// Scored is one entry of an Answer. Pointers tell a missing field from 0;
// Correct, when nil, defaults to Reward > 0.
type Scored struct {
	ID      *string           `json:"id"`
	Reward  *Number           `json:"reward"`
	Correct *Number           `json:"correct,omitempty"`
	Metrics map[string]Number `json:"metrics,omitempty"`
}

// Number is a number of an answer. It also reads the NaN and Infinity
// that some JSON writers (Python's json) emit, and anything else that is
// not a number (null included), so that the check of the entry can name
// the field.
type Number struct {
	V   float64
	Bad string // the text when it is not a number
}

// MarshalJSON writes the number.
func (n Number) MarshalJSON() ([]byte, error) { return json.Marshal(n.V) }

// UnmarshalJSON reads a number, or keeps the text of anything else.
func (n *Number) UnmarshalJSON(b []byte) error {
	var s string
	switch {
	case string(bytes.TrimSpace(b)) == "null":
		n.Bad = "null"
	case json.Unmarshal(b, &n.V) == nil:
	case json.Unmarshal(b, &s) == nil && s == "NaN":
		n.V = math.NaN()
	case s == "Infinity":
		n.V = math.Inf(1)
	case s == "-Infinity":
		n.V = math.Inf(-1)
	default:
		n.Bad = string(b)
	}
	return nil
}

// Result is one item's outcome: its reward, its correctness (the
// answer's, or 1 when Reward > 0, else 0) and its metrics, or Err when
// the item could not be scored.
type Result struct {
	Reward, Correct float64
	Metrics         map[string]float64
	Err             error
}

// Options configure a Client: URL (HTTP) or Command (argv), exactly one.
type Options struct {
	URL     string
	Command []string
	// APIKey, when set, is sent as "Authorization: Bearer APIKey" (HTTP).
	APIKey string
	// Timeout bounds one request (default 60 s).
	Timeout time.Duration
	// Retries is how many times a failed request is tried again.
	Retries int
	// Concurrency bounds the requests in flight (HTTP) or the command's
	// processes (default 1).
	Concurrency int
	// Batch is the most items per request (0: all of a call's items in
	// one request).
	Batch int
	// MaxRestarts bounds how many times dead or hung command processes
	// are started again over the client's life (0: never).
	MaxRestarts int
	// Stderr receives the command's stderr (nil: discarded).
	Stderr io.Writer
}

// Client scores items through an external grader. It is safe for
// concurrent use; Close stops a command's processes.
type Client struct {
	opt   Options
	t     transport
	nonce string        // this client's random prefix of request nonces
	seq   atomic.Uint64 // requests so far
}

// transport sends one encoded request, whose nonce is nonce, and returns
// the raw answer. An error is retried unless it is a permanentError.
type transport interface {
	do(ctx context.Context, body []byte, nonce string) ([]byte, error)
	close() error
}

// permanentError is a failed request that a retry would not mend (an
// HTTP status other than 408, 429 and 5xx).
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// New checks opt and returns a client; a command is started on first use.
func New(opt Options) (*Client, error) {
	if (opt.URL == "") == (len(opt.Command) == 0) {
		return nil, errors.New("reward: give a URL or a command, exactly one")
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 60 * time.Second
	}
	if opt.Concurrency <= 0 {
		opt.Concurrency = 1
	}
	if opt.Retries < 0 || opt.Batch < 0 || opt.MaxRestarts < 0 {
		return nil, errors.New("reward: retries, batch and max_restarts must be >= 0")
	}
	var b [8]byte
	rand.Read(b[:])
	c := &Client{opt: opt, nonce: hex.EncodeToString(b[:])}
	if opt.URL != "" {
		c.t = newHTTP(opt)
	} else {
		c.t = newPool(opt)
	}
	return c, nil
}

// Close stops the command's processes (HTTP: nothing to do).
func (c *Client) Close() error { return c.t.close() }

// Score scores items, in batches of Options.Batch run up to
// Options.Concurrency at a time, and returns one Result per item, in
// order. Items' IDs must be unique. A batch that fails after its retries,
// or whose answer is malformed, gives each of its items an Err naming the
// item's row (and the field at fault); the other batches' results stand.
func (c *Client) Score(ctx context.Context, items []Item) []Result {
	out := make([]Result, len(items))
	size := c.opt.Batch
	if size <= 0 {
		size = max(len(items), 1)
	}
	sem := make(chan struct{}, c.opt.Concurrency)
	var wg sync.WaitGroup
	for lo := 0; lo < len(items); lo += size {
		hi := min(lo+size, len(items))
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c.scoreBatch(ctx, items[lo:hi], out[lo:hi])
		}()
	}
	wg.Wait()
	return out
}

// scoreBatch sends one request (with retries, each with a new nonce) and
// fills out.
func (c *Client) scoreBatch(ctx context.Context, items []Item, out []Result) {
	fail := func(err error) {
		for i := range out {
			out[i] = Result{Err: fmt.Errorf("reward: row %d (id %q): %w", items[i].Row, items[i].ID, err)}
		}
	}
	var raw []byte
	var nonce string
	var err error
	tries := 0
	for try := 0; ; try++ {
		tries++
		nonce = c.nonce + "-" + strconv.FormatUint(c.seq.Add(1), 10)
		var body []byte
		body, err = json.Marshal(Request{Protocol: Protocol, Request: nonce, Items: items})
		if err != nil {
			fail(err)
			return
		}
		rctx, cancel := context.WithTimeout(ctx, c.opt.Timeout)
		raw, err = c.t.do(rctx, body, nonce)
		cancel()
		var perm permanentError
		if err == nil || try >= c.opt.Retries || ctx.Err() != nil || errors.As(err, &perm) {
			break
		}
		pause := time.NewTimer(min(time.Duration(1<<try)*50*time.Millisecond, 2*time.Second))
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (then %w)", err, ctx.Err())
			break
		}
	}
	if err != nil {
		fail(fmt.Errorf("request of %d items failed after %d tries: %w", len(items), tries, err))
		return
	}
	if err := decode(raw, nonce, items, out); err != nil {
		fail(err)
	}
}

// Keys of an answer and of its entries; others are errors.
var (
	answerKeys = []string{"protocol", "request", "rewards"}
	entryKeys  = []string{"id", "reward", "correct", "metrics"}
)

// object reads a JSON object into its members, refusing keys not in keys
// (keys are case-sensitive); field names it in errors.
func object(raw json.RawMessage, keys []string, field string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, fmt.Errorf("field %q: %s, want an object", field, head(raw))
	}
	if err := jsonfix.CheckKeys(m, keys); err != nil {
		return nil, fmt.Errorf("field %q: %v", field, err)
	}
	return m, nil
}

// str reads a string member.
func str(raw json.RawMessage, field string) (string, error) {
	var s string
	if jsonfix.IsNull(raw) || json.Unmarshal(raw, &s) != nil {
		return "", fmt.Errorf("field %q: %s, want a string", field, head(raw))
	}
	return s, nil
}

// decode checks an answer against its request (nonce, items) and fills
// out. An entry's fault is an error naming its item's row (when the id is
// known) and the field.
func decode(raw []byte, nonce string, items []Item, out []Result) error {
	var top json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(jsonfix.QuoteNonFinite(raw)))
	if err := dec.Decode(&top); err != nil {
		return fmt.Errorf("answer: invalid JSON: %v (starts %q)", err, head(raw))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("answer: invalid JSON: data after the answer's object (starts %q)", head(raw))
	}
	a, err := object(top, answerKeys, "answer")
	if err != nil {
		return fmt.Errorf("answer: %w", err)
	}
	if p, ok := a["protocol"]; ok {
		s, err := str(p, "protocol")
		if err != nil {
			return fmt.Errorf("answer: %w", err)
		}
		if s != Protocol {
			return fmt.Errorf("answer: field \"protocol\": %q, want %q", s, Protocol)
		}
	}
	r, ok := a["request"]
	if !ok {
		return fmt.Errorf("answer: missing field \"request\" (echo the request's \"request\", %q)", nonce)
	}
	got, err := str(r, "request")
	if err != nil {
		return fmt.Errorf("answer: %w", err)
	}
	if got != nonce {
		return fmt.Errorf("answer: field \"request\": %q, want the request's %q (an answer to another request?)", got, nonce)
	}
	rw, ok := a["rewards"]
	if !ok {
		return errors.New(`answer: missing field "rewards"`)
	}
	var entries []json.RawMessage
	if jsonfix.IsNull(rw) || json.Unmarshal(rw, &entries) != nil {
		return fmt.Errorf("answer: field \"rewards\": %s, want an array", head(rw))
	}
	if len(entries) != len(items) {
		return fmt.Errorf("answer: field \"rewards\" has %d entries for %d items", len(entries), len(items))
	}
	index := make(map[string]int, len(items))
	for i, it := range items {
		index[it.ID] = i
	}
	done := make([]bool, len(items))
	for k, e := range entries {
		field := fmt.Sprintf("rewards[%d]", k)
		var m map[string]json.RawMessage
		if jsonfix.IsNull(e) || json.Unmarshal(e, &m) != nil {
			return fmt.Errorf("answer: field %q: %s, want an object", field, head(e))
		}
		rawID, ok := m["id"]
		if !ok {
			return fmt.Errorf("answer: field %q: missing", field+".id")
		}
		id, err := str(rawID, field+".id")
		if err != nil {
			return fmt.Errorf("answer: %w", err)
		}
		i, ok := index[id]
		if !ok {
			return fmt.Errorf("answer: field %q: unknown id %q", field+".id", id)
		}
		if done[i] {
			return fmt.Errorf("answer: field %q: id %q answered twice", field+".id", id)
		}
		done[i] = true
		r, err := result(e, field)
		if err != nil {
			out[i] = Result{Err: fmt.Errorf("reward: row %d (id %q): answer: %w", items[i].Row, items[i].ID, err)}
			continue
		}
		out[i] = r
	}
	return nil
}

// result checks one answer entry; field names it in errors.
func result(raw json.RawMessage, field string) (Result, error) {
	m, err := object(raw, entryKeys, field)
	if err != nil {
		return Result{}, err
	}
	number := func(raw json.RawMessage, name string) (float64, error) {
		var n Number
		if err := n.UnmarshalJSON(raw); err != nil {
			return 0, err
		}
		switch {
		case n.Bad != "":
			return 0, fmt.Errorf("field %q: %s, want a finite number", name, head([]byte(n.Bad)))
		case math.IsNaN(n.V) || math.IsInf(n.V, 0):
			return 0, fmt.Errorf("field %q: %g, want a finite number", name, n.V)
		}
		return n.V, nil
	}
	rw, ok := m["reward"]
	if !ok {
		return Result{}, fmt.Errorf("field %q: missing", field+".reward")
	}
	v, err := number(rw, field+".reward")
	if err != nil {
		return Result{}, err
	}
	r := Result{Reward: v}
	if r.Reward > 0 {
		r.Correct = 1
	}
	if c, ok := m["correct"]; ok {
		v, err := number(c, field+".correct")
		if err != nil {
			return Result{}, err
		}
		if v < 0 || v > 1 {
			return Result{}, fmt.Errorf("field %q: %g, want a number within [0, 1] (1: correct)", field+".correct", v)
		}
		r.Correct = v
	}
	if raw, ok := m["metrics"]; ok {
		var ms map[string]json.RawMessage
		if jsonfix.IsNull(raw) || json.Unmarshal(raw, &ms) != nil {
			return Result{}, fmt.Errorf("field %q: %s, want an object of numbers", field+".metrics", head(raw))
		}
		for name, mv := range ms {
			if name == "" || strings.ContainsAny(name, " \t\n") {
				return Result{}, fmt.Errorf("field %q: metric name %q (want a non-empty name without spaces)", field+".metrics", name)
			}
			v, err := number(mv, field+".metrics."+name)
			if err != nil {
				return Result{}, err
			}
			if r.Metrics == nil {
				r.Metrics = map[string]float64{}
			}
			r.Metrics[name] = v
		}
	}
	return r, nil
}

// head is the start of a malformed answer, for errors.
func head(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}
