package tasks

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Countdown: reach a target from given numbers with + - * / and
// parentheses, each number used at most once. Difficulty: 1 uses three
// numbers up to 10 and a two-number solution; 2 three numbers up to 25;
// 3 four numbers up to 25; 4 four numbers, one of them 25, 50, 75 or 100;
// 5 five numbers (up to 25, one of the large ones). The reference solution
// combines 2, 3, 3, 4 and 4 of the numbers at levels 1 to 5; targets are
// in [2, 999] and never one of the numbers. Every generated instance is
// solvable: it is built from a random expression over the numbers (every
// intermediate result a positive integer), which is also the reference
// solution. The verifier evaluates the expression the model wrote (exact
// rational arithmetic), so any correct expression scores 1.
type Countdown struct{}

func init() { register(Countdown{}) }

// Name implements Task.
func (Countdown) Name() string { return "countdown" }

// cdStep is one operation of a solution: a op b = c.
type cdStep struct {
	a, b, c int64
	op      byte
}

type cdProblem struct {
	nums   []int64
	target int64
	steps  []cdStep
	expr   string // the solution, fully parenthesised
}

// Generate implements Task; a difficulty out of range is clamped.
func (Countdown) Generate(r *rand.Rand, d int) Problem {
	d = clampDifficulty(d)
	count := []int{3, 3, 4, 4, 5}[d-1]
	maxN := []int{10, 25, 25, 25, 25}[d-1]
	use := []int{2, 3, 3, 4, 4}[d-1]
	for {
		nums := make([]int64, count)
		for i := range nums {
			nums[i] = int64(1 + r.IntN(maxN))
		}
		if d >= 4 {
			nums[r.IntN(count)] = []int64{25, 50, 75, 100}[r.IntN(4)]
		}
		p, ok := cdBuild(r, nums, use)
		if !ok || p.target < 2 || p.target > 999 || containsInt(nums, p.target) {
			continue
		}
		parts := make([]string, len(nums))
		for i, n := range nums {
			parts[i] = fmt.Sprint(n)
		}
		return Problem{Task: "countdown", Difficulty: d,
			Prompt: fmt.Sprintf("Use %s to make %d.", strings.Join(parts, " "), p.target),
			Answer: fmt.Sprintf("%d|%s", p.target, strings.Join(parts, ",")), solve: p}
	}
}

func containsInt(xs []int64, v int64) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

// cdBuild combines `use` of the numbers, in a random order, with random
// operations whose intermediate results are positive integers.
func cdBuild(r *rand.Rand, nums []int64, use int) (cdProblem, bool) {
	order := r.Perm(len(nums))[:use]
	type val struct {
		v    int64
		expr string
		leaf bool
	}
	vals := make([]val, use)
	for i, j := range order {
		vals[i] = val{nums[j], fmt.Sprint(nums[j]), true}
	}
	p := cdProblem{nums: nums}
	for len(vals) > 1 {
		i := r.IntN(len(vals))
		j := r.IntN(len(vals) - 1)
		if j >= i {
			j++
		}
		a, b := vals[i], vals[j]
		var c int64
		var op byte
		for tries := 0; ; tries++ {
			if tries > 8 {
				return p, false
			}
			op = "+-*/"[r.IntN(4)]
			switch op {
			case '+':
				c = a.v + b.v
			case '-':
				c = a.v - b.v
			case '*':
				c = a.v * b.v
			case '/':
				if b.v == 0 || a.v%b.v != 0 {
					continue
				}
				c = a.v / b.v
			}
			if c > 0 && !(op == '*' && (a.v == 1 || b.v == 1)) && !(op == '/' && b.v == 1) {
				break
			}
		}
		wrap := func(x val) string {
			if x.leaf {
				return x.expr
			}
			return "(" + x.expr + ")"
		}
		p.steps = append(p.steps, cdStep{a.v, b.v, c, op})
		nv := val{c, wrap(a) + string(op) + wrap(b), false}
		rest := []val{nv}
		for k, x := range vals {
			if k != i && k != j {
				rest = append(rest, x)
			}
		}
		vals = rest
	}
	p.target, p.expr = vals[0].v, vals[0].expr
	return p, true
}

// Solve implements Task.
func (Countdown) Solve(pr Problem, style string) string {
	p, ok := solveData(pr).(cdProblem)
	if !ok {
		return ""
	}
	ans := "Answer: " + p.expr
	switch style {
	case Terse:
		return ans
	case Chain:
		var steps []string
		for _, s := range p.steps {
			steps = append(steps, fmt.Sprintf("%d%c%d=%d", s.a, s.op, s.b, s.c))
		}
		return strings.Join(steps, ", ") + "\n" + ans
	}
	var b strings.Builder
	for _, s := range p.steps {
		fmt.Fprintf(&b, "%d%c%d = %d\n", s.a, s.op, s.b, s.c)
	}
	return b.String() + ans
}

// Score implements Task: the final answer must be an expression over the
// given numbers (each used at most once) that evaluates exactly to the
// target. "EXPR = TARGET" is accepted too (with the right target). The
// ground truth is "TARGET|n1,n2,...".
func (Countdown) Score(answer, response string) float64 {
	tgt, list, ok := strings.Cut(answer, "|")
	if !ok {
		return 0
	}
	target, err := strconv.ParseInt(tgt, 10, 64)
	if err != nil {
		return 0
	}
	avail := map[int64]int{}
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return 0
		}
		avail[n]++
	}
	got, ok := FinalAnswer(response)
	if !ok {
		return 0
	}
	if lhs, rhs, found := strings.Cut(got, "="); found {
		if v, ok := parseInt(rhs); !ok || v != target {
			return 0
		}
		got = lhs
	}
	v, used, ok := evalExpr(got)
	if !ok || !v.IsInt() || v.Num().Cmp(big.NewInt(target)) != 0 {
		return 0
	}
	for _, n := range used {
		if avail[n] == 0 {
			return 0
		}
		avail[n]--
	}
	return 1
}

// evalExpr evaluates an arithmetic expression of non-negative integers,
// + - * / and parentheses with exact rationals, returning the numbers it
// used. ok is false for anything malformed, a division by zero or more
// than 64 numbers.
// Spaces and tabs are ignored.
func evalExpr(s string) (v *big.Rat, used []int64, ok bool) {
	e := &exprParser{s: strings.Join(strings.Fields(s), "")}
	v = e.sum(0)
	if e.pos != len(e.s) || e.bad {
		return nil, nil, false
	}
	return v, e.used, true
}

type exprParser struct {
	s    string
	pos  int
	used []int64
	bad  bool
}

func (e *exprParser) peek() byte {
	if e.pos < len(e.s) {
		return e.s[e.pos]
	}
	return 0
}

func (e *exprParser) sum(depth int) *big.Rat {
	v := e.product(depth)
	for !e.bad && (e.peek() == '+' || e.peek() == '-') {
		op := e.peek()
		e.pos++
		w := e.product(depth)
		if e.bad {
			break
		}
		if op == '+' {
			v.Add(v, w)
		} else {
			v.Sub(v, w)
		}
	}
	return v
}

func (e *exprParser) product(depth int) *big.Rat {
	v := e.atom(depth)
	for !e.bad && (e.peek() == '*' || e.peek() == '/') {
		op := e.peek()
		e.pos++
		w := e.atom(depth)
		if e.bad {
			break
		}
		if op == '*' {
			v.Mul(v, w)
		} else {
			if w.Sign() == 0 {
				e.bad = true
				break
			}
			v.Quo(v, w)
		}
	}
	return v
}

func (e *exprParser) atom(depth int) *big.Rat {
	if depth > 32 {
		e.bad = true
		return new(big.Rat)
	}
	if e.peek() == '(' {
		e.pos++
		v := e.sum(depth + 1)
		if e.peek() != ')' {
			e.bad = true
			return new(big.Rat)
		}
		e.pos++
		return v
	}
	start := e.pos
	for e.pos < len(e.s) && e.s[e.pos] >= '0' && e.s[e.pos] <= '9' {
		e.pos++
	}
	// At most 64 numbers of at most 9 digits: exact values stay small
	// however long the response.
	if e.pos == start || e.pos-start > 9 || len(e.used) >= 64 {
		e.bad = true
		return new(big.Rat)
	}
	n, _ := strconv.ParseInt(e.s[start:e.pos], 10, 64)
	e.used = append(e.used, n)
	return new(big.Rat).SetInt64(n)
}
