package tasks

import (
	"math/big"
	"strings"
)

// gsm8kVerifier is the verifier "gsm8k": grade-school word problems whose
// answer is one number (GSM8K's "#### 72").
//
// It is stricter than math: the final answer is the text after the last
// "####" of the response (not a markdown heading "#### Step 2") or,
// without one, the final marker math reads
// (\boxed{}, "the answer is", "Answer:", <answer>); it must be a single
// number — a sign, digits with optional thousands commas, an optional
// decimal part — with at most a currency sign, a percent sign or unit
// words around it ("$1,200", "18 dollars", "25%"), and it must equal the
// ground truth's number exactly ("72.00" is 72). Fractions, expressions,
// lists ("12 or 13"), and boxed answers or a later "the answer is" or
// <answer> that disagree with the "####" number, score 0. A ground
// truth that is a whole GSM8K solution is read after its "####".
type gsm8kVerifier struct{}

func (gsm8kVerifier) Name() string { return "gsm8k" }

// Score implements Verifier.
func (g gsm8kVerifier) Score(answer, response string) (s float64) {
	defer func() {
		if recover() != nil {
			s = 0
		}
	}()
	want, ok := gsmNumber(truthAnswer(answer))
	if !ok {
		return 0
	}
	got, ok := g.Extract(response)
	if !ok {
		return 0
	}
	if v, ok := gsmNumber(got); ok && v.Cmp(want) == 0 {
		return 1
	}
	return 0
}

// Extract implements Extractor: the text after the last "####", else the
// final answer math reads; ok is false when there is none or when a boxed
// answer is not the same number.
func (gsm8kVerifier) Extract(response string) (answer string, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	x := extractMath(response)
	if i, c := hashAnswer(response); i >= 0 && len(response) <= maxResponseLen {
		x.answer, x.found, x.members = c, true, nil
		x.others = x.others[:0]
		if boxes, ok := findBoxes(response); ok {
			for _, bx := range boxes {
				x.others = append(x.others, bx.content)
			}
		} else {
			x.found = false
		}
		// A final-answer phrase or <answer> after the "####" must agree
		// too ("#### 72\nWait, the answer is 73." is no answer); a phrase
		// that is prose ("the answer is correct") does not count.
		if j, rest := answerPhrase(response); j > i {
			if pc := phraseContent(rest); !isProse(pc) {
				x.others = append(x.others, pc)
			}
		}
		if j := strings.LastIndex(response, "<answer>"); j > i {
			rest := response[j+len("<answer>"):]
			if k := strings.Index(rest, "</answer>"); k >= 0 {
				x.others = append(x.others, strings.TrimSpace(rest[:k]))
			}
		}
	}
	if !x.found {
		return x.answer, false
	}
	v, ok := gsmNumber(x.answer)
	if !ok {
		return x.answer, true // read, but not a number: scores 0
	}
	for _, o := range x.others {
		if w, ok := gsmNumber(o); !ok || w.Cmp(v) != 0 {
			return x.answer, false
		}
	}
	return x.answer, true
}

// gsmNumber reads an answer that is one number, with thousands commas,
// currency, percent and unit words allowed around it.
func gsmNumber(s string) (*big.Rat, bool) {
	c, ok := cleanAnswer(s)
	if !ok {
		return nil, false
	}
	c = joinThousands(c)
	var item string
	n := 0
	for _, it := range splitTop(c, listSep) {
		if strings.TrimSpace(it) != "" {
			item = it
			n++
		}
	}
	if n != 1 {
		return nil, false
	}
	item, _ = stripUnits(item)
	item = strings.TrimSpace(unwrapText(item))
	t := strings.TrimPrefix(strings.TrimPrefix(item, "-"), "+")
	t = strings.TrimSpace(t)
	if t == "" || len(t) > 40 {
		return nil, false
	}
	dot := false
	for i := 0; i < len(t); i++ {
		switch {
		case isDigit(t[i]):
		case t[i] == '.' && !dot && i > 0 && i < len(t)-1:
			dot = true
		default:
			return nil, false
		}
	}
	v, ok := new(big.Rat).SetString(t)
	if !ok {
		return nil, false
	}
	if strings.HasPrefix(item, "-") {
		v.Neg(v)
	}
	return v, true
}

func init() {
	registerVerifier(gsm8kVerifier{}, "openai/gsm8k", "GSM8K")
}
