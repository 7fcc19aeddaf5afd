// Package env holds keel's multi-turn environments: an episode starts from
// a data row, the model takes a turn, the environment answers (a tool's
// result, a game's feedback) and the model goes on, until the environment
// says the episode is over and gives its reward.
//
// The environment sees text: each model turn decoded, and it answers with
// chat messages ("tool" messages for tool results, "user" messages for
// anything else), which keel renders in the ChatML layout of Qwen3's chat
// template and tokenises with the run's tokenizer (RenderObservation).
// Those observation tokens are appended to the trajectory with a loss mask:
// the model's own tokens are never re-tokenised, and only they carry
// log-probabilities, advantages and gradients.
//
// Built-in environments (Lookup):
//
//	tools   tool calls in Qwen3's format (<tool_call>{"name": ..., "arguments": {...}}</tool_call>),
//	        answered as <tool_response> blocks; the episode ends at a turn with no tool
//	        call, scored by the row's verifier. Tools: calculator.
//	guess   guess a secret number from "higher" / "lower" answers ("Guess: N").
//
// An environment written in any language plugs in over HTTP (NewHTTP,
// protocol keel-env/1).
package env

import (
	"context"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tokenizer"
)

// Environment starts episodes. Implementations must allow Start, and the
// Steps of different episodes, to run concurrently.
type Environment interface {
	// Start begins an episode on a data row (the rollout's prompt is the
	// row's chat, with SystemPrompt in front when the environment has
	// one).
	Start(ctx context.Context, row *data.Example) (Episode, error)
}

// Episode is one trajectory's environment. Step is never called twice at
// once for one episode.
type Episode interface {
	// Step takes the model's turn and answers: the messages to show the
	// model before its next turn, or Done with the episode's reward.
	// When turn.Last is set no further turn can follow (a budget is
	// spent) and the reply must be Done; a reply that is not is scored 0.
	Step(ctx context.Context, turn Turn) (Reply, error)
	// Close ends the episode, finished or not (a budget can cut it
	// short); the environment frees what it holds for it.
	Close() error
}

// Turn is one model turn as the environment sees it.
type Turn struct {
	// Text is the turn decoded, without the stop token that ended it.
	Text string `json:"text"`
	// Index counts the model's turns from 0.
	Index int `json:"index"`
	// Last: no further turn can follow, whatever the reply.
	Last bool `json:"last"`
	// Truncated: the turn hit its token budget before its stop token.
	Truncated bool `json:"truncated"`
}

// Reply is an environment's answer to one turn.
type Reply struct {
	// Messages are shown to the model before its next turn: role "tool"
	// for a tool's result (rendered as a <tool_response> block), "user"
	// otherwise. Ignored when Done.
	Messages []tokenizer.Message `json:"messages,omitempty"`
	Done     bool                `json:"done"`
	// Reward and Correct (1 or 0, for the accuracy metrics) are the
	// episode's, read when Done.
	Reward  float64 `json:"reward"`
	Correct float64 `json:"correct"`
	// Metrics are counts or measures of this turn (tool_calls,
	// tool_errors, ...): summed over the episode, then averaged over the
	// step's episodes into env/NAME. Send the same keys every turn, zeros
	// included, so that no episode lacks one.
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// Prompter is implemented by an environment whose prompts need a system
// message of its own (the tools' schemas, as Qwen3's chat template
// renders them); the loop and evaluation put it before each row's chat
// (Chat). An empty SystemPrompt means none.
type Prompter interface {
	SystemPrompt() string
}
