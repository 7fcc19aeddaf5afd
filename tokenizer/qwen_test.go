package tokenizer

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
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

// TestQwenGoldens holds keel's byte-level BPE to Hugging Face tokenizers,
// id for id, on a corpus of prose, code, digits, whitespace, CJK, Arabic,
// emoji sequences, combining marks, contractions, special tokens and
// near-misses, unusual whitespace and random valid UTF-8; and checks
// decode(encode(s)) == NFC(s).
func TestQwenGoldens(t *testing.T) {
	tok := qwen(t)
	if tok.VocabSize() != 151669 {
		t.Fatalf("vocabulary %d, want 151669", tok.VocabSize())
	}
	f, err := os.Open("testdata/qwen3-goldens.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(z)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		var g struct {
			Text string  `json:"text"`
			IDs  []int32 `json:"ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatal(err)
		}
		n++
		got := tok.Encode(g.Text)
		if !sameIDs(got, g.IDs) {
			t.Errorf("%q:\n got %v\nwant %v", g.Text, got, g.IDs)
			continue
		}
		back, err := tok.Decode(got)
		if err != nil || back != norm.NFC.String(g.Text) {
			t.Errorf("%q: decode gives %q (%v)", g.Text, back, err)
		}
	}
	if n < 400 {
		t.Fatalf("only %d golden lines", n)
	}
}

func sameIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestQwenHand(t *testing.T) {
	tok := qwen(t)
	// Checked against Hugging Face tokenizers: "Hello world!  <|im_start|>user\n12345 can't 你好".
	want := []int32{9707, 1879, 0, 256, 151644, 872, 198, 16, 17, 18, 19, 20, 646, 944, 220, 108386}
	if got := tok.Encode("Hello world!  <|im_start|>user\n12345 can't 你好"); !sameIDs(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if id, ok := tok.ID("<|im_end|>"); !ok || id != 151645 {
		t.Fatalf("<|im_end|> = %d", id)
	}
}

func FuzzQwenRoundTrip(f *testing.F) {
	f.Add("Hello, world! 你好 👍🏽\n\tcode")
	f.Add("<|im_start|>x<|im_end|>")
	f.Add("e\u0301 ſ 'LL")
	tok := qwen(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		back := tok.DecodeLenient(ids)
		if utf8.ValidString(s) && back != norm.NFC.String(s) {
			t.Fatalf("%q -> %v -> %q", s, ids, back)
		}
	})
}
