package rl

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-rl/keel/reward"
)

// evenFirstServer is an HTTP grader rewarding responses whose first token
// is even (evenFirst's rule), with a metric "first" (the first token);
// nan, when set, answers a NaN reward for the items it picks.
func evenFirstServer(t *testing.T, nan func(reward.Item) bool) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req reward.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Protocol != reward.Protocol {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		type entry struct {
			ID      string             `json:"id"`
			Reward  any                `json:"reward"`
			Metrics map[string]float64 `json:"metrics"`
		}
		out := struct {
			Request string  `json:"request"`
			Rewards []entry `json:"rewards"`
		}{Request: req.Request}
		for _, it := range req.Items {
			var rw any = 1 - it.ResponseIDs[0]%2
			if nan != nil && nan(it) {
				rw = "NaN"
			}
			out.Rewards = append(out.Rewards, entry{ID: it.ID, Reward: rw, Metrics: map[string]float64{"first": float64(it.ResponseIDs[0])}})
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(s.Close)
	return s
}

// externalLoop is testLoop scored by the recipe's external reward.
func externalLoop(t *testing.T, r *Recipe) *Loop {
	t.Helper()
	l := testLoop(t, r, false)
	ext, err := NewExternalScorer(&r.Reward, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ext.Client.Close() })
	l.Score, l.Batch = nil, ext
	return l
}

// An HTTP grader with evenFirst's rule trains exactly as the in-process
// scorer: same weights and metrics, but for the external reward's own.
func TestExternalRewardMatchesInProcess(t *testing.T) {
	s := evenFirstServer(t, nil)
	for _, sets := range [][]string{nil, {"rollout.staleness=1"}} {
		ext := testRecipe(t, append([]string{"reward.kind=http", "reward.url=" + s.URL, "reward.batch=5", "reward.concurrency=2"}, sets...)...)
		w1, m1 := runSteps(t, externalLoop(t, ext), 3)
		w2, m2 := runSteps(t, testLoop(t, testRecipe(t, sets...), false), 3)
		for i, m := range m1 {
			if m["reward/external_errors"] != 0 || m["reward/ext/first"] <= 0 {
				t.Fatalf("step %d: external metrics %v", i+1, m)
			}
			for k := range m {
				if strings.HasPrefix(k, "reward/ext") {
					delete(m, k)
				}
			}
		}
		sameRun(t, "external reward "+strings.Join(sets, " "), w1, w2, m1, m2)
	}
}

// A malformed answer fails the step naming the row and field, or (on_error:
// zero) gives reward 0, counted.
func TestExternalRewardErrors(t *testing.T) {
	s := evenFirstServer(t, func(it reward.Item) bool { return it.Row == 3 })
	l := externalLoop(t, testRecipe(t, "reward.kind=http", "reward.url="+s.URL))
	var err error
	for i := 0; i < 3 && err == nil; i++ { // until row 3 is sampled
		_, err = l.RunStep(t.Context())
	}
	if err == nil || !strings.Contains(err.Error(), "row 3") || !strings.Contains(err.Error(), ".reward") {
		t.Fatalf("got %v, want an error naming row 3 and the reward field", err)
	}
	l = externalLoop(t, testRecipe(t, "reward.kind=http", "reward.url="+s.URL, "reward.on_error=zero"))
	failed := 0.0
	for range 3 {
		res, err := l.RunStep(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		failed += res.Metrics["reward/external_errors"]
		for _, smp := range res.Samples {
			if smp.Prompt.Row == 3 && smp.Reward != 0 {
				t.Fatalf("row 3 has reward %g, want 0", smp.Reward)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no external errors counted")
	}
}

func TestRewardRecipe(t *testing.T) {
	// The verifier's default writes nothing.
	if y := string(testRecipe(t).YAML()); strings.Contains(y, "reward") {
		t.Fatalf("the default recipe writes a reward section:\n%s", y)
	}
	r := testRecipe(t, "reward.kind=command", "reward.command=[sh, -c, cat]")
	w := r.Reward
	if w.Timeout != 60 || *w.Retries != 2 || w.Concurrency != 1 || w.Batch != 64 || *w.MaxRestarts != 3 || w.OnError != "fail" {
		t.Fatalf("defaults %+v", w)
	}
	if again, err := ParseRecipe(r.YAML(), nil); err != nil || string(again.YAML()) != string(r.YAML()) {
		t.Fatalf("the resolved recipe does not read back: %v\n%s", err, r.YAML())
	}
	// max_restarts: 0 stays 0 (no restarts) and reads back.
	if r := testRecipe(t, "reward.kind=command", "reward.command=[a]", "reward.max_restarts=0"); *r.Reward.MaxRestarts != 0 {
		t.Fatalf("max_restarts=0 resolved to %d", *r.Reward.MaxRestarts)
	} else if again, err := ParseRecipe(r.YAML(), nil); err != nil || *again.Reward.MaxRestarts != 0 {
		t.Fatalf("max_restarts=0 does not read back: %v\n%s", err, r.YAML())
	}
	if r := testRecipe(t, "reward.kind=http", "reward.url=http://127.0.0.1:1/r", "reward.retries=0"); *r.Reward.Retries != 0 || r.Reward.Concurrency != 4 {
		t.Fatalf("http %+v", r.Reward)
	}
	for _, tc := range []struct{ set, key string }{
		{"reward.kind=judge", "reward.kind"},
		{"reward.url=http://x", "reward:"},
		{"reward.kind=http", "reward.url"},
		{"reward.kind=http reward.url=ftp://x", "reward.url"},
		{"reward.kind=http reward.url=http://x reward.api_key_env=sk-123abc", "reward.api_key_env"},
		{"reward.kind=http reward.url=http://x reward.command=[a]", "reward.command"},
		{"reward.kind=http reward.url=http://x reward.max_restarts=0", "reward.command"},
		{"reward.max_restarts=0", "reward:"},
		{"reward.kind=command", "reward.command"},
		{"reward.kind=command reward.command=[a] reward.url=http://x", "reward.url"},
		{"reward.kind=command reward.command=[a] reward.timeout=-1", "reward.timeout"},
		{"reward.kind=command reward.command=[a] reward.retries=-1", "reward.retries"},
		{"reward.kind=command reward.command=[a] reward.concurrency=-2", "reward.concurrency"},
		{"reward.kind=command reward.command=[a] reward.batch=-1", "reward.batch"},
		{"reward.kind=command reward.command=[a] reward.on_error=ignore", "reward.on_error"},
		{"reward.kind=command reward.command=[a] reward.max_restarts=-1", "reward.max_restarts"},
		{"reward.kind=command reward.bogus=1", "bogus"},
	} {
		_, err := ParseRecipe([]byte(testRecipeYAML), strings.Fields(tc.set))
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: got %v, want an error naming %s", tc.set, err, tc.key)
		}
	}
}

// A run with an HTTP grader: the grader sees the decoded response, the
// prompt, the ground truth and the API key from the named variable; its
// metrics reach the step's.
func TestRunExternalReward(t *testing.T) {
	t.Setenv("KEEL_TEST_REWARD_KEY", "sesame")
	var mu sync.Mutex
	var bad string
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req reward.Request
		json.NewDecoder(r.Body).Decode(&req)
		out := reward.Answer{Request: req.Request}
		mu.Lock()
		defer mu.Unlock()
		for _, it := range req.Items {
			switch {
			case r.Header.Get("Authorization") != "Bearer sesame":
				bad = "no API key"
			case it.Task == "" || it.GroundTruth == "" || len(it.Messages) == 0 || !strings.Contains(it.Prompt, it.Messages[0].Content) || len(it.ResponseIDs) == 0:
				bad = "incomplete item"
			}
			id := it.ID
			rw := reward.Number{}
			if strings.Contains(it.Response, it.GroundTruth) {
				rw.V = 1
			}
			out.Rewards = append(out.Rewards, reward.Scored{ID: &id, Reward: &rw, Metrics: map[string]reward.Number{"chars": {V: float64(len(it.Response))}}})
		}
		json.NewEncoder(w).Encode(out)
	}))
	defer s.Close()
	r := runRecipe(t, t.TempDir(), "train.steps=2", "eval.skip=true", "reward.kind=http", "reward.url="+s.URL, "reward.api_key_env=KEEL_TEST_REWARD_KEY")
	var chars float64
	_, err := Run(t.Context(), r, false, Progress{Step: func(_, _ int, m map[string]float64, _ time.Duration) { chars += m["reward/ext/chars"] }})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != "" || chars == 0 {
		t.Fatalf("grader saw: %q; reward/ext/chars summed %g", bad, chars)
	}
}
