package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// bpe is a byte-level BPE model in the GPT-2 / Qwen family: text is split
// on added tokens, NFC-normalised, cut into pre-tokens by the Qwen split
// pattern, each pre-token's bytes mapped to printable runes, and merges
// applied by rank.
type bpe struct {
	ranks  map[[2]string]int // merge pair -> rank (lower merges first)
	vocab  map[string]int32  // byte-level piece -> id
	nfc    bool
	byteOf map[rune]byte // inverse of the byte-to-rune table
	runeOf [256]rune     // GPT-2's bytes_to_unicode

	mu    sync.Mutex
	cache map[string][]int32 // pre-token -> ids
}

// bytesToUnicode is GPT-2's table: printable Latin-1 bytes map to
// themselves, the others to U+0100 upwards in byte order.
func bytesToUnicode() (out [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			out[b] = rune(b)
		} else {
			out[b] = rune(256 + n)
			n++
		}
	}
	return out
}

// hfFull is what keel reads of a byte-level BPE tokenizer.json.
type hfFull struct {
	AddedTokens  []hfAdded     `json:"added_tokens"`
	Normalizer   *hfNormalizer `json:"normalizer"`
	PreTokenizer *hfPre        `json:"pre_tokenizer"`
	Model        hfBPEModel    `json:"model"`
}

type hfNormalizer struct {
	Type string `json:"type"`
}

type hfPre struct {
	Type          string  `json:"type"`
	Pretokenizers []hfPre `json:"pretokenizers"`
	Pattern       *struct {
		Regex string `json:"Regex"`
	} `json:"pattern"`
	Behavior     string `json:"behavior"`
	UseRegex     bool   `json:"use_regex"`
	AddPrefixSpc bool   `json:"add_prefix_space"`
}

type hfBPEModel struct {
	Type   string            `json:"type"`
	Vocab  map[string]int32  `json:"vocab"`
	Merges []json.RawMessage `json:"merges"`
}

// qwenPattern is the split pattern keel's hand-written pre-tokenizer
// implements (Go's regexp cannot: it has a lookahead and \s is ASCII
// there).
const qwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// parseBPE builds a byte-level BPE tokenizer from a tokenizer.json of the
// Qwen family.
func parseBPE(b []byte) (*Tokenizer, error) {
	var j hfFull
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %v", err)
	}
	if j.Model.Type != "BPE" {
		return nil, fmt.Errorf("%w: model type %q", ErrUnsupported, j.Model.Type)
	}
	m := &bpe{ranks: make(map[[2]string]int, len(j.Model.Merges)), vocab: j.Model.Vocab, cache: map[string][]int32{}}
	if n := j.Normalizer; n != nil {
		if n.Type != "NFC" {
			return nil, fmt.Errorf("%w: normalizer %q (keel applies NFC or none)", ErrUnsupported, n.Type)
		}
		m.nfc = true
	}
	if err := checkPre(j.PreTokenizer); err != nil {
		return nil, err
	}
	for i, raw := range j.Model.Merges {
		var pair [2]string
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			a, c, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("model.merges[%d]: %q is not \"a b\"", i, s)
			}
			pair = [2]string{a, c}
		} else {
			var arr []string
			if err := json.Unmarshal(raw, &arr); err != nil || len(arr) != 2 {
				return nil, fmt.Errorf("model.merges[%d]: want \"a b\" or [a, b]", i)
			}
			pair = [2]string{arr[0], arr[1]}
		}
		if _, dup := m.ranks[pair]; !dup {
			m.ranks[pair] = i
		}
	}
	m.runeOf = bytesToUnicode()
	m.byteOf = make(map[rune]byte, 256)
	for b, r := range m.runeOf {
		m.byteOf[r] = byte(b)
	}
	// The id -> piece table covers the model's vocabulary and added tokens.
	size := 0
	for _, id := range j.Model.Vocab {
		size = max(size, int(id)+1)
	}
	for _, a := range j.AddedTokens {
		size = max(size, int(a.ID)+1)
	}
	if size == 0 {
		return nil, fmt.Errorf("model.vocab is empty")
	}
	// Ids are dense in real files (Qwen's: 151,643 pieces then 26 added
	// tokens); a sparse id would make the id table absurdly large.
	if limit := len(j.Model.Vocab) + len(j.AddedTokens); size > limit {
		return nil, fmt.Errorf("ids run to %d for %d pieces and added tokens (ids must be dense)", size-1, limit)
	}
	t := &Tokenizer{vocab: map[string]int32{}, pieces: make([]string, size), specials: map[string]bool{}, bpe: m, unk: -1}
	for p, id := range j.Model.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("model.vocab: negative id %d for %q", id, p)
		}
		t.pieces[id] = p
	}
	for i, a := range j.AddedTokens {
		if a.ID < 0 || a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: bad id %d or empty content", i, a.ID)
		}
		t.pieces[a.ID] = a.Content
		t.vocab[a.Content] = a.ID
		t.specials[a.Content] = true
		t.special = append(t.special, a.Content)
		t.added = append(t.added, a.ID)
	}
	sortLongestFirst(t.special)
	return t, nil
}

// checkPre accepts the pre-tokenizers of the Qwen family: a Sequence of a
// Split with the Qwen pattern (behaviour Isolated) and a ByteLevel
// without its own regex or prefix space; or a lone ByteLevel whose regex is
// GPT-2's (not supported).
func checkPre(p *hfPre) error {
	if p == nil || p.Type != "Sequence" || len(p.Pretokenizers) != 2 {
		return fmt.Errorf("%w: pre_tokenizer (keel implements Qwen's Split + ByteLevel sequence)", ErrUnsupported)
	}
	s, bl := p.Pretokenizers[0], p.Pretokenizers[1]
	if s.Type != "Split" || s.Pattern == nil || s.Pattern.Regex != qwenPattern || s.Behavior != "Isolated" {
		return fmt.Errorf("%w: split pattern (keel implements Qwen's: %s)", ErrUnsupported, qwenPattern)
	}
	if bl.Type != "ByteLevel" || bl.UseRegex || bl.AddPrefixSpc {
		return fmt.Errorf("%w: ByteLevel pre-tokenizer with use_regex or add_prefix_space", ErrUnsupported)
	}
	return nil
}

func sortLongestFirst(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && len(s[j]) > len(s[j-1]); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// encode appends the ids of text (no added tokens inside) to ids.
func (m *bpe) encode(ids []int32, text string) []int32 {
	if m.nfc && !norm.NFC.IsNormalString(text) {
		text = norm.NFC.String(text)
	}
	for len(text) > 0 {
		n := splitQwen(text)
		ids = m.encodeWord(ids, text[:n])
		text = text[n:]
	}
	return ids
}

// encodeWord appends the ids of one pre-token, through the cache.
func (m *bpe) encodeWord(ids []int32, w string) []int32 {
	m.mu.Lock()
	c, ok := m.cache[w]
	m.mu.Unlock()
	if ok {
		return append(ids, c...)
	}
	out := m.merge(w)
	m.mu.Lock()
	if len(m.cache) > 1<<18 {
		clear(m.cache)
	}
	m.cache[w] = out
	m.mu.Unlock()
	return append(ids, out...)
}

// merge applies the merges to the byte-level symbols of w, lowest rank
// first (leftmost among equal ranks), and returns the ids.
func (m *bpe) merge(w string) []int32 {
	syms := make([]string, 0, len(w))
	for i := 0; i < len(w); i++ {
		syms = append(syms, string(m.runeOf[w[i]]))
	}
	if len(syms) > 1 {
		if id, ok := m.vocab[strings.Join(syms, "")]; ok {
			return []int32{id}
		}
	}
	for len(syms) > 1 {
		best, at := -1, -1
		for i := 0; i+1 < len(syms); i++ {
			if r, ok := m.ranks[[2]string{syms[i], syms[i+1]}]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		// Merge every occurrence of the best pair, left to right.
		a, b := syms[at], syms[at+1]
		out := syms[:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == a && syms[i+1] == b {
				out = append(out, a+b)
				i++
				continue
			}
			out = append(out, syms[i])
		}
		syms = out
	}
	ids := make([]int32, 0, len(syms))
	for _, s := range syms {
		if id, ok := m.vocab[s]; ok {
			ids = append(ids, id)
			continue
		}
		// A symbol outside the vocabulary (never for a complete byte-level
		// vocabulary): fall back to its single bytes.
		for _, r := range s {
			ids = append(ids, m.vocab[string(r)])
		}
	}
	return ids
}

// decodeBytes appends the bytes a byte-level piece stands for.
func (m *bpe) decodeBytes(dst []byte, piece string) []byte {
	for _, r := range piece {
		if b, ok := m.byteOf[r]; ok {
			dst = append(dst, b)
		} else {
			dst = utf8.AppendRune(dst, r)
		}
	}
	return dst
}

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
