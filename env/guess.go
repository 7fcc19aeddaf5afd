package env

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

// Guess is the "guess" environment, a game of finding a secret integer
// (the row's answer) from "higher" and "lower": a small multi-turn task
// whose best play (bisection) needs the feedback, for testing multi-turn
// RL end to end. The row's prompt states the game and the range.
//
// Each turn's guess is its last "Guess: N" (any letter case, spaces
// allowed after the colon, N an integer with an optional sign), read as
// the task's verifier reads it (tasks.LastGuess), so that the game and
// the verifier of task "guess" agree. The
// secret ends the episode with reward and correct 1; otherwise the
// environment answers one user message, "higher" (the secret is higher
// than the guess) or "lower", or "invalid: say Guess: N" for a turn with
// no guess, and a last turn that missed ends it with reward 0. Metrics
// per turn: guesses (1 for a turn with a guess) and invalid_turns (1 for
// one without).
func Guess() Environment { return guessEnv{} }

type guessEnv struct{}

// Start implements Environment: the row's answer must be an integer.
func (guessEnv) Start(_ context.Context, row *data.Example) (Episode, error) {
	secret, err := strconv.Atoi(strings.TrimSpace(row.Answer))
	if err != nil {
		return nil, fmt.Errorf("env guess: row %q: answer %q is not an integer (the secret number)", row.ID, row.Answer)
	}
	return &guessEpisode{secret: secret}, nil
}

type guessEpisode struct{ secret int }

// Step implements Episode.
func (ep *guessEpisode) Step(_ context.Context, turn Turn) (Reply, error) {
	g, ok := tasks.LastGuess(turn.Text)
	metrics := map[string]float64{"guesses": 1, "invalid_turns": 0}
	if !ok {
		metrics = map[string]float64{"guesses": 0, "invalid_turns": 1}
	}
	switch {
	case ok && g == ep.secret:
		return Reply{Done: true, Reward: 1, Correct: 1, Metrics: metrics}, nil
	case turn.Last:
		return Reply{Done: true, Metrics: metrics}, nil
	}
	say := "invalid: say Guess: N"
	switch {
	case ok && ep.secret > g:
		say = "higher"
	case ok:
		say = "lower"
	}
	return Reply{Messages: []tokenizer.Message{{Role: "user", Content: say}}, Metrics: metrics}, nil
}

// Close implements Episode: a game holds nothing.
func (ep *guessEpisode) Close() error { return nil }
