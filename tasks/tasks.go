// Package tasks generates verifiable problems for RL and supervised cold
// starts, writes reference solutions in several styles (the "teachers" of
// the paper's cold-start study), and scores responses: 1 when the final
// answer is right, 0 otherwise (a malformed response scores 0, never an
// error). Generation is deterministic for a seed.
//
// The families are sized for keel's tiny models (a character tokenizer,
// sequences of at most a few hundred tokens): prompts and solutions are
// compact printable ASCII.
package tasks

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
)

// Problem is one generated problem.
type Problem struct {
	Task       string // family name
	Difficulty int    // 1 (easiest) .. MaxDifficulty
	Prompt     string // the question shown to the model
	// Answer is the ground truth the verifier checks against (for
	// Countdown: "TARGET|n1,n2,..."); it is what data files store.
	Answer string
	// solve holds what the solution writer needs.
	solve any
}

// Styles of reference solutions.
const (
	Terse   = "terse"   // the answer line only
	Scratch = "scratch" // a verbose step-by-step scratchpad
	Chain   = "chain"   // one compact chain of intermediate results
)

// Styles lists the solution styles every task supports.
var Styles = []string{Terse, Scratch, Chain}

// MaxDifficulty is the hardest level of every family.
const MaxDifficulty = 5

// Task is one problem family.
type Task interface {
	// Name is the family's name (a data set's data_source).
	Name() string
	// Generate draws a problem of the given difficulty (1..MaxDifficulty).
	Generate(r *rand.Rand, difficulty int) Problem
	// Solve writes a reference solution in a style, ending with the
	// marked answer line "Answer: ...".
	Solve(p Problem, style string) string
	// Score returns 1 if response's final answer is right for the ground
	// truth answer, else 0. It never fails.
	Score(answer, response string) float64
}

var registry = map[string]Task{}

func register(t Task) { registry[t.Name()] = t }

// Get returns the task named name.
func Get(name string) (Task, error) {
	if t, ok := registry[name]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("unknown task %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Names lists the task families.
func Names() []string {
	var n []string
	for k := range registry {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Score scores response against the ground truth of the named task; an
// unknown task scores 0.
func Score(task, answer, response string) float64 {
	t, ok := registry[task]
	if !ok {
		return 0
	}
	return t.Score(answer, response)
}

// Generate draws a problem of task with difficulty d, checking the level.
func Generate(t Task, r *rand.Rand, d int) (Problem, error) {
	if d < 1 || d > MaxDifficulty {
		return Problem{}, fmt.Errorf("difficulty %d out of range [1, %d]", d, MaxDifficulty)
	}
	return t.Generate(r, d), nil
}

// CheckStyle reports an unknown style.
func CheckStyle(s string) error {
	for _, x := range Styles {
		if s == x {
			return nil
		}
	}
	return fmt.Errorf("unknown style %q (want %s)", s, strings.Join(Styles, ", "))
}

// FinalAnswer extracts the final answer of a response: the content of the
// last "Answer:" line or the last \boxed{...}, whichever comes later. ok
// is false when the response marks no answer.
func FinalAnswer(response string) (string, bool) {
	ans, at := "", -1
	if i := strings.LastIndex(response, "Answer:"); i >= 0 {
		line := response[i+len("Answer:"):]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		ans, at = line, i
	}
	if i := strings.LastIndex(response, `\boxed{`); i > at {
		rest := response[i+len(`\boxed{`):]
		depth := 1
		for j := 0; j < len(rest); j++ {
			switch rest[j] {
			case '{':
				depth++
			case '}':
				depth--
			}
			if depth == 0 {
				ans, at = rest[:j], i
				break
			}
		}
	}
	if at < 0 {
		return "", false
	}
	ans = strings.TrimSpace(ans)
	ans = strings.TrimSuffix(ans, ".")
	return strings.TrimSpace(ans), true
}

// parseInt reads a whole integer answer: optional sign, digits, optional
// thousands commas; nothing else.
func parseInt(s string) (int64, bool) {
	s = strings.ReplaceAll(strings.TrimSpace(s), ",", "")
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = strings.TrimSpace(s[1:])
	}
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// scoreInt is the verifier of the integer-answer families.
func scoreInt(answer, response string) float64 {
	want, ok := parseInt(answer)
	if !ok {
		return 0
	}
	got, ok := FinalAnswer(response)
	if !ok {
		return 0
	}
	if v, ok := parseInt(got); ok && v == want {
		return 1
	}
	return 0
}
