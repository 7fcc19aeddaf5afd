package data

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/tasks"
)

// GenSpec describes a generated data set.
type GenSpec struct {
	Tasks        []string // task families, drawn in turn
	N            int      // examples
	Difficulties []int    // drawn uniformly per example
	Styles       []string // solution styles, drawn uniformly; nil: no responses
	Seed         uint64
}

// Generate draws a data set: example i uses task Tasks[i mod len], a
// random difficulty and style, and its own random stream (seed, i), so the
// same spec gives the same file and a larger N extends a smaller one.
// Besides the task families, "guess" draws guessing games
// (tasks.GenerateGuess), without solutions.
func Generate(s GenSpec) ([]Example, error) {
	if s.N < 1 {
		return nil, fmt.Errorf("n = %d, want >= 1", s.N)
	}
	if len(s.Tasks) == 0 || len(s.Difficulties) == 0 {
		return nil, fmt.Errorf("no tasks or difficulties")
	}
	ts := make([]tasks.Task, len(s.Tasks)) // nil for the guessing game
	for i, n := range s.Tasks {
		if n == "guess" {
			if len(s.Styles) > 0 {
				return nil, fmt.Errorf("task guess: a game has no one-turn solutions (its demonstrations are episodes: style tool)")
			}
			continue
		}
		t, err := tasks.Get(n)
		if err != nil {
			return nil, err
		}
		ts[i] = t
	}
	for _, d := range s.Difficulties {
		if d < 1 || d > tasks.MaxDifficulty {
			return nil, fmt.Errorf("difficulty %d out of range [1, %d]", d, tasks.MaxDifficulty)
		}
	}
	for _, st := range s.Styles {
		if err := tasks.CheckStyle(st); err != nil {
			return nil, err
		}
	}
	out := make([]Example, s.N)
	for i := range out {
		r := rand.New(rand.NewPCG(s.Seed, uint64(i)))
		t := ts[i%len(ts)]
		d := s.Difficulties[r.IntN(len(s.Difficulties))]
		var p tasks.Problem
		if t == nil {
			p = tasks.GenerateGuess(r, d)
		} else {
			p = t.Generate(r, d)
		}
		e := Example{Task: p.Task, Difficulty: d, Prompt: p.Prompt, Answer: p.Answer}
		if len(s.Styles) > 0 {
			e.Style = s.Styles[r.IntN(len(s.Styles))]
			e.Response = t.Solve(p, e.Style)
		}
		out[i] = e
	}
	return out, nil
}

// AddResponses writes a reference solution into every example that has
// none, in a style drawn per example from styles with its own random stream
// (seed, row), so the result is reproducible. The problems are rebuilt from
// their prompt and ground truth with tasks.Parse: a chat prompt's last user
// message is used as the prompt (a Countdown needs only its ground truth).
// A row that does not parse is an error naming the row (counted from 0)
// unless skip is set, when it is dropped; the rows kept are returned.
func AddResponses(ex []Example, styles []string, seed uint64, skip bool) ([]Example, error) {
	if len(styles) == 0 {
		return nil, fmt.Errorf("no styles")
	}
	for _, st := range styles {
		if err := tasks.CheckStyle(st); err != nil {
			return nil, err
		}
	}
	out := make([]Example, 0, len(ex))
	for i, e := range ex {
		if e.Response != "" {
			out = append(out, e)
			continue
		}
		t, err := tasks.Get(e.Task)
		if err != nil {
			if skip {
				continue
			}
			return nil, fmt.Errorf("row %d: %v", i, err)
		}
		prompt := e.Prompt
		for _, m := range e.Messages {
			if m.Role == "user" {
				prompt = m.Content
			}
		}
		p, err := tasks.Parse(e.Task, prompt, e.Answer)
		if err != nil {
			if skip {
				continue
			}
			return nil, fmt.Errorf("row %d: %v", i, err)
		}
		r := rand.New(rand.NewPCG(seed, uint64(i)))
		e.Style = styles[r.IntN(len(styles))]
		e.Response = t.Solve(p, e.Style)
		out = append(out, e)
	}
	return out, nil
}

// ParseDifficulties reads "3", "1-3" or "1,2,5"; every level must be in
// [1, tasks.MaxDifficulty].
func ParseDifficulties(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("difficulty %q: want N, N-M or a comma list", f)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("difficulty %q: want N, N-M or a comma list", f)
			}
		}
		for _, d := range []int{a, b} {
			if d < 1 || d > tasks.MaxDifficulty {
				return nil, fmt.Errorf("difficulty %d out of range [1, %d]", d, tasks.MaxDifficulty)
			}
		}
		for d := a; d <= b; d++ {
			out = append(out, d)
		}
	}
	return out, nil
}

// ParseStyles reads a comma list of styles, or "mixed" for all of them.
func ParseStyles(s string) ([]string, error) {
	if s == "mixed" || s == "all" {
		return append([]string(nil), tasks.Styles...), nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if err := tasks.CheckStyle(f); err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}
