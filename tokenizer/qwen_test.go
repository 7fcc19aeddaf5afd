package tokenizer

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

var (
	qwenOnce sync.Once
	qwenTok  *Tokenizer
	qwenErr  error
)

// qwen loads Qwen3's tokenizer.json (committed gzipped; see tools/tokgold).
func qwen(t testing.TB) *Tokenizer {
	qwenOnce.Do(func() {
		f, err := os.Open("testdata/qwen3-tokenizer.json.gz")
		if err != nil {
			qwenErr = err
			return
		}
		defer f.Close()
		z, err := gzip.NewReader(f)
		if err != nil {
			qwenErr = err
			return
		}
		b, err := io.ReadAll(z)
		if err != nil {
			qwenErr = err
			return
		}
		qwenTok, qwenErr = Parse(b, "qwen3-tokenizer.json")
	})
	if qwenErr != nil {
		t.Fatal(qwenErr)
	}
	return qwenTok
}

// goldenLines reads a JSON line file (gzipped if its name says so) of
// goldens from tools/tokgold/make_goldens.js.
func goldenLines[T any](t *testing.T, name string) []T {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(name, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		r = z
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var out []T
	for n := 1; sc.Scan(); n++ {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s:%d: %v", name, n, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

type encodeGolden struct {
	Text       string  `json:"text"`
	IDs        []int32 `json:"ids"`
	IDsSpecial []int32 `json:"ids_special"`
}

// TestQwenGoldens holds keel's byte-level BPE to Hugging Face tokenizers,
// id for id, on a corpus of prose, code, digits, whitespace, CJK and other
// scripts, emoji sequences, combining marks, contractions, special tokens
// and near-misses, unusual whitespace and random valid UTF-8; through both
// merge paths (array scan and heap); and checks decode(encode(s)) == NFC(s).
func TestQwenGoldens(t *testing.T) {
	tok := qwen(t)
	if tok.VocabSize() != 151669 {
		t.Fatalf("vocabulary %d, want 151669", tok.VocabSize())
	}
	gold := goldenLines[encodeGolden](t, "testdata/qwen3-goldens.jsonl.gz")
	if len(gold) < 900 {
		t.Fatalf("only %d golden lines", len(gold))
	}
	defer func(s int) { smallWord = s }(smallWord)
	for _, small := range []int{64, 1} {
		smallWord = small
		clear(tok.model.cache)
		failed := 0
		for _, g := range gold {
			got := tok.Encode(g.Text)
			if !slices.Equal(got, g.IDs) {
				if failed++; failed < 10 {
					t.Errorf("smallWord %d: %q:\n got %v\nwant %v", small, g.Text, got, g.IDs)
				}
				continue
			}
			back, err := tok.Decode(got)
			if err != nil || back != norm.NFC.String(g.Text) {
				t.Errorf("%q: decode gives %q (%v)", g.Text, back, err)
			}
		}
	}
	clear(tok.model.cache)
}

// TestQwenDecode holds Decode to Hugging Face's decode on random ids,
// cut characters (U+FFFD per maximal invalid part) and special tokens.
func TestQwenDecode(t *testing.T) {
	tok := qwen(t)
	gold := goldenLines[struct {
		IDs  []int32 `json:"ids"`
		Text string  `json:"text"`
	}](t, "testdata/qwen3-decode.jsonl.gz")
	if len(gold) < 300 {
		t.Fatalf("only %d golden lines", len(gold))
	}
	for _, g := range gold {
		if got, err := tok.Decode(g.IDs); err != nil || got != g.Text {
			t.Errorf("%v: %q (%v), want %q", g.IDs, got, err, g.Text)
		}
	}
	if _, err := tok.Decode([]int32{151669}); err == nil {
		t.Error("Decode accepted id 151669")
	}
}

// TestCharGoldens: Hugging Face tokenizers loads keel's character
// tokenizer.json and gives the same ids.
func TestCharGoldens(t *testing.T) {
	tk := NewChar()
	gold := goldenLines[encodeGolden](t, "testdata/char-goldens.jsonl")
	if len(gold) < 100 {
		t.Fatalf("only %d golden lines", len(gold))
	}
	for _, g := range gold {
		if got := tk.Encode(g.Text); !slices.Equal(got, g.IDs) {
			t.Errorf("%q:\n got %v\nwant %v", g.Text, got, g.IDs)
		}
	}
}

// TestFlagsGoldens holds the added-token options (lstrip, rstrip,
// single_word, normalized, overlapping tokens) and a TemplateProcessing
// post-processor to Hugging Face tokenizers on a small tokenizer made by
// make_goldens.js.
func TestFlagsGoldens(t *testing.T) {
	tk, err := Load("testdata/flags-tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	gold := goldenLines[encodeGolden](t, "testdata/flags-goldens.jsonl")
	if len(gold) < 300 {
		t.Fatalf("only %d golden lines", len(gold))
	}
	for _, g := range gold {
		got := tk.Encode(g.Text)
		if !slices.Equal(got, g.IDs) {
			t.Errorf("%q:\n got %v\nwant %v", g.Text, got, g.IDs)
		}
		if sp := tk.AddSpecialTokens(got); !slices.Equal(sp, g.IDsSpecial) {
			t.Errorf("%q with special tokens:\n got %v\nwant %v", g.Text, sp, g.IDsSpecial)
		}
	}
}

func TestQwenHand(t *testing.T) {
	tok := qwen(t)
	// Checked against Hugging Face tokenizers: "Hello world!  <|im_start|>user\n12345 can't 你好".
	want := []int32{9707, 1879, 0, 256, 151644, 872, 198, 16, 17, 18, 19, 20, 646, 944, 220, 108386}
	if got := tok.Encode("Hello world!  <|im_start|>user\n12345 can't 你好"); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if id, ok := tok.ID("<|im_end|>"); !ok || id != 151645 {
		t.Fatalf("<|im_end|> = %d", id)
	}
}

// FuzzQwenRoundTrip: no panic on any input; decode(encode(s)) == NFC(s)
// on valid UTF-8; both merge paths agree on every pre-token; decoding any
// ids gives valid UTF-8.
func FuzzQwenRoundTrip(f *testing.F) {
	f.Add("Hello, world! 你好 👍🏽\n\tcode")
	f.Add("<|im_start|>x<|im_end|>")
	f.Add("e\u0301 ſ 'LL")
	f.Add(strings.Repeat("ab", 100) + "\xff\xfe")
	tok := qwen(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		back := tok.DecodeLenient(ids)
		if utf8.ValidString(s) && back != norm.NFC.String(s) {
			t.Fatalf("%q -> %v -> %q", s, ids, back)
		}
		for w := nfc(s); len(w) > 0; {
			n := splitQwen(w)
			if n <= 0 || n > len(w) {
				t.Fatalf("splitQwen(%q) = %d", w, n)
			}
			small := tok.model.symbols(nil, w[:n])
			heap := slices.Clone(small)
			if len(small) > 1 {
				small = small[:tok.model.mergeSmall(small)]
				heap = heap[:tok.model.mergeHeap(heap)]
			}
			if !slices.Equal(small, heap) {
				t.Fatalf("%q: array merge %v, heap merge %v", w[:n], small, heap)
			}
			w = w[n:]
		}
		raw := make([]int32, 0, len(s)/2)
		for i := 0; i+1 < len(s); i += 2 {
			raw = append(raw, int32(s[i])<<10|int32(s[i+1])<<2)
		}
		if out := tok.DecodeLenient(raw); !utf8.ValidString(out) {
			t.Fatalf("decode of %v is not valid UTF-8", raw)
		}
	})
}
