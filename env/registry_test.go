package env

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
)

func TestLookup(t *testing.T) {
	if got := Names(); !reflect.DeepEqual(got, []string{"guess", "tools"}) {
		t.Errorf("Names() = %v", got)
	}
	e, err := Lookup("tools")
	if err != nil {
		t.Fatal(err)
	}
	tools, ok := e.(*ToolsEnv)
	if !ok || !reflect.DeepEqual(tools.Specs(), []ToolSpec{calculatorSpec}) || !strings.Contains(tools.SystemPrompt(), `"name": "calculator"`) {
		t.Errorf("tools: %#v, want the calculator with its system prompt", e)
	}
	e2, _ := Lookup("tools")
	if e2 == e {
		t.Error("Lookup returned the same environment twice")
	}
	g, err := Lookup("guess")
	if err != nil {
		t.Fatal(err)
	}
	if _, isPrompter := g.(Prompter); isPrompter {
		t.Error("guess has a system prompt")
	}
	ep := start(t, g, &data.Example{Answer: "4"})
	if r, _ := ep.Step(context.Background(), Turn{Text: "Guess: 4"}); r.Reward != 1 {
		t.Errorf("guess: %+v", r)
	}
	_, err = Lookup("chess")
	if err == nil || err.Error() != `unknown environment "chess" (built-in: guess, tools)` {
		t.Errorf("Lookup(chess): %v", err)
	}
}
