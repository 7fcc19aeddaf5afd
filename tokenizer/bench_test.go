package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// benchText is about n bytes of mixed text in 4 KB chunks, like
// tools/tokgold/speed.js makes: prose over a generated lexicon, Go-like
// code, CJK runs.
func benchText(n int) []string {
	r := rand.New(rand.NewPCG(1, 2))
	syll := []string{"ba", "ke", "stri", "lo", "mun", "ther", "qua", "ing", "ex", "pol", "ra", "ti", "on", "ve", "sh", "ck"}
	lex := make([]string, 20000)
	for i := range lex {
		var b strings.Builder
		for k := 1 + r.IntN(3); k > 0; k-- {
			b.WriteString(syll[r.IntN(len(syll))])
		}
		lex[i] = b.String()
	}
	word := func() string { return lex[int(float64(len(lex))*r.Float64()*r.Float64()*r.Float64())] }
	cjk := []rune("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分")
	var chunks []string
	var b strings.Builder
	for total := 0; total < n; {
		switch r.IntN(3) {
		case 0:
			for k := 8 + r.IntN(20); k > 0; k-- {
				b.WriteString(word())
				b.WriteByte(' ')
			}
			b.WriteString("end.\n")
		case 1:
			f, a := word(), word()
			b.WriteString("func " + f + "(" + a + " int) error {\n\tif " + a + " > 10 {\n\t\treturn " + word() + "(" + a + ")\n\t}\n\treturn nil\n}\n\n")
		default:
			for k := 10 + r.IntN(40); k > 0; k-- {
				b.WriteRune(cjk[r.IntN(len(cjk))])
			}
			b.WriteString("。\n")
		}
		if b.Len() >= 4096 {
			total += b.Len()
			chunks = append(chunks, b.String())
			b.Reset()
		}
	}
	return chunks
}

func benchEncode(b *testing.B, cold bool) {
	tok := qwen(b)
	chunks := benchText(1 << 20)
	n := 0
	for _, c := range chunks {
		n += len(c)
	}
	b.SetBytes(int64(n))
	for b.Loop() {
		if cold {
			tok.model.mu.Lock()
			clear(tok.model.cache)
			tok.model.mu.Unlock()
		}
		for _, c := range chunks {
			tok.Encode(c)
		}
	}
}

// BenchmarkQwenEncodeCold encodes 1 MB with an empty pre-token cache each
// time (every pre-token merged); Warm with the cache filled.
func BenchmarkQwenEncodeCold(b *testing.B) { benchEncode(b, true) }
func BenchmarkQwenEncodeWarm(b *testing.B) { benchEncode(b, false) }
