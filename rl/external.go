package rl

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/keel-rl/keel/reward"
	"github.com/keel-rl/keel/tokenizer"
)

// ExternalScorer is a BatchScorer asking an external reward program
// (package reward, protocol keel-reward/1) for the rewards of a round's
// responses.
type ExternalScorer struct {
	Client *reward.Client
	// Tok decodes responses (nil: the request's response text is empty;
	// response_ids always carries the tokens); End is the token that ends
	// a response, left out of the text.
	Tok *tokenizer.Tokenizer
	End int32
	// Zero gives a response that could not be scored reward 0 (counted)
	// instead of failing the step (reward.on_error: zero).
	Zero bool
}

// NewExternalScorer builds the scorer of a recipe's external reward
// section (w.External()), reading the HTTP API key from the environment
// variable w.APIKeyEnv names. Close its Client when done.
func NewExternalScorer(w *RewardSettings, tok *tokenizer.Tokenizer, end int32) (*ExternalScorer, error) {
	opt := reward.Options{Command: w.Command, Timeout: time.Duration(w.Timeout * float64(time.Second)),
		Concurrency: w.Concurrency, Batch: w.Batch, MaxRestarts: 3, Stderr: os.Stderr}
	if w.MaxRestarts != nil {
		opt.MaxRestarts = *w.MaxRestarts
	}
	if w.Retries != nil {
		opt.Retries = *w.Retries
	}
	if w.Kind == RewardHTTP {
		opt.URL = w.URL
		if w.APIKeyEnv != "" {
			if opt.APIKey = os.Getenv(w.APIKeyEnv); opt.APIKey == "" {
				return nil, fmt.Errorf("reward.api_key_env: the environment variable %s is not set", w.APIKeyEnv)
			}
		}
	}
	c, err := reward.New(opt)
	if err != nil {
		return nil, fmt.Errorf("reward: %w", err)
	}
	return &ExternalScorer{Client: c, Tok: tok, End: end, Zero: w.OnError == "zero"}, nil
}

// ScoreBatch sends the samples as one call of the client (in its batches)
// and maps the answers back; an item's error fails the step unless Zero.
func (e *ExternalScorer) ScoreBatch(ctx context.Context, samples []*Sample) ([]Scored, error) {
	items := make([]reward.Item, len(samples))
	seen := map[int]int{} // responses per row so far: ids "ROW.K"
	for i, s := range samples {
		ex := &s.Prompt.Example
		row := s.Prompt.Row
		k := seen[row]
		seen[row]++
		chat := ex.Chat()
		msgs := make([]reward.Message, len(chat))
		for j, m := range chat {
			msgs[j] = reward.Message{Role: m.Role, Content: m.Content}
		}
		ids := s.Response
		if len(ids) > 0 && ids[len(ids)-1] == e.End {
			ids = ids[:len(ids)-1]
		}
		var text string
		if e.Tok != nil {
			text = e.Tok.DecodeLenient(ids)
		}
		items[i] = reward.Item{ID: strconv.Itoa(row) + "." + strconv.Itoa(k), Row: row, Task: ex.Task,
			Prompt: tokenizer.ChatML(chat, true), Messages: msgs, Response: text, ResponseIDs: s.Response,
			Finish: s.Finish, GroundTruth: ex.Answer, Extra: ex.Extra}
	}
	res := e.Client.Score(ctx, items)
	out := make([]Scored, len(res))
	for i, r := range res {
		if r.Err != nil {
			if !e.Zero {
				return nil, fmt.Errorf("%w (reward.on_error: zero gives such responses reward 0 instead)", r.Err)
			}
			out[i] = Scored{Failed: true}
			continue
		}
		out[i] = Scored{Reward: r.Reward, Correct: r.Correct, Metrics: r.Metrics}
	}
	return out, nil
}
