package tasks

import (
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
)

// This file reads a final answer (the content of a \boxed{}, the rest of an
// "Answer:" line, a ground truth) into values and compares two of them
// the way a grader of MATH would; see mathVerifier for the rules.

// maxAnswerLen caps an answer's length: a longer one is refused (0).
const maxAnswerLen = 1000

// stepBudget bounds the work of one comparison (lexing, parsing,
// evaluating at every point).
const stepBudget = 200_000

// rawReplacer rewrites Unicode and a few LaTeX spellings before the scan.
var rawReplacer = strings.NewReplacer(
	"−", "-", "–", "-", "×", `\times `, "·", `\cdot `, "÷", "/", "π", `\pi `,
	"√", `\sqrt`, "∞", `\infty `, "∪", `\cup `, "€", "", "£", "", "¥", "",
	"\u00a0", " ", "\u2009", " ", "\u202f", " ", "²", "^2", "³", "^3", "％", "%",
	"≤", "≤", "≥", "≥", "≠", "≠", "°", "",
	`^{\circ}`, "", `^\circ`, "", `^{ \circ }`, "", `^{\circ }`, "", `^{ \circ}`, "", `\circ`, "",
	`^{\degree}`, "", `\degree`, "", `^{\prime}`, "'", `^\prime`, "'", `\prime`, "'",
	"<=", "≤", ">=", "≥", "!=", "≠", "==", "=", "=<", "≤", "=>", "≥",
)

// textCmds turn their argument into text; fontCmds keep a one-letter
// argument as math ("\mathrm{e}" is e) and a word as text.
var (
	textCmds = map[string]bool{
		"text": true, "textbf": true, "textit": true, "textrm": true, "textnormal": true,
		"textsf": true, "texttt": true, "textup": true, "mbox": true, "hbox": true, "emph": true,
	}
	fontCmds = map[string]bool{
		"mathrm": true, "mathbf": true, "mathit": true, "mathsf": true, "mathtt": true,
		"mathcal": true, "mathbb": true, "boldsymbol": true, "bm": true, "operatorname": true,
		"mathop": true, "mathnormal": true,
	}
	// dropCmds are layout: removed, their arguments (if any) kept.
	dropCmds = map[string]bool{
		"left": true, "right": true, "big": true, "Big": true, "bigg": true, "Bigg": true,
		"bigl": true, "bigr": true, "Bigl": true, "Bigr": true, "biggl": true, "biggr": true,
		"Biggl": true, "Biggr": true, "middle": true, "displaystyle": true, "textstyle": true,
		"scriptstyle": true, "limits": true, "nolimits": true, "mathstrut": true, "strut": true,
		"boxed": true, "fbox": true, "framebox": true, "ensuremath": true, "noindent": true,
		"hfill": true, "rm": true, "bf": true, "it": true,
	}
	// spaceCmds are spacing: removed with their argument.
	spaceCmds = map[string]bool{
		"hspace": true, "vspace": true, "phantom": true, "hphantom": true, "vphantom": true,
	}
	cmdRewrite = map[string]string{
		"dfrac": `\frac`, "tfrac": `\frac`, "cfrac": `\frac`, "frac": `\frac`,
		"le": "≤", "leq": "≤", "leqslant": "≤", "leqq": "≤",
		"ge": "≥", "geq": "≥", "geqslant": "≥", "geqq": "≥",
		"ne": "≠", "neq": "≠", "lt": "<", "gt": ">",
		"cdot": "*", "times": "*", "ast": "*", "div": "/", "colon": ":",
		"vert": "|", "lvert": "|", "rvert": "|", "mid": "|",
		"lbrace": `\{`, "rbrace": `\}`, "lbrack": "[", "rbrack": "]",
		"quad": " ", "qquad": " ", "dots": `\dots`, "ldots": `\dots`, "cdots": `\dots`,
		"dollar": "", "percent": "%", "land": " and ", "lor": " or ",
		"varnothing": `\emptyset`, "infin": `\infty`,
	}
)

// cleanAnswer normalises an answer's LaTeX: math delimiters, \left and
// \right, spacing commands, \! and \, removed; \dfrac and \tfrac made
// \frac; \text{...}, \mbox{...} (and \mathrm{...} of a word) made
// \text{...}, of no letters made plain; degrees removed; \% made %;
// relations made ≤ ≥ ≠; "{,}" made ","; whitespace collapsed; trailing
// punctuation removed. ok is false for an empty or over-long answer.
func cleanAnswer(s string) (string, bool) {
	if len(s) > maxAnswerLen {
		return "", false
	}
	var b strings.Builder
	if !scanLatex(rawReplacer.Replace(s), 0, &b) {
		return "", false
	}
	out := strings.NewReplacer("{,}", ",", "{, }", ",", "{ ,}", ",").Replace(b.String())
	out = strings.Join(strings.Fields(out), " ")
	for {
		t := strings.TrimSpace(strings.TrimRight(out, ".,;"))
		t = strings.TrimSpace(strings.TrimSuffix(t, `\`))
		if t == out {
			break
		}
		out = t
	}
	out = strings.TrimSpace(strings.TrimLeft(out, "=:"))
	return out, out != ""
}

// scanLatex writes s with its LaTeX normalised (see cleanAnswer) to b.
func scanLatex(s string, depth int, b *strings.Builder) bool {
	if depth > 8 {
		return false
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '$':
			i++
		case c == '~':
			b.WriteByte(' ')
			i++
		case c == '\\' && i+2 < len(s) && s[i+1] == '\\' && knownCmd(s[i+2:]):
			i++ // "\\frac" doubly escaped (JSON, Python) is \frac
		case c == '\\' && i+1 < len(s) && !isLetter(s[i+1]):
			switch d := s[i+1]; d {
			case '!':
				// "1,\! 000": a negative space, and the spaces after it.
				for i+2 < len(s) && s[i+2] == ' ' {
					i++
				}
			case ',':
			case ' ', ';', ':', '>', '\t', '\n':
				b.WriteByte(' ')
			case '%':
				b.WriteByte('%')
			case '{', '}':
				b.WriteString(s[i : i+2])
			case '\\':
				b.WriteString(`\\`)
			case '|':
				b.WriteByte('|')
			}
			i += 2
		case c == '\\' && i+1 < len(s):
			j := i + 1
			for j < len(s) && isLetter(s[j]) {
				j++
			}
			name := s[i+1 : j]
			for _, q := range []string{"qquad", "quad"} {
				if strings.HasPrefix(name, q) && len(name) > len(q) && !knownCmd(name) {
					name, j = q, i+1+len(q) // "\quadx_2" is \quad x_2
					break
				}
			}
			i = j
			switch {
			case textCmds[name] || fontCmds[name]:
				arg, n, ok := bracedArg(s[i:])
				if !ok {
					continue
				}
				i += n
				var sub strings.Builder
				if !scanLatex(arg, depth+1, &sub) {
					return false
				}
				content := strings.Join(strings.Fields(sub.String()), " ")
				switch {
				case content == "":
				case !hasLetter(content) || fontCmds[name] && !hasWord(content):
					b.WriteString(content)
				default:
					b.WriteString(`\text{` + content + `}`)
				}
			case dropCmds[name]:
				if (name == "left" || name == "right") && i < len(s) && s[i] == '.' {
					i++
				}
			case spaceCmds[name]:
				if _, n, ok := bracedArg(s[i:]); ok {
					i += n
				}
			default:
				if r, ok := cmdRewrite[name]; ok {
					b.WriteString(r)
				} else {
					b.WriteString(`\` + name)
				}
				if i < len(s) && isLetter(s[i]) {
					b.WriteByte(' ')
				}
			}
		case c == '\\':
			i++
		default:
			b.WriteByte(c)
			i++
		}
	}
	return true
}

// knownCmd reports whether s starts with the name of a LaTeX command that
// answers use.
func knownCmd(s string) bool {
	j := 0
	for j < len(s) && isLetter(s[j]) {
		j++
	}
	n := s[:j]
	if n == "" {
		return false
	}
	_, rw := cmdRewrite[n]
	switch n {
	case "sqrt", "pi", "infty", "pm", "mp", "cup", "cap", "in", "approx", "begin", "end",
		"binom", "dbinom", "lfloor", "rfloor", "lceil", "rceil", "langle", "rangle", "emptyset":
		return true
	}
	return rw || textCmds[n] || fontCmds[n] || dropCmds[n] || spaceCmds[n] || greek[n] || mathFuncs[n]
}

// bracedArg reads "{...}" (after optional spaces) at the start of s: the
// content and the bytes used.
func bracedArg(s string) (string, int, bool) {
	i := 0
	for i < len(s) && s[i] == ' ' {
		i++
	}
	if i >= len(s) || s[i] != '{' {
		return "", 0, false
	}
	content, ok := braced(s[i+1:])
	if !ok {
		return "", 0, false
	}
	return content, i + 1 + len(content) + 1, true
}

func hasLetter(s string) bool {
	for i := 0; i < len(s); i++ {
		if isLetter(s[i]) {
			return true
		}
	}
	return false
}

// hasWord reports a run of two or more letters.
func hasWord(s string) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		if isLetter(s[i]) {
			run++
			if run >= 2 {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
}

// depthDelta is the bracket depth change of byte c; "\begin{" and "\end{"
// count as brackets too (see splitTop).
func depthDelta(c byte) int {
	switch c {
	case '(', '[', '{':
		return 1
	case ')', ']', '}':
		return -1
	}
	return 0
}

// splitTop splits s at depth 0 (outside brackets and environments) where
// sep reports a separator of n bytes at i.
func splitTop(s string, sep func(s string, i int) int) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); {
		// An environment is a bracket of its own; its {name} counts as usual.
		if strings.HasPrefix(s[i:], `\begin{`) {
			depth++
			i += len(`\begin`)
			continue
		}
		if strings.HasPrefix(s[i:], `\end{`) {
			depth--
			i += len(`\end`)
			continue
		}
		if depth == 0 {
			if n := sep(s, i); n > 0 {
				out = append(out, s[start:i])
				i += n
				start = i
				continue
			}
		}
		depth += depthDelta(s[i])
		i++
	}
	return append(out, s[start:])
}

// listSep finds the separators of a list of answers: "," ";" and the
// words "and" and "or" (also as \text{and}).
func listSep(s string, i int) int {
	switch s[i] {
	case ',', ';':
		return 1
	}
	for _, w := range []string{`\text{and}`, `\text{or}`, `\text{, and}`, `\text{,}`} {
		if strings.HasPrefix(s[i:], w) {
			return len(w)
		}
	}
	for _, w := range []string{"and", "or"} {
		if strings.HasPrefix(s[i:], w) && (i == 0 || !isLetter(s[i-1]) && s[i-1] != '\\') &&
			(i+len(w) == len(s) || !isLetter(s[i+len(w)])) {
			return len(w)
		}
	}
	return 0
}

// relOps are the relations an answer may state, longest first.
var relOps = []string{`\approx`, `\in`, "≤", "≥", "≠", "=", "<", ">", ":"}

func relSep(s string, i int) int {
	for _, op := range relOps {
		if strings.HasPrefix(s[i:], op) {
			if op == `\in` && i+3 < len(s) && isLetter(s[i+3]) {
				return 0 // \infty, \int
			}
			return len(op)
		}
	}
	return 0
}

// joinThousands removes the commas of numbers grouped in thousands
// ("12,345,678", "1,000.5") outside brackets: the first group has 1 to 3
// digits and no leading zero, every other group exactly 3. "1000,99" and
// "0,111" are not grouped. Inside brackets commas always separate
// elements ("(1,100)" is a pair).
func joinThousands(s string) string {
	var b strings.Builder
	depth := 0
	for i := 0; i < len(s); {
		c := s[i]
		if depth == 0 && isDigit(c) && (i == 0 || !isDigit(s[i-1]) && s[i-1] != '.' && s[i-1] != ',') {
			j := i
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			first := s[i:j]
			k := j
			groups := 0
			for k+4 <= len(s) && s[k] == ',' && isDigit(s[k+1]) && isDigit(s[k+2]) && isDigit(s[k+3]) && (k+4 == len(s) || !isDigit(s[k+4])) {
				k += 4
				groups++
			}
			ok := groups > 0 && len(first) <= 3 && first[0] != '0' && !(k < len(s) && s[k] == ',' && k+1 < len(s) && isDigit(s[k+1]))
			if ok {
				b.WriteString(strings.ReplaceAll(s[i:k], ",", ""))
				i = k
				continue
			}
			b.WriteString(first)
			i = j
			continue
		}
		depth += depthDelta(c)
		b.WriteByte(c)
		i++
	}
	return b.String()
}

// unitWordsKeep are words never removed as units.
var unitWordsKeep = map[string]bool{
	"pi": true, "infty": true, "inf": true, "and": true, "or": true, "not": true, "no": true,
	"nor": true, "but": true, "if": true, "only": true, "none": true, "all": true, "yes": true,
}

// shortUnits are the two-letter words removed as units; attachedUnits
// longer ones removed even right after a digit.
var (
	shortUnits = map[string]bool{
		"cm": true, "mm": true, "km": true, "kg": true, "mg": true, "ml": true, "ft": true,
		"yd": true, "oz": true, "lb": true, "mi": true, "hr": true, "am": true, "pm": true,
	}
	attachedUnits = map[string]bool{
		"lbs": true, "mph": true, "kmh": true, "sec": true, "min": true, "hrs": true,
		"cents": true, "dollars": true, "inches": true, "feet": true, "meters": true,
		"miles": true, "hours": true, "minutes": true, "seconds": true, "days": true,
		"years": true, "degrees": true, "percent": true, "pct": true,
	}
)

// notUnit are words after a value that change or hedge it: never units
// ("3 thousand", "3 squared", "3 maybe", "3 or more").
var notUnit = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`or and to plus minus not no nor but if only none all yes maybe perhaps
		probably possibly likely approximately approx about around roughly nearly almost circa ish
		more less fewer least most over under above below than times is are was wrong incorrect
		correct false true either neither else otherwise
		hundred hundreds thousand thousands million millions billion billions trillion trillions
		dozen dozens score gross lakh crore
		squared cubed square cubic twice thrice half halves double triple quadruple fold
		third thirds quarter quarters fourth fourths fifth fifths tenth tenths hundredth hundredths
		thousandth thousandths millionth millionths negative positive pi infty inf
		zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
		fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy
		eighty ninety`) {
		notUnit[w] = true
	}
}

// multiUnit are the words of a unit of several words ("square units",
// "cubic feet", "miles per hour"); every word of such a unit must be one.
var multiUnit = map[string]bool{
	"square": true, "sq": true, "sq.": true, "cubic": true, "cu": true, "per": true,
	"units": true, "unit": true, "cm": true, "m": true, "km": true, "mm": true, "meters": true,
	"meter": true, "metres": true, "metre": true, "centimeters": true, "centimeter": true,
	"kilometers": true, "kilometer": true, "millimeters": true, "inches": true, "inch": true,
	"feet": true, "foot": true, "ft": true, "yards": true, "yard": true, "miles": true, "mile": true,
	"hour": true, "hours": true, "minute": true, "minutes": true, "second": true, "seconds": true,
	"day": true, "days": true, "week": true, "weeks": true, "year": true, "years": true,
	"dollars": true, "dollar": true, "cents": true, "cent": true, "kg": true, "g": true,
	"grams": true, "gram": true, "kilograms": true, "liters": true, "liter": true, "litres": true,
	"ml": true, "s": true, "h": true, "min": true, "hr": true, "km/h": true, "m/s": true,
	"light": true, "kilometres": true, "centimetres": true, "degrees": true, "degree": true,
	"celsius": true, "fahrenheit": true, "pounds": true, "ounces": true, "gallons": true,
}

// unitText reports the content of a \text{...} after a value that is a
// unit and may be removed: one word of letters (a unit or a noun: "cm",
// "apples", "yuan"; one letter only for an SI symbol) that is no hedge,
// scale or operation word, or several words each a unit word ("square
// units", "miles per hour"). Content with digits, commas, brackets or
// other punctuation is never a unit ("3 \text{ (or four)}").
func unitText(content string) bool {
	ws := strings.Fields(strings.ToLower(content))
	if len(ws) == 0 {
		return false
	}
	if len(ws) > 1 {
		for _, w := range ws {
			if !multiUnit[w] {
				return false
			}
		}
		return true
	}
	w := ws[0]
	if percentWords[w] || w == "km/h" || w == "m/s" {
		return true
	}
	w = strings.TrimSuffix(w, ".")
	for i := 0; i < len(w); i++ {
		if !isLetter(w[i]) {
			return false
		}
	}
	if len(w) == 1 {
		return strings.Contains("mgshlLKJNWV", strings.TrimSuffix(strings.TrimSpace(content), "."))
	}
	return !notUnit[w]
}

var percentWords = map[string]bool{"percent": true, "percentage": true, "pct": true, "%": true}

// stripUnits removes units after a value: a trailing \text{...} that is a
// unit (see unitText; with ^2 or ^3), plain words of two or more letters
// after a value without letters ("125 miles", "15 cm^2") that are no
// hedge, scale or operation word (notUnit: "3 maybe", "72 thousand"), and
// a percent sign or word, which sets pct. At most 6 are removed.
func stripUnits(item string) (string, bool) {
	pct := false
	for range 6 {
		item = strings.TrimSpace(item)
		if rest, ok := strings.CutSuffix(item, "%"); ok && strings.TrimSpace(rest) != "" {
			item, pct = rest, true
			continue
		}
		body := item
		for _, e := range []string{"^2", "^3", "^{2}", "^{3}"} {
			if b, ok := strings.CutSuffix(body, e); ok {
				body = b
				break
			}
		}
		if strings.HasSuffix(body, "}") {
			if i := strings.LastIndex(body, `\text{`); i > 0 {
				content, ok := braced(body[i+len(`\text{`):])
				head := strings.TrimSpace(body[:i])
				if ok && i+len(`\text{`)+len(content)+1 == len(body) && head != "" && unitText(content) && !endsWithOp(head) {
					item = head
					if percentWords[strings.ToLower(content)] {
						pct = true
					}
					continue
				}
			}
		}
		j := len(body)
		for j > 0 && (isLetter(body[j-1]) || body[j-1] == '/' || body[j-1] == '.') {
			j--
		}
		word := strings.Trim(body[j:], "/.")
		head := strings.TrimSpace(body[:j])
		lw := strings.ToLower(word)
		// A word after a space or a brace: three letters or more, or a
		// two-letter unit; right after a digit only a known unit ("5cm";
		// "3ab" is a product).
		var unit bool
		switch {
		case j == 0 || unitWordsKeep[lw]:
		case body[j-1] == ' ' || body[j-1] == '}':
			unit = len(word) >= 3 || shortUnits[lw]
		case isDigit(body[j-1]):
			unit = shortUnits[lw] || attachedUnits[lw]
		}
		if unit && notUnit[lw] {
			unit = false
		}
		if unit && head != "" && !endsWithOp(head) && !hasPlainLetter(head) {
			item = head
			if percentWords[strings.ToLower(word)] {
				pct = true
			}
			continue
		}
		break
	}
	return strings.TrimSpace(item), pct
}

// endsWithOp reports a head that ends with an operator: what follows is
// an operand, not a unit.
func endsWithOp(s string) bool {
	s = strings.TrimSpace(s)
	if s == "" {
		return true
	}
	return strings.ContainsRune("+-*/^_=<>≤≥≠(,[{", rune(s[len(s)-1]))
}

// hasPlainLetter reports a letter outside LaTeX command names and
// \text{...}: a variable.
func hasPlainLetter(s string) bool {
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\':
			j := i + 1
			for j < len(s) && isLetter(s[j]) {
				j++
			}
			if s[i+1:j] == "text" && j < len(s) && s[j] == '{' {
				if c, ok := braced(s[j+1:]); ok {
					j += 1 + len(c) + 1
				}
			}
			i = j - 1
		case isLetter(s[i]):
			return true
		}
	}
	return false
}

// isText reports an answer of words only ("odd", "Evelyn", "no
// solution"): compared as lower-case text.
//
// Letters alone are text when they hold a word of four letters or more,
// or several words one of which has two letters or more; a run of up to
// three letters ("xy", "abc") is a product of variables.
func isText(s string) bool {
	longest, words, run := 0, 0, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isLetter(c):
			run++
			longest = max(longest, run)
			if run == 1 {
				words++
			}
		case c == ' ' || c == '\'' || c == '-':
			run = 0
		default:
			return false
		}
	}
	return longest >= 4 || words >= 2 && longest >= 2
}

// unwrapText replaces \text{X} by X.
func unwrapText(s string) string {
	for range 32 {
		i := strings.Index(s, `\text{`)
		if i < 0 {
			return s
		}
		c, ok := braced(s[i+len(`\text{`):])
		if !ok {
			return s
		}
		s = s[:i] + " " + c + " " + s[i+len(`\text{`)+len(c)+1:]
	}
	return s
}

// labelLike reports the left side of "x = 3" that only names the answer:
// a symbol ("x", "a_3", "\theta", "f'"), a function value ("f(x)",
// "P(A)"), a tuple of symbols ("(p,q)"), a segment ("AB") or a word.
func labelLike(s string) bool {
	s = strings.ReplaceAll(strings.TrimSpace(unwrapText(s)), " ", "")
	if len(s) > 2 && s[0] == '|' && s[len(s)-1] == '|' {
		s = s[1 : len(s)-1] // "|AB| = 1"
	}
	if a, ok := strings.CutPrefix(s, `\frac{`); ok {
		// "\frac{NO}{BO} = ..." names a ratio of segments.
		if n, ok := braced(a); ok && strings.HasPrefix(a[len(n)+1:], "{") && strings.HasSuffix(a, "}") {
			d := a[len(n)+2 : len(a)-1]
			return isUpper(n) && isUpper(d)
		}
	}
	if s == "" {
		return false
	}
	sym := func(s string) (rest string, ok bool) {
		switch {
		case s != "" && isLetter(s[0]):
			s = s[1:]
		case strings.HasPrefix(s, `\`):
			j := 1
			for j < len(s) && isLetter(s[j]) {
				j++
			}
			if !greek[s[1:j]] {
				return s, false
			}
			s = s[j:]
		default:
			return s, false
		}
		if strings.HasPrefix(s, "_") {
			if strings.HasPrefix(s, "_{") {
				c, ok := braced(s[2:])
				if !ok {
					return s, false
				}
				s = s[2+len(c)+1:]
			} else if len(s) > 1 {
				s = s[2:]
			}
		}
		return strings.TrimLeft(s, "'"), true
	}
	if rest, ok := sym(s); ok {
		if rest == "" {
			return true
		}
		if strings.HasPrefix(rest, "(") && strings.HasSuffix(rest, ")") && !strings.ContainsAny(rest[1:len(rest)-1], "()=") {
			return true
		}
	}
	if strings.HasPrefix(s, "(") && strings.HasSuffix(s, ")") {
		for _, p := range strings.Split(s[1:len(s)-1], ",") {
			if rest, ok := sym(p); !ok || rest != "" {
				return false
			}
		}
		return true
	}
	if isUpper(s) && len(s) <= 4 {
		return true
	}
	return isText(s) && len(s) >= 4
}

// isUpper reports upper-case letters only.
func isUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if !('A' <= s[i] && s[i] <= 'Z') {
			return false
		}
	}
	return s != ""
}

// parseAnswer reads a cleaned answer into one value: a list (kList) when
// it has several items, "x = 3" read as 3, "1 ± √2" as two values.
func parseAnswer(s string, b *budget) (*node, error) {
	s = joinThousands(s)
	var items []*node
	for _, it := range splitTop(s, listSep) {
		it = strings.TrimSpace(it)
		if it == "" {
			continue
		}
		vs, err := parseItem(it, b)
		if err != nil {
			return nil, err
		}
		items = append(items, vs...)
		if len(items) > 64 {
			return nil, errSyntax
		}
	}
	switch len(items) {
	case 0:
		return nil, errSyntax
	case 1:
		return items[0], nil
	}
	return &node{kind: kList, args: items}, nil
}

// parseItem reads one item of a list.
func parseItem(it string, b *budget) ([]*node, error) {
	it, pct := stripUnits(it)
	it, text := cleanItem(it)
	if text != nil {
		return []*node{text}, nil
	}
	sides, ops, err := relations(it)
	if err != nil {
		return nil, err
	}
	allEq, allRatio := true, true
	for _, op := range ops {
		allEq = allEq && op == "="
		allRatio = allRatio && op == ":"
	}
	label := ""
	var labelVar *node
	if len(ops) > 0 && allEq && labelLike(sides[0]) {
		label = canonLabel(sides[0])
		if n, err := parseExpr(sides[0], b); err == nil && n.kind == kVar {
			labelVar = n
		}
		sides, ops = sides[1:], ops[1:]
	}
	parsed := make([]*node, len(sides))
	for k, sd := range sides {
		if strings.TrimSpace(sd) == "" {
			return nil, errSyntax
		}
		n, err := parseExpr(sd, b)
		if err != nil {
			return nil, err
		}
		parsed[k] = n
	}
	v, err := relValue(parsed, ops, allEq, allRatio)
	if err != nil {
		return nil, err
	}
	return labelled(v, label, labelVar, pct, b)
}

// cleanItem normalises an item's spelling (repeating decimals, spaced
// thousands, \text wrappers); an item that is text, not mathematics, is
// returned as a text node.
func cleanItem(it string) (string, *node) {
	it = repeating(it)
	if isSpacedThousands(it) {
		it = strings.ReplaceAll(it, " ", "")
	}
	if c, ok := strings.CutPrefix(it, `\text{`); ok {
		if inner, ok := braced(c); ok && len(inner)+1 == len(c) {
			it = inner
			letter := strings.Trim(inner, "() ")
			if len(letter) == 1 && isLetter(letter[0]) {
				it = letter // a choice "\text{(C)}" is C
			} else if !strings.ContainsAny(inner, `0123456789\^_+*/=()[]`) {
				return it, &node{kind: kText, name: canonText(inner)}
			}
		}
	}
	it = strings.TrimSpace(unwrapText(it))
	if isText(it) {
		return it, &node{kind: kText, name: canonText(it)}
	}
	return it, nil
}

// relations cuts an item at its top-level relation signs: the sides and
// the signs between them, with \approx and \in read as the answer means
// them.
func relations(it string) ([]string, []string, error) {
	sides := splitTop(it, relSep)
	var ops []string
	pos := 0
	for k := range sides[:len(sides)-1] {
		pos += len(sides[k])
		n := relSep(it, pos)
		ops = append(ops, it[pos:pos+n])
		pos += n
	}
	// "x = 1/3 \approx 0.33": the exact value before \approx counts;
	// "x \approx 11" states 11.
	for k, op := range ops {
		if op == `\approx` {
			if k == 0 && len(ops) == 1 && labelLike(sides[0]) {
				ops[0] = "="
				break
			}
			sides, ops = sides[:k+1], ops[:k]
			break
		}
	}
	if len(ops) > 0 && ops[0] == `\in` {
		if len(ops) != 1 || !labelLike(sides[0]) {
			return nil, nil, errSyntax
		}
		sides, ops = sides[1:], nil // "x \in [0, 1)" is the interval
	}
	return sides, ops, nil
}

// relValue is what an item's parsed sides state: a value, an equation or
// inequality, or a ratio.
func relValue(parsed []*node, ops []string, allEq, allRatio bool) (*node, error) {
	switch {
	case len(ops) == 0:
		return parsed[0], nil
	case allEq:
		// "3+4 = 7" and "x = 5+5+1 = 11" state their last side; "7 = 11a+c"
		// and "2x+4y = 3" are equations.
		set := map[string]bool{}
		for _, n := range parsed {
			vars(n, set)
		}
		last := map[string]bool{}
		vars(parsed[len(parsed)-1], last)
		switch {
		case len(set) == 0 || len(parsed) > 2 && len(last) == 0:
			return parsed[len(parsed)-1], nil
		case len(parsed) == 2:
			return &node{kind: kRel, ops: ops, args: parsed}, nil
		}
		return nil, errSyntax
	case allRatio:
		return &node{kind: kSeq, open: ":", close: ":", args: parsed}, nil
	}
	for _, op := range ops {
		if op == ":" || op == `\in` {
			return nil, errSyntax
		}
	}
	return &node{kind: kRel, ops: ops, args: parsed}, nil
}

// labelled gives v its label and percent flag, expanding ± into the
// values it stands for.
func labelled(v *node, label string, labelVar *node, pct bool, b *budget) ([]*node, error) {
	if v.kind == kSeq && v.open == "{" {
		// "\{1 \pm \sqrt5, -2\}" is a set of three.
		var all []*node
		for _, a := range v.args {
			vs, err := expandPM(a, b)
			if err != nil {
				return nil, err
			}
			all = append(all, vs...)
		}
		c := *v
		c.args, c.label, c.labelVar = all, label, labelVar
		return []*node{&c}, nil
	}
	if v.kind == kRel || v.kind == kSeq && v.open == ":" {
		for _, a := range v.args {
			if hasPM(a) {
				return nil, errSyntax
			}
		}
		v.label = label
		return []*node{v}, nil
	}
	vs, err := expandPM(v, b)
	if err != nil {
		return nil, err
	}
	for k, x := range vs {
		if pct && !x.isExpr() {
			return nil, errSyntax
		}
		c := *x
		c.pct, c.label, c.labelVar = pct, label, labelVar
		vs[k] = &c
	}
	return vs, nil
}

// canonLabel is a label's spelling for comparison: "a_{3}" is "a_3".
func canonLabel(s string) string {
	return strings.NewReplacer(" ", "", "{", "", "}", "").Replace(unwrapText(s))
}

// repeating writes a repeating decimal "0.1\overline{6}" as the fraction
// it is, "(1/6)"; an \overline that is no repeating decimal is left as it
// is.
func repeating(s string) string {
	for range 8 {
		k := strings.Index(s, `\overline{`)
		if k < 0 {
			return s
		}
		rep, ok := braced(s[k+len(`\overline{`):])
		end := k + len(`\overline{`) + len(rep) + 1
		if !ok || rep == "" || len(rep) > 20 || strings.Trim(rep, "0123456789") != "" {
			return s
		}
		i := k
		for i > 0 && isDigit(s[i-1]) {
			i--
		}
		if i == 0 || s[i-1] != '.' {
			return s
		}
		j := i - 1
		for j > 0 && isDigit(s[j-1]) {
			j--
		}
		whole, frac := s[j:i-1], s[i:k]
		if whole == "" {
			whole = "0"
		}
		// whole.frac(rep)... = whole + (frac·rep - frac) / (10^|frac| (10^|rep| - 1))
		v, _ := new(big.Rat).SetString(whole)
		fr, _ := new(big.Int).SetString("0"+frac, 10)
		fr2, _ := new(big.Int).SetString("0"+frac+rep, 10)
		den := new(big.Int).Mul(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil),
			new(big.Int).Sub(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(rep))), nil), big.NewInt(1)))
		v.Add(v, new(big.Rat).SetFrac(new(big.Int).Sub(fr2, fr), den))
		s = s[:j] + "(" + v.RatString() + ")" + s[end:]
	}
	return s
}

// isSpacedThousands reports "1 000 000" (groups of three digits after the
// first, single spaces).
func isSpacedThousands(s string) bool {
	g := strings.Split(s, " ")
	if len(g) < 2 || len(g[0]) == 0 || len(g[0]) > 3 || g[0][0] == '0' {
		return false
	}
	for k, x := range g {
		if k > 0 && len(x) != 3 {
			return false
		}
		for i := 0; i < len(x); i++ {
			if !isDigit(x[i]) {
				return false
			}
		}
	}
	return true
}

func canonText(s string) string {
	return strings.ToLower(strings.Join(strings.Fields(strings.Trim(s, " .")), " "))
}

// decimalComma returns the decimal reading of "3,5" (digits, one comma,
// digits, not a thousands grouping) as a number, or nil.
func decimalComma(s string) *node {
	t := strings.TrimLeft(s, "+-")
	i := strings.IndexByte(t, ',')
	if i <= 0 || i == len(t)-1 || strings.Count(t, ",") != 1 {
		return nil
	}
	for k := 0; k < len(t); k++ {
		if k != i && !isDigit(t[k]) {
			return nil
		}
	}
	if joinThousands(t) != t {
		return nil // "1,000" is a thousand
	}
	if strings.Trim(t[i+1:], "0") == "" {
		return nil // "3,0" and "5,00" are lists, not 3.0 and 5.00
	}
	v, ok := new(big.Rat).SetString(t[:i] + "." + t[i+1:])
	if !ok {
		return nil
	}
	if strings.HasPrefix(s, "-") {
		v.Neg(v)
	}
	return &node{kind: kNum, val: v, dec: true}
}

// mathEquivalent reports whether answer (a response's final answer) is
// mathematically equal to truth (a ground truth); both are raw LaTeX or
// text. It never panics on well-formed strings and bounds its work.
func mathEquivalent(truth, answer string) bool {
	b := &budget{left: stepBudget}
	return equivalent(truth, answer, b)
}

func equivalent(truth, answer string, b *budget) bool {
	t, ok1 := cleanAnswer(truth)
	a, ok2 := cleanAnswer(answer)
	if !ok1 || !ok2 {
		return false
	}
	if strings.ReplaceAll(t, " ", "") == strings.ReplaceAll(a, " ", "") {
		return true
	}
	tv, err1 := parseAnswer(t, b)
	av, err2 := parseAnswer(a, b)
	if err1 == nil && err2 == nil && equal(tv, av, b) {
		return true
	}
	// "3,5" for 3.5 (and the other way round), only against one number.
	if d := decimalComma(a); d != nil && err1 == nil && tv.isExpr() {
		return equal(tv, d, b)
	}
	if d := decimalComma(t); d != nil && err2 == nil && av.isExpr() {
		return equal(d, av, b)
	}
	return false
}

// elems returns the elements of an unordered collection: a list, or a set
// written with braces.
func elems(n *node) ([]*node, bool) {
	if n.kind == kList || n.kind == kSeq && n.open == "{" {
		return n.args, true
	}
	return nil, false
}

// equal compares two values structurally (see mathVerifier).
func equal(x, y *node, b *budget) bool {
	if b.spend(1) != nil {
		return false
	}
	if x.label != "" && y.label != "" && x.label != y.label {
		return false // "x = 1" is not "y = 1"
	}
	xs, xColl := elems(x)
	ys, yColl := elems(y)
	switch {
	case xColl && yColl:
		return multisetEqual(xs, ys, b)
	case xColl && len(xs) == 1:
		return equal(xs[0], y, b)
	case yColl && len(ys) == 1:
		return equal(x, ys[0], b)
	case xColl || yColl:
		return false
	}
	if x.isExpr() && y.isExpr() {
		return exprEqual(x, y, b)
	}
	switch {
	case x.kind == kText && y.kind == kText:
		return x.name == y.name
	case x.kind == kSeq && y.kind == kSeq, x.kind == kMatrix && y.kind == kMatrix:
		if x.open != y.open || x.close != y.close || len(x.args) != len(y.args) {
			return false
		}
		for i := range x.args {
			if !equal(x.args[i], y.args[i], b) {
				return false
			}
		}
		return true
	case x.kind == kUnion && y.kind == kUnion:
		return multisetEqual(x.args, y.args, b)
	case x.kind == kRel && y.labelVar != nil && y.isExpr():
		// "2x+4y-3 = 0" against "y = -x/2+3/4".
		return relEqual(x, &node{kind: kRel, ops: []string{"="}, args: []*node{y.labelVar, y}}, b)
	case y.kind == kRel && x.labelVar != nil && x.isExpr():
		return relEqual(&node{kind: kRel, ops: []string{"="}, args: []*node{x.labelVar, x}}, y, b)
	case x.kind == kText && y.kind == kMul && y.name != "":
		return x.name == strings.ToLower(y.name) // "\text{odd}" and "odd"
	case y.kind == kText && x.kind == kMul && x.name != "":
		return y.name == strings.ToLower(x.name)
	case x.kind == kRel && y.kind == kRel:
		if ix, iy := relInterval(x), relInterval(y); ix != nil && iy != nil {
			return equal(ix, iy, b)
		}
		return relEqual(x, y, b)
	case x.kind == kRel && (y.kind == kSeq || y.kind == kUnion):
		if ix := relInterval(x); ix != nil {
			return equal(ix, y, b)
		}
	case y.kind == kRel && (x.kind == kSeq || x.kind == kUnion):
		if iy := relInterval(y); iy != nil {
			return equal(x, iy, b)
		}
	}
	return false
}

// multisetEqual compares two unordered collections as sets: every element
// of each is equal to one of the other (a repeated element counts once).
// When only one side names its elements with two or more labels ("x = 1,
// y = 2" against "1, 2") the order counts.
func multisetEqual(xs, ys []*node, b *budget) bool {
	if lx, ly := labels(xs), labels(ys); (lx > 1 || ly > 1) && (lx == 0 || ly == 0) {
		if len(xs) != len(ys) {
			return false
		}
		for i := range xs {
			if !equal(xs[i], ys[i], b) {
				return false
			}
		}
		return true
	}
	covered := func(xs, ys []*node) bool {
		for _, x := range xs {
			found := false
			for _, y := range ys {
				if equal(x, y, b) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	}
	return covered(xs, ys) && covered(ys, xs)
}

// labels counts the distinct labels of a collection's elements.
func labels(ns []*node) int {
	set := map[string]bool{}
	for _, n := range ns {
		if n.label != "" {
			set[n.label] = true
		}
	}
	return len(set)
}

// relInterval reads "a < x ≤ b", "x > 5" (one variable against
// constants) as an interval; nil otherwise.
func relInterval(r *node) *node {
	isVar := func(n *node) bool { return n.kind == kVar }
	isConst := func(n *node) bool {
		set := map[string]bool{}
		vars(n, set)
		return len(set) == 0
	}
	inf := &node{kind: kInf}
	lower := func(op string) bool { return op == "<" || op == "≤" }
	upper := func(op string) bool { return op == ">" || op == "≥" }
	br := func(op string, open bool) string {
		strict := op == "<" || op == ">"
		switch {
		case strict && open:
			return "("
		case strict:
			return ")"
		case open:
			return "["
		}
		return "]"
	}
	a, o := r.args, r.ops
	switch {
	case len(a) == 3 && isVar(a[1]) && isConst(a[0]) && isConst(a[2]) && lower(o[0]) && lower(o[1]):
		return &node{kind: kSeq, open: br(o[0], true), close: br(o[1], false), args: []*node{a[0], a[2]}}
	case len(a) == 3 && isVar(a[1]) && isConst(a[0]) && isConst(a[2]) && upper(o[0]) && upper(o[1]):
		return &node{kind: kSeq, open: br(o[1], true), close: br(o[0], false), args: []*node{a[2], a[0]}}
	case len(a) == 2 && isVar(a[0]) && isConst(a[1]) && lower(o[0]):
		return &node{kind: kSeq, open: "(", close: br(o[0], false), args: []*node{neg(inf), a[1]}}
	case len(a) == 2 && isVar(a[0]) && isConst(a[1]) && upper(o[0]):
		return &node{kind: kSeq, open: br(o[0], true), close: ")", args: []*node{a[1], inf}}
	case len(a) == 2 && isVar(a[1]) && isConst(a[0]) && lower(o[0]):
		return &node{kind: kSeq, open: br(o[0], true), close: ")", args: []*node{a[0], inf}}
	case len(a) == 2 && isVar(a[1]) && isConst(a[0]) && upper(o[0]):
		return &node{kind: kSeq, open: "(", close: br(o[0], false), args: []*node{neg(inf), a[0]}}
	}
	return nil
}

// relEqual compares two relations L op R as f = L - R against 0: the same
// relation (after turning > into <) and g = c·f at every point, c > 0 for
// inequalities, c ≠ 0 for = and ≠ ("2x = 6" is "x = 3").
func relEqual(x, y *node, b *budget) bool {
	if len(x.args) != 2 || len(y.args) != 2 {
		return false
	}
	norm := func(r *node) (string, *node) {
		l, rt, op := r.args[0], r.args[1], r.ops[0]
		switch op {
		case ">":
			l, rt, op = rt, l, "<"
		case "≥":
			l, rt, op = rt, l, "≤"
		}
		return op, add(l, neg(rt))
	}
	ox, f := norm(x)
	oy, g := norm(y)
	if ox != oy {
		return false
	}
	signed := ox == "<" || ox == "≤"
	var ratio *num
	ok := atPoints(f, g, b, func(fv, gv num) bool {
		if isZero(fv) {
			return isZero(gv)
		}
		if isZero(gv) {
			return false
		}
		c := div(gv, fv)
		if ratio == nil {
			if signed && sign(c) <= 0 {
				return false
			}
			ratio = &c
			return true
		}
		return numEqual(*ratio, c)
	})
	return ok && ratio != nil
}

// sign is -1, 0 or 1 (0 also for an undefined value).
func sign(v num) int {
	switch {
	case v.r != nil:
		return v.r.Sign()
	case v.f > 0:
		return 1
	case v.f < 0:
		return -1
	}
	return 0
}

func isZero(v num) bool {
	if v.r != nil {
		return v.r.Sign() == 0
	}
	return math.Abs(v.f) < 1e-12
}

func div(a, d num) num {
	if a.r != nil && d.r != nil && d.r.Sign() != 0 {
		return exact(new(big.Rat).Quo(a.r, d.r))
	}
	return float(a.f / d.f)
}

// exprEqual compares two expressions, x the ground truth and y the
// answer. A ground truth that is a percentage also stands for its value /
// 100 ("28%" is 28 and 0.28). A percentage answer to a ground truth
// without one has one reading, chosen by the truth: its value / 100
// against a truth of magnitude at most 1 (a proportion: "28%" for 0.28,
// "100%" for 1), its literal value against a larger one ("28%" for a
// "what percent" truth 28). So "0.5%" is not 0.5, "1%" not 1, "5000%"
// not 50: a percent sign never gives an answer two chances.
func exprEqual(x, y *node, b *budget) bool {
	same := func(x, y *node) bool {
		return atPoints(x, y, b, func(u, v num) bool { return numEqual(u, v) })
	}
	hundred := &node{kind: kNum, val: big.NewRat(100, 1)}
	if y.pct && !x.pct {
		set := map[string]bool{}
		vars(x, set)
		proportion := true
		if len(set) == 0 {
			v, err := eval(x, nil, b)
			if err != nil || undefined(v) {
				return false
			}
			if v.r != nil {
				proportion = new(big.Rat).Abs(v.r).Cmp(big.NewRat(1, 1)) <= 0
			} else {
				proportion = math.Abs(v.f) <= 1
			}
		}
		if proportion {
			return same(x, &node{kind: kDiv, args: []*node{y, hundred}})
		}
		return same(x, y)
	}
	if same(x, y) {
		return true
	}
	if x.pct && !y.pct {
		return same(&node{kind: kDiv, args: []*node{x, hundred}}, y)
	}
	return false
}

// Points at which expressions with variables are compared.
const (
	wantPoints = 6  // every one must agree
	minPoints  = 4  // points where both sides are defined, at the least
	maxTries   = 16 // points drawn, at the most
)

// atPoints evaluates x and y at the same values of their variables and
// reports whether agree holds at every point where both are defined.
// Without variables that is one point. With variables the values are
// exact rationals p/q drawn from a fixed stream (all positive at the first
// point, all negative at the second, mixed after), wantPoints points must
// be defined on both sides (at least minPoints of maxTries draws), and
// every one must agree: two different expressions rarely agree at six
// random points.
func atPoints(x, y *node, b *budget, agree func(u, v num) bool) bool {
	set := map[string]bool{}
	vars(x, set)
	vars(y, set)
	if len(set) == 0 {
		u, err1 := eval(x, nil, b)
		v, err2 := eval(y, nil, b)
		return err1 == nil && err2 == nil && !undefined(u) && !undefined(v) && agree(u, v)
	}
	if len(set) > 16 {
		return false
	}
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, k)
	}
	slices.Sort(names)
	r := rand.New(rand.NewPCG(0x6b65656c, uint64(len(names))))
	good := 0
	for try := 0; try < maxTries && good < wantPoints; try++ {
		env := make(map[string]num, len(names))
		for _, n := range names {
			v := big.NewRat(int64(1+r.IntN(40)), int64(1+r.IntN(7)))
			neg := r.IntN(2) == 1
			if try == 0 {
				neg = false
			} else if try == 1 {
				neg = true
			}
			if neg {
				v.Neg(v)
			}
			env[n] = exact(v)
		}
		u, err1 := eval(x, env, b)
		v, err2 := eval(y, env, b)
		if err1 != nil || err2 != nil {
			return false
		}
		if undefined(u) || undefined(v) {
			continue
		}
		if !agree(u, v) {
			return false
		}
		good++
	}
	return good >= minPoints
}

// decimalApprox reports a decimal literal d with k ≥ 1 fractional digits (its
// denominator divides 10^k, not 10^(k-1)) and a non-terminating x with
// |d - x| < 10^-k and within the relative 1e-9 of numEqual: d is x
// rounded or truncated to ten significant digits or more.
func decimalApprox(d, x *big.Rat) bool {
	if d.IsInt() || !terminating(d) || terminating(x) {
		return false
	}
	k := 0
	for p := big.NewInt(1); new(big.Int).Mod(p, d.Denom()).Sign() != 0; p.Mul(p, big.NewInt(10)) {
		k++
		if k > 4000 {
			return false
		}
	}
	diff := new(big.Rat).Sub(d, x)
	diff.Abs(diff)
	ulp := new(big.Rat).SetFrac(big.NewInt(1), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(k)), nil))
	if diff.Cmp(ulp) >= 0 {
		return false
	}
	// relative 1e-9
	m := new(big.Rat).Abs(x)
	if dd := new(big.Rat).Abs(d); dd.Cmp(m) > 0 {
		m = dd
	}
	return diff.Cmp(new(big.Rat).Mul(m, big.NewRat(1, 1_000_000_000))) <= 0 || diff.Cmp(big.NewRat(1, 1_000_000_000_000)) <= 0
}

// terminating reports a rational with a finite decimal expansion: its
// denominator has no prime factor but 2 and 5.
func terminating(r *big.Rat) bool {
	d := new(big.Int).Rsh(r.Denom(), r.Denom().TrailingZeroBits())
	five, m := big.NewInt(5), new(big.Int)
	for d.Cmp(big.NewInt(1)) != 0 {
		q, rem := new(big.Int).QuoRem(d, five, m)
		if rem.Sign() != 0 {
			return false
		}
		d = q
	}
	return true
}

// undefined reports a value that is no number at a point (a division by
// zero, a root of a negative, an overflow). An exact value is defined even
// past float64's range; the symbol ∞ is defined (it equals only ∞).
func undefined(v num) bool { return v.r == nil && math.IsNaN(v.f) }

// numEqual compares two values: exact rationals exactly, and two
// different terminating decimals (integers among them: 2 and
// 2.0000000001) are never equal; otherwise within a relative 1e-9, so a
// decimal of ten significant digits or more equals the irrational or the
// repeating fraction it rounds (1/12 and 0.0833333333333333).
func numEqual(a, b num) bool {
	if a.r != nil && b.r != nil {
		if a.r.Cmp(b.r) == 0 {
			return true
		}
		// Two different exact values are equal only when one is a
		// decimal with fractional digits that rounds (or truncates) the
		// other, a repeating fraction: 0.0833333333333333 for 1/12, never
		// 333333333333 for 10^12/3.
		return a.dec && decimalApprox(a.r, b.r) || b.dec && decimalApprox(b.r, a.r)
	}
	if undefined(a) || undefined(b) {
		return false
	}
	if infinite(a) || infinite(b) {
		return a.f == b.f && infinite(a) && infinite(b)
	}
	if math.IsNaN(a.f) || math.IsNaN(b.f) {
		return false // an exact value outside float64's range
	}
	d := math.Abs(a.f - b.f)
	return d <= 1e-9*math.Max(math.Abs(a.f), math.Abs(b.f)) || d <= 1e-12
}
