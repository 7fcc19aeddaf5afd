package env

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"unicode/utf8"
)

// Bounds of the calculator, so that a pathological expression fails fast.
const (
	maxExprLen    = 200 // bytes of an expression
	maxExprDigits = 40  // digits of one number
	maxExprDepth  = 32  // nesting of parentheses and unary minus signs
	maxExprResult = 100 // digits of any value's numerator and denominator
)

// exprLimit is 10^maxExprResult: every value computed stays below it.
var exprLimit = new(big.Int).Exp(big.NewInt(10), big.NewInt(maxExprResult), nil)

var calculatorSpec = ToolSpec{
	Name:        "calculator",
	Description: "Evaluate an arithmetic expression exactly.",
	Parameters: json.RawMessage(`{"type": "object", "properties": {"expression": {"type": "string", ` +
		`"description": "integers and decimals with + - * / and parentheses"}}, "required": ["expression"]}`),
}

// Calculator is the "calculator" tool: Calculate on the arguments
// {"expression": "..."} (a JSON number in place of the string is taken
// as its text).
func Calculator() Tool {
	return Tool{Spec: calculatorSpec, Call: func(_ context.Context, args json.RawMessage) (string, error) {
		expr, err := expressionArg(args)
		if err != nil {
			return "", err
		}
		return Calculate(expr)
	}}
}

// expressionArg reads the calculator's arguments object.
func expressionArg(args json.RawMessage) (string, error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(args, &m) != nil || m == nil {
		return "", fmt.Errorf(`arguments %s: want {"expression": "..."}`, head(args))
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != "expression" {
			return "", fmt.Errorf(`unknown argument %q (want "expression")`, k)
		}
	}
	raw, ok := m["expression"]
	if !ok {
		return "", errors.New(`missing argument "expression"`)
	}
	var s string
	if raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var n json.Number
	if raw[0] != 'n' && json.Unmarshal(raw, &n) == nil { // not null
		return n.String(), nil
	}
	return "", fmt.Errorf(`argument "expression" is %s, want a string`, head(raw))
}

// Calculate evaluates an arithmetic expression exactly: integers and
// decimals ("12", "0.5", ".5"), unary minus, + - * / with the usual
// precedence (left to right within one level) and parentheses, in
// rational arithmetic. The result is written so that copying it into a
// final answer scores with every verifier: an integer as plain digits
// ("-12"), a non-integer with a finite decimal expansion as that decimal
// ("2.5", "-0.125"), any other as a reduced fraction ("7/3", "-1/6").
//
// Errors, with a message for the model: a syntax error (naming the
// offset), division by zero, an expression over 200 bytes, a number over
// 40 digits, nesting over 32 deep, a value whose numerator or
// denominator reaches 100 digits.
func Calculate(expr string) (string, error) {
	if len(expr) > maxExprLen {
		return "", fmt.Errorf("expression longer than %d bytes", maxExprLen)
	}
	p := &exprParser{s: expr}
	v, err := p.sum()
	if err != nil {
		return "", err
	}
	p.space()
	if p.i < len(p.s) {
		return "", p.unexpected()
	}
	return formatRat(v), nil
}

// formatRat writes a value as Calculate returns it.
func formatRat(v *big.Rat) string {
	if v.IsInt() {
		return v.Num().String()
	}
	// A reduced fraction has a finite decimal expansion when its
	// denominator is 2^a 5^b; it then has max(a, b) decimals.
	d := new(big.Int).Set(v.Denom())
	twos := d.TrailingZeroBits()
	d.Rsh(d, twos)
	fives := uint(0)
	five, m := big.NewInt(5), new(big.Int)
	for {
		q, r := new(big.Int).QuoRem(d, five, m)
		if r.Sign() != 0 {
			break
		}
		d, fives = q, fives+1
	}
	if d.IsInt64() && d.Int64() == 1 {
		return v.FloatString(int(max(twos, fives)))
	}
	return v.String()
}

// exprParser is a recursive-descent parser that evaluates as it reads.
type exprParser struct {
	s     string
	i     int
	depth int
}

func (p *exprParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

// unexpected is the syntax error at the parser's position.
func (p *exprParser) unexpected() error {
	if p.i >= len(p.s) {
		return errors.New("unexpected end of expression")
	}
	r, _ := utf8.DecodeRuneInString(p.s[p.i:])
	return fmt.Errorf("unexpected %q at offset %d (use numbers, + - * / and parentheses)", r, p.i)
}

// sum reads term (('+' | '-') term)*.
func (p *exprParser) sum() (*big.Rat, error) {
	x, err := p.product()
	if err != nil {
		return nil, err
	}
	for {
		p.space()
		if p.i >= len(p.s) || (p.s[p.i] != '+' && p.s[p.i] != '-') {
			return x, nil
		}
		op := p.s[p.i]
		p.i++
		y, err := p.product()
		if err != nil {
			return nil, err
		}
		if op == '+' {
			x.Add(x, y)
		} else {
			x.Sub(x, y)
		}
		if err := checkSize(x); err != nil {
			return nil, err
		}
	}
}

// product reads unary (('*' | '/') unary)*.
func (p *exprParser) product() (*big.Rat, error) {
	x, err := p.unary()
	if err != nil {
		return nil, err
	}
	for {
		p.space()
		if p.i >= len(p.s) || (p.s[p.i] != '*' && p.s[p.i] != '/') {
			return x, nil
		}
		op := p.s[p.i]
		p.i++
		y, err := p.unary()
		if err != nil {
			return nil, err
		}
		if op == '*' {
			x.Mul(x, y)
		} else {
			if y.Sign() == 0 {
				return nil, errors.New("division by zero")
			}
			x.Quo(x, y)
		}
		if err := checkSize(x); err != nil {
			return nil, err
		}
	}
}

// unary reads '-' unary | primary.
func (p *exprParser) unary() (*big.Rat, error) {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == '-' {
		if err := p.enter(); err != nil {
			return nil, err
		}
		p.i++
		x, err := p.unary()
		if err != nil {
			return nil, err
		}
		p.depth--
		return x.Neg(x), nil
	}
	return p.primary()
}

// enter counts one level of nesting.
func (p *exprParser) enter() error {
	p.depth++
	if p.depth > maxExprDepth {
		return fmt.Errorf("expression nested more than %d deep", maxExprDepth)
	}
	return nil
}

// primary reads a number or '(' sum ')'.
func (p *exprParser) primary() (*big.Rat, error) {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == '(' {
		if err := p.enter(); err != nil {
			return nil, err
		}
		p.i++
		x, err := p.sum()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ')' {
			if p.i >= len(p.s) {
				return nil, errors.New("missing ')' at the end of the expression")
			}
			return nil, p.unexpected()
		}
		p.i++
		p.depth--
		return x, nil
	}
	return p.number()
}

// number reads digits ['.' digits] or '.' digits.
func (p *exprParser) number() (*big.Rat, error) {
	start := p.i
	digits := 0
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
		digits++
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		frac := 0
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
			frac++
		}
		if frac == 0 {
			p.i = start
			if digits == 0 {
				return nil, p.unexpected()
			}
			return nil, fmt.Errorf("a digit must follow '.' at offset %d", start+digits)
		}
		digits += frac
	}
	if digits == 0 {
		return nil, p.unexpected()
	}
	if digits > maxExprDigits {
		return nil, fmt.Errorf("number at offset %d longer than %d digits", start, maxExprDigits)
	}
	// "0" in front reads ".5" too; the text is digits with at most one
	// '.', which SetString always reads.
	x, _ := new(big.Rat).SetString("0" + p.s[start:p.i])
	return x, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// checkSize refuses a value whose numerator or denominator reaches
// 10^maxExprResult.
func checkSize(x *big.Rat) error {
	if x.Num().CmpAbs(exprLimit) >= 0 || x.Denom().Cmp(exprLimit) >= 0 {
		return fmt.Errorf("a value has more than %d digits", maxExprResult)
	}
	return nil
}
