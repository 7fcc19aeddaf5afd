package tasks

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"unicode/utf8"
)

// This file is the math verifier's expression parser and evaluator: a
// small recursive-descent parser for the LaTeX and plain-text notation of
// final answers (+ - * / ^, implicit multiplication, \frac, \sqrt, \cdot,
// \times, parentheses, |x|, n!, \pi, functions, variables) into a tree of
// values (numbers, tuples, intervals, sets, matrices), and an evaluator
// that computes exact rationals where it can (big.Rat of bounded size) and
// float64 otherwise. Every token read and every node evaluated spends one
// step of a budget, so a pathological answer fails instead of hanging.

// errBudget and errSyntax make an answer unreadable (it then scores 0).
var (
	errBudget = errors.New("step budget spent")
	errSyntax = errors.New("syntax")
)

// budget counts the steps left for one scoring call.
type budget struct{ left int }

func (b *budget) spend(n int) error {
	b.left -= n
	if b.left < 0 {
		return errBudget
	}
	return nil
}

// Bounds of the exact arithmetic.
const (
	maxRatBits  = 1 << 16 // a rational beyond this many bits is undefined
	maxDepth    = 64      // nesting of brackets and operators in an answer
	maxFactArg  = 1000    // n! beyond this is undefined
	maxExactExp = 1 << 16 // |exponent| of exact integer powers
)

// token kinds.
const (
	tEOF    = iota
	tNum    // digits with an optional decimal point: "12", "0.5", ".5"
	tLetter // one ASCII letter: a variable
	tWord   // two or more ASCII letters: a function, a constant or a word
	tCmd    // a LaTeX command: "\frac" (s holds "frac")
	tSym    // one symbol: + - * / ^ _ ( ) [ ] { } , ; | ! ' : & = < > ≤ ≥ ≠, "\{" "\}" "\\"
)

type token struct {
	kind  int
	s     string
	space bool // whitespace came before the token
}

// lex splits a cleaned answer into tokens.
func lex(s string, b *budget) ([]token, error) {
	var out []token
	space := false
	for i := 0; i < len(s); {
		if err := b.spend(1); err != nil {
			return nil, err
		}
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			space = true
			i++
			continue
		case isDigit(c) || (c == '.' && i+1 < len(s) && isDigit(s[i+1])):
			j := i
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			if j < len(s) && s[j] == '.' && j+1 < len(s) && isDigit(s[j+1]) {
				j++
				for j < len(s) && isDigit(s[j]) {
					j++
				}
			}
			out = append(out, token{tNum, s[i:j], space})
			i = j
		case isLetter(c):
			j := i
			for j < len(s) && isLetter(s[j]) {
				j++
			}
			kind := tWord
			if j-i == 1 {
				kind = tLetter
			}
			out = append(out, token{kind, s[i:j], space})
			i = j
		case c == '\\':
			j := i + 1
			for j < len(s) && isLetter(s[j]) {
				j++
			}
			switch {
			case j > i+1:
				out = append(out, token{tCmd, s[i+1 : j], space})
				i = j
			case i+1 < len(s) && (s[i+1] == '{' || s[i+1] == '}' || s[i+1] == '\\'):
				out = append(out, token{tSym, s[i : i+2], space})
				i += 2
			default:
				return nil, errSyntax
			}
		default:
			r, n := utf8.DecodeRuneInString(s[i:])
			switch r {
			case '+', '-', '*', '/', '^', '_', '(', ')', '[', ']', '{', '}', ',', ';', '|', '!', '\'', ':', '&', '=', '<', '>', '≤', '≥', '≠':
				out = append(out, token{tSym, s[i : i+n], space})
			default:
				return nil, errSyntax
			}
			i += n
		}
		space = false
	}
	return append(out, token{kind: tEOF}), nil
}

func isDigit(c byte) bool  { return '0' <= c && c <= '9' }
func isLetter(c byte) bool { return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') }

// Node kinds of a parsed answer. An expression is a tree of kNum ..
// kFunc nodes; the others are structures of expressions.
const (
	kNum    = iota // val
	kVar           // name
	kPi            // π
	kInf           // +∞
	kAdd           // args summed
	kMul           // args multiplied
	kDiv           // args[0] / args[1]
	kPow           // args[0] ^ args[1]
	kNeg           // -args[0]
	kFunc          // name(args[0]); log with a base: args[1] is the base
	kFact          // args[0]!
	kAbs           // |args[0]|
	kPM            // args[0] ± args[1] (args[0] nil: ±args[1]); expanded before use
	kSeq           // bracketed: open, close, args (a tuple, an interval, a set with open "{")
	kMatrix        // rows of args: args are kSeq rows with open "m"
	kUnion         // args joined by \cup
	kList          // a list of answers (unordered)
	kRel           // relation: args are the sides, ops between them
	kText          // a text answer: name holds its canonical text
)

// node is a parsed answer or part of one.
type node struct {
	kind        int
	val         *big.Rat
	name        string
	args        []*node
	open, close string   // kSeq brackets
	ops         []string // kRel operators: "=", "<", "≤", ">", "≥", "≠"
	pct         bool     // a percentage: the value is also read as val/100
	dec         bool     // kNum: a decimal literal with a point ("0.0833")
	label       string   // what "x = 3" named (x), compared when both sides have one
	labelVar    *node    // the label when it is one variable
}

func (n *node) isExpr() bool { return n.kind <= kPM }

// parser reads one side of an answer (no top-level relation or list).
type parser struct {
	toks  []token
	pos   int
	depth int
	b     *budget
}

func (p *parser) peek() token { return p.toks[p.pos] }

func (p *parser) next() token {
	t := p.toks[p.pos]
	if p.pos < len(p.toks)-1 {
		p.pos++
	}
	return t
}

func (p *parser) isSym(s string) bool {
	t := p.peek()
	return t.kind == tSym && t.s == s
}

func (p *parser) isCmd(s string) bool {
	t := p.peek()
	return t.kind == tCmd && t.s == s
}

func (p *parser) expect(s string) error {
	if !p.isSym(s) {
		return errSyntax
	}
	p.next()
	return nil
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxDepth {
		return errSyntax
	}
	return p.b.spend(1)
}

func (p *parser) leave() { p.depth-- }

// parseExpr parses a whole side: the tokens must all be used.
func parseExpr(s string, b *budget) (*node, error) {
	toks, err := lex(s, b)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks, b: b}
	n, err := p.union()
	if err != nil {
		return nil, err
	}
	if p.peek().kind != tEOF {
		return nil, errSyntax
	}
	return n, nil
}

// union := sum (\cup sum)*
func (p *parser) union() (*node, error) {
	n, err := p.sum()
	if err != nil || !p.isCmd("cup") {
		return n, err
	}
	u := &node{kind: kUnion, args: []*node{n}}
	for p.isCmd("cup") {
		p.next()
		m, err := p.sum()
		if err != nil {
			return nil, err
		}
		u.args = append(u.args, m)
	}
	for _, a := range u.args {
		if a.kind != kSeq && a.kind != kUnion {
			return nil, errSyntax
		}
	}
	return u, nil
}

// sum := [sign] term (sign term)*, sign one of + - ±
func (p *parser) sum() (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	var n *node
	switch {
	case p.isSym("+"):
		p.next()
	case p.isSym("-"):
		p.next()
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		n = neg(t)
	case p.isCmd("pm"):
		p.next()
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		n = &node{kind: kPM, args: []*node{nil, t}}
	}
	if n == nil {
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		n = t
	}
	for {
		var op string
		switch {
		case p.isSym("+"), p.isSym("-"):
			op = p.next().s
		case p.isCmd("pm"):
			p.next()
			op = "pm"
		default:
			return n, nil
		}
		t, err := p.term()
		if err != nil {
			return nil, err
		}
		if !n.isExpr() || !t.isExpr() {
			return nil, errSyntax
		}
		switch op {
		case "+":
			n = add(n, t)
		case "-":
			n = add(n, neg(t))
		default:
			n = &node{kind: kPM, args: []*node{n, t}}
		}
	}
}

func neg(n *node) *node { return &node{kind: kNeg, args: []*node{n}} }

func add(a, b *node) *node {
	if a.kind == kAdd {
		return &node{kind: kAdd, args: append(append([]*node(nil), a.args...), b)}
	}
	return &node{kind: kAdd, args: []*node{a, b}}
}

func mul(a, b *node) *node {
	if a.kind == kMul {
		return &node{kind: kMul, args: append(append([]*node(nil), a.args...), b)}
	}
	return &node{kind: kMul, args: []*node{a, b}}
}

// startsAtom reports whether the next token can begin a factor that is
// multiplied implicitly ("2x", "x(y+1)", "2\pi", "\sqrt2\sqrt3").
func (p *parser) startsAtom() bool {
	t := p.peek()
	switch t.kind {
	case tNum, tLetter, tWord:
		return true
	case tCmd:
		switch t.s {
		case "pm", "mp", "cup", "cap", "in", "setminus", "rfloor", "rceil", "end", "rangle":
			return false
		}
		return true
	case tSym:
		return t.s == "("
	}
	return false
}

// term := unary ((* | / | implicit) unary)*
func (p *parser) term() (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	first := p.peek()
	n, err := p.unary()
	if err != nil {
		return nil, err
	}
	// A mixed number "3 1/2" (an integer, a space, a fraction of integers).
	if first.kind == tNum && n.kind == kNum && n.val.IsInt() && !strings.Contains(first.s, ".") {
		if t := p.peek(); t.kind == tNum && t.space && !strings.Contains(t.s, ".") &&
			p.toks[p.pos+1].kind == tSym && p.toks[p.pos+1].s == "/" && p.toks[p.pos+2].kind == tNum &&
			!strings.Contains(p.toks[p.pos+2].s, ".") {
			num, _ := new(big.Rat).SetString(p.next().s)
			p.next()
			den, _ := new(big.Rat).SetString(p.next().s)
			if den.Sign() == 0 {
				return nil, errSyntax
			}
			n = &node{kind: kNum, val: new(big.Rat).Add(n.val, num.Quo(num, den))}
		}
	}
	for {
		var op string
		switch {
		case p.isSym("*"), p.isSym("/"):
			op = p.next().s
		case p.startsAtom():
			// Two numbers side by side ("2 3") are not a product.
			if p.peek().kind == tNum && p.pos > 0 && p.toks[p.pos-1].kind == tNum {
				return nil, errSyntax
			}
			op = "*"
		default:
			return n, nil
		}
		f, err := p.unary()
		if err != nil {
			return nil, err
		}
		if !n.isExpr() || !f.isExpr() {
			return nil, errSyntax
		}
		if op == "*" {
			n = mul(n, f)
		} else {
			n = &node{kind: kDiv, args: []*node{n, f}}
		}
	}
}

// unary := - unary | + unary | power
func (p *parser) unary() (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	if p.isSym("-") {
		p.next()
		n, err := p.unary()
		if err != nil {
			return nil, err
		}
		return neg(n), nil
	}
	if p.isSym("+") {
		p.next()
		return p.unary()
	}
	return p.power()
}

// power := postfix [^ exponent]; the exponent binds to the right
// ("2^3^2" = 2^9).
func (p *parser) power() (*node, error) {
	n, err := p.postfix()
	if err != nil {
		return nil, err
	}
	if !p.isSym("^") {
		return n, nil
	}
	p.next()
	e, err := p.exponent()
	if err != nil {
		return nil, err
	}
	if !n.isExpr() || !e.isExpr() {
		return nil, errSyntax
	}
	return &node{kind: kPow, args: []*node{n, e}}, nil
}

// exponent reads what follows ^: a braced group, a parenthesised one, a
// sign and an exponent, or one character or command ("x^23" is x^2*3 in
// LaTeX).
func (p *parser) exponent() (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	switch {
	case p.isSym("{"):
		return p.group("{", "}")
	case p.isSym("("):
		return p.group("(", ")")
	case p.isSym("-"):
		p.next()
		e, err := p.exponent()
		if err != nil {
			return nil, err
		}
		return neg(e), nil
	case p.peek().kind == tNum:
		// "2^10" is 1024: plain-text exponents are whole numbers.
		return p.atom()
	}
	return p.single()
}

// single reads one LaTeX argument without braces: one digit, one letter
// or one command atom ("\frac12", "\sqrt3", "x^2").
func (p *parser) single() (*node, error) {
	t := p.peek()
	switch t.kind {
	case tNum:
		if t.s[0] == '.' {
			return nil, errSyntax
		}
		p.next()
		v, _ := new(big.Rat).SetString(t.s[:1])
		if len(t.s) > 1 {
			// Put the rest back as a number token of its own.
			p.pos--
			p.toks[p.pos] = token{tNum, t.s[1:], false}
		}
		return &node{kind: kNum, val: v}, nil
	case tLetter:
		p.next()
		return &node{kind: kVar, name: t.s}, nil
	case tWord:
		p.next()
		p.pos--
		p.toks[p.pos] = token{tWord, t.s[1:], false}
		if len(t.s) == 2 {
			p.toks[p.pos].kind = tLetter
		}
		return &node{kind: kVar, name: t.s[:1]}, nil
	case tCmd:
		return p.atom()
	}
	return nil, errSyntax
}

// arg reads a LaTeX argument: {group} or a single token.
func (p *parser) arg() (*node, error) {
	if p.isSym("{") {
		return p.group("{", "}")
	}
	return p.single()
}

// group reads open side close, where side is one expression.
func (p *parser) group(open, close string) (*node, error) {
	if err := p.expect(open); err != nil {
		return nil, err
	}
	n, err := p.sum()
	if err != nil {
		return nil, err
	}
	if err := p.expect(close); err != nil {
		return nil, err
	}
	if !n.isExpr() {
		return nil, errSyntax
	}
	return n, nil
}

// postfix := atom (! | ')*
func (p *parser) postfix() (*node, error) {
	n, err := p.atom()
	if err != nil {
		return nil, err
	}
	for p.isSym("!") {
		if p.toks[p.pos+1].kind == tSym && p.toks[p.pos+1].s == "=" {
			return n, nil // "!=" is a relation
		}
		p.next()
		if !n.isExpr() {
			return nil, errSyntax
		}
		n = &node{kind: kFact, args: []*node{n}}
	}
	return n, nil
}

// Functions of one argument that answers use; log without a base is
// log10, ln natural.
var mathFuncs = map[string]bool{
	"sin": true, "cos": true, "tan": true, "sec": true, "csc": true, "cot": true,
	"arcsin": true, "arccos": true, "arctan": true, "sinh": true, "cosh": true, "tanh": true,
	"ln": true, "log": true, "exp": true,
}

// greek letters are variables (\pi is the constant).
var greek = map[string]bool{
	"alpha": true, "beta": true, "gamma": true, "delta": true, "epsilon": true, "varepsilon": true,
	"zeta": true, "eta": true, "theta": true, "vartheta": true, "iota": true, "kappa": true,
	"lambda": true, "mu": true, "nu": true, "xi": true, "rho": true, "sigma": true, "tau": true,
	"upsilon": true, "phi": true, "varphi": true, "chi": true, "psi": true, "omega": true,
	"Gamma": true, "Delta": true, "Theta": true, "Lambda": true, "Xi": true, "Sigma": true,
	"Phi": true, "Psi": true, "Omega": true,
}

// atom reads a number, a variable, a constant, a function application, a
// LaTeX construct or a bracketed group (a tuple, an interval, a set).
func (p *parser) atom() (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	t := p.peek()
	switch t.kind {
	case tNum:
		return p.number(t)
	case tLetter:
		p.next()
		return p.subscripted(t.s)
	case tWord:
		return p.word(t)
	case tCmd:
		return p.command(t)
	case tSym:
		return p.symbol(t)
	}
	return nil, errSyntax
}

// number reads a number token, or a mixed number "2\frac{1}{2}".
func (p *parser) number(t token) (*node, error) {
	p.next()
	v, ok := new(big.Rat).SetString(t.s)
	if !ok {
		return nil, errSyntax
	}
	if p.isSym("_") {
		return nil, errSyntax // a base-b numeral "204_5": compared as text only
	}
	// A mixed number "2\frac{1}{2}" = 5/2.
	if !strings.Contains(t.s, ".") && p.isCmd("frac") {
		save := p.pos
		p.next()
		if num, den, ok := p.intFrac(); ok {
			return &node{kind: kNum, val: v.Add(v, num.Quo(num, den))}, nil
		}
		p.pos = save
	}
	return &node{kind: kNum, val: v, dec: strings.Contains(t.s, ".")}, nil
}

// word reads a word: pi, infinity, sqrt, a function, or a product of
// one-letter variables.
func (p *parser) word(t token) (*node, error) {
	p.next()
	w := t.s
	switch {
	case w == "pi":
		return &node{kind: kPi}, nil
	case w == "inf" || w == "infty" || w == "infinity":
		return &node{kind: kInf}, nil
	case w == "sqrt":
		a, err := p.funcArg()
		if err != nil {
			return nil, err
		}
		return &node{kind: kPow, args: []*node{a, {kind: kNum, val: big.NewRat(1, 2)}}}, nil
	case mathFuncs[w]:
		return p.function(w)
	case len(w) <= 3:
		// A product of one-letter variables ("xy", "abc"); the word is
		// kept for a text answer ("odd").
		var n *node
		for i := 0; i < len(w); i++ {
			v := &node{kind: kVar, name: w[i : i+1]}
			if n == nil {
				n = v
			} else {
				n = mul(n, v)
			}
		}
		n.name = w
		if p.isSym("_") || p.isSym("'") {
			return nil, errSyntax
		}
		return n, nil
	}
	return nil, errSyntax
}

// command reads a LaTeX command and its arguments.
func (p *parser) command(t token) (*node, error) {
	p.next()
	switch c := t.s; {
	case c == "frac":
		a, err := p.arg()
		if err != nil {
			return nil, err
		}
		b, err := p.arg()
		if err != nil {
			return nil, err
		}
		return &node{kind: kDiv, args: []*node{a, b}}, nil
	case c == "sqrt":
		var idx *node
		if p.isSym("[") {
			var err error
			if idx, err = p.group("[", "]"); err != nil {
				return nil, err
			}
		}
		a, err := p.arg()
		if err != nil {
			return nil, err
		}
		e := &node{kind: kNum, val: big.NewRat(1, 2)}
		if idx != nil {
			e = &node{kind: kDiv, args: []*node{{kind: kNum, val: big.NewRat(1, 1)}, idx}}
		}
		return &node{kind: kPow, args: []*node{a, e}}, nil
	case c == "pi":
		return &node{kind: kPi}, nil
	case c == "infty" || c == "infin":
		return &node{kind: kInf}, nil
	case greek[c]:
		return p.subscripted(`\` + c)
	case mathFuncs[c]:
		return p.function(c)
	case c == "binom" || c == "dbinom" || c == "tbinom":
		a, err := p.arg()
		if err != nil {
			return nil, err
		}
		b, err := p.arg()
		if err != nil {
			return nil, err
		}
		return &node{kind: kFunc, name: "binom", args: []*node{a, b}}, nil
	case c == "lfloor" || c == "lceil":
		a, err := p.sum()
		if err != nil {
			return nil, err
		}
		closer := "rfloor"
		if c == "lceil" {
			closer = "rceil"
		}
		if !p.isCmd(closer) || !a.isExpr() {
			return nil, errSyntax
		}
		p.next()
		return &node{kind: kFunc, name: c[1:], args: []*node{a}}, nil
	case c == "begin":
		return p.matrix()
	case c == "emptyset":
		return &node{kind: kSeq, open: "{", close: "}"}, nil
	case c == "langle":
		return p.bracketed("langle", []string{"rangle"})
	}
	return nil, errSyntax
}

// symbol reads a bracketed group, a set or an absolute value.
func (p *parser) symbol(t token) (*node, error) {
	switch t.s {
	case "(", "[":
		p.next()
		return p.bracketed(t.s, []string{")", "]"})
	case "{":
		p.next()
		return p.bracketed("{", []string{"}"})
	case `\{`:
		p.next()
		if p.isSym(`\}`) {
			p.next()
			return &node{kind: kSeq, open: "{", close: "}"}, nil // the empty set
		}
		return p.bracketed(`\{`, []string{`\}`})
	case "|":
		p.next()
		a, err := p.sum()
		if err != nil {
			return nil, err
		}
		if err := p.expect("|"); err != nil {
			return nil, err
		}
		if !a.isExpr() {
			return nil, errSyntax
		}
		return &node{kind: kAbs, args: []*node{a}}, nil
	}
	return nil, errSyntax
}

// intFrac reads "{int}{int}" (or "12" in "\frac12") after \frac for a
// mixed number; ok is false when the fraction is not of integers.
func (p *parser) intFrac() (num, den *big.Rat, ok bool) {
	a, err := p.arg()
	if err != nil || a.kind != kNum || !a.val.IsInt() {
		return nil, nil, false
	}
	b, err := p.arg()
	if err != nil || b.kind != kNum || !b.val.IsInt() || b.val.Sign() == 0 {
		return nil, nil, false
	}
	return a.val, b.val, true
}

// subscripted reads the optional subscript and primes of a variable:
// "x_1", "a_{n+1}", "f'".
func (p *parser) subscripted(name string) (*node, error) {
	if p.isSym("_") {
		p.next()
		start := p.pos
		if _, err := p.arg(); err != nil {
			return nil, err
		}
		var sb strings.Builder
		for _, t := range p.toks[start:p.pos] {
			sb.WriteString(t.s)
		}
		name += "_" + strings.TrimSuffix(strings.TrimPrefix(sb.String(), "{"), "}")
	}
	for p.isSym("'") {
		p.next()
		name += "'"
	}
	return &node{kind: kVar, name: name}, nil
}

// funcArg reads a function's argument: a parenthesised or braced group, or
// one factor with its power ("\sin x", "\sin^2 x" is handled by function).
func (p *parser) funcArg() (*node, error) {
	switch {
	case p.isSym("("):
		return p.group("(", ")")
	case p.isSym("{"):
		return p.group("{", "}")
	}
	n, err := p.power()
	if err != nil {
		return nil, err
	}
	if !n.isExpr() {
		return nil, errSyntax
	}
	return n, nil
}

// function reads name[_base][^power] argument: "\log_2 8", "\sin^2 x".
func (p *parser) function(name string) (*node, error) {
	var base, pow *node
	var err error
	if name == "log" && p.isSym("_") {
		p.next()
		if base, err = p.arg(); err != nil {
			return nil, err
		}
	}
	if p.isSym("^") {
		p.next()
		if pow, err = p.exponent(); err != nil {
			return nil, err
		}
	}
	a, err := p.funcArg()
	if err != nil {
		return nil, err
	}
	f := &node{kind: kFunc, name: name, args: []*node{a}}
	if base != nil {
		f.args = append(f.args, base)
	}
	if pow != nil {
		if !pow.isExpr() {
			return nil, errSyntax
		}
		f = &node{kind: kPow, args: []*node{f, pow}}
	}
	return f, nil
}

// bracketed reads the elements of a bracketed group after its opener,
// separated by commas or semicolons, up to one of closers. In ( ) [ ] or
// { } one expression is a parenthesised group, and ( ] or [ ) must hold
// two ends of an interval; more elements make a kSeq: a tuple or an
// interval (open and close as written), or a set (open "{", close "}";
// "\{5\}" is a set of one).
func (p *parser) bracketed(open string, closers []string) (*node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	var elems []*node
	for {
		e, err := p.union()
		if err != nil {
			return nil, err
		}
		elems = append(elems, e)
		if p.isSym(",") || p.isSym(";") {
			p.next()
			continue
		}
		break
	}
	t := p.peek()
	closeOK := false
	for _, c := range closers {
		if (t.kind == tSym || t.kind == tCmd) && t.s == c {
			closeOK = true
		}
	}
	if !closeOK {
		return nil, errSyntax
	}
	p.next()
	closer := t.s
	switch {
	case open == `\{`:
		return &node{kind: kSeq, open: "{", close: "}", args: elems}, nil
	case open == "{":
		if len(elems) == 1 {
			return elems[0], nil
		}
		return &node{kind: kSeq, open: "{", close: "}", args: elems}, nil
	case open == "langle":
		return &node{kind: kSeq, open: "(", close: ")", args: elems}, nil
	}
	if len(elems) == 1 {
		if open == "(" && closer == ")" || open == "[" && closer == "]" {
			return elems[0], nil
		}
		return nil, errSyntax // "(3]" is neither a group nor an interval
	}
	return &node{kind: kSeq, open: open, close: closer, args: elems}, nil
}

// matrix reads \begin{pmatrix} a & b \\ c & d \end{pmatrix} (also bmatrix,
// matrix, array with its column spec) after \begin.
func (p *parser) matrix() (*node, error) {
	env, err := p.envName()
	if err != nil {
		return nil, err
	}
	switch env {
	case "pmatrix", "bmatrix", "matrix", "smallmatrix", "Bmatrix":
	case "array":
		// Skip the column spec {cc}.
		if _, err := p.envName(); err != nil {
			return nil, err
		}
	default:
		return nil, errSyntax
	}
	m := &node{kind: kMatrix}
	row := &node{kind: kSeq, open: "m", close: "m"}
	for {
		if p.isCmd("end") {
			p.next()
			if e, err := p.envName(); err != nil || e != env {
				return nil, errSyntax
			}
			break
		}
		e, err := p.sum()
		if err != nil {
			return nil, err
		}
		if !e.isExpr() {
			return nil, errSyntax
		}
		row.args = append(row.args, e)
		switch {
		case p.isSym("&"):
			p.next()
		case p.isSym(`\\`):
			p.next()
			m.args = append(m.args, row)
			row = &node{kind: kSeq, open: "m", close: "m"}
		case p.isCmd("end"):
		default:
			return nil, errSyntax
		}
	}
	if len(row.args) > 0 {
		m.args = append(m.args, row)
	}
	if len(m.args) == 0 {
		return nil, errSyntax
	}
	for _, r := range m.args {
		if len(r.args) != len(m.args[0].args) {
			return nil, errSyntax
		}
	}
	return m, nil
}

// envName reads {name} after \begin or \end, or an array's column spec.
func (p *parser) envName() (string, error) {
	if err := p.expect("{"); err != nil {
		return "", err
	}
	var sb strings.Builder
	for !p.isSym("}") {
		t := p.next()
		if t.kind == tEOF || sb.Len() > 64 {
			return "", errSyntax
		}
		sb.WriteString(t.s)
	}
	p.next()
	return sb.String(), nil
}

// expandPM returns the values an expression with ± stands for: "1 ± √2"
// is two values. At most two ± (four values); more is an error.
func expandPM(n *node, b *budget) ([]*node, error) {
	if err := b.spend(1); err != nil {
		return nil, err
	}
	if n == nil {
		return []*node{nil}, nil
	}
	if n.kind == kPM {
		var out []*node
		lefts, err := expandPM(n.args[0], b)
		if err != nil {
			return nil, err
		}
		rights, err := expandPM(n.args[1], b)
		if err != nil {
			return nil, err
		}
		for _, l := range lefts {
			for _, r := range rights {
				if l == nil {
					out = append(out, r, neg(r))
				} else {
					out = append(out, add(l, r), add(l, neg(r)))
				}
			}
		}
		if len(out) > 4 {
			return nil, errSyntax
		}
		return out, nil
	}
	if !n.isExpr() {
		return []*node{n}, nil
	}
	// Expand the first argument that has a ±.
	for i, a := range n.args {
		if a == nil || !hasPM(a) {
			continue
		}
		vs, err := expandPM(a, b)
		if err != nil {
			return nil, err
		}
		var out []*node
		for _, v := range vs {
			c := *n
			c.args = append([]*node(nil), n.args...)
			c.args[i] = v
			more, err := expandPM(&c, b)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		}
		if len(out) > 4 {
			return nil, errSyntax
		}
		return out, nil
	}
	return []*node{n}, nil
}

func hasPM(n *node) bool {
	if n == nil {
		return false
	}
	if n.kind == kPM {
		return true
	}
	for _, a := range n.args {
		if hasPM(a) {
			return true
		}
	}
	return false
}

// vars adds the variable names of an expression to set.
func vars(n *node, set map[string]bool) {
	if n == nil {
		return
	}
	if n.kind == kVar {
		set[n.name] = true
	}
	for _, a := range n.args {
		vars(a, set)
	}
}

// num is a value: exact (r not nil) or a float64 only. f is always set;
// NaN marks an undefined value. An exact value outside float64's range
// (2^2000, 2^-2000) has f = NaN: it compares exactly, and any float
// arithmetic with it is undefined. A value that leaves exact arithmetic
// (more than maxRatBits) is undefined, never a rounded float: 2^(2^20)
// and 2^(2^20)+1 must not compare equal as +Inf.
type num struct {
	r   *big.Rat
	f   float64
	dec bool // a decimal literal (signed, or / a power of ten): may round an exact value
}

func exact(r *big.Rat) num {
	if r.Num().BitLen()+r.Denom().BitLen() > maxRatBits {
		return nan
	}
	f, _ := r.Float64()
	if math.IsInf(f, 0) || f == 0 && r.Sign() != 0 {
		f = math.NaN()
	}
	return num{r: r, f: f}
}

// float is an inexact value; an overflow (±Inf) is undefined. Only the
// symbol ∞ (kInf) is infinite.
func float(f float64) num {
	if math.IsInf(f, 0) {
		return nan
	}
	return num{f: f}
}

// infinite reports the value of the symbol ∞ or -∞.
func infinite(v num) bool { return v.r == nil && math.IsInf(v.f, 0) }

var nan = num{f: math.NaN()}

// eval computes an expression at the variables' values env.
func eval(n *node, env map[string]num, b *budget) (num, error) {
	if err := b.spend(1); err != nil {
		return nan, err
	}
	switch n.kind {
	case kNum:
		v := exact(n.val)
		v.dec = n.dec && v.r != nil
		return v, nil
	case kVar:
		v, ok := env[n.name]
		if !ok {
			return nan, errSyntax
		}
		return v, nil
	case kPi:
		return float(math.Pi), nil
	case kInf:
		return num{f: math.Inf(1)}, nil
	case kNeg:
		a, err := eval(n.args[0], env, b)
		if err != nil {
			return nan, err
		}
		if a.r != nil {
			v := exact(new(big.Rat).Neg(a.r))
			v.dec = a.dec && v.r != nil
			return v, nil
		}
		return num{f: -a.f}, nil // -∞ stays infinite
	case kAdd, kMul:
		acc, err := eval(n.args[0], env, b)
		if err != nil {
			return nan, err
		}
		for _, arg := range n.args[1:] {
			v, err := eval(arg, env, b)
			if err != nil {
				return nan, err
			}
			if err := b.spend(ratCost(acc, v)); err != nil {
				return nan, err
			}
			switch {
			case acc.r != nil && v.r != nil && n.kind == kAdd:
				acc = exact(new(big.Rat).Add(acc.r, v.r))
			case acc.r != nil && v.r != nil:
				acc = exact(new(big.Rat).Mul(acc.r, v.r))
			case n.kind == kAdd:
				acc = float(acc.f + v.f)
			default:
				acc = float(acc.f * v.f)
			}
		}
		return acc, nil
	case kDiv:
		a, err := eval(n.args[0], env, b)
		if err != nil {
			return nan, err
		}
		d, err := eval(n.args[1], env, b)
		if err != nil {
			return nan, err
		}
		if err := b.spend(ratCost(a, d)); err != nil {
			return nan, err
		}
		if d.f == 0 && (d.r == nil || d.r.Sign() == 0) {
			return nan, nil
		}
		if a.r != nil && d.r != nil {
			v := exact(new(big.Rat).Quo(a.r, d.r))
			// "33.3333333333%" is a decimal too.
			v.dec = a.dec && v.r != nil && d.r.IsInt() && d.r.Sign() > 0 && terminating(new(big.Rat).Inv(d.r))
			return v, nil
		}
		return float(a.f / d.f), nil
	case kPow:
		a, err := eval(n.args[0], env, b)
		if err != nil {
			return nan, err
		}
		e, err := eval(n.args[1], env, b)
		if err != nil {
			return nan, err
		}
		return pow(a, e, b)
	case kAbs:
		a, err := eval(n.args[0], env, b)
		if err != nil {
			return nan, err
		}
		if a.r != nil {
			return exact(new(big.Rat).Abs(a.r)), nil
		}
		return float(math.Abs(a.f)), nil
	case kFact:
		a, err := eval(n.args[0], env, b)
		if err != nil {
			return nan, err
		}
		if a.r == nil || !a.r.IsInt() || a.r.Sign() < 0 || !a.r.Num().IsInt64() || a.r.Num().Int64() > maxFactArg {
			return nan, nil
		}
		k := a.r.Num().Int64()
		if err := b.spend(int(k)); err != nil {
			return nan, err
		}
		return exact(new(big.Rat).SetInt(new(big.Int).MulRange(1, k))), nil
	case kFunc:
		return evalFunc(n, env, b)
	}
	return nan, errSyntax
}

// ratCost is the step cost of an exact operation on a and b: big
// rationals cost in proportion to their size.
func ratCost(a, b num) int {
	c := 0
	if a.r != nil {
		c += (a.r.Num().BitLen() + a.r.Denom().BitLen()) / 256
	}
	if b.r != nil {
		c += (b.r.Num().BitLen() + b.r.Denom().BitLen()) / 256
	}
	return c
}

// pow computes a^e: exact for an exact base and an integer exponent (and
// for exact roots such as 4^(1/2)), float otherwise; a negative base with
// a fractional exponent is real only for odd roots.
func pow(a, e num, b *budget) (num, error) {
	if a.r != nil && e.r != nil {
		if e.r.IsInt() && e.r.Num().IsInt64() {
			k := e.r.Num().Int64()
			bits := int64(a.r.Num().BitLen() + a.r.Denom().BitLen())
			if k >= -maxExactExp && k <= maxExactExp && bits*abs64(k) <= maxRatBits {
				if k < 0 && a.r.Sign() == 0 {
					return nan, nil
				}
				if err := b.spend(int(bits*abs64(k)/64) + 1); err != nil {
					return nan, err
				}
				x := new(big.Int).Exp(a.r.Num(), big.NewInt(abs64(k)), nil)
				y := new(big.Int).Exp(a.r.Denom(), big.NewInt(abs64(k)), nil)
				r := new(big.Rat).SetFrac(x, y)
				if k < 0 {
					r.Inv(r)
				}
				return exact(r), nil
			}
			// Beyond the exact budget: only 0, 1 and -1 have a value.
			switch {
			case a.r.Sign() == 0 && e.r.Sign() > 0:
				return exact(new(big.Rat)), nil
			case a.r.IsInt() && a.r.Num().CmpAbs(big.NewInt(1)) == 0:
				if a.r.Sign() < 0 && e.r.Num().Bit(0) == 1 {
					return exact(big.NewRat(-1, 1)), nil
				}
				return exact(big.NewRat(1, 1)), nil
			}
			return nan, nil
		} else if e.r.IsInt() {
			return nan, nil // an integer exponent beyond int64
		} else if q := e.r.Denom(); q.IsInt64() && q.Int64() <= 16 && e.r.Num().IsInt64() {
			// An exact root: (x/y)^(p/q) with x and y perfect q-th powers.
			if root, ok := ratRoot(a.r, q.Int64()); ok {
				return pow(exact(root), exact(new(big.Rat).SetInt(e.r.Num())), b)
			}
		}
	}
	if a.r != nil && a.r.Sign() < 0 && e.r != nil && !e.r.IsInt() {
		// The real odd root of a negative number.
		if q := e.r.Denom(); q.IsInt64() && q.Int64()%2 == 1 {
			v := math.Pow(-a.f, e.f)
			if e.r.Num().Bit(0) == 1 {
				v = -v
			}
			return float(v), nil
		}
	}
	v := math.Pow(a.f, e.f)
	if v == 0 && a.f != 0 {
		return nan, nil // an underflow is no value
	}
	return float(v), nil
}

func abs64(k int64) int64 {
	if k < 0 {
		return -k
	}
	return k
}

// ratRoot returns the exact q-th root of a non-negative rational, when it
// is rational.
func ratRoot(r *big.Rat, q int64) (*big.Rat, bool) {
	if r.Sign() < 0 || r.Num().BitLen() > 512 || r.Denom().BitLen() > 512 {
		return nil, false
	}
	x, ok1 := intRoot(r.Num(), q)
	y, ok2 := intRoot(r.Denom(), q)
	if !ok1 || !ok2 {
		return nil, false
	}
	return new(big.Rat).SetFrac(x, y), true
}

// intRoot returns the exact q-th root of a non-negative integer when there
// is one.
func intRoot(n *big.Int, q int64) (*big.Int, bool) {
	if n.Sign() == 0 {
		return new(big.Int), true
	}
	if q == 2 {
		s := new(big.Int).Sqrt(n)
		return s, new(big.Int).Mul(s, s).Cmp(n) == 0
	}
	f, _ := new(big.Float).SetInt(n).Float64()
	g := math.Round(math.Pow(f, 1/float64(q)))
	if math.IsInf(g, 0) || g > 1e15 {
		return nil, false
	}
	for d := -1.0; d <= 1; d++ {
		c := big.NewInt(int64(g + d))
		if c.Sign() <= 0 {
			continue
		}
		if new(big.Int).Exp(c, big.NewInt(q), nil).Cmp(n) == 0 {
			return c, true
		}
	}
	return nil, false
}

// evalFunc computes a function application in float64 (binomials and
// floors of exact values stay exact).
func evalFunc(n *node, env map[string]num, b *budget) (num, error) {
	a, err := eval(n.args[0], env, b)
	if err != nil {
		return nan, err
	}
	x := a.f
	switch n.name {
	case "binom":
		k, err := eval(n.args[1], env, b)
		if err != nil {
			return nan, err
		}
		if a.r == nil || k.r == nil || !a.r.IsInt() || !k.r.IsInt() || a.r.Sign() < 0 || !a.r.Num().IsInt64() ||
			a.r.Num().Int64() > 1000 || !k.r.Num().IsInt64() || k.r.Sign() < 0 {
			return nan, nil
		}
		nn, kk := a.r.Num().Int64(), k.r.Num().Int64()
		if kk > nn {
			return exact(new(big.Rat)), nil
		}
		if err := b.spend(int(nn)); err != nil {
			return nan, err
		}
		return exact(new(big.Rat).SetInt(new(big.Int).Binomial(nn, kk))), nil
	case "floor", "ceil":
		if a.r != nil {
			q := new(big.Int).Div(a.r.Num(), a.r.Denom()) // Euclidean: floor for a positive denominator
			if n.name == "ceil" && !a.r.IsInt() {
				q.Add(q, big.NewInt(1))
			}
			return exact(new(big.Rat).SetInt(q)), nil
		}
		if n.name == "floor" {
			return float(math.Floor(x)), nil
		}
		return float(math.Ceil(x)), nil
	case "log":
		if len(n.args) == 2 {
			base, err := eval(n.args[1], env, b)
			if err != nil {
				return nan, err
			}
			return float(math.Log(x) / math.Log(base.f)), nil
		}
		return float(math.Log10(x)), nil
	}
	if f, ok := floatFuncs[n.name]; ok {
		return float(f(x)), nil
	}
	return nan, errSyntax
}

// floatFuncs are the functions evaluated in float64 only.
var floatFuncs = map[string]func(float64) float64{
	"sin": math.Sin, "cos": math.Cos, "tan": math.Tan,
	"sec":    func(x float64) float64 { return 1 / math.Cos(x) },
	"csc":    func(x float64) float64 { return 1 / math.Sin(x) },
	"cot":    func(x float64) float64 { return 1 / math.Tan(x) },
	"arcsin": math.Asin, "arccos": math.Acos, "arctan": math.Atan,
	"sinh": math.Sinh, "cosh": math.Cosh, "tanh": math.Tanh,
	"exp": math.Exp, "ln": math.Log,
}
