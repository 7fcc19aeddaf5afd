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
	"strings"

	"github.com/keel-rl/keel/tokenizer"
)

func init() {
	register(command{name: "tokenize", summary: "text to token ids and back with a tokenizer.json", run: runTokenize})
}

const tokenizeUsage = `usage: keel tokenize --tokenizer FILE|MODEL_DIR [TEXT] [--input FILE.jsonl] [--output FILE]
                     [--decode] [--chat [--generation-prompt=false]] [--add-special] [--ordinary]

Encodes TEXT, or every {"text": ...} line of FILE.jsonl, to {"ids": [...]}
lines, as Hugging Face tokenizers does: special and added tokens written in
the text are recognised (--ordinary: they are not), and no BOS/EOS is added
(--add-special: the tokens the tokenizer's post-processor adds; none for
Qwen's tokenizers and keel's).

--decode reads {"ids": [...]} lines (or TEXT as a JSON list of ids) and
writes {"text": ...}.

--chat reads {"messages": [{"role", "content"}...]} lines (verl's "prompt"
column name works too; or TEXT as such a JSON list), renders them in the
ChatML layout of Qwen's and keel's tokenizers (<|im_start|>ROLE\nCONTENT<|im_end|>\n
per message, then the generation prompt <|im_start|>assistant\n) and
writes {"text", "ids"}.

Blank input lines are skipped; a malformed line is an error naming the
file and line. Use -- before a TEXT that starts with a dash.

flags:
`

type tokenizeOpts struct {
	decode, chat, genPrompt, addSpecial, ordinary bool
}

func runTokenize(args []string) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), tokenizeUsage); fs.PrintDefaults() }
	tpath := fs.String("tokenizer", "", "tokenizer.json, or a model directory holding one")
	in := fs.String("input", "", "JSONL input file")
	out := fs.String("output", "", "output file (default: standard output)")
	var o tokenizeOpts
	fs.BoolVar(&o.decode, "decode", false, "ids to text")
	fs.BoolVar(&o.chat, "chat", false, "render chat messages in the ChatML layout, then encode")
	fs.BoolVar(&o.genPrompt, "generation-prompt", true, "with --chat, end with the assistant's turn opened")
	fs.BoolVar(&o.addSpecial, "add-special", false, "add the post-processor's tokens (BOS/EOS) around each sequence")
	fs.BoolVar(&o.ordinary, "ordinary", false, "encode added and special tokens written in the text as ordinary text")
	pos, help, err := parseInterleaved(fs, args)
	if help || err != nil {
		return err
	}
	switch {
	case len(pos) > 1:
		return fmt.Errorf("more than one TEXT argument (%q, %q): quote the text", pos[0], pos[1])
	case *tpath == "":
		return errors.New("--tokenizer is required")
	case (len(pos) == 1) == (*in != ""):
		return errors.New("give TEXT or --input FILE.jsonl (one of them)")
	case o.decode && o.chat:
		return errors.New("--decode and --chat do not combine")
	case o.decode && (o.addSpecial || o.ordinary):
		return errors.New("--add-special and --ordinary are for encoding")
	}
	tok, err := tokenizer.Load(*tpath)
	if err != nil {
		return err
	}
	return writeOutput(*out, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		if len(pos) == 1 {
			v, err := tokenizeLine(tok, &o, []byte(pos[0]), true)
			if err != nil {
				return fmt.Errorf("TEXT: %v", err)
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
				v, err := tokenizeLine(tok, &o, line, false)
				if err != nil {
					return fmt.Errorf("%s:%d: %v", *in, n, err)
				}
				if err := enc.Encode(v); err != nil {
					return err
				}
			}
			if rerr == io.EOF {
				return nil
			}
		}
	})
}

// tokenizeLine handles one input: a JSONL line, or the TEXT argument
// (plain text, or for --decode and --chat a JSON list).
func tokenizeLine(tok *tokenizer.Tokenizer, o *tokenizeOpts, line []byte, arg bool) (any, error) {
	encode := func(s string) []int32 {
		var ids []int32
		if o.ordinary {
			ids = tok.EncodeOrdinary(s)
		} else {
			ids = tok.Encode(s)
		}
		if o.addSpecial {
			ids = tok.AddSpecialTokens(ids)
		}
		return ids
	}
	switch {
	case o.decode:
		var ids []int32
		if arg {
			if err := strictJSON(line, &ids); err != nil {
				return nil, fmt.Errorf("want a JSON list of ids: %v", err)
			}
		} else {
			var v struct {
				IDs *[]int32 `json:"ids"`
			}
			if err := strictJSON(line, &v); err != nil {
				return nil, err
			}
			if v.IDs == nil {
				return nil, errors.New(`missing field "ids"`)
			}
			ids = *v.IDs
		}
		s, err := tok.Decode(ids)
		if err != nil {
			return nil, err
		}
		return struct {
			Text string `json:"text"`
		}{s}, nil
	case o.chat:
		var msgs []tokenizer.Message
		if arg {
			if err := strictJSON(line, &msgs); err != nil {
				return nil, fmt.Errorf(`want a JSON list of {"role", "content"}: %v`, err)
			}
		} else {
			var v struct {
				Messages *[]tokenizer.Message `json:"messages"`
				Prompt   *[]tokenizer.Message `json:"prompt"`
			}
			if err := strictJSON(line, &v); err != nil {
				return nil, err
			}
			switch {
			case v.Messages != nil:
				msgs = *v.Messages
			case v.Prompt != nil:
				msgs = *v.Prompt
			default:
				return nil, errors.New(`missing field "messages" (or "prompt")`)
			}
		}
		for i, m := range msgs {
			if m.Role == "" {
				return nil, fmt.Errorf("message %d has no role", i)
			}
		}
		s := tokenizer.ChatML(msgs, o.genPrompt)
		return struct {
			Text string  `json:"text"`
			IDs  []int32 `json:"ids"`
		}{s, encode(s)}, nil
	default:
		text := string(line)
		if !arg {
			var v struct {
				Text *string `json:"text"`
			}
			if err := strictJSON(line, &v); err != nil {
				return nil, err
			}
			if v.Text == nil {
				return nil, errors.New(`missing field "text"`)
			}
			text = *v.Text
		}
		return struct {
			IDs []int32 `json:"ids"`
		}{encode(text)}, nil
	}
}

// parseInterleaved parses flags that may come before or after the
// positional arguments (which it returns); everything after "--" is
// positional.
func parseInterleaved(fs *flag.FlagSet, args []string) (pos []string, help bool, err error) {
	var rest []string
	for i, a := range args {
		if a == "--" {
			rest = args[i+1:]
			args = args[:i]
			break
		}
	}
	for {
		if help, err = parseFlags(fs, args); help || err != nil {
			return nil, help, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return append(pos, rest...), false, nil
}

// strictJSON decodes one JSON value and rejects trailing data.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field != "" {
			return fmt.Errorf("field %s: a JSON %s where %s was expected", typ.Field, typ.Value, strings.TrimPrefix(typ.Type.String(), "*"))
		}
		return fmt.Errorf("invalid JSON: %v", err)
	}
	if dec.More() {
		return errors.New("more than one JSON value on the line")
	}
	return nil
}
