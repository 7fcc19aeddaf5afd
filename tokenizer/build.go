package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// decoderKind is the decoder section of a tokenizer.json.
type decoderKind int

const (
	decodeNone      decoderKind = iota // no decoder: tokens joined with spaces
	decodeByteLevel                    // GPT-2's byte mapping undone
	decodeFuse                         // tokens concatenated
)

// component is the common shape of a pipeline component: its type and the
// fields of the kinds keel applies.
type component struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`
	Pattern       *struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior       string                     `json:"behavior"`
	Invert         bool                       `json:"invert"`
	AddPrefixSpace *bool                      `json:"add_prefix_space"`
	UseRegex       *bool                      `json:"use_regex"`
	Single         []templatePiece            `json:"single"`
	SpecialTokens  map[string]templateSpecial `json:"special_tokens"`
	Cls            *[2]json.RawMessage        `json:"cls"`
	Sep            *[2]json.RawMessage        `json:"sep"`
}

// templatePiece is one element of TemplateProcessing's "single" template.
type templatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// templateSpecial is an entry of TemplateProcessing's special_tokens.
type templateSpecial struct {
	IDs []int32 `json:"ids"`
}

// qwenPattern is the split pattern of Qwen2/2.5/3, which keel's
// hand-written pre-tokenizer implements (Go's regexp cannot: the pattern
// has a lookahead, and \s is ASCII there).
const qwenPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func readComponent(raw json.RawMessage, field string) (*component, error) {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %v", field, err)
	}
	if c.Type == "" {
		return nil, fmt.Errorf("%s: no \"type\"", field)
	}
	return &c, nil
}

// build checks a tokenizer.json and makes the tokenizer it describes.
func build(j *fileJSON) (*Tokenizer, error) {
	if j.Version != "" && j.Version != "1.0" {
		return nil, fmt.Errorf("version: %q (keel reads tokenizer.json version 1.0)", j.Version)
	}
	t := &Tokenizer{added: map[string]int32{}}
	if err := t.readNormalizer(j.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	if err := t.readPreTokenizer(j.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.readDecoder(j.Decoder); err != nil {
		return nil, err
	}
	if err := t.readModel(&j.Model, j.AddedTokens); err != nil {
		return nil, err
	}
	if err := t.readAdded(j.AddedTokens); err != nil {
		return nil, err
	}
	if err := t.readPostProcessor(j.PostProcessor, "post_processor"); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Tokenizer) readNormalizer(raw json.RawMessage, field string) error {
	if isNull(raw) {
		return nil
	}
	c, err := readComponent(raw, field)
	if err != nil {
		return err
	}
	switch c.Type {
	case "NFC":
		t.nfc = true
	case "Sequence":
		for i, n := range c.Normalizers {
			if err := t.readNormalizer(n, fmt.Sprintf("%s.normalizers[%d]", field, i)); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%s: %w: type %q (keel applies NFC or none)", field, ErrUnsupported, c.Type)
	}
	return nil
}

// readPreTokenizer accepts none, a lone ByteLevel without its own regex,
// and Qwen's Sequence of Split (its pattern, Isolated) and ByteLevel.
func (t *Tokenizer) readPreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	c, err := readComponent(raw, "pre_tokenizer")
	if err != nil {
		return err
	}
	steps := []json.RawMessage{raw}
	field := "pre_tokenizer"
	if c.Type == "Sequence" {
		steps, field = c.Pretokenizers, "pre_tokenizer.pretokenizers"
	}
	for i, s := range steps {
		f := field
		if c.Type == "Sequence" {
			f = fmt.Sprintf("%s[%d]", field, i)
		}
		p, err := readComponent(s, f)
		if err != nil {
			return err
		}
		switch {
		case p.Type == "Split" && !t.split && !t.byteLevel:
			if p.Pattern == nil || p.Pattern.Regex == nil || *p.Pattern.Regex != qwenPattern {
				return fmt.Errorf("%s: %w: split pattern (keel implements Qwen's: %s)", f, ErrUnsupported, qwenPattern)
			}
			if p.Behavior != "Isolated" || p.Invert {
				return fmt.Errorf("%s: %w: split behavior %q, invert %v (keel implements Isolated, not inverted)", f, ErrUnsupported, p.Behavior, p.Invert)
			}
			t.split = true
		case p.Type == "ByteLevel" && !t.byteLevel:
			// Hugging Face's defaults are add_prefix_space and use_regex true.
			if p.AddPrefixSpace == nil || *p.AddPrefixSpace {
				return fmt.Errorf("%s: %w: ByteLevel with add_prefix_space", f, ErrUnsupported)
			}
			if p.UseRegex == nil || *p.UseRegex {
				return fmt.Errorf("%s: %w: ByteLevel with use_regex (GPT-2's own split; keel implements Qwen's Split)", f, ErrUnsupported)
			}
			t.byteLevel = true
		default:
			return fmt.Errorf("%s: %w: pre-tokenizer %q here (keel implements Qwen's Split followed by ByteLevel)", f, ErrUnsupported, p.Type)
		}
	}
	if t.split && !t.byteLevel {
		return fmt.Errorf("pre_tokenizer: %w: Split without ByteLevel", ErrUnsupported)
	}
	return nil
}

func (t *Tokenizer) readDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		t.decoder = decodeNone
		return nil
	}
	c, err := readComponent(raw, "decoder")
	if err != nil {
		return err
	}
	switch c.Type {
	case "ByteLevel":
		t.decoder = decodeByteLevel
	case "Fuse":
		t.decoder = decodeFuse
	default:
		return fmt.Errorf("decoder: %w: type %q (keel applies ByteLevel, Fuse or none)", ErrUnsupported, c.Type)
	}
	return nil
}

// readModel reads the BPE model and sizes the id table, which covers the
// model's vocabulary and the added tokens.
func (t *Tokenizer) readModel(m *modelJSON, added []addedJSON) error {
	switch {
	case m.Type != "BPE":
		return fmt.Errorf("model.type: %w: %q (keel applies BPE)", ErrUnsupported, m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return fmt.Errorf("model.dropout: %w: %g (random merges)", ErrUnsupported, *m.Dropout)
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return fmt.Errorf("model.continuing_subword_prefix: %w: %q", ErrUnsupported, *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return fmt.Errorf("model.end_of_word_suffix: %w: %q", ErrUnsupported, *m.EndOfWordSuffix)
	case m.ByteFallback:
		return fmt.Errorf("model.byte_fallback: %w", ErrUnsupported)
	case len(m.Vocab) == 0:
		return fmt.Errorf("model.vocab is empty")
	}
	size := 0
	for p, id := range m.Vocab {
		if id < 0 {
			return fmt.Errorf("model.vocab: %q has the negative id %d", p, id)
		}
		size = max(size, int(id)+1)
	}
	// Ids are dense in real files (Qwen's: 151,643 pieces, then 26 added
	// tokens); a sparse id would make the id table absurdly large.
	if limit := len(m.Vocab) + len(added); size > limit {
		return fmt.Errorf("model.vocab: ids run to %d for %d pieces (ids must be dense)", size-1, len(m.Vocab))
	}
	t.pieces = make([]string, size)
	t.isAdded = make([]bool, size)
	for p, id := range m.Vocab {
		if old := t.pieces[id]; old != "" {
			a, b := old, p
			if a > b {
				a, b = b, a
			}
			return fmt.Errorf("model.vocab: id %d is given to both %q and %q", id, a, b)
		}
		if p == "" {
			return fmt.Errorf("model.vocab: the empty string is not a token (id %d)", id)
		}
		t.pieces[id] = p
	}
	t.vocab = m.Vocab
	model, err := newBPE(m, t.byteLevel)
	if err != nil {
		return err
	}
	t.model = model
	return nil
}

// readAdded reads added_tokens: content -> id for ID, the id table, and
// the two matchers (raw text, normalised text). The ids are Hugging Face's,
// which does not take them from the file: a token that is already in the
// vocabulary keeps that id, a new one gets the next free id (the
// vocabulary's size, then one more than the largest added id). They agree
// with the file's in real files; the id field is only checked for range.
func (t *Tokenizer) readAdded(added []addedJSON) error {
	order := []string{} // contents, in Hugging Face's order: special tokens first
	flags := map[string]addedJSON{}
	for _, special := range []bool{true, false} {
		for i, a := range added {
			if a.Content == "" {
				return fmt.Errorf("added_tokens[%d]: empty content", i)
			}
			if a.ID < 0 {
				return fmt.Errorf("added_tokens[%d]: %q has the negative id %d", i, a.Content, a.ID)
			}
			if a.Special != special {
				continue
			}
			if _, dup := flags[a.Content]; !dup {
				order = append(order, a.Content)
			}
			flags[a.Content] = a // a repeated content keeps its last options
		}
	}
	maxAdded := int32(-1)
	for _, a := range added { // ids are given in file order
		if _, done := t.added[a.Content]; done {
			continue
		}
		id, ok := t.vocab[a.Content]
		if !ok {
			id = int32(len(t.vocab))
			if maxAdded >= id {
				id = maxAdded + 1
			}
			if int(id) < len(t.pieces) && t.pieces[id] != "" {
				return fmt.Errorf("added_tokens: %q would take id %d, model.vocab's %q (model.vocab has holes)", a.Content, id, t.pieces[id])
			}
			for int(id) >= len(t.pieces) {
				t.pieces = append(t.pieces, "")
				t.isAdded = append(t.isAdded, false)
			}
		}
		maxAdded = max(maxAdded, id)
		t.added[a.Content] = id
		t.pieces[id] = a.Content
		t.isAdded[id] = true
	}
	var raw, normed []addedToken
	for _, c := range order {
		a := flags[c]
		tok := addedToken{content: c, id: t.added[c], singleWord: a.SingleWord, lstrip: a.LStrip, rstrip: a.RStrip}
		if a.Normalized {
			if t.nfc {
				tok.content = nfc(tok.content)
			}
			normed = append(normed, tok)
		} else {
			raw = append(raw, tok)
		}
	}
	t.raw = newMatcher(raw)
	t.normed = newMatcher(normed)
	return nil
}

// readPostProcessor reads the tokens a post-processor puts around a single
// sequence (TemplateProcessing, BertProcessing, RobertaProcessing; ByteLevel
// adds none).
func (t *Tokenizer) readPostProcessor(raw json.RawMessage, field string) error {
	if isNull(raw) {
		return nil
	}
	c, err := readComponent(raw, field)
	if err != nil {
		return err
	}
	checkID := func(id int32, what string) error {
		if _, ok := t.Token(id); !ok {
			return fmt.Errorf("%s: %s id %d names no token", field, what, id)
		}
		return nil
	}
	switch c.Type {
	case "ByteLevel":
	case "Sequence":
		for i, p := range c.Processors {
			if err := t.readPostProcessor(p, fmt.Sprintf("%s.processors[%d]", field, i)); err != nil {
				return err
			}
		}
	case "TemplateProcessing":
		var pre, post []int32
		seen := false
		for i, p := range c.Single {
			switch {
			case p.Sequence != nil:
				if seen {
					return fmt.Errorf("%s.single[%d]: a second sequence", field, i)
				}
				seen = true
			case p.SpecialToken != nil:
				sp, ok := c.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("%s.single[%d]: %q is not in special_tokens", field, i, p.SpecialToken.ID)
				}
				for _, id := range sp.IDs {
					if err := checkID(id, "special_tokens"); err != nil {
						return err
					}
				}
				if seen {
					post = append(post, sp.IDs...)
				} else {
					pre = append(pre, sp.IDs...)
				}
			default:
				return fmt.Errorf("%s.single[%d]: want SpecialToken or Sequence", field, i)
			}
		}
		if !seen {
			return fmt.Errorf("%s.single: no Sequence", field)
		}
		t.prefix = append(t.prefix, pre...)
		t.suffix = append(post, t.suffix...)
	case "BertProcessing", "RobertaProcessing":
		if c.Cls == nil || c.Sep == nil {
			return fmt.Errorf("%s: %s without cls and sep", field, c.Type)
		}
		var cls, sep int32
		if json.Unmarshal(c.Cls[1], &cls) != nil || json.Unmarshal(c.Sep[1], &sep) != nil {
			return fmt.Errorf("%s: cls and sep must be [token, id]", field)
		}
		if err := checkID(cls, "cls"); err != nil {
			return err
		}
		if err := checkID(sep, "sep"); err != nil {
			return err
		}
		t.prefix = append(t.prefix, cls)
		t.suffix = append([]int32{sep}, t.suffix...)
	default:
		return fmt.Errorf("%s: %w: type %q", field, ErrUnsupported, c.Type)
	}
	return nil
}
