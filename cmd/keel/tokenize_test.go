package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/tokenizer"
)

func TestTokenizeCommand(t *testing.T) {
	dir := t.TempDir()
	if err := tokenizer.NewChar().WriteFile(dir); err != nil {
		t.Fatal(err)
	}
	in := lpWrite(t, "t.jsonl", `{"text": "a 0"}`+"\n\n"+`{"text": "<|im_end|>"}`+"\n")
	out := filepath.Join(t.TempDir(), "o.jsonl")
	if err := runTokenize([]string{"--tokenizer", dir, "--input", in, "--output", out}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if string(b) != "{\"ids\":[70,5,21]}\n{\"ids\":[2]}\n" {
		t.Fatalf("output %q", b)
	}
	ids := lpWrite(t, "i.jsonl", `{"ids": [70, 5, 21, 2]}`+"\n")
	if err := runTokenize([]string{"--tokenizer", dir, "--input", ids, "--decode", "--output", out}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(out)
	var v map[string]string
	json.Unmarshal(b, &v)
	if v["text"] != "a 0<|im_end|>" {
		t.Fatalf("decode %q", b)
	}
	if err := runTokenize([]string{`[{"role": "user", "content": "hi"}]`, "--tokenizer", dir, "--chat", "--output", out}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(out)
	if !strings.Contains(string(b), `"text":"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"`) {
		t.Fatalf("chat %s", b)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "b.jsonl", `{"text": "x"}`+"\n"+`{"txt": "y"}`+"\n")}, "b.jsonl:2: missing field \"text\""},
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "c.jsonl", `{"ids": [1, 500]}`+"\n"), "--decode"}, "c.jsonl:1"},
		{[]string{"--tokenizer", dir, "--input", lpWrite(t, "d.jsonl", `{"text": `+"\n")}, "d.jsonl:1: invalid JSON"},
		{[]string{"--tokenizer", lpWrite(t, "tokenizer.json", `{"model": {"type": "WordPiece"}}`), "x"}, "WordPiece"},
		{[]string{"--tokenizer", dir}, "give TEXT or --input"},
	} {
		if err := runTokenize(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
}
