package env

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/internal/jsonfix"
	"github.com/keel-rl/keel/tokenizer"
)

// Protocol is the version of the HTTP environment protocol NewHTTP speaks.
const Protocol = "keel-env/1"

// maxHTTPAnswer bounds the body of an environment server's answer.
const maxHTTPAnswer = 16 << 20

// errRedirect refuses redirects: following one would turn the POST into
// a GET (301, 302).
var errRedirect = errors.New("redirects are not followed (give the final URL)")

// HTTPOptions configure NewHTTP.
type HTTPOptions struct {
	// Timeout bounds one try of one request (default 60 s).
	Timeout time.Duration
	// Retries is how many times a failed request is tried again: a
	// connection error, the timeout, HTTP 408, 429 or 5xx. Another status
	// and a malformed answer are not retried.
	Retries int
	// Client sends the requests (nil: a client of its own). Its redirect
	// policy is replaced: redirects are never followed.
	Client *http.Client
}

// NewHTTP returns an environment served over HTTP at url (http or https)
// in protocol keel-env/1, for environments written in any language.
//
// # Protocol keel-env/1
//
// Every request is a POST of a JSON object (Content-Type
// application/json) to url plus "/start", "/step" or "/close"; every
// answer is a JSON object in the body of a 2xx response.
//
// Start, at an episode's start:
//
//	POST URL/start {"protocol": "keel-env/1",
//	                "row": {"task": "arithmetic", "prompt": "Compute 2+3.",
//	                        "messages": [{"role": "user", "content": "Compute 2+3."}],
//	                        "answer": "5", "extra_info": {"index": 17}}}
//	answer         {"episode": "e17-3", "system": ""}
//
// row is the data row: prompt its plain-text prompt ("" when it has a
// chat), messages its chat (the prompt as one user message when it has
// none), answer its ground truth, extra_info its extra fields (absent
// when none). episode is the server's id of the episode, a non-empty
// string it chooses; system (optional) is not used yet.
//
// Step, after each model turn:
//
//	POST URL/step {"episode": "e17-3",
//	               "turn": {"text": "Guess: 50", "index": 0, "last": false, "truncated": false}}
//	answer        {"messages": [{"role": "user", "content": "higher"}],
//	               "done": false, "metrics": {"guesses": 1}}
//
// turn is the model's turn (see Turn): text decoded without its stop
// token, index from 0, last when no further turn can follow (the answer
// must then be done), truncated when it hit its token budget. The answer
// is a Reply: messages (role "tool" for a tool's result, "user"
// otherwise) are shown to the model before its next turn; done (default
// false) ends the episode; reward, a finite number, is required when
// done; correct (optional, within [0, 1], default 1 when reward > 0) feeds
// the accuracy metrics; metrics are finite numbers per name, summed over
// the episode.
//
// Close, when the episode ends, finished or not:
//
//	POST URL/close {"episode": "e17-3"}
//
// answered by any 2xx (the body is not read).
//
// Answers are read strictly: keys are case-sensitive, and an unknown
// key, a null, a wrong type or data after the object is an error naming
// the endpoint and the field. A request is retried unchanged on a
// connection error, the timeout, HTTP 408, 429 or 5xx (HTTPOptions), so
// a server should answer a repeated step (same episode and turn index)
// as it did the first time. Redirects are not followed; an answer over 16
// MiB is an error.
//
// A server in Python's standard library, the "guess" game:
//
//	import json, uuid
//	from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
//
//	games = {}
//
//	class Env(BaseHTTPRequestHandler):
//	    def do_POST(self):
//	        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
//	        if self.path == "/start":
//	            ep = uuid.uuid4().hex
//	            games[ep] = int(req["row"]["answer"])
//	            out = {"episode": ep}
//	        elif self.path == "/step":
//	            secret, turn = games[req["episode"]], req["turn"]
//	            guess = int(turn["text"].rsplit(":", 1)[-1])  # "Guess: N"
//	            if guess == secret or turn["last"]:
//	                out = {"done": True, "reward": float(guess == secret)}
//	            else:
//	                out = {"messages": [{"role": "user", "content": "higher" if secret > guess else "lower"}]}
//	        else:  # /close
//	            games.pop(req["episode"], None)
//	            out = {}
//	        body = json.dumps(out).encode()
//	        self.send_response(200)
//	        self.send_header("Content-Type", "application/json")
//	        self.send_header("Content-Length", str(len(body)))
//	        self.end_headers()
//	        self.wfile.write(body)
//
//	ThreadingHTTPServer(("127.0.0.1", 8000), Env).serve_forever()
func NewHTTP(rawURL string, opt HTTPOptions) (Environment, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("env http: url %q: %v", rawURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("env http: url %q: want http://HOST[:PORT][/PATH] or https://...", rawURL)
	}
	if opt.Retries < 0 {
		return nil, fmt.Errorf("env http: retries %d, want >= 0", opt.Retries)
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 60 * time.Second
	}
	var c http.Client
	if opt.Client != nil {
		c = *opt.Client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return errRedirect }
	return &httpEnv{base: strings.TrimSuffix(rawURL, "/"), opt: opt, client: &c}, nil
}

type httpEnv struct {
	base   string
	opt    HTTPOptions
	client *http.Client
}

// httpRow is a data row as /start sends it.
type httpRow struct {
	Task     string              `json:"task"`
	Prompt   string              `json:"prompt"`
	Messages []tokenizer.Message `json:"messages"`
	Answer   string              `json:"answer"`
	Extra    json.RawMessage     `json:"extra_info,omitempty"`
}

// Start implements Environment.
func (h *httpEnv) Start(ctx context.Context, row *data.Example) (Episode, error) {
	req := struct {
		Protocol string  `json:"protocol"`
		Row      httpRow `json:"row"`
	}{Protocol, httpRow{Task: row.Task, Prompt: row.Prompt, Messages: row.Chat(), Answer: row.Answer, Extra: row.Extra}}
	if len(row.Messages) > 0 {
		req.Row.Prompt = ""
	}
	const ep = "/start"
	raw, err := h.post(ctx, ep, req)
	if err != nil {
		return nil, err
	}
	m, err := object(raw, []string{"episode", "system"}, "")
	if err != nil {
		return nil, answerError(h.base+ep, err)
	}
	id, ok := m["episode"]
	if !ok {
		return nil, answerError(h.base+ep, errors.New(`missing field "episode"`))
	}
	e := &httpEpisode{env: h}
	if e.id, err = str(id, "episode"); err == nil && e.id == "" {
		err = errors.New(`field "episode": "", want a non-empty string`)
	}
	if err != nil {
		return nil, answerError(h.base+ep, err)
	}
	if s, ok := m["system"]; ok {
		if _, err := str(s, "system"); err != nil {
			return nil, answerError(h.base+ep, err)
		}
	}
	return e, nil
}

type httpEpisode struct {
	env      *httpEnv
	id       string
	once     sync.Once
	closeErr error
}

// Step implements Episode.
func (e *httpEpisode) Step(ctx context.Context, turn Turn) (Reply, error) {
	const ep = "/step"
	raw, err := e.env.post(ctx, ep, struct {
		Episode string `json:"episode"`
		Turn    Turn   `json:"turn"`
	}{e.id, turn})
	if err != nil {
		return Reply{}, err
	}
	r, err := decodeReply(raw)
	if err != nil {
		return Reply{}, answerError(e.env.base+ep, err)
	}
	return r, nil
}

// Close implements Episode: it tells the server, once.
func (e *httpEpisode) Close() error {
	e.once.Do(func() {
		_, e.closeErr = e.env.post(context.Background(), "/close", struct {
			Episode string `json:"episode"`
		}{e.id})
	})
	return e.closeErr
}

// answerError names the endpoint of a malformed answer.
func answerError(endpoint string, err error) error {
	return fmt.Errorf("env http: POST %s: answer: %w", endpoint, err)
}

// post sends req to the endpoint, with retries, and returns the answer's
// body.
func (h *httpEnv) post(ctx context.Context, endpoint string, req any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // "<tool_call>" stays readable
	if err := enc.Encode(req); err != nil {
		return nil, fmt.Errorf("env http: POST %s: %v", h.base+endpoint, err)
	}
	var err error
	tries := 0
	for try := 0; ; try++ {
		tries++
		var b []byte
		var permanent bool
		rctx, cancel := context.WithTimeout(ctx, h.opt.Timeout)
		b, permanent, err = h.try(rctx, h.base+endpoint, buf.Bytes())
		cancel()
		if err == nil {
			return b, nil
		}
		if permanent || try >= h.opt.Retries || ctx.Err() != nil {
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
	if tries > 1 {
		return nil, fmt.Errorf("env http: POST %s: failed after %d tries: %w", h.base+endpoint, tries, err)
	}
	return nil, fmt.Errorf("env http: POST %s: %w", h.base+endpoint, err)
}

// try sends one request; permanent reports an error a retry would not
// mend.
func (h *httpEnv) try(ctx context.Context, url string, body []byte) (_ []byte, permanent bool, _ error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, true, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		if errors.Is(err, errRedirect) {
			loc := ""
			if resp != nil {
				loc = resp.Header.Get("Location")
				resp.Body.Close()
			}
			return nil, true, fmt.Errorf("HTTP redirect to %q: %w", loc, errRedirect)
		}
		return nil, false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPAnswer+1))
	if err != nil {
		return nil, false, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		s := resp.StatusCode
		retry := s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500
		return nil, !retry, fmt.Errorf("HTTP %s: %q", resp.Status, head(b))
	}
	if len(b) > maxHTTPAnswer {
		return nil, true, fmt.Errorf("answer larger than %d bytes", maxHTTPAnswer)
	}
	return b, false, nil
}

// Keys of a step's answer and of its messages.
var (
	replyKeys   = []string{"messages", "done", "reward", "correct", "metrics"}
	messageKeys = []string{"role", "content"}
)

// decodeReply reads a step's answer strictly.
func decodeReply(raw []byte) (Reply, error) {
	m, err := object(raw, replyKeys, "")
	if err != nil {
		return Reply{}, err
	}
	var r Reply
	if v, ok := m["done"]; ok {
		if jsonfix.IsNull(v) || json.Unmarshal(v, &r.Done) != nil {
			return r, fmt.Errorf(`field "done": %s, want true or false`, head(v))
		}
	}
	if v, ok := m["messages"]; ok {
		var list []json.RawMessage
		if jsonfix.IsNull(v) || json.Unmarshal(v, &list) != nil {
			return r, fmt.Errorf(`field "messages": %s, want an array of {"role", "content"}`, head(v))
		}
		for i, mv := range list {
			field := fmt.Sprintf("messages[%d]", i)
			mm, err := object(mv, messageKeys, field)
			if err != nil {
				return r, err
			}
			var msg tokenizer.Message
			for _, k := range messageKeys {
				v, ok := mm[k]
				if !ok {
					return r, fmt.Errorf("field %q: missing", field+"."+k)
				}
				s, err := str(v, field+"."+k)
				if err != nil {
					return r, err
				}
				if k == "role" {
					msg.Role = s
				} else {
					msg.Content = s
				}
			}
			if msg.Role == "" {
				return r, fmt.Errorf("field %q: empty, want a role (\"tool\", \"user\")", field+".role")
			}
			r.Messages = append(r.Messages, msg)
		}
	}
	v, ok := m["reward"]
	switch {
	case ok:
		if r.Reward, err = finite(v, "reward"); err != nil {
			return r, err
		}
	case r.Done:
		return r, errors.New(`field "reward": missing (required when "done" is true)`)
	}
	if r.Reward > 0 {
		r.Correct = 1
	}
	if v, ok := m["correct"]; ok {
		if r.Correct, err = finite(v, "correct"); err != nil {
			return r, err
		}
		if r.Correct < 0 || r.Correct > 1 {
			return r, fmt.Errorf(`field "correct": %g, want a number within [0, 1] (1: correct)`, r.Correct)
		}
	}
	if v, ok := m["metrics"]; ok {
		var ms map[string]json.RawMessage
		if jsonfix.IsNull(v) || json.Unmarshal(v, &ms) != nil {
			return r, fmt.Errorf(`field "metrics": %s, want an object of numbers`, head(v))
		}
		r.Metrics = make(map[string]float64, len(ms))
		for name, mv := range ms {
			if name == "" || strings.ContainsAny(name, " \t\n") {
				return r, fmt.Errorf(`field "metrics": metric name %q, want a non-empty name without spaces`, name)
			}
			if r.Metrics[name], err = finite(mv, "metrics."+name); err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// object reads a JSON object, alone in raw, into its members, refusing
// keys not in keys (keys are case-sensitive); field names it in errors
// ("": the whole answer).
func object(raw []byte, keys []string, field string) (map[string]json.RawMessage, error) {
	prefix := ""
	if field != "" {
		prefix = fmt.Sprintf("field %q: ", field)
	}
	var m map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(jsonfix.QuoteNonFinite(raw)))
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, fmt.Errorf("%s%s, want a JSON object", prefix, head(raw))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%sdata after the JSON object", prefix)
	}
	if err := jsonfix.CheckKeys(m, keys); err != nil {
		return nil, fmt.Errorf("%s%v", prefix, err)
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

// finite reads a member that must be a finite number (a quoted NaN or
// Infinity, as jsonfix.QuoteNonFinite leaves them, is refused by name).
func finite(raw json.RawMessage, field string) (float64, error) {
	var f float64
	if jsonfix.IsNull(raw) || json.Unmarshal(raw, &f) != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("field %q: %s, want a finite number", field, head(raw))
	}
	return f, nil
}
