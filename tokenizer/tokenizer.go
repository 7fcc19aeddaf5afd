// Package tokenizer turns text into token ids and back. It holds keel's
// built-in character tokenizer for the synthetic tasks, stored as a real
// Hugging Face tokenizer.json in every model directory keel writes, so a
// model directory describes itself, and the ChatML layout that both keel's
// tokenizer and Qwen's use.
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/keel-rl/keel/internal/atomicfile"
)

// FileName is the tokenizer file of a model directory.
const FileName = "tokenizer.json"

// Special tokens of the ChatML layout, as Qwen names them.
const (
	EndOfText = "<|endoftext|>" // end of a document; also padding
	ImStart   = "<|im_start|>"  // opens a chat turn
	ImEnd     = "<|im_end|>"    // closes a chat turn: the end of a response
	Unknown   = "<|unk|>"       // keel's character tokenizer: a character outside its alphabet
)

// Tokenizer maps text to ids and back: special tokens (matched first,
// anywhere in the text) and then single characters. It is keel's character
// tokenizer; its tokenizer.json is a Hugging Face BPE model without merges,
// which Hugging Face tokenizers loads and applies the same way.
type Tokenizer struct {
	vocab    map[string]int32 // piece -> id (characters and special tokens)
	pieces   []string         // id -> piece
	special  []string         // special (added) tokens, longest first
	specials map[string]bool
	first    [256]bool // first bytes of the special tokens
	unk      int32
	bpe      *bpe    // byte-level BPE (Qwen's tokenizer), or nil: characters
	added    []int32 // ids of added tokens (byte-level BPE)
}

// NewChar returns keel's built-in character tokenizer: the special tokens
// <|endoftext|> (0), <|im_start|> (1), <|im_end|> (2), <|unk|> (3), then
// newline (4) and the printable ASCII characters space to tilde (5..99):
// 100 tokens, enough for every synthetic task.
func NewChar() *Tokenizer {
	pieces := []string{EndOfText, ImStart, ImEnd, Unknown, "\n"}
	for c := ' '; c <= '~'; c++ {
		pieces = append(pieces, string(c))
	}
	t, err := fromPieces(pieces, []string{EndOfText, ImStart, ImEnd, Unknown}, Unknown)
	if err != nil {
		panic(err) // the built-in table is valid
	}
	return t
}

func fromPieces(pieces, special []string, unk string) (*Tokenizer, error) {
	t := &Tokenizer{vocab: map[string]int32{}, pieces: pieces, specials: map[string]bool{}}
	for i, p := range pieces {
		if _, dup := t.vocab[p]; dup {
			return nil, fmt.Errorf("token %q appears twice", p)
		}
		t.vocab[p] = int32(i)
	}
	for _, s := range special {
		if _, ok := t.vocab[s]; !ok {
			return nil, fmt.Errorf("special token %q is not in the vocabulary", s)
		}
		t.specials[s] = true
		t.special = append(t.special, s)
	}
	// Longest first, so a special token that prefixes another never wins.
	sortLongestFirst(t.special)
	t.index()
	id, ok := t.vocab[unk]
	if !ok {
		return nil, fmt.Errorf("unknown token %q is not in the vocabulary", unk)
	}
	t.unk = id
	return t, nil
}

// index records the first bytes of the special tokens.
func (t *Tokenizer) index() {
	for _, s := range t.special {
		t.first[s[0]] = true
	}
}

// VocabSize is the number of ids (a model's vocab_size must be at least
// this).
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// ID returns the id of a piece (a character or a special token).
func (t *Tokenizer) ID(piece string) (int32, bool) {
	id, ok := t.vocab[piece]
	return id, ok
}

// MustID is ID for pieces the caller knows exist (the special tokens).
func (t *Tokenizer) MustID(piece string) int32 {
	id, ok := t.vocab[piece]
	if !ok {
		panic(fmt.Sprintf("tokenizer: no token %q", piece))
	}
	return id
}

// Encode returns the ids of text: special (added) tokens written in the
// text are recognised anywhere (as Hugging Face tokenizers does by
// default); the rest goes through the byte-level BPE, or, for keel's
// character tokenizer, maps character by character (<|unk|> outside the
// alphabet). No BOS/EOS is added.
func (t *Tokenizer) Encode(text string) []int32 {
	ids := make([]int32, 0, len(text)/3+1)
	start := 0
	for i := 0; i < len(text); i++ {
		if !t.first[text[i]] {
			continue
		}
		if s := t.specialAt(text[i:]); s != "" {
			ids = t.encodePlain(ids, text[start:i])
			ids = append(ids, t.vocab[s])
			i += len(s) - 1
			start = i + 1
		}
	}
	return t.encodePlain(ids, text[start:])
}

// encodePlain encodes text that holds no special token.
func (t *Tokenizer) encodePlain(ids []int32, text string) []int32 {
	if text == "" {
		return ids
	}
	if t.bpe != nil {
		return t.bpe.encode(ids, text)
	}
	for _, r := range text {
		id, ok := t.vocab[string(r)]
		if !ok || t.specials[string(r)] {
			id = t.unk
		}
		ids = append(ids, id)
	}
	return ids
}

func (t *Tokenizer) specialAt(text string) string {
	for _, s := range t.special {
		if strings.HasPrefix(text, s) {
			return s
		}
	}
	return ""
}

// Decode returns the text of ids, special tokens included as written.
// An id outside the vocabulary is an error. With byte-level BPE, bytes
// that do not form valid UTF-8 (a token sequence cut inside a character)
// become U+FFFD.
func (t *Tokenizer) Decode(ids []int32) (string, error) {
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.pieces) {
			return "", fmt.Errorf("tokenizer: id %d at position %d is outside the vocabulary [0, %d)", id, i, len(t.pieces))
		}
	}
	return t.DecodeLenient(ids), nil
}

// DecodeLenient is Decode that renders an id outside the vocabulary as
// <|unk|>, for showing model output (which may hold any id below the
// model's vocab_size).
func (t *Tokenizer) DecodeLenient(ids []int32) string {
	if t.bpe != nil {
		var b []byte
		for _, id := range ids {
			switch {
			case id < 0 || int(id) >= len(t.pieces):
				b = append(b, Unknown...)
			case t.specials[t.pieces[id]]:
				b = append(b, t.pieces[id]...)
			default:
				b = t.bpe.decodeBytes(b, t.pieces[id])
			}
		}
		return strings.ToValidUTF8(string(b), "\uFFFD")
	}
	var b strings.Builder
	for _, id := range ids {
		if id < 0 || int(id) >= len(t.pieces) {
			b.WriteString(Unknown)
			continue
		}
		b.WriteString(t.pieces[id])
	}
	return b.String()
}

// hfJSON is the subset of Hugging Face's tokenizer.json that keel writes
// and reads for its character tokenizer.
type hfJSON struct {
	Version       string     `json:"version"`
	Truncation    any        `json:"truncation"`
	Padding       any        `json:"padding"`
	AddedTokens   []hfAdded  `json:"added_tokens"`
	Normalizer    any        `json:"normalizer"`
	PreTokenizer  any        `json:"pre_tokenizer"`
	PostProcessor any        `json:"post_processor"`
	Decoder       *hfDecoder `json:"decoder"`
	Model         hfModel    `json:"model"`
}

type hfAdded struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfDecoder struct {
	Type string `json:"type"`
}

type hfModel struct {
	Type                    string           `json:"type"`
	Dropout                 any              `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix any              `json:"continuing_subword_prefix"`
	EndOfWordSuffix         any              `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  []any            `json:"merges"`
}

// MarshalJSON writes the tokenizer as a Hugging Face tokenizer.json: a BPE
// model with one-character pieces and no merges (so every character is its
// own token), no pre-tokenizer or normaliser, the special tokens as added
// tokens, and the Fuse decoder (pieces concatenated).
func (t *Tokenizer) MarshalJSON() ([]byte, error) {
	if t.bpe != nil {
		return nil, errors.New("tokenizer: writing byte-level BPE tokenizers is not supported (copy the original tokenizer.json)")
	}
	unk := t.pieces[t.unk]
	j := hfJSON{Version: "1.0", Decoder: &hfDecoder{Type: "Fuse"},
		Model: hfModel{Type: "BPE", UnkToken: &unk, Vocab: map[string]int32{}, Merges: []any{}}}
	for id, p := range t.pieces {
		j.Model.Vocab[p] = int32(id)
		if t.specials[p] {
			j.AddedTokens = append(j.AddedTokens, hfAdded{ID: int32(id), Content: p, Special: true})
		}
	}
	return json.MarshalIndent(j, "", "  ")
}

// WriteFile writes the tokenizer.json to path (a file, or a directory to
// hold FileName), crash safe.
func (t *Tokenizer) WriteFile(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, FileName)
	}
	b, err := t.MarshalJSON()
	if err != nil {
		return err
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// Load reads a tokenizer.json, or the one in a model directory.
func Load(path string) (*Tokenizer, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, FileName)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ErrUnsupported is returned for tokenizer.json files keel cannot apply
// yet (byte-level BPE with merges: Qwen's own tokenizer).
var ErrUnsupported = errors.New("unsupported tokenizer")

// Parse reads a tokenizer.json: keel's character tokenizer (a BPE model
// without merges, pre-tokenizer or normaliser), or a byte-level BPE of the
// Qwen family (NFC, Qwen's split pattern, ByteLevel, merges as "a b"
// strings or pairs).
func Parse(b []byte) (*Tokenizer, error) {
	var j hfJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %v", err)
	}
	if len(j.Model.Merges) > 0 || j.PreTokenizer != nil {
		t, err := parseBPE(b)
		if err != nil {
			return nil, err
		}
		t.index()
		return t, nil
	}
	if j.Model.Type != "BPE" {
		return nil, fmt.Errorf("%w: model type %q (keel reads BPE)", ErrUnsupported, j.Model.Type)
	}
	if j.Normalizer != nil {
		return nil, fmt.Errorf("%w: a normaliser without byte-level BPE", ErrUnsupported)
	}
	if len(j.Model.Vocab) == 0 {
		return nil, errors.New("model.vocab is empty")
	}
	pieces := make([]string, len(j.Model.Vocab))
	seen := make([]bool, len(pieces))
	for p, id := range j.Model.Vocab {
		if id < 0 || int(id) >= len(pieces) || seen[id] {
			return nil, fmt.Errorf("model.vocab: id %d of %q is out of range or repeated (ids must be 0..%d)", id, p, len(pieces)-1)
		}
		if p != "" && utf8.RuneCountInString(p) != 1 {
			isAdded := false
			for _, a := range j.AddedTokens {
				isAdded = isAdded || a.Content == p
			}
			if !isAdded {
				return nil, fmt.Errorf("%w: model.vocab holds the multi-character piece %q", ErrUnsupported, p)
			}
		}
		pieces[id], seen[id] = p, true
	}
	var special []string
	for i, a := range j.AddedTokens {
		if id, ok := j.Model.Vocab[a.Content]; !ok || id != a.ID {
			return nil, fmt.Errorf("added_tokens[%d]: %q with id %d does not match model.vocab", i, a.Content, a.ID)
		}
		special = append(special, a.Content)
	}
	unk := Unknown
	if j.Model.UnkToken != nil {
		unk = *j.Model.UnkToken
	}
	return fromPieces(pieces, special, unk)
}
