package tokenizer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// fileJSON is the layout of a Hugging Face tokenizer.json. The pipeline
// components stay raw until parseComponents reads the kinds keel applies.
type fileJSON struct {
	Version       string          `json:"version"`
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         modelJSON       `json:"model"`
}

// addedJSON is one entry of added_tokens.
type addedJSON struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// modelJSON is the model section (keel applies BPE).
type modelJSON struct {
	Type                    string       `json:"type"`
	Dropout                 *float64     `json:"dropout"`
	UnkToken                *string      `json:"unk_token"`
	ContinuingSubwordPrefix *string      `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string      `json:"end_of_word_suffix"`
	FuseUnk                 bool         `json:"fuse_unk"`
	ByteFallback            bool         `json:"byte_fallback"`
	IgnoreMerges            bool         `json:"ignore_merges"`
	Vocab                   orderedVocab `json:"vocab"`
	Merges                  mergesJSON   `json:"merges"`
}

// orderedVocab is model.vocab: read as a map, written in id order (as
// Hugging Face writes it).
type orderedVocab map[string]int32

// MarshalJSON writes the vocabulary in id order.
func (v orderedVocab) MarshalJSON() ([]byte, error) {
	pieces := make([]string, 0, len(v))
	for p := range v {
		pieces = append(pieces, p)
	}
	sortByID(pieces, v)
	var b bytes.Buffer
	b.WriteByte('{')
	for i, p := range pieces {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := marshalNoEscape(p)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(v[p])))
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func sortByID(pieces []string, v map[string]int32) {
	slices.SortFunc(pieces, func(a, b string) int { return cmp.Compare(v[a], v[b]) })
}

// marshalNoEscape is json.Marshal of a string without HTML escaping (so
// "<|im_end|>" stays readable, as Hugging Face writes it).
func marshalNoEscape(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// mergesJSON is model.merges: "a b" strings (older files) or [a, b] pairs
// (newer ones).
type mergesJSON [][2]string

// UnmarshalJSON reads either form.
func (m *mergesJSON) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		*m = nil
		return nil
	}
	// Fast paths for a list all of one form; anything else goes through
	// the element by element reading below, for a precise error.
	var first byte
	if i := bytes.IndexAny(b[min(1, len(b)):], `"[]`); i >= 0 {
		first = b[1+i]
	}
	switch first {
	case '"':
		var ss []string
		if json.Unmarshal(b, &ss) == nil {
			out := make(mergesJSON, len(ss))
			for i, s := range ss {
				a, c, ok := strings.Cut(s, " ")
				if !ok || strings.Contains(c, " ") {
					return fmt.Errorf("model.merges[%d]: %q is not of the form \"a b\"", i, s)
				}
				out[i] = [2]string{a, c}
			}
			*m = out
			return nil
		}
	case '[':
		var pairs [][]string
		if json.Unmarshal(b, &pairs) == nil {
			out := make(mergesJSON, len(pairs))
			ok := true
			for i, p := range pairs {
				if len(p) != 2 {
					ok = false
					break
				}
				out[i] = [2]string{p[0], p[1]}
			}
			if ok {
				*m = out
				return nil
			}
		}
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return errors.New("model.merges: want a list")
	}
	out := make(mergesJSON, len(raw))
	for i, r := range raw {
		r = bytes.TrimSpace(r)
		if len(r) > 0 && r[0] == '"' {
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				return fmt.Errorf("model.merges[%d]: %v", i, err)
			}
			// As Hugging Face: exactly one space separates the two parts.
			a, c, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(c, " ") {
				return fmt.Errorf("model.merges[%d]: %q is not of the form \"a b\"", i, s)
			}
			out[i] = [2]string{a, c}
			continue
		}
		var pair []string
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return fmt.Errorf("model.merges[%d]: want \"a b\" or [\"a\", \"b\"], got %.40s", i, r)
		}
		out[i] = [2]string{pair[0], pair[1]}
	}
	*m = out
	return nil
}

// MarshalJSON writes pairs (the newer form).
func (m mergesJSON) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("[]"), nil
	}
	return marshalNoEscape([][2]string(m))
}

// position returns "line L, column C" (1-based) of byte offset off in data.
func position(data []byte, off int64) string {
	if off < 0 {
		off = 0
	}
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	line := 1 + bytes.Count(data[:off], []byte{'\n'})
	col := int(off) - (bytes.LastIndexByte(data[:off], '\n') + 1) + 1
	return fmt.Sprintf("line %d, column %d", line, col)
}

// jsonError turns a decoding error into one that says where in data it
// happened and, for a wrong type, which field.
func jsonError(data []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		off := syn.Offset // just after the offending byte, or the end of a truncated file
		if off > 0 && !strings.Contains(syn.Error(), "unexpected end") {
			off--
		}
		return fmt.Errorf("%s: invalid JSON: %v", position(data, off), syn)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "top level"
		}
		return fmt.Errorf("%s: field %s: a JSON %s where %s was expected", position(data, typ.Offset), field, typ.Value, goTypeName(typ.Type.String()))
	}
	return err
}

// goTypeName says in words what a Go type stands for in tokenizer.json.
func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "float"):
		return "a number"
	case t == "string", t == "*string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "[]"), strings.HasPrefix(t, "tokenizer.merges"):
		return "a list"
	}
	return "an object"
}
