package remotetest

import (
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/keel-rl/keel/rollout"
)

// SameSamples fails t unless a and b are the same samples bit for bit
// (indices, tokens, log-probs, truncated log-probs, routes, finish reason,
// weight version): what a remote rollout must give against the local
// engine's.
func SameSamples(t testing.TB, what string, a, b []rollout.Sample) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d samples vs %d", what, len(a), len(b))
	}
	bits := func(x []float32) []uint32 {
		if x == nil {
			return nil
		}
		out := make([]uint32, len(x))
		for i, v := range x {
			out[i] = math.Float32bits(v)
		}
		return out
	}
	for i := range a {
		x, y := &a[i], &b[i]
		switch {
		case x.Prompt != y.Prompt || x.Index != y.Index:
			t.Fatalf("%s: sample %d is (%d, %d) vs (%d, %d)", what, i, x.Prompt, x.Index, y.Prompt, y.Index)
		case !slices.Equal(x.Tokens, y.Tokens):
			t.Fatalf("%s: sample %d tokens %v vs %v", what, i, x.Tokens, y.Tokens)
		case !slices.Equal(bits(x.LogProbs), bits(y.LogProbs)):
			t.Fatalf("%s: sample %d log-probs %v vs %v", what, i, x.LogProbs, y.LogProbs)
		case !slices.Equal(bits(x.TruncLogProbs), bits(y.TruncLogProbs)):
			t.Fatalf("%s: sample %d truncated log-probs %v vs %v", what, i, x.TruncLogProbs, y.TruncLogProbs)
		case (x.Routes == nil) != (y.Routes == nil) || (x.Routes != nil && !x.Routes.Equal(y.Routes)):
			t.Fatalf("%s: sample %d routes differ", what, i)
		case x.Finish != y.Finish || x.Version != y.Version:
			t.Fatalf("%s: sample %d finish %s / version %d vs %s / %d", what, i, x.Finish, x.Version, y.Finish, y.Version)
		}
	}
}

// Events collects a client's events (its Options.Events), which arrive
// from several goroutines.
type Events struct {
	mu  sync.Mutex
	msg []string
}

// Add records one event: pass it as Options.Events.
func (e *Events) Add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.msg = append(e.msg, s)
}

// All returns the events so far, one per line.
func (e *Events) All() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.msg, "\n")
}
