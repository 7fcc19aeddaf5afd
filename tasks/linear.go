package tasks

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Linear is solving a linear equation in x with an integer solution, in
// several steps (collect the x terms, move the constants, divide).
// Difficulty: 1 is x+b=c; 2 is ax+b=c; 3 allows negative numbers; 4 puts
// x on both sides (ax+b=cx+d); 5 does so with larger coefficients.
type Linear struct{}

func init() { register(Linear{}) }

// Name implements Task.
func (Linear) Name() string { return "linear" }

type linProblem struct{ a, b, c, d, x int64 } // a·x + b = c·x + d

func (p linProblem) lhs() string { return term(p.a, "x", true) + term(p.b, "", false) }
func (p linProblem) rhs() string {
	if p.c == 0 {
		return fmt.Sprint(p.d)
	}
	return term(p.c, "x", true) + term(p.d, "", false)
}

// term renders coefficient·name with its sign: first terms have no "+",
// a unit coefficient of x is omitted and a zero constant vanishes.
func term(v int64, name string, first bool) string {
	if v == 0 && name == "" {
		return ""
	}
	sign := "+"
	if v < 0 {
		sign, v = "-", -v
	}
	if first && sign == "+" {
		sign = ""
	}
	if name != "" && v == 1 {
		return sign + name
	}
	return sign + fmt.Sprint(v) + name
}

// Generate implements Task; a difficulty out of range is clamped.
func (Linear) Generate(r *rand.Rand, d int) Problem {
	d = clampDifficulty(d)
	rng := func(lo, hi int64) int64 { return lo + r.Int64N(hi-lo+1) }
	nonzero := func(lo, hi int64) int64 {
		for {
			if v := rng(lo, hi); v != 0 {
				return v
			}
		}
	}
	var p linProblem
	switch d {
	case 1:
		p = linProblem{a: 1, b: rng(1, 20), x: rng(0, 20)}
	case 2:
		p = linProblem{a: rng(2, 9), b: rng(0, 20), x: rng(0, 12)}
	case 3:
		p = linProblem{a: nonzero(-9, 9), b: rng(-20, 20), x: rng(-12, 12)}
	case 4:
		p = linProblem{c: nonzero(-5, 5), b: rng(-20, 20), x: rng(-10, 10)}
		p.a = p.c + nonzero(-6, 6)
	default:
		p = linProblem{c: nonzero(-12, 12), b: rng(-60, 60), x: rng(-25, 25)}
		p.a = p.c + nonzero(-12, 12)
	}
	if d >= 4 {
		p.d = (p.a-p.c)*p.x + p.b
	} else {
		p.d = p.a*p.x + p.b
	}
	return Problem{Task: "linear", Difficulty: d, Prompt: fmt.Sprintf("Solve %s=%s.", p.lhs(), p.rhs()),
		Answer: fmt.Sprint(p.x), solve: p}
}

// Solve implements Task.
func (Linear) Solve(pr Problem, style string) string {
	p, ok := solveData(pr).(linProblem)
	if !ok {
		return ""
	}
	ans := fmt.Sprintf("Answer: %d", p.x)
	if style == Terse {
		return ans
	}
	k := p.a - p.c     // coefficient after collecting x
	rhs := p.d - p.b   // constant after moving b
	var eqs []string   // the chain of equations
	var notes []string // what each step did
	if p.c != 0 {
		eqs = append(eqs, fmt.Sprintf("%s%s=%d", term(k, "x", true), term(p.b, "", false), p.d))
		notes = append(notes, "move the x terms left: "+term(p.a, "x", true)+term(-p.c, "x", false)+"="+term(k, "x", true))
	}
	if p.b != 0 {
		eqs = append(eqs, fmt.Sprintf("%s=%d", term(k, "x", true), rhs))
		notes = append(notes, fmt.Sprintf("move the constant right: %d%s=%d", p.d, term(-p.b, "", false), rhs))
	}
	if k != 1 {
		eqs = append(eqs, fmt.Sprintf("x=%d", p.x))
		notes = append(notes, fmt.Sprintf("divide by %d: %d/%d=%d", k, rhs, k, p.x))
	}
	if style == Chain {
		return p.lhs() + "=" + p.rhs() + " -> " + strings.Join(eqs, " -> ") + "\n" + ans
	}
	var b strings.Builder
	for i := range eqs {
		fmt.Fprintf(&b, "%s, so %s\n", notes[i], eqs[i])
	}
	return b.String() + ans
}

// Score implements Task: the final answer must be the integer x (or
// "x=VALUE").
func (Linear) Score(answer, response string) float64 {
	got, ok := FinalAnswer(response)
	if !ok {
		return 0
	}
	got = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(got), "x="))
	got = strings.TrimSpace(strings.TrimPrefix(got, "x ="))
	return scoreInt(answer, "Answer: "+got)
}
