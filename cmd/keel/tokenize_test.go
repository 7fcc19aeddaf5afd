package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/tokenizer"
)

// runTok runs keel tokenize with --output to a temporary file and returns
// what it wrote.
func runTok(t *testing.T, args ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "o.jsonl")
	if err := runTokenize(append([]string{"--output", out}, args...)); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestTokenizeCommand(t *testing.T) {
	dir := t.TempDir()
	if err := tokenizer.NewChar().WriteFile(dir); err != nil {
		t.Fatal(err)
	}
	// Character ids: '\n' 4, ' ' 5, '0' 21, 'a' 70; <|im_start|> 1, <|im_end|> 2.
	in := lpWrite(t, "t.jsonl", `{"text": "a 0"}`+"\n\n"+`{"text": "<|im_end|>"}`+"\n"+`{"text": ""}`)
	if got := runTok(t, "--tokenizer", dir, "--input", in); got != "{\"ids\":[70,5,21]}\n{\"ids\":[2]}\n{\"ids\":[]}\n" {
		t.Fatalf("encode: %q", got)
	}
	// TEXT before or after the flags, and after --.
	for _, args := range [][]string{{"a 0", "--tokenizer", dir}, {"--tokenizer", dir, "a 0"}, {"--tokenizer", dir, "--", "a 0"}} {
		if got := runTok(t, args...); got != "{\"ids\":[70,5,21]}\n" {
			t.Fatalf("%v: %q", args, got)
		}
	}
	if got := runTok(t, "--tokenizer", dir, "--", "-5"); got != "{\"ids\":[18,26]}\n" {
		t.Fatalf("-- -5: %q", got)
	}
	if got := runTok(t, "--tokenizer", dir, "--ordinary", "<|im_end|>"); !strings.HasPrefix(got, `{"ids":[33,97,78,`) {
		t.Fatalf("--ordinary: %q", got)
	}
	ids := lpWrite(t, "i.jsonl", `{"ids": [70, 5, 21, 2]}`+"\n")
	if got := runTok(t, "--tokenizer", dir, "--input", ids, "--decode"); got != "{\"text\":\"a 0<|im_end|>\"}\n" {
		t.Fatalf("decode: %q", got)
	}
	if got := runTok(t, "--tokenizer", dir, "--decode", "[70, 4]"); got != "{\"text\":\"a\\n\"}\n" {
		t.Fatalf("decode TEXT: %q", got)
	}
	got := runTok(t, `[{"role": "user", "content": "hi"}]`, "--tokenizer", dir, "--chat")
	if !strings.HasPrefix(got, `{"text":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n","ids":[1,90,88,74,87,4,77,78,2,4,1,70,`) {
		t.Fatalf("chat: %s", got)
	}
	chat := lpWrite(t, "c.jsonl", `{"prompt": [{"role": "system", "content": "x"}]}`+"\n")
	if got := runTok(t, "--tokenizer", dir, "--chat", "--generation-prompt=false", "--input", chat); got != "{\"text\":\"<|im_start|>system\\nx<|im_end|>\\n\",\"ids\":[1,88,94,88,89,74,82,4,93,2,4]}\n" {
		t.Fatalf("chat without generation prompt: %s", got)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "b.jsonl", `{"text": "x"}`+"\n"+`{"txt": "y"}`+"\n")}, `b.jsonl:2: missing field "text"`},
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "c.jsonl", `{"ids": [1, 500]}`+"\n"), "--decode"}, "c.jsonl:1: tokenizer: id 500 at position 1"},
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "d.jsonl", `{"text": `+"\n")}, "d.jsonl:1: invalid JSON"},
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "e.jsonl", `{"text": 5}`+"\n")}, "e.jsonl:1: field text: a JSON number where string was expected"},
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "f.jsonl", `{"text": "a"} {"text": "b"}`+"\n")}, "f.jsonl:1: more than one JSON value"},
		{[]string{"--tokenizer", dir, "--chat", "--input", lpWrite(t, "g.jsonl", `{"messages": [{"content": "x"}]}`+"\n")}, "g.jsonl:1: message 0 has no role"},
		{[]string{"--tokenizer", dir, "--chat", "--input", lpWrite(t, "h.jsonl", `{"text": "x"}`+"\n")}, `h.jsonl:1: missing field "messages" (or "prompt")`},
		{[]string{"--tokenizer", dir, "--decode", "[1, 2"}, "TEXT: want a JSON list of ids"},
		{[]string{"--tokenizer", lpWrite(t, "tokenizer.json", "{\n\"model\": {\"type\": \"WordPiece\"}}"), "x"}, `tokenizer.json: model.type: unsupported tokenizer: "WordPiece"`},
		{[]string{"--tokenizer", lpWrite(t, "tokenizer.json", "{\n\"model\": [}"), "x"}, "tokenizer.json: line 2, column 11: invalid JSON"},
		{[]string{"--tokenizer", dir}, "give TEXT or --input"},
		{[]string{"--tokenizer", dir, "a", "b"}, "more than one TEXT"},
		{[]string{"x"}, "--tokenizer is required"},
		{[]string{"--tokenizer", dir, "--decode", "--chat", "x"}, "do not combine"},
	} {
		if err := runTokenize(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v:\n err = %v\nwant %q", c.args, err, c.want)
		}
	}
}

// keel tokenize on Qwen3's tokenizer.json (the gzipped copy the tokenizer
// tests use): a chat prompt as Hugging Face's ChatML gives it, and the
// decode of its ids.
func TestTokenizeQwen(t *testing.T) {
	b, err := testmodel.QwenTokenizerJSON()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644)
	// <|im_start|> user \n Hi <|im_end|> \n <|im_start|> assistant \n
	if got := runTok(t, "--tokenizer", dir, "--chat", `[{"role": "user", "content": "Hi"}]`); !strings.Contains(got, `"ids":[151644,872,198,13048,151645,198,151644,77091,198]`) {
		t.Fatalf("chat: %s", got)
	}
	if got := runTok(t, "--tokenizer", dir, "--add-special", "Hello world"); got != "{\"ids\":[9707,1879]}\n" {
		t.Fatalf("--add-special: %s", got)
	}
	if got := runTok(t, "--tokenizer", dir, "--decode", "[9707, 1879, 151645]"); got != "{\"text\":\"Hello world<|im_end|>\"}\n" {
		t.Fatalf("decode: %s", got)
	}
}
