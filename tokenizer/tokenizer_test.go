package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCharHandValues(t *testing.T) {
	tk := NewChar()
	if tk.VocabSize() != 100 {
		t.Fatalf("VocabSize = %d, want 100", tk.VocabSize())
	}
	// '\n' is 4, ' ' is 5, '0' is 5+16 = 21, 'a' is 5+65 = 70.
	got := tk.Encode("<|im_start|>a 0\n<|im_end|>")
	want := []int32{1, 70, 5, 21, 4, 2}
	if len(got) != len(want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Encode = %v, want %v", got, want)
		}
	}
	// Near-misses of special tokens are plain characters; non-ASCII is unknown.
	got = tk.Encode("<|im_star|>é")
	if len(got) != 12 || got[11] != 3 || got[0] != tk.MustID("<") {
		t.Fatalf("near miss: %v", got)
	}
	if s, err := tk.Decode([]int32{1, 70, 2}); err != nil || s != "<|im_start|>a<|im_end|>" {
		t.Fatalf("Decode = %q, %v", s, err)
	}
	if _, err := tk.Decode([]int32{100}); err == nil {
		t.Fatal("Decode accepted id 100")
	}
	if s := tk.DecodeLenient([]int32{70, 120}); s != "a<|unk|>" {
		t.Fatalf("DecodeLenient = %q", s)
	}
}

func TestCharRoundTripAndFile(t *testing.T) {
	tk := NewChar()
	text := "Compute 12*34.\nAnswer: 408\t<|endoftext|>"
	ids := tk.Encode(text)
	back, _ := tk.Decode(ids)
	if back != strings.ReplaceAll(text, "\t", Unknown) {
		t.Fatalf("round trip %q", back)
	}
	dir := t.TempDir()
	if err := tk.WriteFile(dir); err != nil {
		t.Fatal(err)
	}
	tk2, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids2 := tk2.Encode(text)
	for i := range ids {
		if ids[i] != ids2[i] {
			t.Fatalf("loaded tokenizer differs at %d", i)
		}
	}
	// The file is a Hugging Face BPE tokenizer.json.
	b, _ := os.ReadFile(filepath.Join(dir, FileName))
	var j map[string]any
	json.Unmarshal(b, &j)
	if m := j["model"].(map[string]any); m["type"] != "BPE" || len(m["vocab"].(map[string]any)) != 100 {
		t.Fatalf("model section %v", m["type"])
	}
	if len(j["added_tokens"].([]any)) != 4 {
		t.Fatalf("added tokens %v", j["added_tokens"])
	}
}

func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{`, "not a tokenizer.json"},
		{`{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`, "WordPiece"},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "unk_token": "a"}}`, "repeated"},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 5}, "unk_token": "a"}}`, "out of range"},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "ab": 1}, "merges": ["a b"]}}`, "pre_tokenizer"},
		{`{"model": {"type": "BPE", "vocab": {}}}`, "empty"},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "unk_token": "z"}}`, "unknown token"},
	} {
		_, err := Parse([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.json, err, c.want)
		}
	}
	_, err := Parse([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "ab": 1}, "merges": ["a b"]}}`))
	if !errors.Is(err, ErrUnsupported) {
		t.Errorf("a merges file: %v is not ErrUnsupported", err)
	}
}

func TestChatML(t *testing.T) {
	got := ChatML([]Message{{"system", "Be brief."}, {"user", "2+2?"}}, true)
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("ChatML = %q", got)
	}
	if UserPrompt("hi") != "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" {
		t.Fatal("UserPrompt")
	}
}

func FuzzCharRoundTrip(f *testing.F) {
	f.Add("Answer: \\boxed{42}\n")
	f.Add("<|im_start|><|im_end|><|im")
	tk := NewChar()
	f.Fuzz(func(t *testing.T, s string) {
		ids := tk.Encode(s)
		back, err := tk.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		// Every character in the alphabet survives; others become <|unk|>.
		if utf8.ValidString(s) {
			var want strings.Builder
			for _, r := range s {
				if _, ok := tk.vocab[string(r)]; ok || r == '<' {
					want.WriteRune(r)
				} else {
					want.WriteString(Unknown)
				}
			}
			if back != want.String() && !strings.Contains(s, "<|") {
				t.Fatalf("%q -> %q, want %q", s, back, want.String())
			}
		}
	})
}

// A malformed tokenizer.json is an error, never a panic, and whatever
// parses encodes and decodes without panicking.
func FuzzParse(f *testing.F) {
	b, _ := NewChar().MarshalJSON()
	f.Add(b)
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, "pre_tokenizer": null}`))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "a"]]}, "added_tokens": [{"id": 5, "content": "<x>"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := Parse(data)
		if err != nil {
			return
		}
		ids := tk.Encode("a<x>b <|im_end|> é")
		tk.DecodeLenient(ids)
		tk.Decode(ids)
	})
}
