package rollout

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// fakeTurns answers each sample's turn t < turns with observation tokens
// derived from (prompt, index, t) and ends it after that; it records
// every call, and can sleep a random while before answering.
type fakeTurns struct {
	vocab, turns, obsLen int
	sleep                bool
	mu                   sync.Mutex
	calls                []TurnEnd
}

func (f *fakeTurns) obs(p, i, t int) []int32 {
	out := make([]int32, f.obsLen+t)
	for k := range out {
		out[k] = int32((p*7 + i*3 + t*5 + k) % f.vocab)
	}
	return out
}

func (f *fakeTurns) Turn(t TurnEnd) ([]int32, bool, error) {
	if f.sleep {
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	}
	f.mu.Lock()
	f.calls = append(f.calls, t)
	f.mu.Unlock()
	if t.Turn+1 >= f.turns {
		return nil, true, nil
	}
	return f.obs(t.Prompt, t.Index, t.Turn), false, nil
}

// Multi-turn trajectories in exact precision: every model token's log mu
// is the training engine's log-prob of the whole trajectory (prompt, turns
// and observations) bit for bit, and the routes of every position are the
// training engine's, observation positions included: the KV cache carried
// across turns holds exactly what a forward over the whole sequence
// computes. Observation tokens are where the sample says, with log-prob 0;
// each turn's tokens come before Turns is asked, with the turn's own
// budget; fewer slots than samples and a small step budget make turns of
// different samples share batches with prefills.
func TestTurnsExactMatchesTraining(t *testing.T) {
	for _, cfg := range []model.Config{denseConfig(), moeConfig()} {
		m := randomModel(cfg, 5)
		e, err := New(m, Options{Precision: Exact, Slots: 4, MaxLen: 128, StepRows: 6})
		if err != nil {
			t.Fatal(err)
		}
		prompts := testPrompts(rand.New(rand.NewPCG(2, 2)), cfg.VocabSize, 5, 9, 3)
		ft := &fakeTurns{vocab: cfg.VocabSize, turns: 3, obsLen: 4}
		sp := Sampling{Temperature: 1, MaxNewTokens: 6, Stop: []int32{0}, Seed: 11}
		samples, err := e.GenerateTurns(prompts, 2, sp, ft)
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
		eng := train.New(m)
		for i, s := range samples {
			if len(s.Observations) == 0 {
				continue // ended by the engine's MaxLen before any observation (not with these sizes)
			}
			seq := append(slices.Clone(prompts[s.Prompt]), s.Tokens...)
			pl := len(prompts[s.Prompt])
			res, err := eng.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true, Record: cfg.NumExperts > 0})
			if err != nil {
				t.Fatal(err)
			}
			obs := observed(len(s.Tokens), s.Observations)
			for j := range s.Tokens {
				if obs[j] {
					if s.LogProbs[j] != 0 {
						t.Fatalf("sample %d: observation token %d has log-prob %g", i, j, s.LogProbs[j])
					}
					continue
				}
				if got, want := s.LogProbs[j], res.LogProbs[0][pl-1+j]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("%s sample %d token %d: log mu %g, training engine %g", cfg.Architecture, i, j, got, want)
				}
			}
			if cfg.NumExperts > 0 && !s.Routes.Equal(res.Routes[0]) {
				t.Fatalf("sample %d: routes differ from the training engine's", i)
			}
			for k, sp := range s.Observations {
				want := ft.obs(s.Prompt, s.Index, k)
				if got := s.Tokens[sp.Start:sp.End]; !slices.Equal(got, want) {
					t.Fatalf("sample %d observation %d: %v, want %v", i, k, got, want)
				}
			}
		}
		checkTurnCalls(t, ft, samples, sp)
	}
}

// checkTurnCalls checks what Turns heard: one call per turn, in order, each
// with the trajectory up to the turn's end, the turn's start, its finish
// and the engine's room.
func checkTurnCalls(t *testing.T, ft *fakeTurns, samples []Sample, sp Sampling) {
	t.Helper()
	byKey := map[[2]int][]TurnEnd{}
	for _, c := range ft.calls {
		k := [2]int{c.Prompt, c.Index}
		byKey[k] = append(byKey[k], c)
	}
	for _, s := range samples {
		calls := byKey[[2]int{s.Prompt, s.Index}]
		if len(calls) != len(s.Observations)+1 {
			t.Fatalf("prompt %d sample %d: %d calls for %d observations", s.Prompt, s.Index, len(calls), len(s.Observations))
		}
		start := 0
		for k, c := range calls {
			if c.Turn != k || c.TurnStart != start {
				t.Fatalf("prompt %d sample %d call %d: turn %d start %d, want %d %d", s.Prompt, s.Index, k, c.Turn, c.TurnStart, k, start)
			}
			end := len(c.Response)
			if !slices.Equal(c.Response, s.Tokens[:end]) {
				t.Fatalf("prompt %d sample %d call %d: the response it saw is not the sample's prefix", s.Prompt, s.Index, k)
			}
			last := s.Tokens[end-1]
			wantFinish := "length"
			if slices.Contains(sp.Stop, last) {
				wantFinish = "stop"
			} else if end-start != sp.MaxNewTokens {
				t.Fatalf("prompt %d sample %d turn %d: %d tokens without a stop token, budget %d", s.Prompt, s.Index, k, end-start, sp.MaxNewTokens)
			}
			if c.Finish != wantFinish {
				t.Fatalf("prompt %d sample %d turn %d: finish %q, want %q", s.Prompt, s.Index, k, c.Finish, wantFinish)
			}
			if k < len(s.Observations) {
				if s.Observations[k].Start != end {
					t.Fatalf("prompt %d sample %d: observation %d starts at %d, the turn ended at %d", s.Prompt, s.Index, k, s.Observations[k].Start, end)
				}
				start = s.Observations[k].End
			}
		}
	}
}

// observed marks the tokens inside spans.
func observed(n int, spans []Span) []bool {
	out := make([]bool, n)
	for _, s := range spans {
		for j := s.Start; j < s.End; j++ {
			out[j] = true
		}
	}
	return out
}

// Each later turn draws from TurnSeed's stream: a one-sample Generate on
// the trajectory's prefix with that seed gives the turn's tokens and
// log-probs bit for bit (fp32 and bf16 precision: batch invariance), which
// is what lets a remote server be sent one request per turn. And the
// answers' timing changes nothing: Turns sleeping a random while gives the
// same samples.
func TestTurnSeedContinuation(t *testing.T) {
	cfg := moeConfig()
	m := randomModel(cfg, 8)
	for _, p := range []Precision{FP32, BF16} {
		opt := Options{Precision: p, Slots: 3, MaxLen: 128, StepRows: 16}
		prompts := testPrompts(rand.New(rand.NewPCG(4, 4)), cfg.VocabSize, 4, 7)
		sp := Sampling{Temperature: 1, TopK: 9, MaxNewTokens: 5, Stop: []int32{1}, Seed: 21}
		run := func(sleep bool) []Sample {
			e, err := New(m, opt)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			out, err := e.GenerateTurns(prompts, 3, sp, &fakeTurns{vocab: cfg.VocabSize, turns: 3, obsLen: 2, sleep: sleep})
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
		a, b := run(false), run(true)
		sameSamples(t, a, b)
		for i, s := range a {
			if !slices.Equal(s.Observations, b[i].Observations) {
				t.Fatalf("%v sample %d: observations %v vs %v", p, i, s.Observations, b[i].Observations)
			}
			for k, o := range s.Observations {
				prefix := append(slices.Clone(prompts[s.Prompt]), s.Tokens[:o.End]...)
				end := len(s.Tokens)
				if k+1 < len(s.Observations) {
					end = s.Observations[k+1].Start
				}
				sp1 := sp
				sp1.Seed = TurnSeed(sp.Seed, s.Prompt, s.Index, k+1)
				one := generate(t, m, opt, nil, [][]int32{prefix}, 1, sp1)[0]
				if !slices.Equal(one.Tokens, s.Tokens[o.End:end]) {
					t.Fatalf("%v sample %d turn %d: %v, the one-request continuation %v", p, i, k+1, s.Tokens[o.End:end], one.Tokens)
				}
				for j, lp := range one.TruncLogProbs {
					if math.Float32bits(lp) != math.Float32bits(s.TruncLogProbs[o.End+j]) {
						t.Fatalf("%v sample %d turn %d token %d: log mu %g vs %g", p, i, k+1, j, s.TruncLogProbs[o.End+j], lp)
					}
				}
			}
		}
	}
}

// turnsFunc adapts a function to Turns.
type turnsFunc func(TurnEnd) ([]int32, bool, error)

func (f turnsFunc) Turn(t TurnEnd) ([]int32, bool, error) { return f(t) }

// An observation that does not fit the engine's MaxLen ends the sample
// ("length", nothing appended); Turns' errors and out-of-vocabulary
// observations stop the generation with an error naming the sample.
func TestTurnsLimitsAndErrors(t *testing.T) {
	cfg := denseConfig()
	m := randomModel(cfg, 2)
	prompts := testPrompts(rand.New(rand.NewPCG(5, 5)), cfg.VocabSize, 6)
	sp := Sampling{Temperature: 1, MaxNewTokens: 4, Seed: 3}
	e, err := New(m, Options{Precision: FP32, Slots: 2, MaxLen: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var rooms []int
	big := turnsFunc(func(te TurnEnd) ([]int32, bool, error) {
		rooms = append(rooms, te.Room)
		return make([]int32, te.Room), false, nil // one token too many
	})
	out, err := e.GenerateTurns(prompts, 1, sp, big)
	if err != nil {
		t.Fatal(err)
	}
	s := out[0]
	if s.Finish != "length" || s.Observations != nil || len(s.Tokens) != 4 || rooms[0] != 20-6-4 {
		t.Fatalf("finish %q, observations %v, %d tokens, room %v", s.Finish, s.Observations, len(s.Tokens), rooms)
	}
	// The episode's budget bounds the whole trajectory: a turn stops where
	// it runs out (Room 0 then), an observation must leave a token.
	var ends []TurnEnd
	two := turnsFunc(func(te TurnEnd) ([]int32, bool, error) {
		ends = append(ends, te)
		if te.Room == 0 {
			return nil, true, nil
		}
		return []int32{1, 2}, false, nil
	})
	spb := sp
	spb.EpisodeTokens = 7
	out, err = e.GenerateTurns(prompts, 1, spb, two)
	if err != nil {
		t.Fatal(err)
	}
	if s := out[0]; len(s.Tokens) != 7 || len(ends) != 2 || ends[0].Room != 3 || ends[1].Room != 0 || ends[1].Finish != "length" || len(s.Tokens)-len(ends[1].Response) != 0 {
		t.Fatalf("%d tokens, turn ends %+v", len(s.Tokens), ends)
	}
	fail := turnsFunc(func(TurnEnd) ([]int32, bool, error) { return nil, false, errors.New("env down") })
	if _, err := e.GenerateTurns(prompts, 2, sp, fail); err == nil || !strings.Contains(err.Error(), "env down") || !strings.Contains(err.Error(), "prompt 0") {
		t.Fatalf("err = %v", err)
	}
	bad := turnsFunc(func(TurnEnd) ([]int32, bool, error) { return []int32{int32(cfg.VocabSize)}, false, nil })
	if _, err := e.GenerateTurns(prompts, 1, sp, bad); err == nil || !strings.Contains(err.Error(), "vocabulary") {
		t.Fatalf("err = %v", err)
	}
	// The engine is still usable after the errors.
	if _, err := e.Generate(prompts, 2, sp); err != nil {
		t.Fatal(err)
	}
}

// Weights switched while samples wait for Turns (partial rollouts with an
// environment): every model token's log mu is that of the weights that
// sampled it given the whole sequence, as in GenerateSwitching, even for a
// sample admitted after the switch whose prompt another slot (waiting,
// with an old cache) holds: it must not copy that cache. Fewer slots than
// samples of the one prompt, and one sample's answer is slow.
func TestTurnsSwitchingWhileWaiting(t *testing.T) {
	cfg := moeConfig()
	old, neu := randomModel(cfg, 3), randomModel(cfg, 4)
	e, err := New(old, Options{Precision: Exact, Slots: 2, MaxLen: 96, StepRows: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.UpdateWeights(t.Context(), old, 7); err != nil {
		t.Fatal(err)
	}
	prompts := testPrompts(rand.New(rand.NewPCG(6, 6)), cfg.VocabSize, 9)
	// Sample 0's first answer waits for the switch to load; the other
	// first answers wait for sample 0 to be waiting: the switch comes
	// while sample 0 waits, before samples 2 and 3 are admitted.
	started, loaded := make(chan struct{}), make(chan struct{})
	slow := turnsFunc(func(te TurnEnd) ([]int32, bool, error) {
		if te.Turn >= 1 {
			return nil, true, nil
		}
		if te.Index == 0 {
			close(started)
			select {
			case <-loaded:
			case <-time.After(5 * time.Second):
				return nil, false, errors.New("the switch never loaded")
			}
		} else {
			<-started
		}
		return []int32{3, 4, 5}, false, nil
	})
	switched := false
	next := func() *Switch {
		select {
		case <-started:
			if !switched {
				switched = true
				return &Switch{Model: neu, Version: 8, Release: func(bool) { close(loaded) }}
			}
		default:
		}
		return nil
	}
	sp := Sampling{Temperature: 1, MaxNewTokens: 5, Seed: 2}
	samples, err := e.GenerateTurnsSwitching(prompts, 4, sp, slow, next)
	if err != nil {
		t.Fatal(err)
	}
	if !switched {
		t.Fatal("no switch happened")
	}
	oldEng, newEng := train.New(old), train.New(neu)
	fresh := 0
	for i, s := range samples {
		seq := append(slices.Clone(prompts[s.Prompt]), s.Tokens...)
		ro, err := oldEng.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true})
		if err != nil {
			t.Fatal(err)
		}
		rn, err := newEng.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true})
		if err != nil {
			t.Fatal(err)
		}
		obs := observed(len(s.Tokens), s.Observations)
		for j := range s.Tokens {
			if obs[j] {
				continue
			}
			v := s.Version
			if s.TokenVersions != nil {
				v = s.TokenVersions[j]
			}
			want := ro.LogProbs[0][len(prompts[0])-1+j]
			if v == 8 {
				want = rn.LogProbs[0][len(prompts[0])-1+j]
			}
			if math.Float32bits(s.LogProbs[j]) != math.Float32bits(want) {
				t.Fatalf("sample %d token %d (version %d): log mu %g, the training engine %g", i, j, v, s.LogProbs[j], want)
			}
		}
		if s.Version == 8 {
			fresh++
		}
	}
	if fresh == 0 {
		t.Fatal("no sample started after the switch")
	}
}

// Multi-turn episodes over a backend that draws the tokens itself
// (Drawer) are the batcher's own samples bit for bit: each turn's uniforms
// come from the turn's own stream, reseeded at its start, whether the
// batcher or the backend draws (full, truncated and with top log-probs).
func TestTurnsOverDrawer(t *testing.T) {
	cfg := moeConfig()
	m := randomModel(cfg, 9)
	prompts := testPrompts(rand.New(rand.NewPCG(5, 5)), cfg.VocabSize, 4, 7)
	ref, e, d := drawerPair(t, m, Options{Precision: FP8, Slots: 3, MaxLen: 96, StepRows: 16})
	for _, sp := range []Sampling{
		{Temperature: 1, MaxNewTokens: 6, Stop: []int32{1}, Seed: 3},
		{Temperature: 0.9, TopK: 7, TopP: 0.8, TopLogProbs: 2, MaxNewTokens: 5, Seed: 4},
	} {
		turns := func() Turns { return &fakeTurns{vocab: cfg.VocabSize, turns: 3, obsLen: 2} }
		want, err := ref.GenerateTurns(prompts, 2, sp, turns())
		if err != nil {
			t.Fatal(err)
		}
		before := d.drawn
		got, err := e.GenerateTurns(prompts, 2, sp, turns())
		if err != nil {
			t.Fatal(err)
		}
		identical(t, got, want)
		for i := range got {
			if !slices.Equal(got[i].Observations, want[i].Observations) || len(got[i].Observations) == 0 {
				t.Fatalf("%+v sample %d: observations %v, want %v", sp, i, got[i].Observations, want[i].Observations)
			}
		}
		if d.drawn == before {
			t.Fatalf("%+v: the backend drew no row", sp)
		}
	}
}
