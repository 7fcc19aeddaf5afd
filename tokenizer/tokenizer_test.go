package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

var update = flag.Bool("update", false, "rewrite testdata/char-tokenizer.json from NewChar")

func TestCharHandValues(t *testing.T) {
	tk := NewChar()
	if tk.VocabSize() != 100 {
		t.Fatalf("VocabSize = %d, want 100", tk.VocabSize())
	}
	// '\n' is 4, ' ' is 5, '0' is 5+16 = 21, 'a' is 5+65 = 70.
	if got, want := tk.Encode("<|im_start|>a 0\n<|im_end|>"), []int32{1, 70, 5, 21, 4, 2}; !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	// Near-misses of special tokens are plain characters; non-ASCII is unknown.
	got := tk.Encode("<|im_star|>é")
	if len(got) != 12 || got[11] != 3 || got[0] != tk.MustID("<") {
		t.Fatalf("near miss: %v", got)
	}
	if got := tk.EncodeOrdinary("<|im_end|>"); len(got) != 10 || got[0] != tk.MustID("<") {
		t.Fatalf("EncodeOrdinary = %v", got)
	}
	if s, err := tk.Decode([]int32{1, 70, 2}); err != nil || s != "<|im_start|>a<|im_end|>" {
		t.Fatalf("Decode = %q, %v", s, err)
	}
	if _, err := tk.Decode([]int32{100}); err == nil {
		t.Fatal("Decode accepted id 100")
	}
	if s := tk.DecodeLenient([]int32{70, 120, -1}); s != "a<|unk|><|unk|>" {
		t.Fatalf("DecodeLenient = %q", s)
	}
	if sp := tk.Special(); sp != (Special{EndOfText: 0, ImStart: 1, ImEnd: 2, Pad: 0}) {
		t.Fatalf("Special = %+v", sp)
	}
	if ids := tk.AddSpecialTokens([]int32{7}); !slices.Equal(ids, []int32{7}) {
		t.Fatalf("AddSpecialTokens = %v", ids)
	}
	if tok, ok := tk.Token(4); !ok || tok != "\n" {
		t.Fatalf("Token(4) = %q", tok)
	}
}

// TestCharFile holds NewChar's tokenizer.json to testdata/char-tokenizer.json,
// the file tools/tokgold/make_goldens.js loads into Hugging Face tokenizers
// (go test -run TestCharFile -update rewrites it), and checks that it, and
// the same content as keel wrote it before (HTML-escaped, vocabulary in
// key order), load back to the same tokenizer.
func TestCharFile(t *testing.T) {
	b, err := NewChar().MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	const golden = "testdata/char-tokenizer.json"
	if *update {
		if err := os.WriteFile(golden, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("NewChar's tokenizer.json differs from %s (go test -run TestCharFile -update, then regenerate the goldens)", golden)
	}
	dir := t.TempDir()
	if err := NewChar().WriteFile(dir); err != nil {
		t.Fatal(err)
	}
	var generic map[string]any
	if err := json.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	old, _ := json.MarshalIndent(generic, "", "  ") // escapes <, sorts keys
	oldPath := filepath.Join(dir, "old.json")
	os.WriteFile(oldPath, old, 0o644)
	text := "<|im_start|>user\nCompute 12*34.<|im_end|>\n<|im_start|>assistant\n408\t€<|im_end|>"
	want2 := NewChar().Encode(text)
	for _, p := range []string{dir, oldPath} {
		tk, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := tk.Encode(text); !slices.Equal(got, want2) {
			t.Fatalf("%s: %v, want %v", p, got, want2)
		}
	}
}

func TestCharRoundTrip(t *testing.T) {
	tk := NewChar()
	text := "Compute 12*34.\nAnswer: 408\t<|endoftext|>"
	back, err := tk.Decode(tk.Encode(text))
	if err != nil || back != strings.ReplaceAll(text, "\t", Unknown) {
		t.Fatalf("round trip %q, %v", back, err)
	}
}

func TestParseErrors(t *testing.T) {
	const ok = `"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}`
	const byteLevel = `"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}`
	for _, c := range []struct {
		json, want  string
		unsupported bool
	}{
		{`{`, "t.json: line 1, column 2: invalid JSON", false},
		{"{\n  \"model\": {\n    \"type\": \"BPE\",\n    \"vocab\": {\"a\": \"x\"}}}", `t.json: line 4, column 23: field model.vocab: a JSON string where a number was expected`, false},
		{"{\n\"added_tokens\": [{\"id\": 1, \"content\": 5}]}", "line 2, column 40: field added_tokens.content: a JSON number where a string was expected", false},
		{`{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`, `model.type: unsupported tokenizer: "WordPiece"`, true},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}}}`, `id 0 is given to both "a" and "b"`, false},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 5}}}`, "ids must be dense", false},
		{`{"model": {"type": "BPE", "vocab": {"a": -1}}}`, "negative id", false},
		{`{"model": {"type": "BPE", "vocab": {}}}`, "model.vocab is empty", false},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "unk_token": "z"}}`, `model.unk_token: "z" is not in model.vocab`, false},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "ab": 1}, "merges": ["a b"]}}`, `model.merges[0]: "b" is not in model.vocab`, false},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]}}`, `model.merges[0]: the merged "ab"`, false},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b c"]}}`, `model.merges[0]: "a b c" is not of the form`, false},
		{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": [["a"]]}}`, `model.merges[0]: want "a b" or ["a", "b"]`, false},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "dropout": 0.1}}`, "model.dropout", true},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "byte_fallback": true}}`, "model.byte_fallback", true},
		{`{"model": {"type": "BPE", "vocab": {"a": 0}, "continuing_subword_prefix": "##"}}`, "continuing_subword_prefix", true},
		{`{"normalizer": {"type": "NFKC"}, ` + ok + `}`, `normalizer: unsupported tokenizer: type "NFKC"`, true},
		{`{"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}, ` + ok + `}`, `normalizer.normalizers[1]`, true},
		{`{"normalizer": {"nfc": 1}, ` + ok + `}`, `normalizer: no "type"`, false},
		{`{"pre_tokenizer": {"type": "ByteLevel"}, ` + ok + `}`, "add_prefix_space", true},
		{`{"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}, ` + ok + `}`, "use_regex", true},
		{`{"pre_tokenizer": {"type": "Whitespace"}, ` + ok + `}`, `pre-tokenizer "Whitespace"`, true},
		{`{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated"}]}, ` + ok + `}`, "pre_tokenizer.pretokenizers[0]: unsupported tokenizer: split pattern", true},
		{`{"decoder": {"type": "WordPiece"}, ` + ok + `}`, `decoder: unsupported tokenizer: type "WordPiece"`, true},
		{`{"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {}}, ` + ok + `}`, `post_processor.single[0]: "<s>" is not in special_tokens`, false},
		{`{"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [9]}}}, ` + ok + `}`, `special_tokens id 9 names no token`, false},
		{`{"post_processor": {"type": "BertProcessing", "cls": ["a", 0], "sep": ["b", 7]}, ` + ok + `}`, `sep id 7 names no token`, false},
		{`{"added_tokens": [{"id": 3, "content": ""}], ` + ok + `}`, "added_tokens[0]: empty content", false},
		{`{"added_tokens": [{"id": -3, "content": "<x>"}], ` + ok + `}`, `added_tokens[0]: "<x>" has the negative id -3`, false},
		{`{"added_tokens": [{"id": 2, "content": "<x>"}], "model": {"type": "BPE", "vocab": {"a": 0, "b": 2}}}`, `"<x>" would take id 2, model.vocab's "b"`, false},
		{`{"version": "2.0", ` + ok + `}`, `version: "2.0"`, false},
		{`{` + byteLevel + `, ` + ok + `}`, "", false},
	} {
		_, err := Parse([]byte(c.json), "t.json")
		switch {
		case c.want == "":
			if err != nil {
				t.Errorf("%s: %v", c.json, err)
			}
		case err == nil || !strings.Contains(err.Error(), c.want):
			t.Errorf("%s:\n err = %v\nwant %q", c.json, err, c.want)
		case errors.Is(err, ErrUnsupported) != c.unsupported:
			t.Errorf("%s: errors.Is(ErrUnsupported) = %v", c.json, !c.unsupported)
		}
	}
	// Added tokens get Hugging Face's ids, whatever the file says: a
	// vocabulary piece keeps its id, a new token takes the next one.
	tk, err := Parse([]byte(`{"added_tokens": [{"id": 0, "content": "<x>"}, {"id": 0, "content": "b"}, {"id": 0, "content": "<y>"}], `+ok+`}`), "t.json")
	if err != nil {
		t.Fatal(err)
	}
	if x, b, y := tk.MustID("<x>"), tk.MustID("b"), tk.MustID("<y>"); x != 3 || b != 1 || y != 4 || tk.VocabSize() != 5 {
		t.Errorf("<x> %d, b %d, <y> %d, size %d; want 3, 1, 4, 5", x, b, y, tk.VocabSize())
	}
	if _, err := Load(filepath.Join(t.TempDir(), "nothing")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

// A tiny non-byte-level BPE, hand-checked: merges apply lowest rank
// first, leftmost among equals; without unk_token an unknown character
// is dropped (as Hugging Face does); with fuse_unk unknown runs give one
// unk.
func TestBPEHand(t *testing.T) {
	const vocab = `{"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "aa": 6, "?": 7}`
	const merges = `[["b", "c"], ["a", "b"], ["a", "bc"], ["a", "a"]]`
	tk, err := Parse([]byte(`{"decoder": {"type": "Fuse"}, "model": {"type": "BPE", "vocab": `+vocab+`, "merges": `+merges+`}}`), "t.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in   string
		want []int32
	}{
		{"abc", []int32{5}},           // b c (rank 0) first, then a bc (rank 2)
		{"abab", []int32{3, 3}},       // a b twice
		{"aaa", []int32{6, 0}},        // leftmost a a first
		{"aaaa", []int32{6, 6}},       // left to right
		{"xabx", []int32{3}},          // x is dropped
		{"cab", []int32{2, 3}},        // c, then a b
		{"abcabc", []int32{5, 5}},     // both
		{"bcab", []int32{4, 3}},       //
		{"", nil},                     //
		{"aabc", []int32{0, 5}},       // b c, then a bc beats a a (rank 2 < 3)
		{"aab", []int32{0, 3}},        // a b (rank 1) before a a (rank 3)
		{"ba", []int32{1, 0}},         //
		{"cccc", []int32{2, 2, 2, 2}}, //
	} {
		for _, small := range []int{64, 1} {
			smallWord = small
			got := tk.Encode(c.in)
			tk.model.cache = map[string][]int32{} // the next pass must merge again
			if !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
				t.Errorf("smallWord %d: %q = %v, want %v", small, c.in, got, c.want)
			}
		}
	}
	smallWord = 64
	unk, err := Parse([]byte(`{"model": {"type": "BPE", "unk_token": "?", "fuse_unk": true, "vocab": `+vocab+`, "merges": `+merges+`}}`), "t.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := unk.Encode("xyabz"); !slices.Equal(got, []int32{7, 3, 7}) {
		t.Errorf("fuse_unk: %v", got)
	}
	// No decoder: Hugging Face joins the tokens with spaces.
	if s := unk.DecodeLenient([]int32{5, 0}); s != "abc a" {
		t.Errorf("no decoder: %q", s)
	}
}

// Added-token options, hand-checked against Hugging Face's rules (the
// goldens of testdata/flags-goldens.jsonl check them against the library).
func TestAddedTokenOptions(t *testing.T) {
	vocab := map[string]int32{}
	for c := ' '; c <= '~'; c++ {
		vocab[string(c)] = int32(len(vocab))
	}
	vocab["\t"] = int32(len(vocab))
	n := int32(len(vocab))
	vb, _ := json.Marshal(vocab)
	file := `{"normalizer": {"type": "NFC"}, "decoder": {"type": "Fuse"},
	  "added_tokens": [
	    {"id": ` + itoa(n) + `, "content": "<mask>", "lstrip": true, "rstrip": true, "single_word": true},
	    {"id": ` + itoa(n+1) + `, "content": "caf\u00e9", "normalized": true},
	    {"id": ` + itoa(n+2) + `, "content": "<s>", "special": true}],
	  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
	    "special_tokens": {"<s>": {"id": "<s>", "ids": [` + itoa(n+2) + `], "tokens": ["<s>"]}}},
	  "model": {"type": "BPE", "vocab": ` + string(vb) + `, "merges": []}}`
	tk, err := Parse([]byte(file), "t.json")
	if err != nil {
		t.Fatal(err)
	}
	mask, cafe := n, n+1
	id := func(s string) int32 { return vocab[s] }
	for _, c := range []struct {
		in   string
		want []int32
	}{
		// lstrip and rstrip take the spaces around <mask>.
		{"a <mask> b", []int32{id("a"), mask, id("b")}},
		{"a\t<mask>\tb", []int32{id("a"), mask, id("b")}},
		// single_word: no match touching a word character (nor a mark).
		{"a<mask> <mask>b", []int32{id("a"), id("<"), id("m"), id("a"), id("s"), id("k"), id(">"), id(" "), id("<"), id("m"), id("a"), id("s"), id("k"), id(">"), id("b")}},
		{"-<mask>", []int32{id("-"), mask}},
		// Normalised tokens match after NFC: "cafe" + combining acute.
		{"cafe\u0301!", []int32{cafe, id("!")}},
		{"café", []int32{cafe}},
	} {
		if got := tk.Encode(c.in); !slices.Equal(got, c.want) {
			t.Errorf("%q = %v, want %v", c.in, got, c.want)
		}
	}
	if got := tk.AddSpecialTokens([]int32{5}); !slices.Equal(got, []int32{n + 2, 5}) {
		t.Errorf("AddSpecialTokens = %v", got)
	}
}

func itoa(i int32) string { b, _ := json.Marshal(i); return string(b) }

// The example of Unicode 3.9, table 3-8 (U+FFFD for each maximal subpart),
// and the cases Hugging Face's decoder was seen to give.
func TestLossyUTF8(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd"},
		{"\xE4\xBD", "\uFFFD"},
		{"\xE4\xBD\xFF", "\uFFFD\uFFFD"},
		{"\xFF\xFF", "\uFFFD\uFFFD"},
		{"\xED\xA0\x80", "\uFFFD\uFFFD\uFFFD"}, // a surrogate: E0..9F only after ED
		{"\xF4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
		{"\xF0\x9F\x98", "\uFFFD"},
		{"ok\uFFFD", "ok\uFFFD"},
	} {
		if got := lossyUTF8([]byte(c.in)); got != c.want {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
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
	if got := ChatML([]Message{{"user", "x"}}, false); got != "<|im_start|>user\nx<|im_end|>\n" {
		t.Fatalf("no generation prompt: %q", got)
	}
	tk := NewChar()
	ids := tk.EncodeChat([]Message{{"user", "1+1"}}, true)
	// <|im_start|> u s e r \n 1 + 1 <|im_end|> \n <|im_start|> a s s i s t a n t \n
	chars := func(s string) (ids []int32) {
		for _, c := range s {
			ids = append(ids, int32(c)-' '+5)
		}
		return ids
	}
	want2 := slices.Concat([]int32{1}, chars("user"), []int32{4}, chars("1+1"), []int32{2, 4, 1}, chars("assistant"), []int32{4})
	if !slices.Equal(ids, want2) {
		t.Fatalf("EncodeChat = %v, want %v", ids, want2)
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
		// Every character of the alphabet survives; others become <|unk|>.
		if utf8.ValidString(s) {
			var want strings.Builder
			for _, r := range s {
				if _, ok := tk.vocab[string(r)]; ok {
					want.WriteRune(r)
				} else {
					want.WriteString(Unknown)
				}
			}
			if back != want.String() {
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
	f.Add([]byte(`{"normalizer": {"type": "NFC"}, "added_tokens": [{"id": 2, "content": "<x>", "lstrip": true, "rstrip": true, "single_word": true, "normalized": true}], "post_processor": {"type": "BertProcessing", "cls": ["a", 0], "sep": ["b", 1]}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := Parse(data, "f.json")
		if err != nil {
			return
		}
		ids := tk.Encode("a<x>b <|im_end|> é \xff")
		tk.DecodeLenient(append(ids, -1, 1<<30))
		tk.Decode(ids)
		tk.AddSpecialTokens(ids)
	})
}
