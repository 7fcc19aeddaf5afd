package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Character classes of the split pattern, as the Rust regex engines of
// Hugging Face tokenizers see them: \p{L}, \p{N} and Unicode \s
// (White_Space).
func isL(r rune) bool     { return unicode.IsLetter(r) }
func isN(r rune) bool     { return unicode.IsNumber(r) }
func isSpace(r rune) bool { return unicode.IsSpace(r) }
func isNL(r rune) bool    { return r == '\r' || r == '\n' }

// splitQwen returns the length in bytes of the first pre-token of s (non
// empty), by Qwen's pattern, alternatives tried in order:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)     contractions, any case
//	[^\r\n\p{L}\p{N}]?\p{L}+          a word, with one leading non-letter
//	\p{N}                             one digit
//	 ?[^\s\p{L}\p{N}]+[\r\n]*         punctuation, one leading space, newlines
//	\s*[\r\n]+                        whitespace up to its last newline
//	\s+(?!\S)                         whitespace not followed by a non-space
//	\s+                               whitespace
func splitQwen(s string) int {
	r0, n0 := utf8.DecodeRuneInString(s)
	// Contractions.
	if r0 == '\'' && len(s) > 1 {
		r1, n1 := utf8.DecodeRuneInString(s[1:])
		l1 := unicode.ToLower(r1)
		switch {
		case l1 == 's' || r1 == 'ſ' || l1 == 't' || l1 == 'm' || l1 == 'd':
			return 1 + n1
		case l1 == 'r' || l1 == 'v' || l1 == 'l':
			if len(s) > 1+n1 {
				r2, n2 := utf8.DecodeRuneInString(s[1+n1:])
				l2 := unicode.ToLower(r2)
				if (l1 == 'r' || l1 == 'v') && (l2 == 'e') || l1 == 'l' && (l2 == 'l') {
					return 1 + n1 + n2
				}
			}
		}
	}
	// A word with an optional leading non-letter, non-number, non-newline.
	i := 0
	if !isNL(r0) && !isL(r0) && !isN(r0) {
		i = n0
	}
	if j := letters(s[i:]); j > 0 {
		return i + j
	}
	if isN(r0) {
		return n0
	}
	// Punctuation run.
	i = 0
	if r0 == ' ' {
		i = 1
	}
	j := i
	for j < len(s) {
		r, n := utf8.DecodeRuneInString(s[j:])
		if isSpace(r) || isL(r) || isN(r) {
			break
		}
		j += n
	}
	if j > i {
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Whitespace: the maximal run, its last newline, and the lookahead.
	end, lastNL, prev := 0, -1, 0
	for end < len(s) {
		r, n := utf8.DecodeRuneInString(s[end:])
		if !isSpace(r) {
			break
		}
		if isNL(r) {
			lastNL = end + n
		}
		prev = end
		end += n
	}
	if end == 0 {
		return n0 // not reachable: every rune falls in some class
	}
	if lastNL > 0 {
		return lastNL
	}
	if end == len(s) || prev == 0 {
		return end
	}
	return prev // leave the last whitespace rune to the next pre-token
}

// letters returns the length of the run of letters at the start of s.
func letters(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !isL(r) {
			break
		}
		i += n
	}
	return i
}
