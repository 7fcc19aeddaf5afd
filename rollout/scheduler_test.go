package rollout

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// identical fails unless a and b are the same samples bit for bit: what
// sameSamples checks, and the truncated log-probabilities, finish reasons
// and versions.
func identical(t *testing.T, a, b []Sample) {
	t.Helper()
	sameSamples(t, a, b)
	for i := range a {
		x, y := a[i], b[i]
		if x.Finish != y.Finish || x.Version != y.Version {
			t.Fatalf("sample %d: finish %q version %d, want %q %d", i, x.Finish, x.Version, y.Finish, y.Version)
		}
		if (x.TruncLogProbs == nil) != (y.TruncLogProbs == nil) || len(x.TruncLogProbs) != len(y.TruncLogProbs) {
			t.Fatalf("sample %d: %d truncated log-probs, want %d", i, len(x.TruncLogProbs), len(y.TruncLogProbs))
		}
		for j := range x.TruncLogProbs {
			if math.Float32bits(x.TruncLogProbs[j]) != math.Float32bits(y.TruncLogProbs[j]) {
				t.Fatalf("sample %d token %d: truncated log-prob differs", i, j)
			}
		}
		if len(x.TopLogProbs) != len(y.TopLogProbs) {
			t.Fatalf("sample %d: top log-probs at %d positions, want %d", i, len(x.TopLogProbs), len(y.TopLogProbs))
		}
		for j := range x.TopLogProbs {
			if !slices.EqualFunc(x.TopLogProbs[j], y.TopLogProbs[j], func(a, b TokenLogProb) bool {
				return a.Token == b.Token && math.Float32bits(a.LogProb) == math.Float32bits(b.LogProb)
			}) {
				t.Fatalf("sample %d position %d: top log-probs %v, want %v", i, j, x.TopLogProbs[j], y.TopLogProbs[j])
			}
		}
	}
}

// mixedRequests returns n requests of varied prompts (some equal) and
// settings: greedy and sampled at several temperatures, top-k, top-p,
// both, stop tokens, response lengths (some cut by MaxLen 40), seeds and
// sample counts.
func mixedRequests(r *rand.Rand, vocab, n int) []Request {
	var reqs []Request
	for i := range n {
		sp := Sampling{MaxNewTokens: 1 + r.IntN(14), Seed: r.Uint64()}
		switch i % 5 {
		case 1:
			sp.Temperature = 1
			if i%10 == 1 {
				sp.TopLogProbs = 2 // sampled on the host beside a Drawer
			}
		case 2:
			sp.Temperature, sp.TopK = 0.7, 1+r.IntN(6)
		case 3:
			sp.Temperature, sp.TopP = 1.3, 0.8
		case 4:
			sp.Temperature, sp.TopK, sp.TopP = 0.9, 5, 0.9
		}
		if r.IntN(2) == 0 {
			sp.Stop = []int32{int32(r.IntN(vocab)), int32(r.IntN(vocab))}
		}
		prompt := testPrompts(r, vocab, 1+r.IntN(20))[0]
		switch i % 7 {
		case 5:
			sp.MaxNewTokens = 40 // MaxLen bounds it
		case 6:
			prompt = reqs[i-1].Prompt // equal prompts, other settings
		}
		reqs = append(reqs, Request{Prompt: prompt, N: 1 + r.IntN(3), Sampling: sp})
	}
	reqs = append(reqs, reqs[0]) // the same request twice
	return reqs
}

// reference is what each request gets from Generate alone on a fresh
// engine of model m (Slots 2: the slot count does not matter).
func reference(t *testing.T, m *model.Model, p Precision, reqs []Request) [][]Sample {
	t.Helper()
	out := make([][]Sample, len(reqs))
	for i, r := range reqs {
		out[i] = generate(t, m, Options{Precision: p, Slots: 2, MaxLen: 40}, nil, [][]int32{r.Prompt}, r.N, r.Sampling)
	}
	return out
}

// streamed records what OnToken reported, per sample.
type streamed struct {
	tok      [][]int32
	lp, tlp  [][]float32
	returned bool // Do has returned: OnToken must not be called any more
	late     bool
}

func newStreamed(n int) *streamed {
	return &streamed{tok: make([][]int32, n), lp: make([][]float32, n), tlp: make([][]float32, n)}
}

func (st *streamed) onToken(i int, tok int32, lp, tlp float32) {
	if st.returned {
		st.late = true
	}
	st.tok[i] = append(st.tok[i], tok)
	st.lp[i] = append(st.lp[i], lp)
	st.tlp[i] = append(st.tlp[i], tlp)
}

// check fails unless OnToken reported exactly the samples' tokens and
// log-probabilities (0 as truncated log-probability without truncation).
func (st *streamed) check(t *testing.T, samples []Sample) {
	t.Helper()
	if st.late {
		t.Fatal("OnToken called after Do returned")
	}
	for i, s := range samples {
		want := s.TruncLogProbs
		if want == nil {
			want = make([]float32, len(s.Tokens))
		}
		if fmt.Sprint(st.tok[i], st.lp[i], st.tlp[i]) != fmt.Sprint(s.Tokens, s.LogProbs, want) {
			t.Fatalf("sample %d: OnToken reported %v %v %v, sample %v %v %v", i, st.tok[i], st.lp[i], st.tlp[i], s.Tokens, s.LogProbs, want)
		}
	}
}

// serve runs reqs concurrently on s, arriving three ways: every third one
// (i%3 == 0) queued while s is paused, then all started together; each
// one after those (i%3 == 1) submitted from inside a step, at the first
// token of the one before, so that it joins a batch in flight; the others
// from goroutines started at staggered times. It returns each request's
// samples, checking what OnToken streamed, and how many of the steps that
// sampled a token had rows at different temperatures.
func serve(t *testing.T, s *Scheduler, reqs []Request) ([][]Sample, int) {
	t.Helper()
	reqs = slices.Clone(reqs) // for OnToken
	out := make([][]Sample, len(reqs))
	errs := make([]error, len(reqs))
	streams := make([]*streamed, len(reqs))
	mixed, lastMixed := 0, int64(-1)
	var wg sync.WaitGroup
	do := func(i int, r Request) {
		wg.Go(func() {
			out[i], errs[i] = s.Do(context.Background(), r)
			streams[i].returned = true
		})
	}
	for i := range reqs {
		streams[i] = newStreamed(reqs[i].N)
		st, first := streams[i], true
		reqs[i].OnToken = func(j int, tk Token) {
			st.onToken(j, tk.ID, tk.LogProb, tk.TruncLogProb)
			// OnToken runs inside the step: the engine's output rows are
			// this step's.
			if e := s.e; slices.Min(e.batch.OutTemp) != slices.Max(e.batch.OutTemp) && lastMixed != s.stats.Steps {
				mixed++
				lastMixed = s.stats.Steps
			}
			if first && i%3 == 0 && i+1 < len(reqs) {
				first = false
				s.mu.Lock()
				n := len(s.inbox)
				s.mu.Unlock()
				do(i+1, reqs[i+1])
				waitFor(t, s, func() bool { return len(s.inbox) > n })
			}
		}
	}
	s.Pause()
	queued := 0
	for i, r := range reqs {
		if i%3 == 0 {
			do(i, r)
			queued++
		}
	}
	waitWaiting(t, s, queued)
	s.Continue()
	for i, r := range reqs {
		if i%3 == 2 {
			time.Sleep(time.Duration(i%4) * 100 * time.Microsecond)
			do(i, r)
		}
	}
	wg.Wait()
	for i := range reqs {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		streams[i].check(t, out[i])
	}
	return out, mixed
}

// A request served with others (different settings and arrival times,
// more requests than slots, prompts prefilled in chunks) gets exactly
// what Generate gives it alone on a fresh engine, in every precision, for
// dense and MoE models, with the fused and the unfused forward paths.
func TestSchedulerMatchesGenerate(t *testing.T) {
	for _, cfg := range []model.Config{denseConfig(), moeConfig()} {
		m := randomModel(cfg, 12)
		reqs := mixedRequests(rand.New(rand.NewPCG(12, uint64(cfg.NumExperts))), cfg.VocabSize, 14)
		for _, p := range []Precision{Exact, FP32, BF16, FP8, FP4} {
			want := reference(t, m, p, reqs)
			for _, opt := range []Options{{Slots: 3, StepRows: 5}, {Slots: 8}} {
				opt.Precision, opt.MaxLen = p, 40
				t.Run(fmt.Sprintf("%d-experts/%s/%d-slots", cfg.NumExperts, p, opt.Slots), func(t *testing.T) {
					e, err := New(m, opt)
					if err != nil {
						t.Fatal(err)
					}
					defer e.Close()
					cpuOf(e).fuse = 1 // 3 slots: fused
					if opt.Slots == 8 {
						cpuOf(e).fuse = -1
					}
					s := NewScheduler(e)
					defer s.Close()
					got, mixed := serve(t, s, reqs)
					for i := range reqs {
						identical(t, got[i], want[i])
					}
					t.Logf("%d steps mixed temperatures", mixed)
					if mixed < 3 {
						t.Fatalf("%d steps mixed temperatures, want several", mixed)
					}
				})
			}
		}
	}
}

// newTestScheduler serves model m in precision p with slots slots.
func newTestScheduler(t *testing.T, m *model.Model, p Precision, slots int) (*Engine, *Scheduler) {
	t.Helper()
	e, err := New(m, Options{Precision: p, Slots: slots, MaxLen: 40})
	if err != nil {
		t.Fatal(err)
	}
	return e, NewScheduler(e)
}

// A request whose context is cancelled mid-decode stops (Do returns the
// context's error, no token is streamed after) and frees its slots for the
// others, which still get exactly their Generate samples; one cancelled
// while queued (here: while the scheduler is paused) returns at once, and
// one whose context is already done is not queued.
func TestSchedulerCancel(t *testing.T) {
	m := randomModel(moeConfig(), 13)
	e, s := newTestScheduler(t, m, BF16, 2)
	defer e.Close()
	defer s.Close()
	others := mixedRequests(rand.New(rand.NewPCG(13, 1)), 41, 4)
	want := reference(t, m, BF16, others)

	// The long request takes both slots. At its first sample's third token
	// (the step holds meanwhile) the others queue and it is cancelled.
	long := Request{Prompt: []int32{1, 2, 3, 4}, N: 2, Sampling: Sampling{Temperature: 1, MaxNewTokens: 30, Seed: 1}}
	ctx, cancel := context.WithCancel(context.Background())
	st := newStreamed(2)
	reached, release := make(chan struct{}), make(chan struct{})
	long.OnToken = func(i int, tk Token) {
		st.onToken(i, tk.ID, tk.LogProb, tk.TruncLogProb)
		if i == 0 && len(st.tok[0]) == 3 {
			close(reached)
			<-release
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Do(ctx, long)
		st.returned = true
		done <- err
	}()
	<-reached
	got := make([][]Sample, len(others))
	var wg sync.WaitGroup
	for i, r := range others {
		s.mu.Lock()
		n := len(s.inbox)
		s.mu.Unlock()
		wg.Go(func() {
			var err error
			if got[i], err = s.Do(context.Background(), r); err != nil {
				t.Error(err)
			}
		})
		waitFor(t, s, func() bool { return len(s.inbox) > n })
	}
	cancel()
	close(release)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: err = %v", err)
	}
	wg.Wait()
	if st.late {
		t.Fatal("OnToken called after the cancelled Do returned")
	}
	longTokens := len(st.tok[0]) + len(st.tok[1])
	if len(st.tok[0]) != 3 || len(st.tok[1]) > 4 {
		t.Fatalf("the cancelled request went on: %d and %d tokens", len(st.tok[0]), len(st.tok[1]))
	}
	for i := range others {
		identical(t, got[i], want[i])
	}
	n := longTokens
	for _, ss := range got {
		for _, smp := range ss {
			n += len(smp.Tokens)
		}
	}
	if st := s.Stats(); st.SampledTokens != int64(n) || st.Running != 0 || st.Waiting != 0 {
		t.Fatalf("stats %+v, want %d tokens sampled, none running or waiting", st, n)
	}

	// Cancelled while queued.
	s.Pause()
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- func() error { _, err := s.Do(ctx, others[0]); return err }() }()
	waitWaiting(t, s, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while queued: err = %v", err)
	}
	if st := s.Stats(); st.Waiting != 0 {
		t.Fatalf("stats %+v after the queued request was cancelled", st)
	}
	s.Continue()
	if _, err := s.Do(ctx, others[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("done context: err = %v", err)
	}
	if got, err := s.Do(context.Background(), others[1]); err != nil {
		t.Fatal(err)
	} else {
		identical(t, got, want[1])
	}
}

// While paused no step runs: a request in flight keeps its state and
// one submitted meanwhile waits; after Continue both get their Generate
// samples.
func TestSchedulerPause(t *testing.T) {
	m := randomModel(denseConfig(), 14)
	e, s := newTestScheduler(t, m, FP8, 4)
	defer e.Close()
	defer s.Close()
	reqs := []Request{
		{Prompt: []int32{5, 6, 7}, N: 2, Sampling: Sampling{Temperature: 0.8, MaxNewTokens: 25, Seed: 3}},
		{Prompt: []int32{9, 1}, N: 1, Sampling: Sampling{Temperature: 1, TopK: 4, MaxNewTokens: 10, Seed: 4}},
	}
	want := reference(t, m, FP8, reqs)

	// Pause during the first request's third token (the step it is
	// sampled in holds until Pause has been called).
	third, paused := make(chan struct{}), make(chan struct{})
	n := 0
	reqs[0].OnToken = func(i int, _ Token) {
		if n++; n == 3 {
			close(third)
			<-paused
		}
	}
	var got [2][]Sample
	var errs [2]error
	var wg sync.WaitGroup
	wg.Go(func() { got[0], errs[0] = s.Do(context.Background(), reqs[0]) })
	<-third
	pauseDone := make(chan struct{})
	go func() { s.Pause(); close(pauseDone) }()
	waitFor(t, s, func() bool { return s.paused > 0 })
	select {
	case <-pauseDone:
		t.Error("Pause returned while a step was running")
	default:
	}
	close(paused)
	<-pauseDone
	wg.Go(func() { got[1], errs[1] = s.Do(context.Background(), reqs[1]) })
	before := s.Stats()
	waitWaiting(t, s, 1)
	time.Sleep(20 * time.Millisecond)
	if st := s.Stats(); st.Steps != before.Steps || st.Running != 2 || st.Waiting != 1 {
		t.Errorf("paused: stats %+v, before %+v", st, before)
	}
	s.Continue()
	wg.Wait()
	for i := range reqs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		identical(t, got[i], want[i])
	}
}

// UpdateWeights waits for the requests in flight (all of a request's
// samples, those not yet admitted included, come from the old weights),
// holds a request that arrives meanwhile, and serves it with the new
// weights exactly as a fresh engine on them would. A model of another
// configuration is refused at once.
func TestSchedulerUpdateWeights(t *testing.T) {
	for _, p := range []Precision{Exact, FP4} {
		m1, m2 := randomModel(moeConfig(), 15), randomModel(moeConfig(), 16)
		e, s := newTestScheduler(t, m1, p, 2)
		a := Request{Prompt: []int32{3, 1, 4, 1, 5}, N: 3, Sampling: Sampling{Temperature: 1, MaxNewTokens: 12, Seed: 5}}
		b := Request{Prompt: []int32{2, 7, 1}, N: 2, Sampling: Sampling{Temperature: 0.6, TopP: 0.9, MaxNewTokens: 8, Seed: 6}}
		wantA := reference(t, m1, p, []Request{a})[0]
		wantB := reference(t, m2, p, []Request{b})[0]
		for i := range wantB {
			wantB[i].Version = 9
		}

		// At a's first token, queue the update and b (the step holds until
		// both are registered); a has 3 samples for 2 slots, so its third
		// starts after the update was asked for.
		var updErr, errB error
		var gotB []Sample
		var wg sync.WaitGroup
		first := true
		a.OnToken = func(int, Token) {
			if !first {
				return
			}
			first = false
			wg.Go(func() { updErr = s.UpdateWeights(m2, 9) })
			waitFor(t, s, func() bool { return len(s.updates) == 1 })
			wg.Go(func() { gotB, errB = s.Do(context.Background(), b) })
			waitFor(t, s, func() bool { return len(s.inbox) == 1 })
		}
		gotA, err := s.Do(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if updErr != nil || errB != nil {
			t.Fatal(updErr, errB)
		}
		identical(t, gotA, wantA)
		identical(t, gotB, wantB)
		if s.Version() != 9 {
			t.Fatalf("version %d, want 9", s.Version())
		}
		if err := s.UpdateWeights(randomModel(denseConfig(), 1), 10); err == nil || s.Version() != 9 {
			t.Fatalf("%s: a model of another configuration: err %v, version %d", p, err, s.Version())
		}
		s.Close()
		e.Close()
	}
}

// An in-place update (partial rollouts) switches the sequences in flight:
// at a's third token the update is queued and applied at the next step
// boundary, without waiting for a to finish; every token of a is then of
// the weights that sampled it, its log-prob theirs given the whole
// sequence (exact precision), and the sample says which version sampled
// each token. A paused scheduler takes an in-place update too.
func TestSchedulerUpdateWeightsInPlace(t *testing.T) {
	m1, m2 := randomModel(moeConfig(), 15), randomModel(moeConfig(), 16)
	e, s := newTestScheduler(t, m1, Exact, 2)
	defer e.Close()
	defer s.Close()
	a := Request{Prompt: []int32{3, 1, 4, 1, 5}, N: 2, Sampling: Sampling{Temperature: 1, MaxNewTokens: 12, Seed: 5}}
	var updErr error
	var wg sync.WaitGroup
	n := 0
	a.OnToken = func(int, Token) {
		if n++; n != 3 {
			return
		}
		wg.Go(func() { updErr = s.UpdateWeightsInPlace(m2, 9) })
		waitFor(t, s, func() bool { return len(s.updates) == 1 })
	}
	got, err := s.Do(context.Background(), a)
	wg.Wait()
	if err != nil || updErr != nil {
		t.Fatal(err, updErr)
	}
	old, neu := train.New(m1), train.New(m2)
	switched := 0
	for i, smp := range got {
		if smp.TokenVersions == nil {
			t.Fatalf("sample %d: no token versions, the update did not switch it", i)
		}
		switched++
		seq := append(slices.Clone(a.Prompt), smp.Tokens...)
		ro, _ := old.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true})
		rn, _ := neu.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true})
		for j, v := range smp.TokenVersions {
			want := ro.LogProbs[0][len(a.Prompt)-1+j]
			if v == 9 {
				want = rn.LogProbs[0][len(a.Prompt)-1+j]
			}
			if math.Float32bits(smp.LogProbs[j]) != math.Float32bits(want) {
				t.Fatalf("sample %d token %d (version %d): log-prob %g, want %g", i, j, v, smp.LogProbs[j], want)
			}
		}
	}
	// Paused, with nothing running: applied at once.
	s.Pause()
	if err := s.UpdateWeightsInPlace(m1, 10); err != nil || s.Version() != 10 {
		t.Fatalf("paused: err %v, version %d", err, s.Version())
	}
	s.Continue()
}

// settledGoroutines returns the goroutine count once goroutines of
// earlier tests (engines' workers) have exited.
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for i := 0; i < 100; i++ {
		time.Sleep(2 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			break
		}
		n = m
	}
	return n
}

// waitFor polls cond under s.mu, for tests that must see the scheduler
// reach a state. After 10 seconds it fails the test (with t.Error: it may
// run in OnToken) and returns false.
func waitFor(t *testing.T, s *Scheduler, cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); ; {
		s.mu.Lock()
		ok := cond()
		s.mu.Unlock()
		if ok {
			return true
		}
		if time.Now().After(deadline) {
			t.Error("the scheduler did not reach the state waited for")
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// waitWaiting waits until n requests are waiting.
func waitWaiting(t *testing.T, s *Scheduler, n int) bool {
	return waitFor(t, s, func() bool { return s.stats.Waiting+len(s.inbox) >= n })
}

// The samples of a request share its prompt's prefill, two requests with
// the same prompt do not; the stats count what was computed.
func TestSchedulerPromptSharing(t *testing.T) {
	m := randomModel(moeConfig(), 17)
	e, s := newTestScheduler(t, m, Exact, 8)
	defer e.Close()
	defer s.Close()
	r := Request{Prompt: []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, N: 3, Sampling: Sampling{Temperature: 1, MaxNewTokens: 5, Seed: 7}}
	count := func(ss []Sample) (n int) {
		for _, x := range ss {
			n += len(x.Tokens)
		}
		return n
	}
	got, err := s.Do(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.PromptTokens != 9+2 || st.SampledTokens != int64(count(got)) || st.Steps == 0 || st.LastStepRows == 0 || st.Running != 0 {
		t.Fatalf("one request: stats %+v, want 11 prompt rows and %d tokens", st, count(got))
	}
	// Two at once (the second is queued while the loop is paused, so they
	// are admitted in the same step): no sharing between them.
	s.Pause()
	var wg sync.WaitGroup
	var res [2][]Sample
	for i := range res {
		wg.Go(func() { res[i], _ = s.Do(context.Background(), r) })
	}
	waitWaiting(t, s, 2)
	s.Continue()
	wg.Wait()
	identical(t, res[0], got)
	identical(t, res[1], got)
	if st := s.Stats(); st.PromptTokens != 3*(9+2) {
		t.Fatalf("stats %+v, want %d prompt rows", st, 3*(9+2))
	}
}

// Invalid requests fail at once with Generate's errors, without
// disturbing a request in flight.
func TestSchedulerBadRequests(t *testing.T) {
	m := randomModel(denseConfig(), 18)
	e, s := newTestScheduler(t, m, BF16, 2)
	defer e.Close()
	defer s.Close()
	good := Request{Prompt: []int32{4, 4, 2}, N: 2, Sampling: Sampling{Temperature: 1, MaxNewTokens: 20, Seed: 8}}
	want := reference(t, m, BF16, []Request{good})[0]
	ok := Sampling{Temperature: 1, MaxNewTokens: 2}
	bad := []struct {
		r    Request
		want string
	}{
		{Request{Prompt: []int32{1, 99}, N: 1, Sampling: ok}, "id 99"},
		{Request{Prompt: []int32{1, -1}, N: 1, Sampling: ok}, "id -1"},
		{Request{N: 1, Sampling: ok}, "empty"},
		{Request{Prompt: make([]int32, 40), N: 1, Sampling: ok}, "at most 40"},
		{Request{Prompt: []int32{1}, N: 0, Sampling: ok}, "n = 0"},
		{Request{Prompt: []int32{1}, N: 1, Sampling: Sampling{Temperature: math.NaN(), MaxNewTokens: 1}}, "temperature"},
		{Request{Prompt: []int32{1}, N: 1, Sampling: Sampling{Temperature: 1, TopP: 2, MaxNewTokens: 1}}, "top-p"},
		{Request{Prompt: []int32{1}, N: 1, Sampling: Sampling{Temperature: 1}}, "max new tokens"},
		{Request{Prompt: []int32{1}, N: 1, Sampling: Sampling{Temperature: 1, MaxNewTokens: 1, Stop: []int32{37}}}, "stop token"},
	}
	var got []Sample
	var err error
	var wg sync.WaitGroup
	started, first := make(chan struct{}), true
	good.OnToken = func(i int, _ Token) {
		if first {
			first = false
			close(started)
		}
	}
	wg.Go(func() { got, err = s.Do(context.Background(), good) })
	<-started
	for _, c := range bad {
		if _, err := s.Do(context.Background(), c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v, want one mentioning %q", c.r, err, c.want)
		}
	}
	if err := s.UpdateWeights(nil, 1); err == nil {
		t.Error("UpdateWeights(nil) accepted")
	}
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	identical(t, got, want)
}

// Close waits for the requests accepted (a paused scheduler included),
// leaves no goroutine behind, and Do and UpdateWeights after it fail; an
// idle scheduler's loop sleeps rather than spins.
func TestSchedulerCloseAndIdle(t *testing.T) {
	m := randomModel(moeConfig(), 19)
	e, err := New(m, Options{Slots: 2, MaxLen: 40})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	base := settledGoroutines()
	s := NewScheduler(e)
	r := Request{Prompt: []int32{6, 5, 4}, N: 3, Sampling: Sampling{Temperature: 1, MaxNewTokens: 10, Seed: 9}}
	if _, err := s.Do(context.Background(), r); err != nil {
		t.Fatal(err)
	}

	// Idle: the loop waits.
	waitFor(t, s, func() bool { return !s.stepping })
	s.mu.Lock()
	loops := s.loops
	s.mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	s.mu.Lock()
	idle := s.loops - loops
	s.mu.Unlock()
	if idle != 0 {
		t.Fatalf("the idle loop ran %d times in 30 ms", idle)
	}

	// Close while paused with a request queued: it is served first.
	s.Pause()
	var got []Sample
	var wg sync.WaitGroup
	wg.Go(func() { got, err = s.Do(context.Background(), r) })
	waitWaiting(t, s, 1)
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	wg.Wait()
	if err != nil || len(got) != 3 {
		t.Fatalf("request queued before Close: %d samples, err %v", len(got), err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Fatalf("%d goroutines after Close, %d before NewScheduler", n, base)
	}
	s.Close()
	s.Pause()
	s.Continue()
	if _, err := s.Do(context.Background(), r); err == nil {
		t.Error("Do after Close succeeded")
	}
	if err := s.UpdateWeights(m, 1); err == nil {
		t.Error("UpdateWeights after Close succeeded")
	}
	// The engine is the caller's again.
	if _, err := e.Generate([][]int32{r.Prompt}, 1, r.Sampling); err != nil {
		t.Fatal(err)
	}
}

// topTokens keeps the largest entries, largest first, lower ids first
// among equals: against a full sort, with many ties.
func TestTopTokens(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	for trial := range 200 {
		z := make([]float32, 1+r.IntN(60))
		for i := range z {
			z[i] = float32(r.IntN(12)) - 6 // ties
		}
		n := 1 + r.IntN(min(len(z), MaxTopLogProbs))
		top := make([]TokenLogProb, n)
		topTokens(top, z)
		ids := make([]int, len(z))
		for i := range ids {
			ids[i] = i
		}
		sort.SliceStable(ids, func(a, b int) bool { return z[ids[a]] > z[ids[b]] })
		for k := range n {
			if top[k].Token != int32(ids[k]) || top[k].LogProb != z[ids[k]] {
				t.Fatalf("trial %d: top %v, want ids %v of %v", trial, top, ids[:n], z)
			}
		}
	}
}

// Asking for the top log-probs changes no sample; they are the most
// probable tokens (greedy picks the first), and streamed ones match.
func TestTopLogProbs(t *testing.T) {
	m := randomModel(moeConfig(), 4)
	prompts := testPrompts(rand.New(rand.NewPCG(1, 1)), 41, 3, 5)
	for _, temp := range []float64{0, 0.9} {
		sp := Sampling{Temperature: temp, MaxNewTokens: 10, Seed: 3}
		plain := generate(t, m, Options{Slots: 4, MaxLen: 32}, nil, prompts, 2, sp)
		sp.TopLogProbs = 4
		with := generate(t, m, Options{Slots: 4, MaxLen: 32}, nil, prompts, 2, sp)
		for i := range plain {
			p, w := plain[i], with[i]
			if !slices.Equal(p.Tokens, w.Tokens) || !slices.Equal(p.LogProbs, w.LogProbs) || p.TopLogProbs != nil {
				t.Fatalf("T=%g sample %d: top log-probs changed the sample", temp, i)
			}
			if len(w.TopLogProbs) != len(w.Tokens) {
				t.Fatalf("T=%g sample %d: %d top lists for %d tokens", temp, i, len(w.TopLogProbs), len(w.Tokens))
			}
			for j, top := range w.TopLogProbs {
				if len(top) != 4 || top[0].LogProb < w.LogProbs[j] || !sort.SliceIsSorted(top, func(a, b int) bool { return top[a].LogProb > top[b].LogProb }) {
					t.Fatalf("T=%g sample %d token %d: top %v, sampled %v", temp, i, j, top, w.LogProbs[j])
				}
				if temp == 0 && top[0].Token != w.Tokens[j] {
					t.Fatalf("greedy sample %d token %d: %d, top %v", i, j, w.Tokens[j], top)
				}
			}
		}
	}
	e, _ := New(m, Options{Slots: 4, MaxLen: 32})
	defer e.Close()
	if _, err := e.Generate(prompts, 1, Sampling{Temperature: 1, MaxNewTokens: 2, TopLogProbs: MaxTopLogProbs + 1}); err == nil {
		t.Error("TopLogProbs beyond the maximum was accepted")
	}
}
