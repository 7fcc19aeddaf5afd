// Package tasks generates verifiable problems for RL and supervised cold
// starts, writes reference solutions in several styles (the "teachers" of
// the paper's cold-start study), and scores responses: 1 when the final
// answer is right, 0 otherwise (a malformed response scores 0, never an
// error). Generation is deterministic for a seed.
//
// The families are sized for keel's tiny models (a character tokenizer,
// sequences of at most a few hundred tokens): prompts and solutions are
// compact printable ASCII. Each has difficulty levels 1..5 (see the
// family's type for what a level means):
//
//	arithmetic  "Compute 4821+397."          answer "5218"
//	countdown   "Use 3 7 25 50 to make 104." answer "104|3,7,25,50"
//	linear      "Solve 8x+4=7x-21."          answer "-25"
//
// Solutions end with the marked line "Answer: ..."; verifiers also accept
// \boxed{...} and <answer>...</answer> (see FinalAnswer).
//
// Real data sets have verify-only verifiers (Verifier), selected by a
// row's task or verl's data_source (LookupVerifier):
//
//	math   MATH, MATH-500, DAPO-Math-17k, AIME, NuminaMath: LaTeX answers
//	       compared as a mathematician would (see mathVerifier)
//	gsm8k  GSM8K: one number after "####" (see gsm8kVerifier)
//
// Score dispatches to either kind; Extract reports the final answer a
// verifier reads, to audit its verdicts.
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

// Task is one problem family: a Verifier (its Name is a data set's
// data_source) that also generates problems and writes their solutions.
type Task interface {
	Verifier
	// Generate draws a problem of the given difficulty (1..MaxDifficulty).
	Generate(r *rand.Rand, difficulty int) Problem
	// Solve writes a reference solution in a style, ending with the
	// marked answer line "Answer: ...". A Problem that did not come from
	// Generate or Parse is rebuilt with Parse from its Prompt and Answer;
	// when that fails Solve gives "".
	Solve(p Problem, style string) string
}

var registry = map[string]Task{}

func register(t Task) { registry[t.Name()] = t }

// Get returns the generated family named name. A name that has only a
// verifier (math, gsm8k and their aliases) is an error saying so.
func Get(name string) (Task, error) {
	if t, ok := registry[name]; ok {
		return t, nil
	}
	if v, err := LookupVerifier(name); err == nil {
		return nil, fmt.Errorf("task %q has a verifier (%s) but no generator or solver (generated families: %s)", name, v.Name(), strings.Join(Names(), ", "))
	}
	return nil, fmt.Errorf("unknown task %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Names lists the generated task families (LookupVerifier accepts more
// names: VerifierNames).
func Names() []string {
	var n []string
	for k := range registry {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Score scores response against the ground truth of the named task, a
// generated family or a verify-only verifier (LookupVerifier); an unknown
// task scores 0.
func Score(task, answer, response string) float64 {
	v, err := LookupVerifier(task)
	if err != nil {
		return 0
	}
	return v.Score(answer, response)
}

// Generate draws a problem of task with difficulty d, checking the level.
func Generate(t Task, r *rand.Rand, d int) (Problem, error) {
	if d < 1 || d > MaxDifficulty {
		return Problem{}, fmt.Errorf("difficulty %d out of range [1, %d]", d, MaxDifficulty)
	}
	return t.Generate(r, d), nil
}

// solveData returns what Solve needs of p, rebuilding it with Parse when p
// was not generated here; nil when that fails.
func solveData(p Problem) any {
	if p.solve != nil {
		return p.solve
	}
	q, err := Parse(p.Task, p.Prompt, p.Answer)
	if err != nil {
		return nil
	}
	return q.solve
}

// clampDifficulty brings d into [1, MaxDifficulty].
func clampDifficulty(d int) int { return max(1, min(d, MaxDifficulty)) }

// CheckStyle reports an unknown style.
func CheckStyle(s string) error {
	for _, x := range Styles {
		if s == x {
			return nil
		}
	}
	return fmt.Errorf("unknown style %q (want %s)", s, strings.Join(Styles, ", "))
}

// FinalAnswer extracts the final answer of a response. Three markers are
// recognised, and the one that starts last in the response wins:
//
//   - an answer line: "Answer:" (any letter case, so "Final answer:" too),
//     the answer being the rest of that line;
//   - \boxed{...}, with balanced braces inside (an unclosed one is ignored);
//   - <answer>...</answer>, as R1-style and TinyZero prompts ask for.
//
// Surrounding spaces and one trailing period are removed. ok is false when
// the response marks no answer; a verifier then scores 0.
func FinalAnswer(response string) (string, bool) {
	ans, at := "", -1
	if i := lastIndexFold(response, "answer:"); i >= 0 {
		line := response[i+len("answer:"):]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		line, _, _ = strings.Cut(line, "</answer>") // "<answer>Answer: 5</answer>"
		ans, at = line, i
	}
	// The last closed \boxed{...}; a few unclosed ones after it are skipped
	// (bounded, so a pathological response stays linear).
	end := len(response)
	for try := 0; try < 8; try++ {
		i := strings.LastIndex(response[:end], `\boxed{`)
		if i <= at {
			break
		}
		if content, ok := braced(response[i+len(`\boxed{`):]); ok {
			ans, at = content, i
			break
		}
		end = i
	}
	if i := strings.LastIndex(response, "<answer>"); i > at {
		rest := response[i+len("<answer>"):]
		if j := strings.Index(rest, "</answer>"); j >= 0 {
			ans, at = rest[:j], i
		}
	}
	if at < 0 {
		return "", false
	}
	ans = strings.TrimSpace(ans)
	ans = strings.TrimSuffix(ans, ".")
	return strings.TrimSpace(ans), true
}

// braced returns the text before the '}' that closes an already opened
// brace, counting nested braces; ok is false when it never closes.
func braced(s string) (string, bool) {
	depth := 1
	for j := 0; j < len(s); j++ {
		switch s[j] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return s[:j], true
			}
		}
	}
	return "", false
}

// lastIndexFold is strings.LastIndex with ASCII letters matched in any
// case; lower must be lower-case ASCII.
func lastIndexFold(s, lower string) int {
	for i := len(s) - len(lower); i >= 0; i-- {
		match := true
		for k := 0; k < len(lower); k++ {
			c := s[i+k]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != lower[k] {
				match = false
				break
			}
		}
		if match {
			return i
		}
	}
	return -1
}

// parseInt reads a whole integer answer: an optional sign (a space may
// follow it), then digits, which may be grouped in thousands by commas
// ("12,345", not "1,2345"); nothing else. Values beyond 18 digits are
// rejected.
func parseInt(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg = s[0] == '-'
		s = strings.TrimSpace(s[1:])
	}
	if strings.Contains(s, ",") {
		groups := strings.Split(s, ",")
		for i, g := range groups {
			if len(g) == 0 || len(g) > 3 || (i > 0 && len(g) != 3) {
				return 0, false
			}
		}
		s = strings.Join(groups, "")
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

// Score scores response against p's ground truth with p's task verifier.
func (p Problem) Score(response string) float64 { return Score(p.Task, p.Answer, response) }
