package env

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

// scripted answers every turn with one user message "ok" until the turn
// says "done", then ends with reward 1; it records the turns it saw.
type scripted struct{ turns *[]Turn }

func (s scripted) Start(context.Context, *data.Example) (Episode, error) { return s, nil }
func (s scripted) Close() error                                          { return nil }
func (s scripted) Step(_ context.Context, t Turn) (Reply, error) {
	*s.turns = append(*s.turns, t)
	if strings.Contains(t.Text, "done") {
		return Reply{Done: true, Reward: 1, Correct: 1, Metrics: map[string]float64{"k": 1}}, nil
	}
	return Reply{Messages: []tokenizer.Message{{Role: "user", Content: "ok"}}, Metrics: map[string]float64{"k": 1}}, nil
}

func newTestSession(t *testing.T, b Budgets) (*Session, *[]Turn, *tokenizer.Tokenizer) {
	t.Helper()
	tok := tokenizer.NewChar()
	var seen []Turn
	s, err := NewSession(context.Background(), scripted{&seen}, tok, []*data.Example{{Task: "x", Prompt: "p"}}, 1, b)
	if err != nil {
		t.Fatal(err)
	}
	return s, &seen, tok
}

// A turn reaches the environment decoded, without its stop token; the
// answer comes back rendered and tokenised; a cut turn's observation
// closes it with <|im_end|> first; the last turn a budget allows is marked
// Last, and the environment's wish for more after it is a cut.
func TestSessionTurnsAndBudgets(t *testing.T) {
	s, seen, tok := newTestSession(t, Budgets{MaxTurns: 2})
	end := tok.MustID(tokenizer.ImEnd)
	resp := append(tok.Encode("hi"), end)
	obs, done, err := s.Turn(rollout.TurnEnd{Response: resp, Finish: "stop", Room: 100})
	if err != nil || done {
		t.Fatal(done, err)
	}
	if got, want := tok.DecodeLenient(obs), RenderObservation([]tokenizer.Message{{Role: "user", Content: "ok"}}); got != want {
		t.Fatalf("observation %q, want %q", got, want)
	}
	resp = append(append(resp, obs...), tok.Encode("abc")...)
	obs2, done, err := s.Turn(rollout.TurnEnd{Turn: 1, Response: resp, TurnStart: len(resp) - 3, Finish: "length", Room: 100})
	if err != nil || !done || obs2 != nil {
		t.Fatal(obs2, done, err)
	}
	want := []Turn{{Text: "hi", Index: 0}, {Text: "abc", Index: 1, Last: true, Truncated: true}}
	if !slices.Equal(*seen, want) {
		t.Fatalf("the environment saw %+v, want %+v", *seen, want)
	}
	oc := s.Outcome(0, 0)
	if oc.Done || oc.Cut != CutTurns || oc.Turns != 2 || oc.ObsTokens != len(obs) || oc.Metrics["k"] != 2 || oc.Reward != 0 {
		t.Fatalf("outcome %+v", oc)
	}

	// A cut turn that goes on: its observation starts by closing it.
	s, _, _ = newTestSession(t, Budgets{MaxTurns: 3})
	obs, _, _ = s.Turn(rollout.TurnEnd{Response: tok.Encode("xy"), Finish: "length", Room: 100})
	if got := tok.DecodeLenient(obs); !strings.HasPrefix(got, tokenizer.ImEnd+"\n"+tokenizer.ImStart) {
		t.Fatalf("observation after a cut turn: %q", got)
	}

	// An observation that does not fit the token budget, or the context,
	// ends the episode with a cut and reward 0.
	s, _, _ = newTestSession(t, Budgets{MaxTurns: 5, MaxTokens: 20})
	if obs, done, _ := s.Turn(rollout.TurnEnd{Response: tok.Encode("hi"), Finish: "stop", Room: 100}); !done || obs != nil || s.Outcome(0, 0).Cut != CutTokens {
		t.Fatalf("token budget: done %v, outcome %+v", done, s.Outcome(0, 0))
	}
	s, _, _ = newTestSession(t, Budgets{MaxTurns: 5})
	if _, done, _ := s.Turn(rollout.TurnEnd{Response: tok.Encode("hi"), Finish: "stop", Room: 10}); !done || s.Outcome(0, 0).Cut != CutContext {
		t.Fatalf("context: done %v, outcome %+v", done, s.Outcome(0, 0))
	}
	// No room at all: the turn is the last one.
	s, seen, _ = newTestSession(t, Budgets{MaxTurns: 5})
	if _, done, _ := s.Turn(rollout.TurnEnd{Response: tok.Encode("done"), Finish: "length", Room: 0}); !done || !(*seen)[0].Last || !s.Outcome(0, 0).Done || s.Outcome(0, 0).Reward != 1 {
		t.Fatalf("no room: done %v, turns %+v, outcome %+v", done, *seen, s.Outcome(0, 0))
	}
}

func TestChatWithSystem(t *testing.T) {
	row := &data.Example{Prompt: "q"}
	if got := Chat("", row); len(got) != 1 || got[0].Content != "q" {
		t.Fatalf("%+v", got)
	}
	if got := Chat("S", row); len(got) != 2 || got[0] != (tokenizer.Message{Role: "system", Content: "S"}) {
		t.Fatalf("%+v", got)
	}
	row.Messages = []tokenizer.Message{{Role: "system", Content: "own"}, {Role: "user", Content: "q"}}
	if got := Chat("S", row); len(got) != 2 || got[0].Content != "own\n\nS" || row.Messages[0].Content != "own" {
		t.Fatalf("%+v (row %+v)", got, row.Messages)
	}
}

// SplitTrajectory undoes Demonstrate's layout; demonstrations of both
// built-in games win and read back.
func TestDemonstrationsSplit(t *testing.T) {
	ex, err := GenerateDemos(context.Background(), DemoSpec{Tasks: []string{"arithmetic", "guess"}, N: 20, Difficulties: []int{3, 4}, Seed: 1, Demos: true, UseTool: 0.5, Bisect: 0.5, MaxTurns: 6})
	if err != nil {
		t.Fatal(err)
	}
	tools := 0
	for i, e := range ex {
		segs := SplitTrajectory(e.Response)
		var b strings.Builder
		for k, s := range segs {
			b.WriteString(s.Text)
			if s.Obs != (k%2 == 1) {
				t.Fatalf("row %d: segment %d is observation %v", i, k, s.Obs)
			}
			if s.Obs && (!strings.HasPrefix(s.Text, "\n"+tokenizer.ImStart) || !strings.HasSuffix(s.Text, tokenizer.ImStart+"assistant\n")) {
				t.Fatalf("row %d: observation %q", i, s.Text)
			}
		}
		if b.String() != e.Response {
			t.Fatalf("row %d: the segments do not rebuild the response", i)
		}
		if strings.Contains(e.Response, "<tool_call>") {
			tools++
		}
		last := segs[len(segs)-1].Text
		if tasksScore(e, last) != 1 {
			t.Fatalf("row %d: the demonstration's last turn %q does not score", i, last)
		}
	}
	if len(ex) < 18 || tools == 0 {
		t.Fatalf("%d rows of 20, %d with tool calls", len(ex), tools)
	}
}

func tasksScore(e data.Example, text string) float64 {
	return tasks.Score(e.Task, e.Answer, text)
}

// With Qwen3's own tokenizer, an observation's markers are its added
// tokens (<|im_end|>, <|im_start|>, <tool_response>, </tool_response>: one
// id each), as Hugging Face's apply_chat_template tokenises a tool
// message, and a model's tool call reaches the environment as text.
func TestSessionQwenTokenizer(t *testing.T) {
	js, err := testmodel.QwenTokenizerJSON()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(js, "qwen3")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(context.Background(), NewTools(Calculator()), tok, []*data.Example{{Task: "arithmetic", Prompt: "Compute 12*34.", Answer: "408"}}, 1, Budgets{MaxTurns: 3})
	if err != nil {
		t.Fatal(err)
	}
	call := tok.Encode("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call><|im_end|>")
	obs, done, err := s.Turn(rollout.TurnEnd{Response: call, Finish: "stop", Room: 1000})
	if err != nil || done {
		t.Fatal(done, err)
	}
	id := func(s string) int32 { return tok.MustID(s) }
	want := tok.Encode("\n")
	want = append(want, id("<|im_start|>"))
	want = append(want, tok.Encode("user\n")...)
	want = append(want, id("<tool_response>"))
	want = append(want, tok.Encode("\n408\n")...)
	want = append(want, id("</tool_response>"), id("<|im_end|>"))
	want = append(want, tok.Encode("\n")...)
	want = append(want, id("<|im_start|>"))
	want = append(want, tok.Encode("assistant\n")...)
	if !slices.Equal(obs, want) {
		t.Fatalf("observation %v (%q), want %v", obs, tok.DecodeLenient(obs), want)
	}
	if tok.MustID("<tool_call>") != call[0] {
		t.Fatalf("<tool_call> is not one token: %v", call[:3])
	}
	resp := append(append(call, obs...), tok.Encode("Answer: 408<|im_end|>")...)
	if _, done, err := s.Turn(rollout.TurnEnd{Turn: 1, Response: resp, TurnStart: len(call) + len(obs), Finish: "stop", Room: 1000}); err != nil || !done {
		t.Fatal(done, err)
	}
	if oc := s.Outcome(0, 0); !oc.Done || oc.Reward != 1 || oc.Metrics["tool_calls"] != 1 {
		t.Fatalf("outcome %+v", oc)
	}
}
