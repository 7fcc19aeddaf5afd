package tokenizer

import (
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// byteRune is GPT-2's bytes_to_unicode table: the printable Latin-1 bytes
// stand for themselves, the others (control bytes, space, 0x7F-0xA0,
// 0xAD) for U+0100 upwards in byte order.
var byteRune, runeByte = func() (br [256]rune, rb [0x144]int16) {
	for i := range rb {
		rb[i] = -1
	}
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			br[b] = rune(b)
		} else {
			br[b] = rune(256 + n)
			n++
		}
		rb[br[b]] = int16(b)
	}
	return br, rb
}()

// byteLevelString is s with every byte replaced by its byte-level rune.
func byteLevelString(s string) string {
	b := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		b = utf8.AppendRune(b, byteRune[s[i]])
	}
	return string(b)
}

// appendByteLevel appends the bytes a token stands for, as Hugging Face's
// ByteLevel decoder does: a token whose every character is in the table
// gives those bytes, any other token its own text.
func appendByteLevel(dst []byte, tok string) []byte {
	start := len(dst)
	for _, r := range tok {
		if r >= rune(len(runeByte)) || runeByte[r] < 0 {
			return append(dst[:start], tok...)
		}
		dst = append(dst, byte(runeByte[r]))
	}
	return dst
}

// lossyUTF8 is b as a string with each maximal invalid part (the longest
// prefix of a well-formed sequence, or one byte) replaced by U+FFFD: Rust's
// String::from_utf8_lossy, which Hugging Face's decoders use.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r != utf8.RuneError || n > 1 {
			out = append(out, b[:n]...)
			b = b[n:]
			continue
		}
		out = append(out, "\uFFFD"...)
		b = b[invalidPrefix(b):]
	}
	return string(out)
}

// invalidPrefix returns the length of the maximal subpart at the start of
// b, which does not begin a valid sequence (Unicode 3.9, table 3-7).
func invalidPrefix(b []byte) int {
	lo, hi, need := byte(0x80), byte(0xBF), 0
	switch c := b[0]; {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		lo, need = 0xA0, 2
	case c == 0xED:
		hi, need = 0x9F, 2
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		lo, need = 0x90, 3
	case c == 0xF4:
		hi, need = 0x8F, 3
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	default:
		return 1
	}
	i := 1
	for ; i <= need && i < len(b); i++ {
		if b[i] < lo || b[i] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return i
}

// nfc returns s in Normalization Form C.
func nfc(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			// A combining mark composes with the character before it.
			if norm.NFC.IsNormalString(s[max(i-1, 0):]) {
				return s
			}
			return norm.NFC.String(s)
		}
	}
	return s // ASCII is in NFC
}
