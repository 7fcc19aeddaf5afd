package env

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

func user(s string) []tokenizer.Message { return []tokenizer.Message{{Role: "user", Content: s}} }

func TestGuessGame(t *testing.T) {
	ep := start(t, Guess(), &data.Example{Task: "guess", Prompt: "Guess my number in 1..100.", Answer: "37"})
	for i, c := range []struct {
		text string
		want Reply
	}{
		{"Guess: 50", Reply{Messages: user("lower"), Metrics: metrics("guesses", 1, "invalid_turns", 0)}},
		{"guess:20", Reply{Messages: user("higher"), Metrics: metrics("guesses", 1, "invalid_turns", 0)}},
		{"I am not sure.", Reply{Messages: user("invalid: say Guess: N"), Metrics: metrics("guesses", 0, "invalid_turns", 1)}},
		{"Guess: N", Reply{Messages: user("invalid: say Guess: N"), Metrics: metrics("guesses", 0, "invalid_turns", 1)}},
		{"Guess: 36 ... no. GUESS:   38", Reply{Messages: user("lower"), Metrics: metrics("guesses", 1, "invalid_turns", 0)}}, // the last guess counts
		{"Guess:\t37", Reply{Done: true, Reward: 1, Correct: 1, Metrics: metrics("guesses", 1, "invalid_turns", 0)}},
	} {
		if r := step(t, ep, Turn{Text: c.text, Index: i}); !reflect.DeepEqual(r, c.want) {
			t.Errorf("turn %d %q: %+v, want %+v", i, c.text, r, c.want)
		}
	}
}

func TestGuessLastTurn(t *testing.T) {
	row := &data.Example{Answer: "-5"}
	ep := start(t, Guess(), row)
	if r := step(t, ep, Turn{Text: "Guess: 3", Last: true}); !reflect.DeepEqual(r, Reply{Done: true, Metrics: metrics("guesses", 1, "invalid_turns", 0)}) {
		t.Errorf("a last miss: %+v, want done with reward 0", r)
	}
	ep = start(t, Guess(), row)
	if r := step(t, ep, Turn{Text: "nothing", Last: true}); !reflect.DeepEqual(r, Reply{Done: true, Metrics: metrics("guesses", 0, "invalid_turns", 1)}) {
		t.Errorf("a last invalid turn: %+v, want done with reward 0", r)
	}
	ep = start(t, Guess(), row)
	if r := step(t, ep, Turn{Text: "Guess: -5", Last: true}); !r.Done || r.Reward != 1 || r.Correct != 1 {
		t.Errorf("a last hit: %+v, want reward 1", r)
	}
	ep = start(t, Guess(), &data.Example{Answer: " +7 "})
	if r := step(t, ep, Turn{Text: "Guess: +7"}); !r.Done || r.Reward != 1 {
		t.Errorf("signed: %+v, want reward 1", r)
	}
	ep = start(t, Guess(), &data.Example{Answer: "7"})
	if r := step(t, ep, Turn{Text: "Guess: 123456789012345678901234567890"}); !reflect.DeepEqual(r.Messages, user("lower")) {
		t.Errorf("a huge guess: %+v, want lower", r)
	}
}

func TestGuessStartErrors(t *testing.T) {
	for _, answer := range []string{"", "abc", "1.5", "12 13", "0x10", "1e3"} {
		_, err := Guess().Start(context.Background(), &data.Example{ID: "row9", Answer: answer})
		if err == nil || !strings.Contains(err.Error(), `answer "`+answer+`" is not an integer`) || !strings.Contains(err.Error(), "row9") {
			t.Errorf("answer %q: %v, want an error naming the row and the answer", answer, err)
		}
	}
}

// TestGuessAgreesWithVerifier checks that a last turn's reward is the
// score that the verifier of task "guess" gives the same text.
func TestGuessAgreesWithVerifier(t *testing.T) {
	for _, text := range []string{"Guess: 12", "guess:12", "GUESS:  -12", "Guess: 12 Guess: 13", "Guess: 13 Guess: 12",
		"Guess: 12 then Guess: x", "Guess: x", "", "Guess:12.5", "Guess: +12", "guess:\t12"} {
		ep := start(t, Guess(), &data.Example{Task: "guess", Answer: "12"})
		r := step(t, ep, Turn{Text: text, Last: true})
		if s := tasks.Score("guess", "12", text); r.Reward != s {
			t.Errorf("%q: reward %g, the verifier scores %g", text, r.Reward, s)
		}
	}
}
