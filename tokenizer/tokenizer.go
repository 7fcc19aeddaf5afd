// Package tokenizer turns text into token ids and back, as Hugging Face
// tokenizers does with a tokenizer.json. It applies keel's built-in
// character tokenizer (stored as a real tokenizer.json in every model
// directory keel writes, so a model directory describes itself) and the
// byte-level BPE of the Qwen family (Qwen2, Qwen2.5, Qwen3: NFC, Qwen's
// split pattern, GPT-2's byte mapping, ranked merges, added and special
// tokens), id for id; and it renders chats in the ChatML layout both use.
package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

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

// ErrUnsupported is wrapped by the errors for tokenizer.json files that
// are valid but use a component keel does not apply (another model type,
// normaliser or pre-tokenizer).
var ErrUnsupported = errors.New("unsupported tokenizer")

// Tokenizer maps text to ids and back following a Hugging Face
// tokenizer.json: added tokens are matched first (leftmost, longest), the
// text between them is normalised (NFC or nothing), cut into pre-tokens
// (Qwen's split pattern, or not at all) and each pre-token's bytes or
// characters are merged by the BPE model. A Tokenizer is safe for
// concurrent use.
type Tokenizer struct {
	pieces  []string         // id -> token: model pieces as stored, added tokens' content; "" for an unused id
	vocab   map[string]int32 // model vocabulary
	added   map[string]int32 // added tokens: content -> id
	isAdded []bool           // by id

	raw    matcher // added tokens matched on the raw text (normalized: false)
	normed matcher // added tokens matched after normalisation (normalized: true)

	nfc       bool // NFC normaliser
	split     bool // Qwen's split pattern
	byteLevel bool // GPT-2 byte mapping before the model
	model     *bpe
	decoder   decoderKind

	prefix, suffix []int32 // the post-processor's tokens around a sequence

	src []byte // the tokenizer.json this tokenizer was read from or built as
}

// NewChar returns keel's built-in character tokenizer: the special tokens
// <|endoftext|> (0), <|im_start|> (1), <|im_end|> (2), <|unk|> (3), then
// newline (4) and the printable ASCII characters space to tilde (5..99):
// 100 tokens, enough for every synthetic task. Its tokenizer.json (WriteFile)
// is a BPE model with one-character pieces and no merges, no normaliser or
// pre-tokenizer, the four special tokens as added tokens and the Fuse
// decoder: Hugging Face tokenizers loads it and gives the same ids.
func NewChar() *Tokenizer {
	j := charJSON()
	t, err := build(j)
	if err != nil {
		panic(err) // the built-in table is valid; TestCharFile checks it
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(j); err != nil {
		panic(err)
	}
	t.src = b.Bytes()
	return t
}

func charJSON() *fileJSON {
	pieces := []string{EndOfText, ImStart, ImEnd, Unknown, "\n"}
	for c := ' '; c <= '~'; c++ {
		pieces = append(pieces, string(c))
	}
	unk := Unknown
	j := &fileJSON{
		Version:       "1.0",
		Truncation:    nullJSON,
		Padding:       nullJSON,
		Normalizer:    nullJSON,
		PreTokenizer:  nullJSON,
		PostProcessor: nullJSON,
		Decoder:       []byte(`{"type":"Fuse"}`),
		Model: modelJSON{Type: "BPE", UnkToken: &unk, Vocab: orderedVocab{},
			Merges: mergesJSON{}},
	}
	for id, p := range pieces {
		j.Model.Vocab[p] = int32(id)
		if id < 4 {
			j.AddedTokens = append(j.AddedTokens, addedJSON{ID: int32(id), Content: p, Special: true})
		}
	}
	return j
}

var nullJSON = []byte("null")

// Load reads a tokenizer.json, or the one in a model directory. Errors
// name the file, and for malformed JSON the line and column.
func Load(path string) (*Tokenizer, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, FileName)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b, path)
}

// Parse reads a tokenizer.json; name (a file name) starts every error.
// keel applies BPE models with no normaliser or NFC, no pre-tokenizer or
// Qwen's Split + ByteLevel, and the ByteLevel, Fuse or no decoder; other
// components give an error wrapping ErrUnsupported.
func Parse(data []byte, name string) (*Tokenizer, error) {
	var j fileJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("%s: %w", name, jsonError(data, err))
	}
	t, err := build(&j)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	t.src = data
	return t, nil
}

// VocabSize is the number of ids, one more than the largest id (a model's
// vocab_size must be at least this).
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }

// ID returns the id of a token: an added token's content, or a model piece
// as the vocabulary stores it (byte-level form for byte-level BPE).
func (t *Tokenizer) ID(token string) (int32, bool) {
	if id, ok := t.added[token]; ok {
		return id, true
	}
	id, ok := t.vocab[token]
	return id, ok
}

// MustID is ID for tokens the caller knows exist (the special tokens of
// its own tokenizer); it panics on a missing one.
func (t *Tokenizer) MustID(token string) int32 {
	id, ok := t.ID(token)
	if !ok {
		panic(fmt.Sprintf("tokenizer: no token %q", token))
	}
	return id
}

// Token returns the token of id as ID takes it, and whether id names one.
func (t *Tokenizer) Token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(t.pieces) || (t.pieces[id] == "" && !t.isAdded[id]) {
		return "", false
	}
	return t.pieces[id], true
}

// Special holds the ids of the tokens of the ChatML layout; -1 where the
// tokenizer has none.
type Special struct {
	EndOfText int32 // <|endoftext|>: the end of a document
	ImStart   int32 // <|im_start|>
	ImEnd     int32 // <|im_end|>: the end of a response (generation stops here)
	Pad       int32 // padding: <|endoftext|>, as Qwen pads
}

// Special returns the ids of the ChatML layout's tokens.
func (t *Tokenizer) Special() Special {
	get := func(s string) int32 {
		if id, ok := t.ID(s); ok {
			return id
		}
		return -1
	}
	s := Special{EndOfText: get(EndOfText), ImStart: get(ImStart), ImEnd: get(ImEnd)}
	s.Pad = s.EndOfText
	return s
}

// Encode returns the ids of text as Hugging Face tokenizers' encode with
// add_special_tokens false gives them: added and special tokens written in
// the text are recognised, and nothing is added around it.
func (t *Tokenizer) Encode(text string) []int32 {
	return t.encode(make([]int32, 0, len(text)/3+1), text, true)
}

// EncodeOrdinary is Encode with no added token recognised: text that spells
// one ("<|im_end|>" in user content) is encoded as ordinary characters.
func (t *Tokenizer) EncodeOrdinary(text string) []int32 {
	return t.encode(make([]int32, 0, len(text)/3+1), text, false)
}

// AddSpecialTokens returns ids with the tokens the tokenizer's post-processor
// puts around a single sequence (BOS, EOS: Hugging Face's
// add_special_tokens); Qwen's tokenizers and keel's add none.
func (t *Tokenizer) AddSpecialTokens(ids []int32) []int32 {
	if len(t.prefix)+len(t.suffix) == 0 {
		return ids
	}
	out := make([]int32, 0, len(t.prefix)+len(ids)+len(t.suffix))
	out = append(out, t.prefix...)
	out = append(out, ids...)
	return append(out, t.suffix...)
}

func (t *Tokenizer) encode(ids []int32, text string, added bool) []int32 {
	if !added || t.raw.empty() {
		return t.encodeNormalized(ids, text, added)
	}
	t.raw.split(text, func(s string, id int32) {
		if id >= 0 {
			ids = append(ids, id)
		} else {
			ids = t.encodeNormalized(ids, s, true)
		}
	})
	return ids
}

// encodeNormalized normalises text (a piece between raw added tokens),
// matches the normalised added tokens in it, and encodes the rest.
func (t *Tokenizer) encodeNormalized(ids []int32, text string, added bool) []int32 {
	if t.nfc {
		text = nfc(text)
	}
	if !added || t.normed.empty() {
		return t.encodePlain(ids, text)
	}
	t.normed.split(text, func(s string, id int32) {
		if id >= 0 {
			ids = append(ids, id)
		} else {
			ids = t.encodePlain(ids, s)
		}
	})
	return ids
}

// encodePlain pre-tokenizes normalised text and encodes every pre-token.
func (t *Tokenizer) encodePlain(ids []int32, text string) []int32 {
	if !t.split {
		if text == "" {
			return ids
		}
		return t.model.encodeWord(ids, text)
	}
	for len(text) > 0 {
		n := splitQwen(text)
		ids = t.model.encodeWord(ids, text[:n])
		text = text[n:]
	}
	return ids
}

// Decode returns the text of ids as Hugging Face tokenizers' decode with
// skip_special_tokens false gives it: added tokens as written, byte-level
// pieces back to their bytes, and a byte sequence that is not valid UTF-8
// (ids cut inside a character) with U+FFFD for each maximal invalid part.
// An id that names no token is an error.
func (t *Tokenizer) Decode(ids []int32) (string, error) {
	for i, id := range ids {
		if _, ok := t.Token(id); !ok {
			return "", fmt.Errorf("tokenizer: id %d at position %d names no token (vocabulary size %d)", id, i, len(t.pieces))
		}
	}
	return t.DecodeLenient(ids), nil
}

// DecodeLenient is Decode that renders an id naming no token as <|unk|>,
// for showing model output (which may hold any id below the model's
// vocab_size).
func (t *Tokenizer) DecodeLenient(ids []int32) string {
	switch t.decoder {
	case decodeByteLevel:
		b := make([]byte, 0, 4*len(ids))
		for _, id := range ids {
			if tok, ok := t.Token(id); ok {
				b = appendByteLevel(b, tok)
			} else {
				b = append(b, Unknown...)
			}
		}
		return lossyUTF8(b)
	default:
		var b strings.Builder
		for i, id := range ids {
			if i > 0 && t.decoder == decodeNone {
				b.WriteByte(' ') // Hugging Face joins tokens with spaces when there is no decoder
			}
			if tok, ok := t.Token(id); ok {
				b.WriteString(tok)
			} else {
				b.WriteString(Unknown)
			}
		}
		return b.String()
	}
}

// MarshalJSON returns the tokenizer.json: the bytes it was read from, or
// for keel's character tokenizer the file NewChar describes.
func (t *Tokenizer) MarshalJSON() ([]byte, error) {
	if t.src == nil {
		return nil, errors.New("tokenizer: no tokenizer.json behind this tokenizer")
	}
	return t.src, nil
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
		_, err := w.Write(b)
		return err
	})
}
