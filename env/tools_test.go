package env

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tokenizer"
)

func call(name, args string) ToolCall { return ToolCall{Name: name, Arguments: json.RawMessage(args)} }

func TestParseToolCalls(t *testing.T) {
	for _, c := range []struct {
		name  string
		text  string
		calls []ToolCall
		errs  []string // substrings of the errors, in order
	}{
		{"none", "Answer: 5", nil, nil},
		{"qwen3 layout", "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"2+3\"}}\n</tool_call>",
			[]ToolCall{call("calculator", `{"expression": "2+3"}`)}, nil},
		{"tight", `<tool_call>{"name":"a","arguments":{}}</tool_call>`, []ToolCall{call("a", `{}`)}, nil},
		{"spaces around", "<tool_call> \t\r\n {\"name\":\"a\",\"arguments\":{\"x\":1}} \n\n</tool_call>", []ToolCall{call("a", `{"x":1}`)}, nil},
		{"no arguments", `<tool_call>{"name":"a"}</tool_call>`, []ToolCall{call("a", `{}`)}, nil},
		{"null arguments", `<tool_call>{"name":"a","arguments":null}</tool_call>`, []ToolCall{call("a", `{}`)}, nil},
		{"other keys ignored", `<tool_call>{"name":"a","arguments":{},"id":7}</tool_call>`, []ToolCall{call("a", `{}`)}, nil},
		{"two", `<tool_call>{"name":"a"}</tool_call> and <tool_call>{"name":"b","arguments":{"y":[1]}}</tool_call>`,
			[]ToolCall{call("a", `{}`), call("b", `{"y":[1]}`)}, nil},
		{"bad json", `<tool_call>{"name": "a", "arguments": {</tool_call>`, nil, []string{"tool call 1: invalid JSON"}},
		{"not an object", `<tool_call>["a"]</tool_call>`, nil, []string{"tool call 1: not a JSON object"}},
		{"null", `<tool_call>null</tool_call>`, nil, []string{"tool call 1: null"}},
		{"empty", `<tool_call></tool_call>`, nil, []string{"tool call 1: invalid JSON"}},
		{"missing name", `<tool_call>{"arguments": {}}</tool_call>`, nil, []string{`tool call 1: missing "name"`}},
		{"empty name", `<tool_call>{"name": ""}</tool_call>`, nil, []string{`"name" is ""`}},
		{"name not a string", `<tool_call>{"name": 3}</tool_call>`, nil, []string{`"name" is 3, want a non-empty string`}},
		{"arguments a string", `<tool_call>{"name": "a", "arguments": "{\"x\": 1}"}</tool_call>`, nil, []string{`"arguments" of "a" is "{\"x\": 1}", want an object`}},
		{"arguments an array", `<tool_call>{"name": "a", "arguments": [1]}</tool_call>`, nil, []string{`want an object`}},
		{"text after", `<tool_call>{"name": "a"} {"name": "b"}</tool_call>`, nil, []string{"tool call 1: text after the JSON object"}},
		{"unclosed", `<tool_call>{"name": "a"}`, nil, []string{"tool call 1: <tool_call> without </tool_call>"}},
		{"good then unclosed", `<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}`,
			[]ToolCall{call("a", `{}`)}, []string{"tool call 2: <tool_call> without </tool_call>"}},
		{"bad then good", `<tool_call>{name: a}</tool_call><tool_call>{"name": "b"}</tool_call>`,
			[]ToolCall{call("b", `{}`)}, []string{"tool call 1: invalid JSON"}},
		{"closing tag alone", `</tool_call> done`, nil, nil},
	} {
		calls, errs := ParseToolCalls(c.text)
		if !reflect.DeepEqual(calls, c.calls) {
			t.Errorf("%s: calls %v, want %v", c.name, calls, c.calls)
		}
		if len(errs) != len(c.errs) {
			t.Errorf("%s: errors %v, want %d", c.name, errs, len(c.errs))
			continue
		}
		for i, e := range errs {
			if !strings.Contains(e.Error(), c.errs[i]) {
				t.Errorf("%s: error %d %q, want it to hold %q", c.name, i, e, c.errs[i])
			}
		}
	}
}

func TestParseToolCallsBounds(t *testing.T) {
	one := `<tool_call>{"name": "a"}</tool_call>`
	calls, errs := ParseToolCalls(strings.Repeat(one, 18))
	if len(calls) != 16 || len(errs) != 2 {
		t.Fatalf("18 calls: %d calls, %d errors; want 16 and 2", len(calls), len(errs))
	}
	for i, e := range errs {
		want := fmt.Sprintf("tool call %d: more than 16 tool calls in one turn", 17+i)
		if e.Error() != want {
			t.Errorf("error %q, want %q", e, want)
		}
	}
	// Text past 64 KiB is not read: a call there is not seen, one across
	// the bound is unclosed.
	pad := strings.Repeat("x", maxCallText)
	if calls, errs := ParseToolCalls(pad + one); len(calls) != 0 || len(errs) != 0 {
		t.Errorf("a call past 64 KiB: %v, %v; want none", calls, errs)
	}
	if calls, errs := ParseToolCalls(pad[:maxCallText-15] + one); len(calls) != 0 || len(errs) != 1 {
		t.Errorf("a call across 64 KiB: %v, %v; want one error", calls, errs)
	}
	if calls, _ := ParseToolCalls(pad[:maxCallText-len(one)] + one); len(calls) != 1 {
		t.Errorf("a call ending at 64 KiB: %v, want it read", calls)
	}
}

// arithRow is a row of the arithmetic task.
var arithRow = &data.Example{Task: "arithmetic", Prompt: "Compute 4821+397.", Answer: "5218"}

func start(t *testing.T, e Environment, row *data.Example) Episode {
	t.Helper()
	ep, err := e.Start(context.Background(), row)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

func step(t *testing.T, ep Episode, turn Turn) Reply {
	t.Helper()
	r, err := ep.Step(context.Background(), turn)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func metrics(kv ...any) map[string]float64 {
	m := map[string]float64{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = float64(kv[i+1].(int))
	}
	return m
}

func TestToolsEpisode(t *testing.T) {
	ep := start(t, NewTools(Calculator()), arithRow)
	r := step(t, ep, Turn{Text: "I'll use the calculator.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"4821+397\"}}\n</tool_call>"})
	want := Reply{Messages: []tokenizer.Message{{Role: "tool", Content: "5218"}}, Metrics: metrics("tool_calls", 1, "tool_errors", 0)}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("turn 0: %+v, want %+v", r, want)
	}
	r = step(t, ep, Turn{Text: "The calculator says 5218.\nAnswer: 5218", Index: 1})
	want = Reply{Done: true, Reward: 1, Correct: 1, Metrics: metrics("tool_calls", 0, "tool_errors", 0)}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("turn 1: %+v, want %+v", r, want)
	}

	ep = start(t, NewTools(Calculator()), arithRow)
	if r := step(t, ep, Turn{Text: "Answer: 5219"}); !r.Done || r.Reward != 0 || r.Correct != 0 {
		t.Errorf("a wrong answer: %+v, want done with reward 0", r)
	}
}

func TestToolsErrors(t *testing.T) {
	ep := start(t, NewTools(Calculator()), arithRow)
	text := `<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>` +
		`<tool_call>{"name": "search", "arguments": {}}</tool_call>` +
		`<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>` +
		`<tool_call>{"name": calculator}</tool_call>` +
		`<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>`
	r := step(t, ep, Turn{Text: text})
	want := []string{
		"error: division by zero",
		`error: unknown tool "search" (tools: calculator)`,
		"42",
		"error: tool call 4: invalid JSON: ",
		`error: unknown argument "expr" (want "expression")`,
	}
	if r.Done || len(r.Messages) != len(want) {
		t.Fatalf("got %+v, want %d tool messages", r, len(want))
	}
	for i, m := range r.Messages {
		if m.Role != "tool" || !strings.HasPrefix(m.Content, want[i]) {
			t.Errorf("message %d: %+v, want a tool message starting %q", i, m, want[i])
		}
	}
	if !reflect.DeepEqual(r.Metrics, metrics("tool_calls", 5, "tool_errors", 4)) {
		t.Errorf("metrics %v", r.Metrics)
	}
}

// countingTool counts its calls.
func countingTool(n *atomic.Int64) Tool {
	return Tool{Spec: ToolSpec{Name: "count"}, Call: func(context.Context, json.RawMessage) (string, error) {
		return fmt.Sprint(n.Add(1)), nil
	}}
}

func TestToolsLastTurn(t *testing.T) {
	var n atomic.Int64
	ep := start(t, NewTools(countingTool(&n)), arithRow)
	r := step(t, ep, Turn{Text: `<tool_call>{"name": "count"}</tool_call><tool_call>{bad}</tool_call>Answer: 5218`, Last: true})
	want := Reply{Done: true, Reward: 1, Correct: 1, Metrics: metrics("tool_calls", 2, "tool_errors", 1)}
	if !reflect.DeepEqual(r, want) || n.Load() != 0 {
		t.Errorf("last turn: %+v (tool run %d times), want %+v and no run", r, n.Load(), want)
	}
	// A truncated turn with an open call is answered with the error.
	ep = start(t, NewTools(countingTool(&n)), arithRow)
	r = step(t, ep, Turn{Text: `<tool_call>{"name": "cou`, Truncated: true})
	if r.Done || len(r.Messages) != 1 || !strings.Contains(r.Messages[0].Content, "without </tool_call>") {
		t.Errorf("truncated turn: %+v", r)
	}
}

func TestToolsThinking(t *testing.T) {
	var n atomic.Int64
	ep := start(t, NewTools(countingTool(&n)), arithRow)
	// A call drafted while thinking is not run; the turn is final.
	r := step(t, ep, Turn{Text: "<think>\nmaybe <tool_call>{\"name\": \"count\"}</tool_call>\n</think>\n\nAnswer: 5218"})
	if !r.Done || r.Reward != 1 || n.Load() != 0 {
		t.Errorf("call in thinking: %+v, run %d times; want done, no run", r, n.Load())
	}
	r = step(t, ep, Turn{Text: "<think>\nI'll count.\n</think>\n\n<tool_call>{\"name\": \"count\"}</tool_call>"})
	if r.Done || n.Load() != 1 {
		t.Errorf("call after thinking: %+v, run %d times; want it run", r, n.Load())
	}
}

func TestToolsCanceled(t *testing.T) {
	blocking := Tool{Spec: ToolSpec{Name: "wait"}, Call: func(ctx context.Context, _ json.RawMessage) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}}
	ep := start(t, NewTools(blocking), arithRow)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := ep.Step(ctx, Turn{Text: `<tool_call>{"name": "wait"}</tool_call>`}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the context's error", err)
	}
}

func TestToolsStartUnknownTask(t *testing.T) {
	_, err := NewTools(Calculator()).Start(context.Background(), &data.Example{Task: "no-such-task", Answer: "1"})
	if err == nil || !strings.Contains(err.Error(), `"no-such-task"`) {
		t.Errorf("got %v, want an error naming the task", err)
	}
}

func TestToolsSystemPromptOption(t *testing.T) {
	e := NewTools(Calculator())
	var p Prompter = e
	if got, want := p.SystemPrompt(), ToolsSystemPrompt("", []ToolSpec{calculatorSpec}); got != want {
		t.Errorf("SystemPrompt %q, want %q", got, want)
	}
	specs := e.Specs()
	specs[0].Name = "changed"
	if e.Specs()[0].Name != "calculator" {
		t.Error("Specs returned the environment's own slice")
	}
}

func TestNewToolsPanics(t *testing.T) {
	ok := func(context.Context, json.RawMessage) (string, error) { return "", nil }
	for _, c := range []struct {
		name  string
		tools []Tool
		want  string
	}{
		{"no name", []Tool{{Call: ok}}, "no name"},
		{"no call", []Tool{{Spec: ToolSpec{Name: "a"}}}, `"a" has no Call`},
		{"twice", []Tool{{Spec: ToolSpec{Name: "a"}, Call: ok}, {Spec: ToolSpec{Name: "a"}, Call: ok}}, `"a" given twice`},
		{"bad parameters", []Tool{{Spec: ToolSpec{Name: "a", Parameters: json.RawMessage(`{"type":`)}, Call: ok}}, "not a JSON object"},
		{"array parameters", []Tool{{Spec: ToolSpec{Name: "a", Parameters: json.RawMessage(`[]`)}, Call: ok}}, "not a JSON object"},
	} {
		func() {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, c.want) {
					t.Errorf("%s: recovered %v, want a panic saying %q", c.name, r, c.want)
				}
			}()
			NewTools(c.tools...)
		}()
	}
}

func TestToolsConcurrent(t *testing.T) {
	e := NewTools(Calculator())
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			row := &data.Example{Task: "arithmetic", Answer: fmt.Sprint(i * 7)}
			ep, err := e.Start(context.Background(), row)
			if err != nil {
				t.Error(err)
				return
			}
			defer ep.Close()
			r, err := ep.Step(context.Background(), Turn{Text: fmt.Sprintf(`<tool_call>{"name": "calculator", "arguments": {"expression": "%d*7"}}</tool_call>`, i)})
			if err != nil || len(r.Messages) != 1 {
				t.Error(r, err)
				return
			}
			r, err = ep.Step(context.Background(), Turn{Text: "Answer: " + r.Messages[0].Content, Index: 1})
			if err != nil || r.Reward != 1 {
				t.Error(r, err)
			}
		}()
	}
	wg.Wait()
}

func FuzzParseToolCalls(f *testing.F) {
	f.Add(`<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>`)
	f.Add(`<tool_call>{"name": "a"}</tool_call><tool_call>`)
	f.Add(`<tool_call><tool_call>{"name":"a"}</tool_call></tool_call>`)
	f.Add(`<tool_call>{"name": "a", "arguments": [}</tool_call>`)
	f.Fuzz(func(t *testing.T, text string) {
		t0 := time.Now()
		calls, errs := ParseToolCalls(text)
		if d := time.Since(t0); d > time.Second {
			t.Errorf("took %v", d)
		}
		if n := strings.Count(text, "<tool_call>"); len(calls)+len(errs) > n {
			t.Errorf("%d calls and %d errors for %d <tool_call> tags", len(calls), len(errs), n)
		}
		if len(calls) > maxCalls {
			t.Errorf("%d calls", len(calls))
		}
		for _, c := range calls {
			var m map[string]json.RawMessage
			if c.Name == "" || json.Unmarshal(c.Arguments, &m) != nil || m == nil {
				t.Errorf("bad call %+v", c)
			}
		}
	})
}
