package reward

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
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
	var a Answer
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
// once; "hang" never answers.
func helper(mode string) {
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
		case "hang":
			time.Sleep(time.Hour)
		}
		b, _ := json.Marshal(grade(req))
		os.Stdout.Write(append(b, '\n'))
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
		{"wrong count", `{"rewards": [{"id": "10.0", "reward": 1}]}`, `"rewards" has 1 entries for 2 items`, 11},
		{"missing id", `{"rewards": [{"id": "10.0", "reward": 1}, {"reward": 0}]}`, `"rewards[1].id": missing`, 11},
		{"unknown id", `{"rewards": [{"id": "10.0", "reward": 1}, {"id": "x", "reward": 0}]}`, `"rewards[1].id": unknown id "x"`, 11},
		{"NaN reward", `{"rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": NaN}]}`, `"rewards[1].reward": NaN`, 11},
		{"missing reward", `{"rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0"}]}`, `"rewards[1].reward": missing`, 11},
		{"string reward", `{"rewards": [{"id": "11.0", "reward": "1"}, {"id": "10.0", "reward": 1}]}`, `"rewards[0].reward": "1"`, 11},
		{"infinite metric", `{"rewards": [{"id": "10.0", "reward": 1}, {"id": "11.0", "reward": 0, "metrics": {"m": -Infinity}}]}`, `"rewards[1].metrics.m": -Inf`, 11},
		{"bad JSON", `{"rewards": [`, `invalid JSON`, 10},
		{"no rewards", `{}`, `missing field "rewards"`, 10},
		{"protocol", `{"protocol": "keel-reward/9", "rewards": []}`, `"protocol"`, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := server(t, func(_ int, w http.ResponseWriter, _ Request) { w.Write([]byte(tc.answer)) })
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
	s, _ := server(t, func(_ int, w http.ResponseWriter, _ Request) {
		w.Write([]byte(`{"protocol": "keel-reward/1", "rewards": [{"id": "11.0", "reward": NaN}, {"id": "10.0", "reward": 0.5}]}`))
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
	c = newClient(t, Options{Command: []string{"sh", "-c", `while read -r l; do echo '{"rewards": [{"id": "10.0", "reward": 0.25}]}'; done`}})
	res = c.Score(context.Background(), items(1))
	if res[0].Err != nil || res[0].Reward != 0.25 || res[0].Correct != 1 {
		t.Fatalf("sh grader: %+v", res[0])
	}
}
