// Package evaluate measures a model on a data set of verifiable problems:
// k samples per problem from the rollout engine, each scored by its task's
// verifier; it reports avg@k (accuracy averaged over the samples) and
// pass@k (some sample right) overall, per task and per difficulty.
package evaluate

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

// Score is accuracy over a group of problems.
type Score struct {
	Group    string  `json:"group"` // "all", a task, or "task/dN"
	Problems int     `json:"problems"`
	AvgAtK   float64 `json:"avg_at_k"`
	PassAtK  float64 `json:"pass_at_k"`
	// MeanLen is the mean response length in tokens.
	MeanLen float64 `json:"mean_response_tokens"`
}

// Report is an evaluation's result.
type Report struct {
	K      int     `json:"k"`
	Scores []Score `json:"scores"` // "all" first, then tasks, then task/difficulty
	// Samples holds, per problem, its k decoded responses and rewards
	// (for inspection).
	Samples []ProblemResult `json:"-"`
}

// ProblemResult is one problem's samples.
type ProblemResult struct {
	Example   data.Example
	Responses []string
	Lengths   []int // response lengths in tokens
	Rewards   []float64
}

// Prompts renders examples as token ids in the ChatML layout with the
// generation prompt, as keel's SFT trains them.
func Prompts(tok *tokenizer.Tokenizer, ex []data.Example) [][]int32 {
	out := make([][]int32, len(ex))
	for i := range ex {
		out[i] = tok.Encode(tokenizer.ChatML(ex[i].Chat(), true))
	}
	return out
}

// CheckTasks reports the first example (row, from 0) whose task has no
// verifier: scoring it would silently give 0 to every response. A task is
// a generated family or a verify-only verifier such as math or gsm8k,
// under any data_source name verl's data sets carry
// (tasks.LookupVerifier).
func CheckTasks(ex []data.Example) error {
	for i := range ex {
		if _, err := tasks.LookupVerifier(ex[i].Task); err != nil {
			return fmt.Errorf("row %d: %v", i, err)
		}
	}
	return nil
}

// Run samples k responses per example (stopping at <|im_end|>) and scores
// them. Every example's task must have a verifier (CheckTasks).
func Run(e *rollout.Engine, tok *tokenizer.Tokenizer, ex []data.Example, k int, sp rollout.Sampling) (*Report, error) {
	if k < 1 {
		return nil, fmt.Errorf("evaluate: k = %d, want >= 1", k)
	}
	if err := CheckTasks(ex); err != nil {
		return nil, fmt.Errorf("evaluate: %v", err)
	}
	end, ok := tok.ID(tokenizer.ImEnd)
	if !ok {
		return nil, fmt.Errorf("evaluate: the tokenizer has no %s token", tokenizer.ImEnd)
	}
	sp.Stop = append(append([]int32(nil), sp.Stop...), end)
	samples, err := e.Generate(Prompts(tok, ex), k, sp)
	if err != nil {
		return nil, err
	}
	return report(tok, end, ex, k, samples, func(s *rollout.Sample) (int, float64) {
		return len(s.Tokens), scoreSample(tok, end, ex[s.Prompt], s.Tokens)
	}), nil
}

// Episodes makes an evaluation multi-turn (RunEpisodes): each problem is
// an episode of Env within Budgets, its prompt the row's chat with System
// in front (env.Chat).
type Episodes struct {
	Env     env.Environment
	Budgets env.Budgets
	System  string
	// AnyTask: the environment scores rows whatever their task (one
	// served over HTTP), so they need no built-in verifier.
	AnyTask bool
}

// RunEpisodes is Run over episodes: k episodes per example, sp's
// MaxNewTokens bounding each turn; a sample's reward is its episode's
// correctness, its response the whole trajectory (observations
// included) and its length the model's tokens.
func RunEpisodes(e *rollout.Engine, tok *tokenizer.Tokenizer, ex []data.Example, k int, sp rollout.Sampling, ep Episodes) (*Report, error) {
	if k < 1 {
		return nil, fmt.Errorf("evaluate: k = %d, want >= 1", k)
	}
	end, ok := tok.ID(tokenizer.ImEnd)
	if !ok {
		return nil, fmt.Errorf("evaluate: the tokenizer has no %s token", tokenizer.ImEnd)
	}
	sp.Stop = append(append([]int32(nil), sp.Stop...), end)
	prompts := make([][]int32, len(ex))
	rows := make([]*data.Example, len(ex))
	for i := range ex {
		rows[i] = &ex[i]
		prompts[i] = tok.Encode(tokenizer.ChatML(env.Chat(ep.System, rows[i]), true))
	}
	sess, err := env.NewSession(context.Background(), ep.Env, tok, rows, k, ep.Budgets)
	if err != nil {
		return nil, err
	}
	sp.EpisodeTokens = ep.Budgets.MaxTokens
	samples, err := e.GenerateTurns(prompts, k, sp, sess)
	sess.Close() // a failed close loses no result
	if err != nil {
		return nil, err
	}
	return report(tok, end, ex, k, samples, func(s *rollout.Sample) (int, float64) {
		model := len(s.Tokens)
		for _, o := range s.Observations {
			model -= o.End - o.Start
		}
		return model, sess.Outcome(s.Prompt, s.Index).Correct
	}), nil
}

// report gathers the samples of k per example into a summarised Report,
// each response decoded, with the length and reward measure gives it.
func report(tok *tokenizer.Tokenizer, end int32, ex []data.Example, k int, samples []rollout.Sample, measure func(*rollout.Sample) (int, float64)) *Report {
	rep := &Report{K: k, Samples: make([]ProblemResult, len(ex))}
	for i := range rep.Samples {
		rep.Samples[i].Example = ex[i]
	}
	for i := range samples {
		s := &samples[i]
		pr := &rep.Samples[s.Prompt]
		n, r := measure(s)
		pr.Responses = append(pr.Responses, responseText(tok, end, s.Tokens))
		pr.Lengths = append(pr.Lengths, n)
		pr.Rewards = append(pr.Rewards, r)
	}
	rep.summarise()
	return rep
}

// responseText decodes a response without its final stop token.
func responseText(tok *tokenizer.Tokenizer, end int32, ids []int32) string {
	if len(ids) > 0 && ids[len(ids)-1] == end {
		ids = ids[:len(ids)-1] // the stop token is not part of the answer
	}
	return tok.DecodeLenient(ids)
}

// scoreSample is the reward of a sampled response to ex.
func scoreSample(tok *tokenizer.Tokenizer, end int32, ex data.Example, ids []int32) float64 {
	return tasks.Score(ex.Task, ex.Answer, responseText(tok, end, ids))
}

// summarise fills Scores from Samples: per problem, avg = mean reward over
// its k samples and pass = 1 if any is right; groups average them.
func (r *Report) summarise() {
	type acc struct{ n, sum, pass, tokens float64 }
	groups := map[string]*acc{}
	add := func(g string, avg, pass, tokens float64) {
		a := groups[g]
		if a == nil {
			a = &acc{}
			groups[g] = a
		}
		a.n++
		a.sum += avg
		a.pass += pass
		a.tokens += tokens
	}
	for _, pr := range r.Samples {
		var sum, pass, tokens float64
		for i, rw := range pr.Rewards {
			sum += rw
			pass = max(pass, rw)
			tokens += float64(pr.Lengths[i])
		}
		n := float64(max(len(pr.Rewards), 1))
		add("all", sum/n, pass, tokens/n)
		add(pr.Example.Task, sum/n, pass, tokens/n)
		add(fmt.Sprintf("%s/d%d", pr.Example.Task, pr.Example.Difficulty), sum/n, pass, tokens/n)
	}
	names := make([]string, 0, len(groups))
	for g := range groups {
		names = append(names, g)
	}
	sort.Slice(names, func(i, j int) bool {
		if (names[i] == "all") != (names[j] == "all") {
			return names[i] == "all"
		}
		return names[i] < names[j]
	})
	r.Scores = r.Scores[:0]
	for _, g := range names {
		a := groups[g]
		r.Scores = append(r.Scores, Score{Group: g, Problems: int(a.n), AvgAtK: a.sum / a.n, PassAtK: a.pass / a.n, MeanLen: a.tokens / a.n})
	}
}

// Overall returns the "all" score.
func (r *Report) Overall() Score { return r.Scores[0] }

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "group\tproblems\tavg@%d\tpass@%d\tresponse tokens\t\n", r.K, r.K)
	for _, s := range r.Scores {
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.1f\t\n", s.Group, s.Problems, s.AvgAtK, s.PassAtK, s.MeanLen)
	}
	tw.Flush()
}
