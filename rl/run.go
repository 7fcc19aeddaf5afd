package rl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

// Progress receives what a run reports as it goes (nil fields: ignored).
type Progress struct {
	// Step is called after every global step with its metrics.
	Step func(step, total int, m map[string]float64, elapsed time.Duration)
	// Eval is called with each held-out evaluation (step 0: before
	// training).
	Eval func(step int, rep *evaluate.Report)
	// Warn receives guard warnings.
	Warn func(msg string)
}

// Result is what a finished (or stopped) run reports.
type Result struct {
	Dir      string
	ModelDir string
	Steps    int
	Before   *evaluate.Report // held-out evaluation before training (nil on resume or without eval)
	After    *evaluate.Report
	Elapsed  time.Duration
	Stopped  bool // ctx cancelled: checkpointed, resumable
	PeakRSS  int64
	Resumed  int // the step resumed from (0: fresh)
	Recipe   *Recipe
	LastStep map[string]float64
	// Decontaminated counts training prompts dropped for being in the
	// held-out set.
	Decontaminated int
}

// loopState is what a checkpoint saves besides model and optimiser.
type loopState struct {
	Loader    LoaderState `json:"loader"`
	NonFinite int         `json:"nonfinite"`
	Elapsed   float64     `json:"elapsed_s"`
	// Pending holds the batches sampled ahead for the steps after the
	// checkpoint (rollout.staleness > 0).
	Pending []SavedBatch `json:"pending,omitempty"`
}

// Files of a run directory.
const (
	RecipeFile  = run.RecipeFile
	MetricsFile = run.MetricsFile
)

// ErrRunExists is returned when a fresh run would overwrite one.
var ErrRunExists = errors.New("run directory holds a run")

// decontaminate drops the prompts whose chat text is that of an
// evaluation example.
func decontaminate(prompts []Prompt, eval []data.Example) ([]Prompt, int) {
	held := map[string]bool{}
	for i := range eval {
		held[chatKey(eval[i].Chat())] = true
	}
	out := prompts[:0:0]
	for _, p := range prompts {
		if !held[chatKey(p.Example.Chat())] {
			out = append(out, p)
		}
	}
	return out, len(prompts) - len(out)
}

func chatKey(msgs []tokenizer.Message) string {
	return tokenizer.ChatML(msgs, true)
}

// guardMessage says which guard threshold a step passed ("" if none).
func guardMessage(r *Recipe, m map[string]float64) string {
	g := &r.Guards
	if g.KLMax > 0 && m["train_infer/k3"] > g.KLMax {
		return fmt.Sprintf("train-infer KL k3 = %.3g above guards.kl_max = %g", m["train_infer/k3"], g.KLMax)
	}
	if g.ISMax > 0 && m["is/max"] > g.ISMax {
		return fmt.Sprintf("IS weight max = %.3g above guards.is_max = %g", m["is/max"], g.ISMax)
	}
	return ""
}

// VerifierScorer scores a response with its task's verifier: the reward
// and the correctness are both the verifier's 0/1.
func VerifierScorer(tok *tokenizer.Tokenizer, end int32) Scorer {
	return func(p *Prompt, response []int32) (float64, float64) {
		ids := response
		if len(ids) > 0 && ids[len(ids)-1] == end {
			ids = ids[:len(ids)-1]
		}
		s := tasks.Score(p.Example.Task, p.Example.Answer, tok.DecodeLenient(ids))
		return s, s
	}
}

// loadPrompts reads or generates the prompt set and tokenizes it (each
// row's chat with system in front, env.Chat), checking every row fits the
// context and, unless the reward is external or an environment scores any
// task, has a verifier.
func loadPrompts(r *Recipe, tok *tokenizer.Tokenizer, maxPos int, system string) ([]Prompt, error) {
	var ex []data.Example
	var err error
	where := "data.file"
	if r.Data.File != "" {
		if ex, err = data.Read(r.Data.File); err != nil {
			return nil, fmt.Errorf("data.file: %w", err)
		}
	} else {
		where = "data.tasks"
		spec := data.GenSpec{Tasks: r.Data.Tasks, N: r.Data.N, Seed: r.Seed}
		if spec.Difficulties, err = data.ParseDifficulties(r.Data.Difficulty); err != nil {
			return nil, fmt.Errorf("data.difficulty: %w", err)
		}
		if ex, err = data.Generate(spec); err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
	}
	if len(ex) == 0 {
		return nil, fmt.Errorf("%s: no prompts", where)
	}
	// An external reward program scores tasks keel has no verifier for.
	if err := evaluate.CheckTasks(ex); err != nil && !r.Reward.External() && !r.Env.scoresAnyTask() {
		return nil, fmt.Errorf("%s: %s: %w", where, r.Data.File, err)
	}
	out := make([]Prompt, len(ex))
	for i := range ex {
		ids := tok.Encode(tokenizer.ChatML(env.Chat(system, &ex[i]), true))
		if maxPos > 0 && len(ids) >= maxPos {
			return nil, fmt.Errorf("%s: row %d: the prompt has %d tokens, the model's context (max_position_embeddings) is %d: no room for a response", where, i, len(ids), maxPos)
		}
		out[i] = Prompt{Row: i, IDs: ids, Example: ex[i]}
	}
	return out, nil
}

// writeSamples stores a step's samples as JSON lines (prompt, response,
// reward, advantage, length, finish reason) for inspection.
func writeSamples(dir string, step int, tok *tokenizer.Tokenizer, samples []*Sample) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, fmt.Sprintf("step-%06d.jsonl", step))
	return atomicfile.Write(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		for _, s := range samples {
			row := map[string]any{
				"group": s.Group, "task": s.Prompt.Example.Task, "prompt": s.Prompt.Example.Chat()[len(s.Prompt.Example.Chat())-1].Content,
				"answer": s.Prompt.Example.Answer, "response": tok.DecodeLenient(s.Response), "reward": s.Reward,
				"advantage": s.Advantage, "tokens": s.tokens(), "finish": s.Finish, "version": s.Version,
			}
			if oc := s.Episode; oc != nil {
				row["turns"] = trajectoryTurns(tok, s)
				row["episode"] = map[string]any{"turns": oc.Turns, "done": oc.Done, "cut": oc.Cut, "obs_tokens": oc.ObsTokens, "metrics": oc.Metrics}
			}
			if err := enc.Encode(row); err != nil {
				return err
			}
		}
		return nil
	})
}

// trajectoryTurns cuts a multi-turn response into its turns, decoded:
// {"model": text} for the model's, {"env": text} for the observations.
func trajectoryTurns(tok *tokenizer.Tokenizer, s *Sample) []map[string]string {
	var out []map[string]string
	at := 0
	for _, o := range s.Obs {
		if o.Start > at {
			out = append(out, map[string]string{"model": tok.DecodeLenient(s.Response[at:o.Start])})
		}
		out = append(out, map[string]string{"env": tok.DecodeLenient(s.Response[o.Start:o.End])})
		at = o.End
	}
	if at < len(s.Response) {
		out = append(out, map[string]string{"model": tok.DecodeLenient(s.Response[at:])})
	}
	return out
}
