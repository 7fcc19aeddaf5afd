package reward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestMain doubles as the grader command of the command tests: with
// KEEL_REWARD_HELPER set, the test binary is a grader (see helper).
func TestMain(m *testing.M) {
	if mode := os.Getenv("KEEL_REWARD_HELPER"); mode != "" {
		helper(mode)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// grade answers a request: reward 1 when the response starts with "yes",
// correct as the reward, a metric "len" with the response's length.
func grade(req Request) Answer {
	a := Answer{Request: req.Request}
	for _, it := range req.Items {
		id := it.ID
		r := Number{}
		if strings.HasPrefix(it.Response, "yes") {
			r.V = 1
		}
		a.Rewards = append(a.Rewards, Scored{ID: &id, Reward: &r, Metrics: map[string]Number{"len": {V: float64(len(it.Response))}}})
	}
	return a
}

// helper is the grader command: "ok" answers every line; "die1" answers
// one request and exits (its restart answers the next); "die" exits at
// once; "hang" never answers; "stray" answers its first request twice;
// "child" first starts a child "sleep 30" sharing its stdout and writes
// the child's pid to $KEEL_REWARD_PIDFILE, "escape" the same in a
// process group of the child's own, then hangs; "long" answers with a
// line of 4 KiB.
func helper(mode string) {
	if mode == "child" || mode == "escape" {
		child(mode == "escape")
	}
	first := true
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		switch mode {
		case "die":
			os.Exit(3)
		case "hang", "escape":
			time.Sleep(time.Hour)
		case "long":
			os.Stdout.Write(append(bytes.Repeat([]byte("x"), 4096), '\n'))
			continue
		}
		b, _ := json.Marshal(grade(req))
		os.Stdout.Write(append(b, '\n'))
		if mode == "stray" && first {
			os.Stdout.Write(append(b, '\n'))
		}
		first = false
		if mode == "die1" {
			os.Exit(0)
		}
	}
}

func items(n int) []Item {
	out := make([]Item, n)
	for i := range out {
		resp := "no"
		if i%2 == 0 {
			resp = "yes!"
		}
		out[i] = Item{ID: fmt.Sprintf("%d.0", 10+i), Row: 10 + i, Task: "t", Response: resp, GroundTruth: "x"}
	}
	return out
}

func checkGood(t *testing.T, res []Result) {
	t.Helper()
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("item %d: %v", i, r.Err)
		}
		want := 0.0
		if i%2 == 0 {
			want = 1
		}
		if r.Reward != want || r.Correct != want || r.Metrics["len"] == 0 {
			t.Fatalf("item %d: %+v, want reward %g", i, r, want)
		}
	}
}

func newClient(t *testing.T, opt Options) *Client {
	t.Helper()
	c, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// server answers with handle(call, request) and counts calls.
func server(t *testing.T, handle func(call int, w http.ResponseWriter, req Request)) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Protocol != Protocol {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if r.Header.Get("Authorization") != "Bearer sesame" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		handle(int(calls.Add(1)), w, req)
	}))
	t.Cleanup(s.Close)
	return s, &calls
}

func TestHTTP(t *testing.T) {
	s, calls := server(t, func(_ int, w http.ResponseWriter, req Request) { json.NewEncoder(w).Encode(grade(req)) })
	c := newClient(t, Options{URL: s.URL, APIKey: "sesame", Batch: 3, Concurrency: 2})
	checkGood(t, c.Score(context.Background(), items(8)))
	if n := calls.Load(); n != 3 {
		t.Errorf("%d requests for 8 items in batches of 3, want 3", n)
	}
}

// A slow answer times out and is retried; a 500 is retried.
func TestHTTPRetry(t *testing.T) {
	s, calls := server(t, func(call int, w http.ResponseWriter, req Request) {
		if call == 1 {
			time.Sleep(500 * time.Millisecond)
		}
		if call == 2 {
			http.Error(w, "oops", http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(grade(req))
	})
	c := newClient(t, Options{URL: s.URL, APIKey: "sesame", Timeout: 100 * time.Millisecond, Retries: 2})
	checkGood(t, c.Score(context.Background(), items(4)))
	if n := calls.Load(); n != 3 {
		t.Errorf("%d calls, want 3 (slow, 500, ok)", n)
	}
	// Without retries the 500 is an error naming the row.
	s2, _ := server(t, func(_ int, w http.ResponseWriter, _ Request) { http.Error(w, "oops", http.StatusInternalServerError) })
	c2 := newClient(t, Options{URL: s2.URL, APIKey: "sesame", Retries: 1})
	res := c2.Score(context.Background(), items(2))
	if res[1].Err == nil || !strings.Contains(res[1].Err.Error(), "row 11") || !strings.Contains(res[1].Err.Error(), "500") {
		t.Fatalf("got %v, want an HTTP 500 error naming row 11", res[1].Err)
	}
}

func TestHTTPMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, answer, want string
		row                int // the item whose error is checked
	}{
		{"wrong count", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}]}`, `"rewards" has 1 entries for 2 items`, 11},
		{"missing id", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"reward": 0}]}`, `"rewards[1].id": missing`, 11},
		{"unknown id", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "x", "reward": 0}]}`, `"rewards[1].id": unknown id "x"`, 11},
		{"NaN reward", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": NaN}]}`, `"rewards[1].reward": NaN`, 11},
		{"missing reward", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0"}]}`, `"rewards[1].reward": missing`, 11},
		{"string reward", `{"request": $R, "rewards": [{"id": "11.0", "reward": "1"}, {"id": "10.0", "reward": 1}]}`, `"rewards[0].reward": "1"`, 11},
		{"infinite metric", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 0, "metrics": {"m": -Infinity}}]}`, `"rewards[1].metrics.m": -Inf`, 11},
		{"bad JSON", `{"request": $R, "rewards": [`, `invalid JSON`, 10},
		{"no rewards", `{"request": $R}`, `missing field "rewards"`, 10},
		{"protocol", `{"protocol": "keel-reward/9", "request": $R, "rewards": []}`, `"protocol"`, 10},
		{"null metric", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 0, "metrics": {"m": null}}]}`, `"rewards[1].metrics.m": null`, 11},
		{"null reward", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": null}]}`, `"rewards[1].reward": null`, 11},
		{"null correct", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 1, "correct": null}]}`, `"rewards[1].correct": null`, 11},
		{"correct 2", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 1, "correct": 2}]}`, `"rewards[1].correct": 2`, 11},
		{"trailing data", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 1}]} {"x": 1}`, `data after`, 10},
		{"key case", `{"request": $R, "Rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 1}]}`, `unknown key "Rewards"`, 10},
		{"entry key case", `{"request": $R, "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "Reward": 1}]}`, `unknown key "Reward"`, 11},
		{"unknown key", `{"request": $R, "rewards": [], "score": 1}`, `unknown key "score"`, 10},
		{"no request", `{"rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 1}]}`, `missing field "request"`, 10},
		{"other request", `{"request": "x-1", "rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 1}]}`, `field "request": "x-1"`, 10},
		{"null request", `{"request": null, "rewards": []}`, `field "request": null`, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := server(t, func(_ int, w http.ResponseWriter, req Request) {
				w.Write([]byte(strings.ReplaceAll(tc.answer, "$R", strconv.Quote(req.Request))))
			})
			c := newClient(t, Options{URL: s.URL, APIKey: "sesame", Retries: 2})
			res := c.Score(context.Background(), items(2))
			err := res[tc.row-10].Err
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), fmt.Sprintf("row %d", tc.row)) {
				t.Fatalf("got %v, want an error naming row %d and %s", err, tc.row, tc.want)
			}
		})
	}
}

// An entry's own fault fails only its item; correct defaults to reward > 0.
func TestAnswerPerItem(t *testing.T) {
	s, _ := server(t, func(_ int, w http.ResponseWriter, req Request) {
		w.Write([]byte(`{"protocol": "keel-reward/1", "request": ` + strconv.Quote(req.Request) + `, "rewards": [{"id": "11.0", "reward": NaN}, {"id": "10.0", "reward": 0.5}]}`))
	})
	c := newClient(t, Options{URL: s.URL, APIKey: "sesame"})
	res := c.Score(context.Background(), items(2))
	if res[0].Err != nil || res[0].Reward != 0.5 || res[0].Correct != 1 {
		t.Fatalf("item 0: %+v", res[0])
	}
	if res[1].Err == nil || !strings.Contains(res[1].Err.Error(), "row 11") {
		t.Fatalf("item 1: %v", res[1].Err)
	}
}

func helperCommand(t *testing.T, mode string) []string {
	t.Setenv("KEEL_REWARD_HELPER", mode)
	return []string{os.Args[0], "-test.run=^$"}
}

func TestCommand(t *testing.T) {
	c := newClient(t, Options{Command: helperCommand(t, "ok"), Batch: 3, Concurrency: 2})
	for range 3 { // the processes stay up across calls
		checkGood(t, c.Score(context.Background(), items(7)))
	}
	p := c.t.(*pool)
	if p.starts != 2 || p.restarts != 0 {
		t.Errorf("%d starts, %d restarts; want 2 and 0", p.starts, p.restarts)
	}
}

// A process that dies after each answer is restarted (a retry), until
// max_restarts.
func TestCommandRestart(t *testing.T) {
	c := newClient(t, Options{Command: helperCommand(t, "die1"), Retries: 1, MaxRestarts: 2})
	checkGood(t, c.Score(context.Background(), items(3))) // the first process
	checkGood(t, c.Score(context.Background(), items(3))) // died: restart 1
	checkGood(t, c.Score(context.Background(), items(3))) // restart 2
	res := c.Score(context.Background(), items(3))
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "max_restarts") || !strings.Contains(res[0].Err.Error(), "row 10") {
		t.Fatalf("got %v, want the restart limit's error naming row 10", res[0].Err)
	}
}

func TestCommandFails(t *testing.T) {
	c := newClient(t, Options{Command: helperCommand(t, "die"), Retries: 1, MaxRestarts: 5})
	res := c.Score(context.Background(), items(2))
	if res[1].Err == nil || !strings.Contains(res[1].Err.Error(), "exited before answering") {
		t.Fatalf("got %v", res[1].Err)
	}
	c = newClient(t, Options{Command: helperCommand(t, "hang"), Timeout: 200 * time.Millisecond})
	res = c.Score(context.Background(), items(2))
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "no answer") {
		t.Fatalf("got %v", res[0].Err)
	}
	// A shell one-liner grader: reward 0.25 for the one item.
	c = newClient(t, Options{Command: []string{"sh", "-c", `while read -r l; do r=$(printf '%s\n' "$l" | sed 's/.*"request":"\([^"]*\)".*/\1/'); echo "{\"request\": \"$r\", \"rewards\": [{\"id\": \"10.0\", \"reward\": 0.25}]}"; done`}})
	res = c.Score(context.Background(), items(1))
	if res[0].Err != nil || res[0].Reward != 0.25 || res[0].Correct != 1 {
		t.Fatalf("sh grader: %+v", res[0])
	}
}

// The HTTP client does not follow redirects, nor retry a 4xx other than
// 408 and 429; it retries 429.
func TestHTTPStatus(t *testing.T) {
	target, targetCalls := server(t, func(_ int, w http.ResponseWriter, req Request) { json.NewEncoder(w).Encode(grade(req)) })
	s, calls := server(t, func(_ int, w http.ResponseWriter, _ Request) {
		w.Header().Set("Location", target.URL)
		w.WriteHeader(http.StatusFound)
	})
	c := newClient(t, Options{URL: s.URL, APIKey: "sesame", Retries: 3})
	res := c.Score(context.Background(), items(2))
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "redirect") || calls.Load() != 1 || targetCalls.Load() != 0 {
		t.Fatalf("got %v after %d calls (%d at the target), want one call and a redirect error", res[0].Err, calls.Load(), targetCalls.Load())
	}
	s, calls = server(t, func(_ int, w http.ResponseWriter, _ Request) { http.Error(w, "no", http.StatusBadRequest) })
	c = newClient(t, Options{URL: s.URL, APIKey: "sesame", Retries: 3})
	if res := c.Score(context.Background(), items(2)); res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "400") || calls.Load() != 1 {
		t.Fatalf("got %v after %d calls, want one call and an HTTP 400 error", res[0].Err, calls.Load())
	}
	s, calls = server(t, func(call int, w http.ResponseWriter, req Request) {
		if call == 1 {
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		json.NewEncoder(w).Encode(grade(req))
	})
	c = newClient(t, Options{URL: s.URL, APIKey: "sesame", Retries: 3})
	checkGood(t, c.Score(context.Background(), items(2)))
	if calls.Load() != 2 {
		t.Fatalf("%d calls, want 2 (429, ok)", calls.Load())
	}
}

// Cancelling the context stops the pause between retries.
func TestRetryPauseStopsOnCancel(t *testing.T) {
	s, _ := server(t, func(_ int, w http.ResponseWriter, _ Request) { http.Error(w, "oops", http.StatusInternalServerError) })
	c := newClient(t, Options{URL: s.URL, APIKey: "sesame", Retries: 50})
	ctx, cancel := context.WithTimeout(context.Background(), 900*time.Millisecond) // in the 800 ms pause
	defer cancel()
	start := time.Now()
	res := c.Score(ctx, items(1))
	if d := time.Since(start); d > 1500*time.Millisecond || res[0].Err == nil {
		t.Fatalf("returned after %v with %v, want an error soon after the 900 ms cancel", d, res[0].Err)
	}
}

// scoreWithin runs Score and fails the test when it takes longer than d.
func scoreWithin(t *testing.T, d time.Duration, c *Client, its []Item) []Result {
	t.Helper()
	done := make(chan []Result, 1)
	go func() { done <- c.Score(context.Background(), its) }()
	select {
	case res := <-done:
		return res
	case <-time.After(d):
		t.Fatalf("Score still blocked after %v", d)
		return nil
	}
}

// A grader that does not read stdin times out (the write does not block
// keel), each try.
func TestCommandUnreadStdin(t *testing.T) {
	c := newClient(t, Options{Command: []string{"sh", "-c", "exec sleep 30"}, Timeout: time.Second, Retries: 1, MaxRestarts: 1})
	its := items(1)
	its[0].Response = strings.Repeat("y", 1<<20)
	start := time.Now()
	res := scoreWithin(t, 10*time.Second, c, its)
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "not read") || !strings.Contains(res[0].Err.Error(), "2 tries") {
		t.Fatalf("got %v, want a timeout of the unread request after 2 tries", res[0].Err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v for 2 tries of 1 s", d)
	}
	if p := c.t.(*pool); p.restarts != 1 {
		t.Fatalf("%d restarts, want 1", p.restarts)
	}
}

// Killing a command whose child holds stdout does not hang.
func TestCommandChildHoldsStdout(t *testing.T) {
	c := newClient(t, Options{Command: []string{"sh", "-c", "sleep 20; true"}, Timeout: time.Second})
	start := time.Now()
	res := scoreWithin(t, 10*time.Second, c, items(1))
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "no answer") {
		t.Fatalf("got %v, want no answer", res[0].Err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v for a timeout of 1 s", d)
	}
}

// A stray line on stdout is caught: the process restarts and the request
// is tried again, and the answers stay with their requests.
func TestCommandStrayLine(t *testing.T) {
	c := newClient(t, Options{Command: helperCommand(t, "stray"), Retries: 1, MaxRestarts: 1})
	checkGood(t, c.Score(context.Background(), items(3)))
	flipped := items(3)
	for i := range flipped {
		flipped[i].Response = map[string]string{"no": "yes!", "yes!": "no"}[flipped[i].Response]
	}
	res := c.Score(context.Background(), flipped)
	for i, r := range res {
		if r.Err != nil || r.Reward != float64(i%2) {
			t.Fatalf("item %d: %+v, want reward %d (the second request's answer)", i, r, i%2)
		}
	}
	if p := c.t.(*pool); p.restarts != 1 {
		t.Fatalf("%d restarts, want 1", p.restarts)
	}
}

// An answer line longer than the limit is an error.
func TestCommandLongLine(t *testing.T) {
	old := maxLine
	maxLine = 1000
	defer func() { maxLine = old }()
	c := newClient(t, Options{Command: helperCommand(t, "long")})
	res := scoreWithin(t, 10*time.Second, c, items(1))
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "longer than 1000 bytes") {
		t.Fatalf("got %v, want an overlong line's error", res[0].Err)
	}
}

// MaxRestarts 0 disables restarts.
func TestCommandNoRestarts(t *testing.T) {
	c := newClient(t, Options{Command: helperCommand(t, "die1"), Retries: 1})
	checkGood(t, c.Score(context.Background(), items(2)))
	res := c.Score(context.Background(), items(2))
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "max_restarts: 0") {
		t.Fatalf("got %v, want the restart limit's error", res[0].Err)
	}
}
