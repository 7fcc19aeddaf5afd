package tasks

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Arithmetic is multi-digit addition, subtraction and multiplication with a
// worked solution by place values. Difficulty: 1 adds numbers of up to two
// digits; 2 adds or subtracts up to three digits; 3 up to four digits, or
// multiplies two digits by one; 4 up to five digits, or two digits by two;
// 5 up to six digits, or three digits by two. Operands are drawn with a
// uniform number of digits, so a subtraction may go below zero; the answer
// is the exact integer.
type Arithmetic struct{}

func init() { register(Arithmetic{}) }

// Name implements Task.
func (Arithmetic) Name() string { return "arithmetic" }

type arithProblem struct {
	a, b int64
	op   byte
}

func digits(r *rand.Rand, lo, hi int) int64 {
	n := lo + r.IntN(hi-lo+1)
	min := int64(1)
	for i := 1; i < n; i++ {
		min *= 10
	}
	if n == 1 {
		return int64(r.IntN(10))
	}
	return min + r.Int64N(9*min)
}

// Generate implements Task; a difficulty out of range is clamped.
func (Arithmetic) Generate(r *rand.Rand, d int) Problem {
	d = clampDifficulty(d)
	var p arithProblem
	mul := d >= 3 && r.IntN(3) == 0
	switch {
	case mul && d == 3:
		p = arithProblem{digits(r, 2, 2), digits(r, 1, 1), '*'}
	case mul && d == 4:
		p = arithProblem{digits(r, 2, 2), digits(r, 2, 2), '*'}
	case mul:
		p = arithProblem{digits(r, 3, 3), digits(r, 2, 2), '*'}
	default:
		hi := []int{2, 3, 4, 5, 6}[d-1]
		p = arithProblem{digits(r, 1, hi), digits(r, 1, hi), '+'}
		if d >= 2 && r.IntN(2) == 0 {
			p.op = '-'
		}
	}
	return Problem{Task: "arithmetic", Difficulty: d, Prompt: fmt.Sprintf("Compute %d%c%d.", p.a, p.op, p.b),
		Answer: fmt.Sprint(p.value()), solve: p}
}

func (p arithProblem) value() int64 {
	switch p.op {
	case '+':
		return p.a + p.b
	case '-':
		return p.a - p.b
	}
	return p.a * p.b
}

// placeValues splits n >= 0 into its non-zero place values, largest first
// (397 -> 300, 90, 7); 0 gives [0].
func placeValues(n int64) []int64 {
	var out []int64
	for pv := int64(1); n > 0; pv *= 10 {
		if d := n % 10; d != 0 {
			out = append([]int64{d * pv}, out...)
		}
		n /= 10
	}
	if len(out) == 0 {
		out = []int64{0}
	}
	return out
}

// Solve implements Task.
func (Arithmetic) Solve(pr Problem, style string) string {
	p, ok := solveData(pr).(arithProblem)
	if !ok {
		return ""
	}
	ans := fmt.Sprintf("Answer: %d", p.value())
	if style == Terse {
		return ans
	}
	parts := placeValues(p.b)
	var b strings.Builder
	if p.op == '*' {
		// a*b = a*b1 + a*b2 + ...
		var prods []string
		var terms []string
		var sum int64
		for _, v := range parts {
			prods = append(prods, fmt.Sprintf("%d*%d", p.a, v))
			terms = append(terms, fmt.Sprint(p.a*v))
			sum += p.a * v
		}
		if style == Chain {
			fmt.Fprintf(&b, "%d*%d = %s = %s = %d\n", p.a, p.b, strings.Join(prods, "+"), strings.Join(terms, "+"), sum)
		} else {
			for i, v := range parts {
				fmt.Fprintf(&b, "%d*%d = %s\n", p.a, v, terms[i])
			}
			if len(terms) > 1 {
				fmt.Fprintf(&b, "add them: %s = %d\n", strings.Join(terms, "+"), sum)
			}
		}
		return b.String() + ans
	}
	// a ± b by place values of b.
	acc := p.a
	if style == Chain {
		fmt.Fprintf(&b, "%d%c%d", p.a, p.op, p.b)
		for i, v := range parts {
			if p.op == '+' {
				acc += v
			} else {
				acc -= v
			}
			if i < len(parts)-1 {
				rest := int64(0)
				for _, w := range parts[i+1:] {
					rest += w
				}
				fmt.Fprintf(&b, " = %d%c%d", acc, p.op, rest)
			}
		}
		fmt.Fprintf(&b, " = %d\n", acc)
		return b.String() + ans
	}
	verb := "add"
	if p.op == '-' {
		verb = "subtract"
	}
	for _, v := range parts {
		prev := acc
		if p.op == '+' {
			acc += v
		} else {
			acc -= v
		}
		fmt.Fprintf(&b, "%s %d: %d%c%d = %d\n", verb, v, prev, p.op, v, acc)
	}
	return b.String() + ans
}

// Score implements Task: the final answer must be the exact integer.
func (Arithmetic) Score(answer, response string) float64 { return scoreInt(answer, response) }
