// Package jsonfix reads the JSON that other programs' writers emit but
// encoding/json refuses, so that a check can name the field at fault
// instead of failing on the syntax.
package jsonfix

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// QuoteNonFinite quotes the bare NaN, Infinity and -Infinity outside
// strings that some JSON writers emit (Python's json.dumps), so that the
// document parses and its reader can refuse the field holding one by
// name. b is returned as it is when it holds none.
func QuoteNonFinite(b []byte) []byte {
	if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) {
		return b
	}
	out := make([]byte, 0, len(b)+8)
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			out = append(out, c)
			continue
		}
		if c == '"' {
			inString = true
		}
		word := ""
		for _, w := range []string{"NaN", "Infinity", "-Infinity"} {
			if bytes.HasPrefix(b[i:], []byte(w)) {
				word = w
			}
		}
		if word != "" {
			out = append(out, '"')
			out = append(out, word...)
			out = append(out, '"')
			i += len(word) - 1
			continue
		}
		out = append(out, c)
	}
	return out
}

// CheckKeys refuses a member of a decoded object whose key is not in
// keys. Keys are case-sensitive: a key that differs from a wanted one
// only in case is named with the spelling wanted.
func CheckKeys(m map[string]json.RawMessage, keys []string) error {
	for k := range m {
		if slices.Contains(keys, k) {
			continue
		}
		for _, want := range keys {
			if strings.EqualFold(k, want) {
				return fmt.Errorf("unknown key %q (keys are case-sensitive: want %q)", k, want)
			}
		}
		return fmt.Errorf("unknown key %q (want %s)", k, strings.Join(keys, ", "))
	}
	return nil
}

// IsNull reports whether a member is JSON null.
func IsNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }
