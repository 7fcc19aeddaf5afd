package env

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

// Bounds of tool-call parsing, so that a runaway turn costs little: text
// past maxCallText is not read, and a turn's calls past maxCalls are
// errors, not run.
const (
	maxCallText = 64 << 10
	maxCalls    = 16
)

// ToolCall is one tool call of a model turn, in Qwen3's format:
// <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.
type ToolCall struct {
	Name string `json:"name"`
	// Arguments is the arguments object as the model wrote it ({} when
	// it wrote none).
	Arguments json.RawMessage `json:"arguments"`
}

// callBlock is one <tool_call> block: a call, or why it is none.
type callBlock struct {
	call ToolCall
	err  error
}

// ParseToolCalls reads the tool calls of a model turn: every
// <tool_call>...</tool_call> block, whose content (spaces and newlines
// around it allowed) is a JSON object with "name", a non-empty string, and
// "arguments", an object (absent or null: {}); other keys are ignored. A
// block that is malformed (bad JSON, no name, arguments not an object, no
// closing tag) gives an error and no call. Only the first 64 KiB of text
// are read (a block still open there is unclosed), and a turn's blocks
// after the 16th are errors, one each.
func ParseToolCalls(text string) (calls []ToolCall, errs []error) {
	for _, b := range parseBlocks(text) {
		if b.err != nil {
			errs = append(errs, b.err)
		} else {
			calls = append(calls, b.call)
		}
	}
	return calls, errs
}

// parseBlocks reads text's <tool_call> blocks in order.
func parseBlocks(text string) []callBlock {
	const open, closing = "<tool_call>", "</tool_call>"
	if len(text) > maxCallText {
		text = text[:maxCallText]
	}
	var out []callBlock
	for n := 1; ; n++ {
		i := strings.Index(text, open)
		if i < 0 {
			return out
		}
		text = text[i+len(open):]
		j := strings.Index(text, closing)
		if j < 0 {
			return append(out, callBlock{err: fmt.Errorf("tool call %d: <tool_call> without </tool_call>", n)})
		}
		body := text[:j]
		text = text[j+len(closing):]
		if n > maxCalls {
			out = append(out, callBlock{err: fmt.Errorf("tool call %d: more than %d tool calls in one turn", n, maxCalls)})
			continue
		}
		c, err := parseCall(body)
		if err != nil {
			err = fmt.Errorf("tool call %d: %w", n, err)
		}
		out = append(out, callBlock{c, err})
	}
}

// parseCall reads the JSON of one <tool_call> block.
func parseCall(body string) (ToolCall, error) {
	const want = `want {"name": "...", "arguments": {...}}`
	dec := json.NewDecoder(strings.NewReader(body))
	var m map[string]json.RawMessage
	if err := dec.Decode(&m); err != nil {
		if _, isType := err.(*json.UnmarshalTypeError); isType {
			return ToolCall{}, fmt.Errorf("not a JSON object (%s)", want)
		}
		return ToolCall{}, fmt.Errorf("invalid JSON: %v (%s)", err, want)
	}
	if m == nil {
		return ToolCall{}, fmt.Errorf("null (%s)", want)
	}
	if _, err := dec.Token(); err != io.EOF {
		return ToolCall{}, fmt.Errorf("text after the JSON object (%s)", want)
	}
	var c ToolCall
	rawName, ok := m["name"]
	if !ok {
		return c, fmt.Errorf(`missing "name" (%s)`, want)
	}
	if json.Unmarshal(rawName, &c.Name) != nil || c.Name == "" {
		return c, fmt.Errorf(`"name" is %s, want a non-empty string`, head(rawName))
	}
	args := bytes.TrimSpace(m["arguments"])
	switch {
	case len(args) == 0 || string(args) == "null":
		c.Arguments = json.RawMessage("{}")
	case args[0] == '{':
		c.Arguments = args
	default:
		return c, fmt.Errorf(`"arguments" of %q is %s, want an object`, c.Name, head(args))
	}
	return c, nil
}

// head is the start of a long value, for errors.
func head(b []byte) string {
	const n = 80
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// Tool is a function the model can call.
type Tool struct {
	Spec ToolSpec
	// Call runs the tool on the call's arguments object and returns its
	// result as text for the model. An error is shown to the model as
	// "error: MESSAGE", so it should say what to fix. Call must be safe
	// for concurrent use: episodes run at once.
	Call func(ctx context.Context, args json.RawMessage) (string, error)
}

// ToolsEnv is the "tools" environment: the model calls tools in Qwen3's
// format and gets their results as <tool_response> blocks, until a turn
// with no tool call, its final answer, which the row's verifier scores
// (the row's task names it: tasks.LookupVerifier).
//
// Each turn with tool calls (when it is not the last) is answered with one
// "tool" message per <tool_call> block, in order: the tool's result, or
// "error: ..." for a malformed block, an unknown tool or a tool's error.
// A turn with none, or the last turn, ends the episode: reward and
// correct are the verifier's score of the turn's text. Tool calls are read
// after the first </think> when the turn has one, as Qwen3 is served
// (vLLM's reasoning parser gives the tool parser only what follows the
// thinking): a call drafted while thinking is not run.
//
// Metrics per turn: tool_calls (blocks found, run or not; those of a last
// turn are counted but not run) and tool_errors (blocks that gave an
// error).
type ToolsEnv struct {
	tools  map[string]Tool
	specs  []ToolSpec
	system string
}

// NewTools returns the tools environment for these tools. It panics on a
// tool with no name or no Call, a name given twice, or Parameters that are
// not a JSON object: tools are written by programmers.
func NewTools(tools ...Tool) *ToolsEnv {
	e := &ToolsEnv{tools: map[string]Tool{}}
	for _, t := range tools {
		name := t.Spec.Name
		switch _, dup := e.tools[name]; {
		case name == "":
			panic("env: NewTools: a tool has no name")
		case t.Call == nil:
			panic(fmt.Sprintf("env: NewTools: tool %q has no Call", name))
		case dup:
			panic(fmt.Sprintf("env: NewTools: tool %q given twice", name))
		}
		if p := bytes.TrimSpace(t.Spec.Parameters); len(p) > 0 {
			if _, err := PythonJSON(p); err != nil || p[0] != '{' {
				panic(fmt.Sprintf("env: NewTools: tool %q: parameters are not a JSON object", name))
			}
		}
		e.tools[name] = t
		e.specs = append(e.specs, t.Spec)
	}
	e.system = ToolsSystemPrompt("", e.specs)
	return e
}

// SystemPrompt implements Prompter: Qwen3's tools block (ToolsSystemPrompt
// with no system text of its own). A tiny model with a character
// tokenizer cannot afford its 600-odd tokens: a recipe then asks for
// CompactSystemPrompt (env.system_prompt: compact) or none.
func (e *ToolsEnv) SystemPrompt() string { return e.system }

// Specs returns the tools' specs in the order given, to render them with
// a system message of the row's own (ToolsSystemPrompt).
func (e *ToolsEnv) Specs() []ToolSpec { return append([]ToolSpec(nil), e.specs...) }

// Start implements Environment. The row's task must have a verifier.
func (e *ToolsEnv) Start(_ context.Context, row *data.Example) (Episode, error) {
	v, err := tasks.LookupVerifier(row.Task)
	if err != nil {
		return nil, fmt.Errorf("env tools: %w", err)
	}
	return &toolsEpisode{env: e, verifier: v, answer: row.Answer}, nil
}

type toolsEpisode struct {
	env      *ToolsEnv
	verifier tasks.Verifier
	answer   string
}

// afterThink is the part of a turn that tool calls are read from: what
// follows the first </think>, or all of it.
func afterThink(text string) string {
	if _, rest, ok := strings.Cut(text, "</think>"); ok {
		return rest
	}
	return text
}

// Step implements Episode.
func (ep *toolsEpisode) Step(ctx context.Context, turn Turn) (Reply, error) {
	blocks := parseBlocks(afterThink(turn.Text))
	if len(blocks) == 0 || turn.Last {
		nErr := 0
		for _, b := range blocks {
			if b.err != nil {
				nErr++
			}
		}
		score := ep.verifier.Score(ep.answer, turn.Text)
		return Reply{Done: true, Reward: score, Correct: score, Metrics: map[string]float64{
			"tool_calls": float64(len(blocks)), "tool_errors": float64(nErr)}}, nil
	}
	msgs := make([]tokenizer.Message, len(blocks))
	nErr := 0
	for i, b := range blocks {
		result, err := "", b.err
		if err == nil {
			result, err = ep.env.run(ctx, b.call)
		}
		if err != nil {
			nErr++
			result = "error: " + err.Error()
		}
		msgs[i] = tokenizer.Message{Role: "tool", Content: result}
	}
	if err := ctx.Err(); err != nil {
		return Reply{}, err
	}
	return Reply{Messages: msgs, Metrics: map[string]float64{
		"tool_calls": float64(len(blocks)), "tool_errors": float64(nErr)}}, nil
}

// run runs one call.
func (e *ToolsEnv) run(ctx context.Context, c ToolCall) (string, error) {
	t, ok := e.tools[c.Name]
	if !ok {
		names := make([]string, len(e.specs))
		for i, s := range e.specs {
			names[i] = s.Name
		}
		return "", fmt.Errorf("unknown tool %q (tools: %s)", c.Name, strings.Join(names, ", "))
	}
	return t.Call(ctx, c.Arguments)
}

// Close implements Episode: a tools episode holds nothing.
func (ep *toolsEpisode) Close() error { return nil }
