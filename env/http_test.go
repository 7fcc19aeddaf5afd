package env

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tokenizer"
)

// gameServer is a keel-env/1 server of the guessing game that checks the
// requests it gets as strictly as keel checks answers.
type gameServer struct {
	t      *testing.T
	mu     sync.Mutex
	games  map[string]int
	closed []string
	starts []json.RawMessage // /start requests' rows
}

func (g *gameServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
		g.t.Errorf("%s %s with Content-Type %q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	g.mu.Lock()
	defer g.mu.Unlock()
	var out any
	switch r.URL.Path {
	case "/env/start":
		var req struct {
			Protocol string          `json:"protocol"`
			Row      json.RawMessage `json:"row"`
		}
		if err := dec.Decode(&req); err != nil || req.Protocol != Protocol {
			g.t.Errorf("/start: %+v, %v", req, err)
		}
		g.starts = append(g.starts, req.Row)
		var row struct{ Answer string }
		json.Unmarshal(req.Row, &row)
		secret, _ := strconv.Atoi(row.Answer)
		id := fmt.Sprintf("ep%d", len(g.starts))
		g.games[id] = secret
		out = map[string]any{"episode": id, "system": ""}
	case "/env/step":
		var req struct {
			Episode string `json:"episode"`
			Turn    Turn   `json:"turn"`
		}
		if err := dec.Decode(&req); err != nil {
			g.t.Errorf("/step: %v", err)
		}
		secret, ok := g.games[req.Episode]
		if !ok {
			http.Error(w, "no such episode", http.StatusNotFound)
			return
		}
		guess, err := strconv.Atoi(strings.TrimPrefix(req.Turn.Text, "Guess: "))
		switch {
		case err == nil && guess == secret:
			out = map[string]any{"done": true, "reward": 1, "metrics": map[string]any{"guesses": 1}}
		case req.Turn.Last:
			out = map[string]any{"done": true, "reward": 0}
		case guess < secret:
			out = map[string]any{"messages": []any{map[string]string{"role": "user", "content": "higher"}}, "metrics": map[string]any{"guesses": 1}}
		default:
			out = map[string]any{"messages": []any{map[string]string{"role": "user", "content": "lower"}}, "done": false, "reward": 0}
		}
	case "/env/close":
		var req struct {
			Episode string `json:"episode"`
		}
		if err := dec.Decode(&req); err != nil {
			g.t.Errorf("/close: %v", err)
		}
		delete(g.games, req.Episode)
		g.closed = append(g.closed, req.Episode)
		w.WriteHeader(http.StatusNoContent)
		return
	default:
		http.NotFound(w, r)
		return
	}
	json.NewEncoder(w).Encode(out)
}

func TestHTTPGame(t *testing.T) {
	g := &gameServer{t: t, games: map[string]int{}}
	srv := httptest.NewServer(g)
	defer srv.Close()
	e, err := NewHTTP(srv.URL+"/env/", HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	row := &data.Example{ID: "3", Task: "guess", Prompt: "Guess my number.", Answer: "37", Extra: json.RawMessage(`{"index":3}`)}
	ep := start(t, e, row)
	for i, c := range []struct {
		text string
		want Reply
	}{
		{"Guess: 50", Reply{Messages: []tokenizer.Message{{Role: "user", Content: "lower"}}}},
		{"Guess: 20", Reply{Messages: []tokenizer.Message{{Role: "user", Content: "higher"}}, Metrics: map[string]float64{"guesses": 1}}},
		{"Guess: 37", Reply{Done: true, Reward: 1, Correct: 1, Metrics: map[string]float64{"guesses": 1}}},
	} {
		if r := step(t, ep, Turn{Text: c.text, Index: i}); !reflect.DeepEqual(r, c.want) {
			t.Errorf("turn %d: %+v, want %+v", i, r, c.want)
		}
	}
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ep.Close(); err != nil { // closed once
		t.Fatal(err)
	}
	// A chat row: its messages, no prompt.
	chat := &data.Example{Task: "guess", Messages: []tokenizer.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "<go>"}}, Answer: "5"}
	ep2 := start(t, e, chat)
	if r := step(t, ep2, Turn{Text: "Guess: 1", Last: true}); !r.Done || r.Reward != 0 || r.Correct != 0 {
		t.Errorf("last turn: %+v, want done with reward 0", r)
	}
	ep2.Close()

	g.mu.Lock()
	defer g.mu.Unlock()
	if !reflect.DeepEqual(g.closed, []string{"ep1", "ep2"}) {
		t.Errorf("closed %v, want ep1 and ep2 once each", g.closed)
	}
	wantRows := []string{
		`{"task":"guess","prompt":"Guess my number.","messages":[{"role":"user","content":"Guess my number."}],"answer":"37","extra_info":{"index":3}}`,
		`{"task":"guess","prompt":"","messages":[{"role":"system","content":"s"},{"role":"user","content":"<go>"}],"answer":"5"}`,
	}
	for i, w := range wantRows {
		if i >= len(g.starts) || string(g.starts[i]) != w {
			t.Errorf("start %d: row %s, want %s", i, g.starts, w)
		}
	}
}

// answering is a server that answers every request with the same status
// and body, counting requests.
func answering(status int, body string, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(status)
		io.WriteString(w, body)
	})
}

func TestHTTPMalformedStart(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{}`, `missing field "episode"`},
		{`{"episode": 5}`, `field "episode": 5, want a string`},
		{`{"episode": null}`, `field "episode": null, want a string`},
		{`{"episode": ""}`, `field "episode": "", want a non-empty string`},
		{`{"episode": "a", "system": 3}`, `field "system": 3, want a string`},
		{`{"episode": "a", "x": 1}`, `unknown key "x" (want episode, system)`},
		{`{"Episode": "a"}`, `unknown key "Episode" (keys are case-sensitive: want "episode")`},
		{`{"episode": "a"} {}`, `data after the JSON object`},
		{`["a"]`, `["a"], want a JSON object`},
		{`not json`, `not json, want a JSON object`},
		{``, `, want a JSON object`},
	} {
		var n atomic.Int64
		srv := httptest.NewServer(answering(200, c.body, &n))
		e, _ := NewHTTP(srv.URL, HTTPOptions{Retries: 2})
		_, err := e.Start(context.Background(), arithRow)
		srv.Close()
		want := "POST " + srv.URL + "/start: answer: " + c.want
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error holding %q", c.body, err, want)
		}
		if n.Load() != 1 {
			t.Errorf("%s: %d requests, want 1 (a malformed answer is not retried)", c.body, n.Load())
		}
	}
}

// stepAnswering is a server that starts episode "e" and answers /step
// with body.
func stepAnswering(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/start":
			io.WriteString(w, `{"episode": "e"}`)
		case "/step":
			io.WriteString(w, body)
		}
	})
}

func TestHTTPMalformedStep(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"done": true}`, `field "reward": missing (required when "done" is true)`},
		{`{"done": true, "reward": null}`, `field "reward": null, want a finite number`},
		{`{"done": true, "reward": "1"}`, `field "reward": "1", want a finite number`},
		{`{"done": true, "reward": NaN}`, `field "reward": "NaN", want a finite number`},
		{`{"done": true, "reward": -Infinity}`, `field "reward": "-Infinity", want a finite number`},
		{`{"done": true, "reward": 1e999}`, `field "reward": 1e999, want a finite number`},
		{`{"done": "yes"}`, `field "done": "yes", want true or false`},
		{`{"done": null}`, `field "done": null, want true or false`},
		{`{"done": true, "reward": 1, "correct": 2}`, `field "correct": 2, want a number within [0, 1]`},
		{`{"done": true, "reward": 1, "correct": "x"}`, `field "correct": "x", want a finite number`},
		{`{"messages": {}}`, `field "messages": {}, want an array`},
		{`{"messages": [{"role": "", "content": "x"}]}`, `field "messages[0].role": empty`},
		{`{"messages": [{"role": "user", "content": "x"}, {"content": "x"}]}`, `field "messages[1].role": missing`},
		{`{"messages": [{"role": "user"}]}`, `field "messages[0].content": missing`},
		{`{"messages": [{"role": 1, "content": "x"}]}`, `field "messages[0].role": 1, want a string`},
		{`{"messages": [{"role": "user", "content": 5}]}`, `field "messages[0].content": 5, want a string`},
		{`{"messages": [{"role": "user", "content": "x", "name": "y"}]}`, `field "messages[0]": unknown key "name"`},
		{`{"messages": ["hi"]}`, `field "messages[0]": "hi", want a JSON object`},
		{`{"metrics": {"a": "x"}}`, `field "metrics.a": "x", want a finite number`},
		{`{"metrics": {"a b": 1}}`, `field "metrics": metric name "a b"`},
		{`{"metrics": [1]}`, `field "metrics": [1], want an object of numbers`},
		{`{"reward": 1, "extra": 1}`, `unknown key "extra" (want messages, done, reward, correct, metrics)`},
		{`{"Reward": 1}`, `unknown key "Reward" (keys are case-sensitive: want "reward")`},
		{`{"done": true, "reward": 1} x`, `data after the JSON object`},
	} {
		srv := httptest.NewServer(stepAnswering(c.body))
		e, _ := NewHTTP(srv.URL, HTTPOptions{})
		ep, err := e.Start(context.Background(), arithRow)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ep.Step(context.Background(), Turn{Text: "x"})
		srv.Close()
		want := "POST " + srv.URL + "/step: answer: " + c.want
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error holding %q", c.body, err, want)
		}
	}
}

func TestHTTPStepDefaults(t *testing.T) {
	for _, c := range []struct {
		body string
		want Reply
	}{
		{`{}`, Reply{}},
		{`{"done": true, "reward": 0.5}`, Reply{Done: true, Reward: 0.5, Correct: 1}},
		{`{"done": true, "reward": 0.5, "correct": 0}`, Reply{Done: true, Reward: 0.5}},
		{`{"done": true, "reward": -1}`, Reply{Done: true, Reward: -1}},
		{`{"messages": [], "metrics": {}}`, Reply{Metrics: map[string]float64{}}},
		{`{"messages": [{"role": "tool", "content": "<b>"}], "done": false}`, Reply{Messages: []tokenizer.Message{{Role: "tool", Content: "<b>"}}}},
	} {
		srv := httptest.NewServer(stepAnswering(c.body))
		e, _ := NewHTTP(srv.URL, HTTPOptions{})
		ep := start(t, e, arithRow)
		r, err := ep.Step(context.Background(), Turn{})
		srv.Close()
		if err != nil || !reflect.DeepEqual(r, c.want) {
			t.Errorf("%s: %+v, %v; want %+v", c.body, r, err, c.want)
		}
	}
}

// flaky answers its first fails requests with status, then echoes a
// good start answer; it records each request's body.
func flaky(fails int, status int, n *atomic.Int64, bodies *[]string, mu *sync.Mutex) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		*bodies = append(*bodies, string(b))
		mu.Unlock()
		if int(n.Add(1)) <= fails {
			http.Error(w, "busy", status)
			return
		}
		io.WriteString(w, `{"episode": "e"}`)
	})
}

func TestHTTPRetries(t *testing.T) {
	for _, c := range []struct {
		status, fails, retries int
		ok                     bool
		requests               int64
	}{
		{500, 1, 1, true, 2},
		{503, 2, 3, true, 3},
		{429, 1, 1, true, 2},
		{408, 1, 1, true, 2},
		{500, 1, 0, false, 1},
		{502, 3, 2, false, 3},
		{400, 1, 3, false, 1}, // not retried
		{404, 1, 3, false, 1},
	} {
		var n atomic.Int64
		var bodies []string
		var mu sync.Mutex
		srv := httptest.NewServer(flaky(c.fails, c.status, &n, &bodies, &mu))
		e, _ := NewHTTP(srv.URL, HTTPOptions{Retries: c.retries})
		_, err := e.Start(context.Background(), arithRow)
		srv.Close()
		if (err == nil) != c.ok || n.Load() != c.requests {
			t.Errorf("%+v: %v after %d requests", c, err, n.Load())
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("HTTP %d", c.status)) {
			t.Errorf("%+v: %v, want the status", c, err)
		}
		for _, b := range bodies[1:] {
			if b != bodies[0] {
				t.Errorf("%+v: a retry sent %s, the first try %s", c, b, bodies[0])
			}
		}
	}
}

func TestHTTPConnectionRetry(t *testing.T) {
	// A server that drops the first connection, then answers.
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		io.WriteString(w, `{"episode": "e"}`)
	}))
	defer srv.Close()
	e, _ := NewHTTP(srv.URL, HTTPOptions{Retries: 1})
	if _, err := e.Start(context.Background(), arithRow); err != nil || n.Load() != 2 {
		t.Errorf("%v after %d requests, want success after 2", err, n.Load())
	}
}

// hanging is a server that answers nothing until its client gives up.
func hanging(n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.Copy(io.Discard, r.Body) // then the server watches the connection
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
}

func TestHTTPTimeout(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(hanging(&n))
	defer srv.Close()
	e, _ := NewHTTP(srv.URL, HTTPOptions{Timeout: 50 * time.Millisecond, Retries: 1})
	t0 := time.Now()
	_, err := e.Start(context.Background(), arithRow)
	if d := time.Since(t0); err == nil || !errors.Is(err, context.DeadlineExceeded) || d > 5*time.Second {
		t.Errorf("%v after %v, want the timeout", err, d)
	}
	if n.Load() != 2 || !strings.Contains(err.Error(), "after 2 tries") {
		t.Errorf("%v: %d requests, want a timed-out request retried once", err, n.Load())
	}
}

func TestHTTPCanceled(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(hanging(&n))
	defer srv.Close()
	e, _ := NewHTTP(srv.URL, HTTPOptions{Retries: 5})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	t0 := time.Now()
	_, err := e.Start(ctx, arithRow)
	if d := time.Since(t0); !errors.Is(err, context.Canceled) || d > 5*time.Second || n.Load() != 1 {
		t.Errorf("%v after %v and %d requests, want the cancellation, no retry", err, d, n.Load())
	}
}

func TestHTTPRedirect(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	// A client of the caller's own also follows no redirect.
	e, _ := NewHTTP(srv.URL, HTTPOptions{Retries: 2, Client: &http.Client{}})
	_, err := e.Start(context.Background(), arithRow)
	if err == nil || !strings.Contains(err.Error(), `redirect to "/elsewhere"`) || n.Load() != 1 {
		t.Errorf("%v after %d requests, want a redirect error and no retry", err, n.Load())
	}
}

func TestHTTPLargeAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte(" "), maxHTTPAnswer+1))
	}))
	defer srv.Close()
	e, _ := NewHTTP(srv.URL, HTTPOptions{Retries: 2})
	if _, err := e.Start(context.Background(), arithRow); err == nil || !strings.Contains(err.Error(), "answer larger than") {
		t.Errorf("got %v, want the answer refused", err)
	}
}

func TestHTTPCloseError(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/close" {
			n.Add(1)
			http.Error(w, "gone", http.StatusGone)
			return
		}
		io.WriteString(w, `{"episode": "e"}`)
	}))
	defer srv.Close()
	e, _ := NewHTTP(srv.URL, HTTPOptions{})
	ep, err := e.Start(context.Background(), arithRow)
	if err != nil {
		t.Fatal(err)
	}
	err1, err2 := ep.Close(), ep.Close()
	if err1 == nil || !strings.Contains(err1.Error(), "/close: HTTP 410") || err2 != err1 || n.Load() != 1 {
		t.Errorf("Close: %v then %v after %d requests, want one HTTP 410 error", err1, err2, n.Load())
	}
}

func TestNewHTTPErrors(t *testing.T) {
	for _, c := range []struct {
		url  string
		opt  HTTPOptions
		want string
	}{
		{"localhost:8000", HTTPOptions{}, `url "localhost:8000"`},
		{"ftp://host/env", HTTPOptions{}, `url "ftp://host/env"`},
		{"http://", HTTPOptions{}, `url "http://"`},
		{"http://host\x7f", HTTPOptions{}, "url"},
		{"http://host", HTTPOptions{Retries: -1}, "retries -1"},
	} {
		if _, err := NewHTTP(c.url, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error holding %q", c.url, err, c.want)
		}
	}
}
