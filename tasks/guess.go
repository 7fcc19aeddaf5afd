package tasks

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Guess is the verifier of the number-guessing game of the multi-turn
// environment "guess" (package env): "Guess my number from 1 to N." with
// the secret as the answer; the model says "Guess: K" and hears "higher"
// or "lower" until it finds it. A response is scored by its last guess.
// It is verify-only (no one-turn solutions: its demonstrations are whole
// episodes, keel data gen --style tool); GenerateGuess draws problems.
type Guess struct{}

func init() { registerVerifier(Guess{}) }

// Name implements Verifier.
func (Guess) Name() string { return "guess" }

// GuessRanges are the ranges 1..N of the difficulty levels: a bisection
// needs at most 3, 4, 5, 6, 7 guesses.
var GuessRanges = [MaxDifficulty]int{8, 16, 30, 60, 100}

// GenerateGuess draws a guessing game of difficulty d (clamped to
// 1..MaxDifficulty): a secret uniform in 1..GuessRanges[d-1].
func GenerateGuess(r *rand.Rand, d int) Problem {
	d = clampDifficulty(d)
	n := GuessRanges[d-1]
	secret := 1 + r.IntN(n)
	return Problem{Task: "guess", Difficulty: d, Prompt: fmt.Sprintf("Guess my number from 1 to %d.", n), Answer: strconv.Itoa(secret)}
}

// Score implements Verifier: 1 when the response's last guess is the
// secret.
func (Guess) Score(answer, response string) float64 {
	want, err := strconv.Atoi(strings.TrimSpace(answer))
	if err != nil {
		return 0
	}
	if got, ok := LastGuess(response); ok && got == want {
		return 1
	}
	return 0
}

// LastGuess returns the number of a response's last "Guess: K" (any
// letter case, spaces after the colon, an optional sign); ok is false when
// there is none.
func LastGuess(response string) (int, bool) {
	s := response
	for {
		i := lastIndexFold(s, "guess:")
		if i < 0 {
			return 0, false
		}
		rest := strings.TrimLeft(s[i+len("guess:"):], " \t")
		j := 0
		if j < len(rest) && (rest[j] == '-' || rest[j] == '+') {
			j++
		}
		for j < len(rest) && j < 12 && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if v, err := strconv.Atoi(rest[:j]); err == nil {
			return v, true
		}
		s = s[:i]
	}
}

// ParseGuessRange reads N from a guess prompt ("... from 1 to N ..."); ok
// is false when the prompt says no range.
func ParseGuessRange(prompt string) (int, bool) {
	i := strings.LastIndex(prompt, "from 1 to ")
	if i < 0 {
		return 0, false
	}
	rest := prompt[i+len("from 1 to "):]
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	n, err := strconv.Atoi(rest[:j])
	return n, err == nil && n >= 1
}
