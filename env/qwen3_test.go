package env

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/keel-rl/keel/tokenizer"
)

// weatherSpec has compact parameters, which the prompt re-spaces.
var weatherSpec = ToolSpec{
	Name:        "get_weather",
	Description: "Get the weather of a city.",
	Parameters:  json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","description":"the city, e.g. Paris"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"]}`),
}

// qwen3WeatherSystem is Qwen3's chat template's system message for
// weatherSpec and the system text "You are helpful.", typed out from the
// template (apply_chat_template(messages, tools=[...])).
const qwen3WeatherSystem = `<|im_start|>system
You are helpful.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Get the weather of a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city, e.g. Paris"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
`

func TestToolsSystemPromptGolden(t *testing.T) {
	sys := ToolsSystemPrompt("You are helpful.", []ToolSpec{weatherSpec})
	got := tokenizer.ChatML([]tokenizer.Message{
		{Role: "system", Content: sys},
		{Role: "user", Content: "Weather in Paris?"},
	}, true)
	if got != qwen3WeatherSystem {
		t.Errorf("got\n%s\nwant\n%s", got, qwen3WeatherSystem)
	}
	// Without a system text the block starts the message.
	noSys := ToolsSystemPrompt("", []ToolSpec{weatherSpec})
	if want := strings.TrimPrefix(sys, "You are helpful.\n\n"); noSys != want || !strings.HasPrefix(noSys, "# Tools\n\n") {
		t.Errorf("no system text: got %q", noSys)
	}
	if strings.Contains(sys, tokenizer.ImEnd) {
		t.Errorf("the content holds %s: %q", tokenizer.ImEnd, sys)
	}
}

func TestToolsSystemPromptCalculatorGolden(t *testing.T) {
	const want = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
		`{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression exactly.", ` +
		`"parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "integers and decimals with + - * / and parentheses"}}, "required": ["expression"]}}}` +
		"\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n" +
		"<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
	if got := NewTools(Calculator()).SystemPrompt(); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}

func TestToolsSystemPromptSeveral(t *testing.T) {
	specs := []ToolSpec{
		{Name: "a", Description: `say "hi" <b>&`, Parameters: json.RawMessage(`{}`)},
		{Name: "b", Description: "é\n"},
	}
	got := ToolsSystemPrompt("", specs)
	want := "<tools>\n" +
		`{"type": "function", "function": {"name": "a", "description": "say \"hi\" <b>&", "parameters": {}}}` + "\n" +
		`{"type": "function", "function": {"name": "b", "description": "é\n"}}` + "\n</tools>"
	if !strings.Contains(got, want) {
		t.Errorf("got %q, want it to hold %q", got, want)
	}
	if got := ToolsSystemPrompt("sys", nil); got != "sys" {
		t.Errorf("no tools: got %q, want the system text unchanged", got)
	}
}

func TestToolsSystemPromptPanicsOnBadParameters(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), `"bad"`) {
			t.Errorf("recovered %v, want a panic naming the tool", r)
		}
	}()
	ToolsSystemPrompt("", []ToolSpec{{Name: "bad", Parameters: json.RawMessage(`{"a":`)}})
}

func TestRenderObservation(t *testing.T) {
	for _, c := range []struct {
		name string
		msgs []tokenizer.Message
		want string
	}{
		{"none", nil, "\n<|im_start|>assistant\n"},
		{"one tool", []tokenizer.Message{{Role: "tool", Content: "5218"}},
			"\n<|im_start|>user\n<tool_response>\n5218\n</tool_response><|im_end|>\n<|im_start|>assistant\n"},
		{"tools grouped", []tokenizer.Message{{Role: "tool", Content: "1"}, {Role: "tool", Content: "two\nlines"}},
			"\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\ntwo\nlines\n</tool_response><|im_end|>\n<|im_start|>assistant\n"},
		{"user", []tokenizer.Message{{Role: "user", Content: "higher"}},
			"\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"},
		{"mixed", []tokenizer.Message{{Role: "tool", Content: "a"}, {Role: "user", Content: "b"}, {Role: "tool", Content: "c"}, {Role: "system", Content: "d"}},
			"\n<|im_start|>user\n<tool_response>\na\n</tool_response><|im_end|>\n" +
				"<|im_start|>user\nb<|im_end|>\n" +
				"<|im_start|>user\n<tool_response>\nc\n</tool_response><|im_end|>\n" +
				"<|im_start|>system\nd<|im_end|>\n<|im_start|>assistant\n"},
	} {
		if got := RenderObservation(c.msgs); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// TestRenderObservationContinuesChatML checks that a prompt, a model turn
// with its stop token and the observation read as the whole chat in
// ChatML: the layout a model sees is the same either way.
func TestRenderObservationContinuesChatML(t *testing.T) {
	chat := []tokenizer.Message{{Role: "user", Content: "Guess a number."}}
	turn := "Guess: 50"
	got := tokenizer.ChatML(chat, true) + turn + tokenizer.ImEnd +
		RenderObservation([]tokenizer.Message{{Role: "user", Content: "higher"}})
	want := tokenizer.ChatML(append(chat, tokenizer.Message{Role: "assistant", Content: turn},
		tokenizer.Message{Role: "user", Content: "higher"}), true)
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestPythonJSON(t *testing.T) {
	// Expected values are Python's json.dumps(json.loads(in), ensure_ascii=False).
	for _, c := range []struct{ in, want string }{
		{`{"a":1,"b":[true,false,null]}`, `{"a": 1, "b": [true, false, null]}`},
		{"{ \"z\" : 1 ,\n \"a\" : {} , \"m\":[ ] }", `{"z": 1, "a": {}, "m": []}`},
		{`{"a":1,"b":2,"a":3}`, `{"a": 3, "b": 2}`}, // a repeated key: first place, last value
		{`"<>&\u00e9\/"`, `"<>&é/"`},
		{`"\u0001\u001f\u007f\b\f\n\r\t\"\\"`, "\"\\u0001\\u001f\x7f\\b\\f\\n\\r\\t\\\"\\\\\""},
		{`"\ud83d\ude00 漢字"`, `"😀 漢字"`},
		{`[1.0,2.50,1E5,1e16,1.5e16,0.0001,0.00001,-0.0,-0,1e400,123456789012345678901234567890]`,
			`[1.0, 2.5, 100000.0, 1e+16, 1.5e+16, 0.0001, 1e-05, -0.0, 0, Infinity, 123456789012345678901234567890]`},
		{`[12345678901234567.0, 1e15, 0.1, 100e-2, 5e-324]`, `[1.2345678901234568e+16, 1000000000000000.0, 0.1, 1.0, 5e-324]`},
		{` 7 `, `7`},
	} {
		got, err := PythonJSON([]byte(c.in))
		if err != nil || got != c.want {
			t.Errorf("PythonJSON(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":}`, `{"a":1}}`, `[1,]`, `{"a":1} x`, `nul`, `{1:2}`} {
		if got, err := PythonJSON([]byte(bad)); err == nil {
			t.Errorf("PythonJSON(%q) = %q, want an error", bad, got)
		}
	}
}
