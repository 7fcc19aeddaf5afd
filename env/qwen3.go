package env

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/tokenizer"
)

// This file renders tools and tool results exactly as Qwen3's chat
// template does (tokenizer_config.json's chat_template with tools=...), so
// that a Qwen3 model sees during RL the prompt layout it was trained on and
// will be served with.

// ToolSpec describes a tool to the model: what Qwen3's template puts in
// its system message, inside <tools></tools>.
type ToolSpec struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Parameters is the JSON schema of the arguments object. Its key
	// order is kept in the prompt (Python dicts keep insertion order), so
	// write it in the order the model should read it. Empty: the tool
	// has no "parameters" key.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// The fixed text around the tools in Qwen3's system message.
const (
	toolsHeader = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
	toolsFooter = "\n</tools>\n\nFor each function call, return a json object with function name and arguments " +
		"within <tool_call></tool_call> XML tags:\n<tool_call>\n" +
		`{"name": <function-name>, "arguments": <args-json-object>}` + "\n</tool_call>"
)

// ToolsSystemPrompt returns the content of the system message that Qwen3's
// chat template renders when it is given tools (the text between
// "<|im_start|>system\n" and "<|im_end|>"; tokenizer.ChatML adds those):
// system and a blank line when system is not empty, then the tools block.
// Each tool is written as the template's `tool | tojson` writes
// {"type": "function", "function": {"name", "description", "parameters"}}:
// Python's json.dumps(ensure_ascii=False), with ", " and ": " separators,
// non-ASCII kept and <, >, & not escaped. With no tools it returns system
// unchanged, as the template does.
//
// It panics when a tool's Parameters are not valid JSON: specs are written
// by programmers (NewTools checks them first).
func ToolsSystemPrompt(system string, tools []ToolSpec) string {
	if len(tools) == 0 {
		return system
	}
	var b strings.Builder
	if system != "" {
		b.WriteString(system)
		b.WriteString("\n\n")
	}
	b.WriteString(toolsHeader)
	for _, t := range tools {
		b.WriteString("\n{\"type\": \"function\", \"function\": {\"name\": ")
		writePyString(&b, t.Name)
		b.WriteString(", \"description\": ")
		writePyString(&b, t.Description)
		if len(bytes.TrimSpace(t.Parameters)) > 0 {
			p, err := PythonJSON(t.Parameters)
			if err != nil {
				panic(fmt.Sprintf("env: tool %q: parameters: %v", t.Name, err))
			}
			b.WriteString(", \"parameters\": ")
			b.WriteString(p)
		}
		b.WriteString("}}")
	}
	b.WriteString(toolsFooter)
	return b.String()
}

// RenderObservation returns the text that follows a model turn ended by
// its stop token <|im_end|>, up to the next turn: the newline that
// follows <|im_end|>, msgs as Qwen3's chat template renders them, and the
// generation prompt "<|im_start|>assistant\n" (thinking left to the
// model: the template's enable_thinking=false would add an empty
// <think></think>).
//
// Consecutive "tool" messages become one user turn of <tool_response>
// blocks, as in the template; any other message is
// "<|im_start|>ROLE\nCONTENT<|im_end|>\n".
func RenderObservation(msgs []tokenizer.Message) string {
	var b strings.Builder
	b.WriteByte('\n')
	for i, m := range msgs {
		if m.Role != "tool" {
			b.WriteString(tokenizer.ImStart + m.Role + "\n" + m.Content + tokenizer.ImEnd + "\n")
			continue
		}
		if i == 0 || msgs[i-1].Role != "tool" {
			b.WriteString(tokenizer.ImStart + "user")
		}
		b.WriteString("\n<tool_response>\n" + m.Content + "\n</tool_response>")
		if i == len(msgs)-1 || msgs[i+1].Role != "tool" {
			b.WriteString(tokenizer.ImEnd + "\n")
		}
	}
	b.WriteString(tokenizer.ImStart + "assistant\n")
	return b.String()
}

// PythonJSON re-writes a JSON value as Python's json.dumps(json.loads(raw),
// ensure_ascii=False) writes it, which is what Hugging Face's chat
// templates give for `value | tojson`: ", " between items, ": " after
// keys, key order kept (a repeated key keeps its first place and its last
// value, as a Python dict does), strings with only '"', '\\' and control
// characters escaped, integers as written ("-0" is 0) and other numbers
// as Python's repr of the float (1e5 is 100000.0, 1e16 is 1e+16, a number
// beyond float64's range is Infinity).
func PythonJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := readPy(dec)
	if err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("invalid JSON: data after the value")
	}
	var b strings.Builder
	v.write(&b)
	return b.String(), nil
}

// pyValue is a parsed JSON value with its objects' key order.
type pyValue struct {
	kind byte   // '{', '[', '"' (a string), '0' (a number), 'l' (true, false, null)
	text string // a string's value, a number's literal, a literal
	keys []string
	vals []*pyValue // an object's values, by keys, or an array's elements
}

// readPy reads one value from dec.
func readPy(dec *json.Decoder) (*pyValue, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("invalid JSON: %v", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		v := &pyValue{kind: byte(t)}
		at := map[string]int{}
		for dec.More() {
			var key string
			if t == '{' {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("invalid JSON: %v", err)
				}
				key = kt.(string) // the decoder only gives string keys
			}
			e, err := readPy(dec)
			if err != nil {
				return nil, err
			}
			if i, dup := at[key]; dup && t == '{' {
				v.vals[i] = e
				continue
			}
			if t == '{' {
				at[key] = len(v.keys)
				v.keys = append(v.keys, key)
			}
			v.vals = append(v.vals, e)
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, fmt.Errorf("invalid JSON: %v", err)
		}
		return v, nil
	case string:
		return &pyValue{kind: '"', text: t}, nil
	case json.Number:
		return &pyValue{kind: '0', text: pyNumber(string(t))}, nil
	case bool:
		return &pyValue{kind: 'l', text: strconv.FormatBool(t)}, nil
	case nil:
		return &pyValue{kind: 'l', text: "null"}, nil
	}
	return nil, fmt.Errorf("invalid JSON: unexpected %v", tok)
}

func (v *pyValue) write(b *strings.Builder) {
	switch v.kind {
	case '{', '[':
		b.WriteByte(v.kind)
		for i, e := range v.vals {
			if i > 0 {
				b.WriteString(", ")
			}
			if v.kind == '{' {
				writePyString(b, v.keys[i])
				b.WriteString(": ")
			}
			e.write(b)
		}
		if v.kind == '{' {
			b.WriteByte('}')
		} else {
			b.WriteByte(']')
		}
	case '"':
		writePyString(b, v.text)
	default:
		b.WriteString(v.text)
	}
}

// pyNumber spells a JSON number as Python writes it back: an integer as
// is (Python's int; "-0" is 0), anything with a fraction or an exponent
// as repr(float).
func pyNumber(lit string) string {
	if !strings.ContainsAny(lit, ".eE") {
		if lit == "-0" {
			return "0"
		}
		return lit
	}
	f, _ := strconv.ParseFloat(lit, 64) // a valid literal; out of range gives ±Inf
	return pyFloat(f)
}

// pyFloat is Python's repr of a float as json.dumps writes it: the
// shortest digits that read back the same; exponent notation when the
// decimal exponent is below -4 or at least 16, else positional with at
// least one decimal ("100.0").
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // "1.5e+16": Python's exponent form too
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// writePyString writes s as a JSON string the way Python's json.dumps
// (ensure_ascii=False) does: only '"', '\\' and control characters below
// U+0020 escaped (\n \r \t \b \f, else \u00XX in lower-case hex). Bytes
// that are not UTF-8 become U+FFFD.
func writePyString(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[r>>4])
				b.WriteByte(hex[r&0xf])
				continue
			}
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
