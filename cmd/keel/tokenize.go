package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/keel-rl/keel/tokenizer"
)

func init() {
	register(command{name: "tokenize", summary: "text to token ids and back with a tokenizer.json", run: runTokenize})
}

const tokenizeUsage = `usage: keel tokenize --tokenizer FILE|MODEL_DIR [TEXT] [--input FILE.jsonl] [--output FILE] [--decode] [--chat] [--add-special]

Encodes TEXT, or every {"text": ...} line of FILE.jsonl, to {"ids": [...]}
lines; --decode reads {"ids": [...]} lines (or TEXT as a JSON list of ids)
and writes {"text": ...}. Special and added tokens written in the text are
recognised, as Hugging Face tokenizers does. --chat reads {"messages":
[{"role", "content"}...]} lines (or TEXT as such a JSON list) and renders
them in the ChatML layout with the generation prompt, writing {"text",
"ids"}. --add-special applies the tokenizer's post-processor (Qwen's and
keel's add nothing, as with Hugging Face's add_special_tokens).

flags:
`

func runTokenize(args []string) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), tokenizeUsage); fs.PrintDefaults() }
	tpath := fs.String("tokenizer", "", "tokenizer.json, or a model directory holding one")
	in := fs.String("input", "", "JSONL input file")
	out := fs.String("output", "", "output file (default: standard output)")
	decode := fs.Bool("decode", false, "ids to text")
	chat := fs.Bool("chat", false, "render chat messages in the ChatML layout first")
	_ = fs.Bool("add-special", false, "apply the tokenizer's post-processor (adds nothing for Qwen and keel tokenizers)")
	var text string
	var rest []string
	for i := 0; i < len(args); i++ { // TEXT may come before or after the flags
		if len(args[i]) > 0 && args[i][0] != '-' && text == "" && (i == 0 || !needsValue(args[i-1])) {
			text = args[i]
			continue
		}
		rest = append(rest, args[i])
	}
	if help, err := parseFlags(fs, rest); help || err != nil {
		return err
	}
	switch {
	case *tpath == "":
		return errors.New("--tokenizer is required")
	case (text == "") == (*in == ""):
		return errors.New("give TEXT or --input FILE.jsonl (one of them)")
	case *decode && *chat:
		return errors.New("--decode and --chat do not combine")
	}
	tok, err := tokenizer.Load(*tpath)
	if err != nil {
		return err
	}
	process := func(line []byte, name string) (any, error) {
		switch {
		case *decode:
			var v struct {
				IDs *[]int32 `json:"ids"`
			}
			if text != "" {
				var ids []int32
				if err := json.Unmarshal(line, &ids); err != nil {
					return nil, fmt.Errorf("%s: want a JSON list of ids: %v", name, err)
				}
				v.IDs = &ids
			} else if err := strictJSON(line, &v); err != nil {
				return nil, fmt.Errorf("%s: %v", name, err)
			}
			if v.IDs == nil {
				return nil, fmt.Errorf(`%s: missing field "ids"`, name)
			}
			s, err := tok.Decode(*v.IDs)
			if err != nil {
				return nil, fmt.Errorf("%s: %v", name, err)
			}
			return map[string]string{"text": s}, nil
		case *chat:
			var v struct {
				Messages *[]tokenizer.Message `json:"messages"`
			}
			if text != "" {
				var msgs []tokenizer.Message
				if err := json.Unmarshal(line, &msgs); err != nil {
					return nil, fmt.Errorf(`%s: want a JSON list of {"role", "content"}: %v`, name, err)
				}
				v.Messages = &msgs
			} else if err := strictJSON(line, &v); err != nil {
				return nil, fmt.Errorf("%s: %v", name, err)
			}
			if v.Messages == nil {
				return nil, fmt.Errorf(`%s: missing field "messages"`, name)
			}
			s := tokenizer.ChatML(*v.Messages, true)
			return struct {
				Text string  `json:"text"`
				IDs  []int32 `json:"ids"`
			}{s, tok.Encode(s)}, nil
		default:
			var v struct {
				Text *string `json:"text"`
			}
			if text != "" {
				s := string(line)
				v.Text = &s
			} else if err := strictJSON(line, &v); err != nil {
				return nil, fmt.Errorf("%s: %v", name, err)
			}
			if v.Text == nil {
				return nil, fmt.Errorf(`%s: missing field "text"`, name)
			}
			return map[string][]int32{"ids": tok.Encode(*v.Text)}, nil
		}
	}
	write := func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		if text != "" {
			v, err := process([]byte(text), "TEXT")
			if err != nil {
				return err
			}
			return enc.Encode(v)
		}
		f, err := os.Open(*in)
		if err != nil {
			return err
		}
		defer f.Close()
		r := bufio.NewReaderSize(f, 1<<16)
		for n := 1; ; n++ {
			line, rerr := r.ReadBytes('\n')
			if rerr != nil && rerr != io.EOF {
				return fmt.Errorf("%s:%d: %w", *in, n, rerr)
			}
			if len(bytes.TrimSpace(line)) > 0 {
				v, err := process(line, fmt.Sprintf("%s:%d", *in, n))
				if err != nil {
					return err
				}
				if err := enc.Encode(v); err != nil {
					return err
				}
			}
			if rerr == io.EOF {
				return nil
			}
		}
	}
	return writeOutput(*out, write)
}

// needsValue reports whether a flag takes the next argument as its value.
func needsValue(arg string) bool {
	switch arg {
	case "--tokenizer", "-tokenizer", "--input", "-input", "--output", "-output":
		return true
	}
	return false
}

// strictJSON decodes one JSON object and rejects trailing data.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if dec.More() {
		return errors.New("more than one JSON value on the line")
	}
	return nil
}
