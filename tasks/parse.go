package tasks

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Parse rebuilds a Problem from what a data file stores, its prompt and
// ground truth, so that Solve can write reference solutions for problems
// that were not generated here (a user's data set, say). It checks that the
// two agree:
//
//   - arithmetic: the prompt must be "Compute A+B." (or - or *) with
//     non-negative integers, the answer its value;
//   - linear: the prompt must be "Solve LHS=RHS." with terms like 3x, -x,
//     +7 on either side, the answer its integer solution;
//   - countdown: only the ground truth "TARGET|n1,n2,..." (at most 6
//     numbers) is read, and a solution is searched for (intermediate
//     results positive integers, as in the game); the prompt is kept as it
//     is.
//
// The difficulty of a parsed problem is unknown and left 0.
func Parse(task, prompt, answer string) (Problem, error) {
	p := Problem{Task: task, Prompt: prompt, Answer: answer}
	var err error
	switch task {
	case "arithmetic":
		p.solve, err = parseArith(prompt, answer)
	case "linear":
		p.solve, err = parseLinear(prompt, answer)
	case "countdown":
		p.solve, err = parseCountdown(answer)
	default:
		_, err = Get(task)
	}
	if err != nil {
		return Problem{}, fmt.Errorf("%s problem: %w", task, err)
	}
	return p, nil
}

// parseArith reads "Compute A op B.".
func parseArith(prompt, answer string) (arithProblem, error) {
	body, ok := strings.CutPrefix(strings.TrimSpace(prompt), "Compute ")
	if !ok {
		return arithProblem{}, fmt.Errorf(`prompt %q: want "Compute A+B."`, prompt)
	}
	body = strings.TrimSuffix(body, ".")
	i := strings.IndexAny(body, "+-*")
	if i <= 0 {
		return arithProblem{}, fmt.Errorf(`prompt %q: want "Compute A+B." (or - or *)`, prompt)
	}
	a, errA := strconv.ParseInt(body[:i], 10, 64)
	b, errB := strconv.ParseInt(body[i+1:], 10, 64)
	const limit = 1e9 // products stay exact
	if errA != nil || errB != nil || a < 0 || b < 0 || a > limit || b > limit {
		return arithProblem{}, fmt.Errorf("prompt %q: want two non-negative integers below 10^9", prompt)
	}
	p := arithProblem{a, b, body[i]}
	if err := agree(p.value(), answer); err != nil {
		return arithProblem{}, err
	}
	return p, nil
}

// agree checks that a ground truth is the integer want.
func agree(want int64, answer string) error {
	if v, ok := parseInt(answer); !ok || v != want {
		return fmt.Errorf("the prompt's answer is %d but the ground truth is %q", want, answer)
	}
	return nil
}

// parseLinear reads "Solve LHS=RHS.".
func parseLinear(prompt, answer string) (linProblem, error) {
	body, ok := strings.CutPrefix(strings.TrimSpace(prompt), "Solve ")
	if !ok {
		return linProblem{}, fmt.Errorf(`prompt %q: want "Solve 3x+1=x-5."`, prompt)
	}
	lhs, rhs, ok := strings.Cut(strings.TrimSuffix(body, "."), "=")
	if !ok {
		return linProblem{}, fmt.Errorf("prompt %q: no '='", prompt)
	}
	var p linProblem
	var err error
	if p.a, p.b, err = linearSide(lhs); err != nil {
		return linProblem{}, fmt.Errorf("prompt %q: %v", prompt, err)
	}
	if p.c, p.d, err = linearSide(rhs); err != nil {
		return linProblem{}, fmt.Errorf("prompt %q: %v", prompt, err)
	}
	k := p.a - p.c
	if k == 0 || (p.d-p.b)%k != 0 {
		return linProblem{}, fmt.Errorf("prompt %q: no unique integer solution", prompt)
	}
	p.x = (p.d - p.b) / k
	if err := agree(p.x, answer); err != nil {
		return linProblem{}, err
	}
	return p, nil
}

// linearSide sums the terms of one side: coef·x and constants, each at
// most 10^6 in size.
func linearSide(s string) (coef, konst int64, err error) {
	s = strings.Join(strings.Fields(s), "")
	if s == "" {
		return 0, 0, errors.New("an empty side")
	}
	for i := 0; i < len(s); {
		sign := int64(1)
		if s[i] == '+' || s[i] == '-' {
			if s[i] == '-' {
				sign = -1
			}
			i++
		} else if i > 0 {
			return 0, 0, fmt.Errorf("want + or - at %q", s[i:])
		}
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j-i > 6 {
			return 0, 0, fmt.Errorf("number too large at %q", s[i:])
		}
		n := int64(1)
		if j > i {
			n, _ = strconv.ParseInt(s[i:j], 10, 64)
		}
		switch {
		case j < len(s) && s[j] == 'x':
			coef += sign * n
			j++
		case j > i:
			konst += sign * n
		default:
			return 0, 0, fmt.Errorf("want a term at %q", s[i:])
		}
		i = j
	}
	return coef, konst, nil
}

// parseCountdown reads "TARGET|n1,n2,..." and searches for a solution.
func parseCountdown(answer string) (cdProblem, error) {
	tgt, list, ok := strings.Cut(answer, "|")
	target, err := strconv.ParseInt(strings.TrimSpace(tgt), 10, 64)
	if !ok || err != nil {
		return cdProblem{}, fmt.Errorf(`ground truth %q: want "TARGET|n1,n2,..."`, answer)
	}
	var nums []int64
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 1 || n > 1e6 {
			return cdProblem{}, fmt.Errorf("ground truth %q: numbers must be integers in [1, 10^6]", answer)
		}
		nums = append(nums, n)
	}
	if len(nums) > 6 {
		return cdProblem{}, fmt.Errorf("ground truth %q: at most 6 numbers", answer)
	}
	p, ok := cdSolve(nums, target)
	if !ok {
		return cdProblem{}, fmt.Errorf("ground truth %q: no solution", answer)
	}
	return p, nil
}

// cdVal is a number made so far: its value, expression and the steps that
// made it.
type cdVal struct {
	v     int64
	expr  string
	leaf  bool
	steps []cdStep
}

// cdSolve searches for a solution with the fewest operations: pairs of
// numbers are combined with + - * / while every intermediate result is a
// positive integer, as in the game. The search is exhaustive (a set of
// values already seen at a depth is not searched again), so no solution
// means there is none.
func cdSolve(nums []int64, target int64) (cdProblem, bool) {
	vals := make([]cdVal, len(nums))
	for i, n := range nums {
		vals[i] = cdVal{v: n, expr: strconv.FormatInt(n, 10), leaf: true}
		if n == target {
			return cdProblem{nums: nums, target: target, expr: vals[i].expr}, true
		}
	}
	for ops := 1; ops < len(nums); ops++ {
		seen := map[string]bool{}
		if v, ok := cdSearch(vals, target, ops, seen); ok {
			return cdProblem{nums: nums, target: target, steps: v.steps, expr: v.expr}, true
		}
	}
	return cdProblem{}, false
}

// cdSearch combines pairs of vals at most ops times until one equals the
// target.
func cdSearch(vals []cdVal, target int64, ops int, seen map[string]bool) (cdVal, bool) {
	if ops == 0 {
		return cdVal{}, false
	}
	key := make([]int64, len(vals))
	for i, v := range vals {
		key[i] = v.v
	}
	slices.Sort(key)
	k := fmt.Sprint(ops, key)
	if seen[k] {
		return cdVal{}, false
	}
	seen[k] = true
	wrap := func(x cdVal) string {
		if x.leaf {
			return x.expr
		}
		return "(" + x.expr + ")"
	}
	for i := range vals {
		for j := range vals {
			if i == j {
				continue
			}
			a, b := vals[i], vals[j]
			for _, op := range []byte("+-*/") {
				var c int64
				switch op {
				case '+':
					if i > j {
						continue // commutative: one order is enough
					}
					c = a.v + b.v
				case '-':
					c = a.v - b.v
				case '*':
					if i > j {
						continue
					}
					c = a.v * b.v
				case '/':
					if a.v%b.v != 0 {
						continue
					}
					c = a.v / b.v
				}
				if c <= 0 || c > 1e12 {
					continue
				}
				steps := append(append(slices.Clip(a.steps), b.steps...), cdStep{a.v, b.v, c, op})
				nv := cdVal{v: c, expr: wrap(a) + string(op) + wrap(b), steps: steps}
				if c == target {
					return nv, true
				}
				rest := []cdVal{nv}
				for k, x := range vals {
					if k != i && k != j {
						rest = append(rest, x)
					}
				}
				if v, ok := cdSearch(rest, target, ops-1, seen); ok {
					return v, true
				}
			}
		}
	}
	return cdVal{}, false
}
