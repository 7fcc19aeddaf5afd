package tokenizer

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of added_tokens as the matcher uses it.
type addedToken struct {
	content    string
	id         int32
	singleWord bool // match only where no word character touches it
	lstrip     bool // take the whitespace before it
	rstrip     bool // take the whitespace after it
}

// matcher finds added tokens in text the way Hugging Face tokenizers does:
// leftmost match first, the longest token among those starting there,
// matches never overlapping.
type matcher struct {
	toks    []addedToken
	byFirst [256][]int32 // first byte -> indices into toks, longest first
	single  int          // the only first byte, or -1
}

func newMatcher(toks []addedToken) matcher {
	m := matcher{toks: toks, single: -1}
	for i, tk := range toks {
		m.byFirst[tk.content[0]] = append(m.byFirst[tk.content[0]], int32(i))
	}
	firsts := 0
	for b := range m.byFirst {
		l := m.byFirst[b]
		if len(l) == 0 {
			continue
		}
		firsts++
		m.single = b
		slices.SortStableFunc(l, func(x, y int32) int { return len(toks[y].content) - len(toks[x].content) })
	}
	if firsts != 1 {
		m.single = -1
	}
	return m
}

func (m *matcher) empty() bool { return len(m.toks) == 0 }

// find returns the leftmost-longest match in s at or after from.
func (m *matcher) find(s string, from int) (start int, tok *addedToken) {
	for i := from; i < len(s); i++ {
		if m.single >= 0 {
			j := strings.IndexByte(s[i:], byte(m.single))
			if j < 0 {
				return -1, nil
			}
			i += j
		}
		for _, k := range m.byFirst[s[i]] {
			if strings.HasPrefix(s[i:], m.toks[k].content) {
				return i, &m.toks[k]
			}
		}
	}
	return -1, nil
}

// split calls f for the pieces of s in order: text between tokens with id
// -1, each matched token with its id (and its text, stripped whitespace
// included). A single_word token touching a word character is not a match
// (and the search goes on after it, as Hugging Face's does); lstrip and
// rstrip tokens take the whitespace around them.
func (m *matcher) split(s string, f func(piece string, id int32)) {
	done, from := 0, 0
	for {
		start, tk := m.find(s, from)
		if tk == nil {
			break
		}
		end := start + len(tk.content)
		from = end
		if tk.singleWord && (endsWithWord(s[:start]) || startsWithWord(s[end:])) {
			continue
		}
		if tk.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), done)
		}
		if tk.rstrip {
			end = len(s) - len(strings.TrimLeftFunc(s[end:], unicode.IsSpace))
			from = end
		}
		if done < start {
			f(s[done:start], -1)
		}
		f(s[start:end], tk.id)
		done = end
	}
	if done < len(s) {
		f(s[done:], -1)
	}
}

// isWord is the \w of Hugging Face's Rust regex: alphabetic, marks,
// decimal digits, connector punctuation, join controls.
func isWord(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Nl, r) ||
		unicode.Is(unicode.Other_Alphabetic, r) || unicode.Is(unicode.Join_Control, r)
}

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWord(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWord(r)
}
