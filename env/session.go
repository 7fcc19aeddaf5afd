package env

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
)

// Budgets bound an episode; a budget that cuts one short gives it reward
// 0, and the cut is recorded (Outcome.Cut).
type Budgets struct {
	// MaxTurns bounds the model's turns (>= 1): the last one is shown to
	// the environment as Turn.Last.
	MaxTurns int
	// MaxTokens bounds the tokens after the prompt, the model's and the
	// observations' together (0: only the engine's context bounds them).
	MaxTokens int
}

// Cuts of an episode by a budget (Outcome.Cut).
const (
	CutTurns   = "turns"   // the environment wanted another turn after the last
	CutTokens  = "tokens"  // an observation did not fit Budgets.MaxTokens
	CutContext = "context" // an observation did not fit the engine's context
)

// Outcome is how one episode ended.
type Outcome struct {
	Reward, Correct float64
	// Done: the environment ended the episode; otherwise Cut says which
	// budget did (reward 0).
	Done bool
	Cut  string
	// Turns counts the model's turns, ObsTokens the observation tokens.
	Turns, ObsTokens int
	// Metrics sums the environment's per-turn metrics.
	Metrics map[string]float64
	// Time is spent in the environment (Start and Step).
	Time time.Duration
}

// take counts a turn and its reply's metrics into o, and the episode's
// end when the reply is done (which it reports).
func (o *Outcome) take(reply Reply) bool {
	o.Turns++
	for k, v := range reply.Metrics {
		if o.Metrics == nil {
			o.Metrics = map[string]float64{}
		}
		o.Metrics[k] += v
	}
	if reply.Done {
		o.Done, o.Reward, o.Correct = true, reply.Reward, reply.Correct
	}
	return reply.Done
}

// Session runs the episodes of one rollout call: n samples of each row,
// as the rollout engine's Turns (GenerateTurns). It decodes each model
// turn, hands it to its episode (started on the first turn), renders the
// reply in the ChatML layout of Qwen3's chat template and tokenises it as
// the observation, within the budgets. Its Turn is safe for concurrent use
// across samples.
type Session struct {
	ctx  context.Context
	env  Environment
	tok  *tokenizer.Tokenizer
	rows []*data.Example
	n    int
	b    Budgets
	stop int32 // the turn-ending token (<|im_end|>), not shown to the environment
	eps  []episodeState

	closing   sync.WaitGroup // episodes being closed
	closeMu   sync.Mutex
	closeErrs []error
}

type episodeState struct {
	mu     sync.Mutex
	ep     Episode
	out    Outcome
	closed bool // by Session.Close: a late turn starts nothing
}

// end closes st's episode, if open, on a goroutine of its own: an episode
// is closed as soon as it is over, and a slow close (a request to an
// environment server) holds up no sample.
func (s *Session) end(st *episodeState) {
	if st.ep == nil {
		return
	}
	ep := st.ep
	st.ep = nil
	s.closing.Add(1)
	go func() {
		defer s.closing.Done()
		if err := ep.Close(); err != nil {
			s.closeMu.Lock()
			s.closeErrs = append(s.closeErrs, err)
			s.closeMu.Unlock()
		}
	}()
}

// NewSession prepares the episodes of n samples of each row.
func NewSession(ctx context.Context, e Environment, tok *tokenizer.Tokenizer, rows []*data.Example, n int, b Budgets) (*Session, error) {
	if b.MaxTurns < 1 {
		return nil, fmt.Errorf("env: max turns %d, want >= 1", b.MaxTurns)
	}
	if b.MaxTokens < 0 {
		return nil, fmt.Errorf("env: max tokens %d, want >= 0", b.MaxTokens)
	}
	stop, ok := tok.ID(tokenizer.ImEnd)
	if !ok {
		return nil, fmt.Errorf("env: the tokenizer has no %s token to end turns", tokenizer.ImEnd)
	}
	return &Session{ctx: ctx, env: e, tok: tok, rows: rows, n: n, b: b, stop: stop, eps: make([]episodeState, len(rows)*n)}, nil
}

// Turn is rollout.Turns' method: the episode's answer to the turn t
// ended.
func (s *Session) Turn(t rollout.TurnEnd) ([]int32, bool, error) {
	if t.Prompt < 0 || t.Prompt >= len(s.rows) || t.Index < 0 || t.Index >= s.n {
		return nil, false, fmt.Errorf("env: a turn of sample %d of prompt %d, the session has %d x %d", t.Index, t.Prompt, len(s.rows), s.n)
	}
	st := &s.eps[t.Prompt*s.n+t.Index]
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, false, fmt.Errorf("env: a turn of sample %d of prompt %d after the session closed", t.Index, t.Prompt)
	}
	out := &st.out
	if out.Done || out.Cut != "" {
		return nil, false, fmt.Errorf("env: turn %d of an episode that has ended", t.Turn)
	}
	start := time.Now()
	defer func() { out.Time += time.Since(start) }()
	row := s.rows[t.Prompt]
	if st.ep == nil {
		ep, err := s.env.Start(s.ctx, row)
		if err != nil {
			return nil, false, fmt.Errorf("env: start (row task %q): %w", row.Task, err)
		}
		st.ep = ep
	}
	ids := t.Response[t.TurnStart:]
	if t.Finish == "stop" && len(ids) > 0 && ids[len(ids)-1] == s.stop {
		ids = ids[:len(ids)-1]
	}
	// The turn is the last when no budget leaves room for an observation
	// and another turn; cut names the budget.
	cut := ""
	switch {
	case t.Turn+1 >= s.b.MaxTurns:
		cut = CutTurns
	case s.b.MaxTokens > 0 && len(t.Response)+2 > s.b.MaxTokens:
		cut = CutTokens
	case t.Room < 2:
		cut = CutContext
	}
	turn := Turn{Text: s.tok.DecodeLenient(ids), Index: t.Turn, Last: cut != "", Truncated: t.Finish == "length"}
	reply, err := st.ep.Step(s.ctx, turn)
	if err != nil {
		return nil, false, fmt.Errorf("env: turn %d (row task %q): %w", t.Turn, row.Task, err)
	}
	if out.take(reply) {
		s.end(st)
		return nil, true, nil
	}
	if cut != "" {
		out.Cut = cut
		s.end(st)
		return nil, true, nil
	}
	text := RenderObservation(reply.Messages)
	if t.Finish != "stop" {
		text = tokenizer.ImEnd + text // close the cut turn, as the template would
	}
	obs := s.tok.Encode(text)
	switch {
	case s.b.MaxTokens > 0 && len(t.Response)+len(obs)+1 > s.b.MaxTokens:
		out.Cut = CutTokens
	case len(obs)+1 > t.Room:
		out.Cut = CutContext
	}
	if out.Cut != "" {
		s.end(st)
		return nil, true, nil
	}
	out.ObsTokens += len(obs)
	return obs, false, nil
}

// Outcome returns how sample index of prompt's episode ended (after the
// rollout call returned).
func (s *Session) Outcome(prompt, index int) Outcome {
	return s.eps[prompt*s.n+index].out
}

// Close closes the episodes still open (an episode is closed as soon as
// it ends; one the rollout cut short is not), waits for every close and
// returns how many failed, with the first failure. A failed close loses
// no result: the caller may count it and go on.
func (s *Session) Close() (failed int, err error) {
	for i := range s.eps {
		st := &s.eps[i]
		st.mu.Lock()
		s.end(st)
		st.closed = true
		st.mu.Unlock()
	}
	s.closing.Wait()
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if len(s.closeErrs) > 0 {
		err = fmt.Errorf("env: closing an episode: %w", s.closeErrs[0])
	}
	return len(s.closeErrs), err
}

// Chat returns a row's chat with an environment's system prompt in front
// ("" leaves it as it is): appended to the row's own system message,
// after a blank line, as Qwen3's chat template joins a system message and
// the tools' schemas, or as a system message of its own.
func Chat(system string, row *data.Example) []tokenizer.Message {
	msgs := row.Chat()
	if system == "" {
		return msgs
	}
	if len(msgs) > 0 && msgs[0].Role == "system" {
		out := append([]tokenizer.Message{{Role: "system", Content: msgs[0].Content + "\n\n" + system}}, msgs[1:]...)
		return out
	}
	return append([]tokenizer.Message{{Role: "system", Content: system}}, msgs...)
}
