package tasks

import (
	"strings"
)

// mathVerifier is the verifier "math": competition and word-problem math
// (MATH, MATH-500, DAPO-Math-17k, AIME, NuminaMath) with answers in LaTeX.
//
// The final answer of a response is the marker that starts last (see
// extractMath): \boxed{...} or \fbox{...}, "#### N", "the answer is ...",
// "Answer: ...", <answer>...</answer>. A ground truth that holds \boxed{}
// or "####" (a whole reference solution) is read the same way.
//
// Two answers are equal when, after LaTeX noise is removed (math
// delimiters, \left \right, \! \, spacing, \text{}, \mathrm{}, \dfrac and
// \tfrac as \frac), one of these holds:
//
//   - their normalised texts are the same;
//   - they are numbers of equal value: thousands separators ("12,345",
//     "1{,}000", "1\,000"), a decimal comma ("3,5" against one number
//     only), units and currency ($, \$, \text{ cm}, "miles", ^\circ)
//     ignored; fractions, mixed numbers ("2\frac12", "3 1/2"), percentages
//     (28% is 28 or 0.28), \sqrt, \pi, powers;
//   - they are expressions of equal value at wantPoints random points of
//     their variables, exact rationals where possible, a relative 1e-9
//     otherwise (two different integers are never equal);
//   - they are tuples, intervals or matrices of equal elements in order
//     with the same brackets ("(1,2]" is not "(1,2)"); unordered sets and
//     lists ("1, -2" is "-2, 1"; "\{1,2\}"; "1 \pm \sqrt2" is two values)
//     with the same elements, each once; unions of intervals;
//   - "x = 3" against 3 (a name on the left: x, f(x), a_1, (p,q)); an
//     equation against an equation with proportional sides; an inequality
//     or "x \in [a,b]" against the same interval.
//
// Wrong answers stay wrong — a false positive is a reward a policy learns
// to exploit — so the verifier refuses:
//
//   - a response whose \boxed answers disagree (a hedge "\boxed{12} ...
//     \boxed{13}"); boxes side by side joined only by commas or "and" are
//     one list answer;
//   - an answer that only contains the truth ("12 or 13", "12, 13",
//     "x = 12, y = 13" against 12): lists must match element for element;
//   - approximations: 0.333 is not 1/3 (1e-9 relative), 10^20+1 is not
//     10^20; expressions must agree at every point, not at one;
//   - words after a number only count as units when the number has no
//     variable ("3ab" is a product, not 3);
//   - an answer over maxAnswerLen characters, more than 64 boxes, or one
//     that spends the step budget (stepBudget) scores 0: the work per
//     response is bounded, and the verifier never panics (a recovered
//     panic scores 0).
type mathVerifier struct{}

func (mathVerifier) Name() string { return "math" }

// Score implements Verifier.
func (mathVerifier) Score(answer, response string) (s float64) {
	defer func() {
		if recover() != nil {
			s = 0
		}
	}()
	return scoreMath(answer, response)
}

// Extract implements Extractor: the response's final answer; ok is false
// when there is none or when the boxed answers disagree.
func (mathVerifier) Extract(response string) (answer string, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	x := extractMath(response)
	if !x.found {
		return x.answer, false
	}
	return x.answer, consistent(x, &budget{left: stepBudget})
}

// scoreMath is the math verifier without its panic guard (the fuzz test
// calls it so).
func scoreMath(truth, response string) float64 {
	x := extractMath(response)
	if !x.found {
		return 0
	}
	b := &budget{left: stepBudget}
	if !consistent(x, b) {
		return 0
	}
	if equivalent(truthAnswer(truth), x.answer, b) {
		return 1
	}
	return 0
}

// consistent reports whether every other boxed answer of a response
// agrees with its final answer (is equal to it or to one of the boxes the
// final answer lists).
func consistent(x mathExtraction, b *budget) bool {
	for _, o := range x.others {
		ok := equivalent(x.answer, o, b)
		for _, m := range x.members {
			ok = ok || equivalent(m, o, b)
		}
		if !ok {
			return false
		}
	}
	return true
}

// Response limits: a longer response is refused; a box longer than
// maxBoxLen is not an answer; more than maxBoxes boxes is refused.
const (
	maxResponseLen = 1 << 22
	maxBoxLen      = 4 * maxAnswerLen
	maxBoxes       = 64
)

// mathExtraction is what extractMath reads from a response.
type mathExtraction struct {
	answer  string   // the final answer, raw
	found   bool     // some marker was found (and the response not refused)
	members []string // the boxes a final list of boxes is made of
	others  []string // the other boxed answers, which must agree
}

// box is one \boxed{...} of a response.
type box struct {
	start, end int
	content    string
}

// findBoxes returns the \boxed{...} and \fbox{...} of s, outermost only,
// in order; ok is false when there are more than maxBoxes (or more than
// 4*maxBoxes unclosed ones: each costs a scan of up to maxBoxLen bytes).
func findBoxes(s string) ([]box, bool) {
	var out []box
	for i, tries := 0, 0; i < len(s); tries++ {
		if tries > 4*maxBoxes {
			return nil, false
		}
		j := strings.Index(s[i:], `\boxed`)
		k := strings.Index(s[i:], `\fbox`)
		n := len(`\boxed`)
		if j < 0 || k >= 0 && k < j {
			j, n = k, len(`\fbox`)
		}
		if j < 0 {
			break
		}
		start := i + j
		p := start + n
		if p < len(s) && s[p] == '{' {
			lim := min(len(s), p+1+maxBoxLen)
			if content, ok := braced(s[p+1 : lim]); ok {
				out = append(out, box{start, p + 1 + len(content) + 1, content})
				i = p + 1 + len(content) + 1
			} else {
				i = p
			}
		} else if p < len(s) && s[p] == ' ' {
			// "\boxed 5": one token.
			q := p + 1
			for q < len(s) && q < p+64 && !strings.ContainsRune(" \n\t$.,", rune(s[q])) {
				q++
			}
			if q > p+1 {
				out = append(out, box{start, q, s[p+1 : q]})
			}
			i = q
		} else {
			i = p
		}
		if len(out) > maxBoxes {
			return nil, false
		}
	}
	return out, true
}

// boxGap reports whether the text between two boxes only separates them:
// spaces, math delimiters, commas, "and", \quad.
func boxGap(s string) bool {
	if len(s) > 80 {
		return false
	}
	s = strings.NewReplacer(`\text{and}`, " ", `\text{ and }`, " ", `\quad`, " ", `\qquad`, " ",
		`\(`, " ", `\)`, " ", `\[`, " ", `\]`, " ", `\,`, " ", `\\`, " ", "$", " ", ",", " ", ";", " ",
		"&", " ", "~", " ").Replace(s)
	for _, f := range strings.Fields(s) {
		if f != "and" {
			return false
		}
	}
	return true
}

// lastGroup returns the index of the first box of the run of boxes that
// ends with the last one, side by side (boxGap).
func lastGroup(s string, boxes []box) int {
	g := len(boxes) - 1
	for g > 0 && boxGap(s[boxes[g-1].end:boxes[g].start]) {
		g--
	}
	return g
}

// extractMath finds a response's final answer: the marker that starts
// last among the last \boxed{} (with the boxes side by side before it, as
// a list), the last "####" line, the last "answer is" / "answer:" phrase
// (not prose after a box), and the last <answer>...</answer>.
func extractMath(response string) mathExtraction {
	var x mathExtraction
	if len(response) > maxResponseLen {
		return x
	}
	boxes, ok := findBoxes(response)
	if !ok {
		return x
	}
	at := -1
	var g int
	if len(boxes) > 0 {
		g = lastGroup(response, boxes)
		at = boxes[g].start
		var parts []string
		for _, bx := range boxes[g:] {
			parts = append(parts, bx.content)
		}
		x.answer, x.found = strings.Join(parts, ", "), true
		if len(parts) > 1 {
			x.members = parts
		}
	}
	if i, c := hashAnswer(response); i > at {
		x.answer, x.found, x.members, at = c, true, nil, i
	}
	// A phrase after a box counts unless it is prose ("... the answer is
	// correct").
	if i, rest := answerPhrase(response); i > at {
		if c := phraseContent(rest); len(boxes) == 0 || !isProse(c) {
			x.answer, x.found, x.members, at = c, true, nil, i
		}
	}
	if i := strings.LastIndex(response, "<answer>"); i > at {
		rest := response[i+len("<answer>"):]
		if j := strings.Index(rest, "</answer>"); j >= 0 {
			x.answer, x.found, x.members, at = strings.TrimSpace(rest[:j]), true, nil, i
		}
	}
	// Every other box must agree with the final answer.
	for k, bx := range boxes {
		if x.members != nil && k >= g {
			break
		}
		if x.members == nil && k == len(boxes)-1 && bx.start == at {
			break
		}
		x.others = append(x.others, bx.content)
	}
	if x.found && strings.TrimSpace(x.answer) == "" {
		x.found = false
	}
	return x
}

// hashAnswer finds the last "####" line whose content does not start with
// a letter (a GSM8K answer "#### 72", not a markdown heading "####
// Verification") and returns where it starts and its content; -1 when
// there is none.
func hashAnswer(s string) (int, string) {
	end := len(s)
	for try := 0; try < 64; try++ {
		i := strings.LastIndex(s[:end], "####")
		if i < 0 {
			return -1, ""
		}
		end = i
		rest := strings.TrimLeft(s[i+4:], " \t*")
		if rest == "" || rest[0] == '#' || rest[0] == '\n' || isLetter(rest[0]) {
			continue
		}
		if c := phraseContent(rest); c != "" {
			return i, c
		}
	}
	return -1, ""
}

// isProse reports a phrase's content that is words, not an answer.
func isProse(s string) bool {
	c, ok := cleanAnswer(s)
	return !ok || isText(unwrapText(c))
}

// answerPhrase finds the last "answer is", "answer:" or "answer is:" (any
// letter case, "**" allowed around) and returns where it starts and the
// text after it; -1 when there is none. Tags (<answer>) do not count.
func answerPhrase(s string) (int, string) {
	end := len(s)
	for try := 0; try < 256; try++ {
		i := lastIndexFold(s[:end], "answer")
		if i < 0 {
			return -1, ""
		}
		end = i
		if i > 0 && (s[i-1] == '<' || s[i-1] == '/' || isLetter(s[i-1])) {
			continue
		}
		rest := s[i+len("answer"):]
		if rest != "" && rest[0] == '>' {
			continue
		}
		rest = strings.TrimLeft(rest, " *")
		switch {
		case strings.HasPrefix(rest, ":"):
			return i, rest[1:]
		case len(rest) >= 2 && strings.EqualFold(rest[:2], "is") && (len(rest) == 2 || !isLetter(rest[2])):
			rest = strings.TrimLeft(rest[2:], " *")
			return i, strings.TrimPrefix(rest, ":")
		}
	}
	return -1, ""
}

// phraseContent reads the answer after a phrase or "####": the rest of
// the line (or the next line when it is empty), the math in $...$, \(...\)
// or \[...\] when it starts so, else up to the end of the sentence.
func phraseContent(s string) string {
	s = strings.TrimLeft(s, " \t*:")
	if strings.HasPrefix(s, "\n") {
		s = strings.TrimLeft(s, " \t\r\n*")
	}
	if j := strings.IndexByte(s, '\n'); j >= 0 {
		s = s[:j]
	}
	if m, ok := mathSpan(s); ok {
		return m
	}
	for _, stop := range []string{". ", ".\t", " I hope"} {
		if j := strings.Index(s, stop); j >= 0 {
			s = s[:j]
		}
	}
	// A sentence: "Answer: The volume of $ABCD$ is 120." states 120.
	if j := strings.LastIndex(s, " is "); j >= 0 && strings.TrimSpace(s[j+4:]) != "" {
		s = strings.TrimLeft(s[j+4:], " ")
		if m, ok := mathSpan(s); ok {
			return m
		}
	}
	s = strings.TrimSpace(strings.TrimRight(strings.TrimSpace(s), "*"))
	return strings.TrimSpace(strings.TrimSuffix(s, "."))
}

// mathSpan returns the math of s when s starts with $, $$, \( or \[: up to
// the closing delimiter (or the end).
func mathSpan(s string) (string, bool) {
	for _, d := range [][2]string{{"$$", "$$"}, {"$", "$"}, {`\(`, `\)`}, {`\[`, `\]`}} {
		if rest, ok := strings.CutPrefix(s, d[0]); ok {
			if j := strings.Index(rest, d[1]); j >= 0 {
				return strings.TrimSpace(rest[:j]), true
			}
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// truthAnswer reads a ground truth: the boxed answer (or "####" line, or
// final "answer is" phrase) of a whole reference solution, else the text
// as it is.
func truthAnswer(gt string) string {
	if len(gt) > maxResponseLen {
		return ""
	}
	if boxes, ok := findBoxes(gt); ok && len(boxes) > 0 {
		g := lastGroup(gt, boxes)
		var parts []string
		for _, bx := range boxes[g:] {
			parts = append(parts, bx.content)
		}
		return strings.Join(parts, ", ")
	}
	if i, c := hashAnswer(gt); i >= 0 {
		return c
	}
	if len(gt) > 200 {
		if x := extractMath(gt); x.found {
			return x.answer
		}
	}
	return gt
}

func init() {
	registerVerifier(mathVerifier{},
		// verl's names (reward_score/__init__.py) and the Hub ids of the
		// data sets.
		"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
		"hendrycks/competition_math", "EleutherAI/hendrycks_math", "nlile/hendrycks-MATH-benchmark",
		"math_dapo", "math_dapo_reasoning", "BytedTsinghua-SIA/DAPO-Math-17k", "MATH", "MATH-500", "math500",
		"aime*", "AIME*", "HuggingFaceH4/aime_2024", "Maxwell-Jia/AIME_2024", "math-ai/aime24", "math-ai/aime25",
		"AI-MO/aimo-validation-aime", "AI-MO/aimo-validation-amc", "amc*",
		"numina_*", "AI-MO/NuminaMath-CoT", "AI-MO/NuminaMath-1.5",
		"agentica-org/DeepScaleR-Preview-Dataset", "deepscaler",
	)
}
