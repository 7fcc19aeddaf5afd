package tasks

import (
	"math/rand/v2"
	"testing"
)

func TestGuessScore(t *testing.T) {
	cases := []struct {
		resp string
		want float64
	}{
		{"Guess: 17", 1},
		{"guess:17", 1},
		{"Guess: 3\nGuess: 17", 1},
		{"Guess: 17\nGuess: 3", 0}, // the last guess counts
		{"Guess: 17 then guess: x", 1},
		{"Guess: 170", 0},
		{"17", 0},
		{"Answer: 17", 0},
		{"", 0},
	}
	for _, c := range cases {
		if got := Score("guess", "17", c.resp); got != c.want {
			t.Errorf("%q: %v, want %v", c.resp, got, c.want)
		}
	}
	if Score("guess", "x", "Guess: 1") != 0 {
		t.Error("a bad secret scored")
	}
}

func TestGenerateGuess(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for d := 1; d <= MaxDifficulty; d++ {
		for range 50 {
			p := GenerateGuess(r, d)
			n, ok := ParseGuessRange(p.Prompt)
			if !ok || n != GuessRanges[d-1] {
				t.Fatalf("%q: range %d, want %d", p.Prompt, n, GuessRanges[d-1])
			}
			if p.Score("Guess: "+p.Answer) != 1 {
				t.Fatalf("%q: its secret %s does not score", p.Prompt, p.Answer)
			}
		}
	}
	if _, ok := ParseGuessRange("Guess my number."); ok {
		t.Error("a range read from a prompt with none")
	}
}
