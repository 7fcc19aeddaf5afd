package rl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/internal/builtin"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/rollout/remote"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
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
}

// Files of a run directory.
const (
	RecipeFile  = run.RecipeFile
	MetricsFile = run.MetricsFile
)

// ErrRunExists is returned when a fresh run would overwrite one.
var ErrRunExists = errors.New("run directory holds a run")

// Run executes a recipe in its run directory: a fresh run, or (resume)
// the continuation of the one there from its last checkpoint. The
// directory is locked for the run's duration. Cancelling ctx stops it after
// the current step with a checkpoint.
func Run(ctx context.Context, r *Recipe, resume bool, pr Progress) (*Result, error) {
	start := time.Now()
	sess, err := run.OpenSession(r.Out)
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	// A run with a checkpoint is resumed, never overwritten; one that
	// stopped before its first checkpoint has nothing to keep and starts
	// afresh (its metrics log is discarded).
	ck := sess.Resumed
	if ck == nil && resume {
		return nil, fmt.Errorf("%s has no checkpoint to resume: start it afresh with keel rl --recipe %s", r.Out, filepath.Join(r.Out, RecipeFile))
	}
	if ck != nil && !resume {
		return nil, fmt.Errorf("%s: %w (checkpoint at step %d): resume it with keel rl --resume %s, or choose another name", r.Out, ErrRunExists, ck.Step, r.Out)
	}
	if err := atomicfile.Write(filepath.Join(r.Out, RecipeFile), func(w io.Writer) error {
		_, err := w.Write(r.YAML())
		return err
	}); err != nil {
		return nil, err
	}

	// The built-in model and held-out set come from the binary when the
	// working directory is not a checkout of the repository.
	modelPath, err := builtin.Resolve(r.Model.Path, "")
	if err != nil {
		return nil, fmt.Errorf("model.path: %w", err)
	}
	evalFile := r.Eval.File
	if !r.Eval.Skip {
		if evalFile, err = builtin.Resolve(evalFile, ""); err != nil {
			return nil, fmt.Errorf("eval.file: %w", err)
		}
	}
	tok, err := tokenizer.Load(filepath.Join(modelPath, tokenizer.FileName))
	if err != nil {
		return nil, fmt.Errorf("model.path: %w", err)
	}
	var policy *model.Model
	var st loopState
	res := &Result{Dir: r.Out, ModelDir: sess.ModelDir(), Recipe: r}
	if ck != nil {
		policy = ck.Model
		if err := sess.State(&st); err != nil {
			return nil, err
		}
		res.Resumed = ck.Step
	} else if policy, err = model.Load(modelPath); err != nil {
		return nil, fmt.Errorf("model.path: %w", err)
	}
	if tok.VocabSize() > policy.Config.VocabSize {
		return nil, fmt.Errorf("model.path: the tokenizer has %d tokens, the model's vocab_size is %d", tok.VocabSize(), policy.Config.VocabSize)
	}
	end, ok := tok.ID(tokenizer.ImEnd)
	if !ok {
		return nil, fmt.Errorf("model.path: the tokenizer has no %s token to end responses", tokenizer.ImEnd)
	}
	maxPos := policy.Config.MaxPositionEmbeddings
	prompts, err := loadPrompts(r, tok, maxPos)
	if err != nil {
		return nil, err
	}
	var evalSet []data.Example
	if !r.Eval.Skip {
		if evalSet, err = data.Read(evalFile); err != nil {
			return nil, fmt.Errorf("eval.file: %w", err)
		}
		if err := evaluate.CheckTasks(evalSet); err != nil {
			return nil, fmt.Errorf("eval.file: %s: %w", r.Eval.File, err)
		}
		if r.Eval.N > 0 && r.Eval.N < len(evalSet) {
			evalSet = evalSet[:r.Eval.N]
		}
		// Held out means held out: training prompts that are also
		// evaluation prompts (small problems recur) are dropped.
		var dropped int
		if prompts, dropped = decontaminate(prompts, evalSet); len(prompts) == 0 {
			return nil, fmt.Errorf("data: every training prompt is also in eval.file %s", r.Eval.File)
		}
		res.Decontaminated = dropped
	}
	longest := 0
	for _, p := range prompts {
		longest = max(longest, len(p.IDs))
	}
	maxLen := longest + r.Rollout.MaxNewTokens
	if maxPos > 0 {
		maxLen = min(maxLen, maxPos)
	}
	var sampler Sampler
	if ro := &r.Rollout; len(ro.Servers) > 0 {
		// Remote rollout: the servers run their own precision; each step's
		// weights reach them through ro.WeightsDir.
		rs, err := remote.New(remote.Options{Servers: ro.Servers, Kind: ro.ServerKind, WeightsDir: ro.WeightsDir,
			RequestTimeout: time.Duration(ro.RequestTimeout * float64(time.Second)), MaxConcurrency: ro.MaxConcurrency,
			APIKey: os.Getenv(remote.APIKeyEnv), Config: policy.Config, MaxLen: maxLen, Events: pr.Warn,
			WriteFiles: func(dir string) error { return tok.WriteFile(filepath.Join(dir, tokenizer.FileName)) }})
		if err != nil {
			return nil, fmt.Errorf("rollout.servers: %w", err)
		}
		defer rs.Close()
		sampler = rs
	} else {
		prec, _ := rollout.ParsePrecision(ro.Precision)
		eng, err := rollout.New(policy, rollout.Options{Precision: prec, Slots: ro.Slots, MaxLen: maxLen})
		if err != nil {
			return nil, err
		}
		defer eng.Close()
		sampler = eng
	}
	if err := sampler.UpdateWeights(context.Background(), policy, int64(res.Resumed)); err != nil {
		return nil, err
	}
	var optim *train.OptimState
	if ck != nil {
		optim = (*train.OptimState)(ck.Optim)
	}
	trainer, err := train.NewTrainer(policy, r.AdamW(), optim)
	if err != nil {
		return nil, err
	}
	defer trainer.Close()
	loop := &Loop{R: r, Trainer: trainer, Sampler: sampler, Loader: NewLoader(prompts, r.Seed), Stop: []int32{end},
		Score: VerifierScorer(tok, end), Step: res.Resumed, NonFinite: st.NonFinite}
	loop.Loader.Seek(st.Loader)
	if r.Algorithm.KLCoef > 0 {
		ref, err := model.Load(modelPath)
		if err != nil {
			return nil, fmt.Errorf("model.path (reference): %w", err)
		}
		refTrainer, err := train.NewTrainer(ref, r.AdamW(), nil)
		if err != nil {
			return nil, err
		}
		defer refTrainer.Close()
		loop.Reference = refTrainer
	}
	if err := loop.Init(); err != nil {
		return nil, err
	}

	var evalEng *rollout.Engine
	if !r.Eval.Skip {
		ep, _ := rollout.ParsePrecision(r.Eval.Precision)
		evLen := r.Eval.MaxNewTokens
		for _, p := range evaluate.Prompts(tok, evalSet) {
			evLen = max(evLen, len(p)+r.Eval.MaxNewTokens)
		}
		if maxPos > 0 {
			evLen = min(evLen, maxPos)
		}
		if evalEng, err = rollout.New(policy, rollout.Options{Precision: ep, Slots: r.Rollout.Slots, MaxLen: evLen}); err != nil {
			return nil, err
		}
		defer evalEng.Close()
	}
	evaluateNow := func(step int) (*evaluate.Report, error) {
		if err := evalEng.UpdateWeights(context.Background(), policy, int64(step)); err != nil {
			return nil, err
		}
		rep, err := evaluate.Run(evalEng, tok, evalSet, r.Eval.K, rollout.Sampling{Temperature: r.Rollout.Temperature,
			TopK: r.Rollout.TopK, TopP: r.Rollout.TopP, MaxNewTokens: r.Eval.MaxNewTokens, Seed: r.Seed ^ 0xe7a1})
		if err != nil {
			return nil, fmt.Errorf("eval: %w", err)
		}
		if pr.Eval != nil {
			pr.Eval(step, rep)
		}
		return rep, nil
	}

	// A fresh run starts an empty log (a crash before the first
	// checkpoint leaves nothing to keep); a resumed one is cut back to its
	// checkpoint.
	metrics, err := sess.OpenMetrics(true)
	if err != nil {
		return nil, err
	}
	var tb *run.EventWriter
	if r.Log.TensorBoard {
		if tb, err = run.OpenEvents(filepath.Join(r.Out, "tensorboard")); err != nil {
			return nil, err
		}
		defer tb.Close()
	}
	write := func(step int, m map[string]float64) error {
		rec := make(map[string]any, len(m)+1)
		for k, v := range m {
			rec[k] = v
		}
		rec["step"] = step
		if err := metrics.Write(rec); err != nil {
			return err
		}
		if tb != nil {
			return tb.Scalars(int64(step), time.Now(), m)
		}
		return nil
	}
	evalMetrics := func(rep *evaluate.Report, m map[string]float64) {
		k := itoa(rep.K)
		for _, s := range rep.Scores {
			suffix := ""
			if s.Group != "all" {
				suffix = "/" + s.Group
			}
			m["eval/avg@"+k+suffix] = s.AvgAtK
			m["eval/pass@"+k+suffix] = s.PassAtK
		}
	}
	if ck == nil && evalEng != nil {
		rep, err := evaluateNow(0)
		if err != nil {
			return nil, err
		}
		res.Before = rep
		m := map[string]float64{"data/prompts": float64(len(prompts)), "data/decontaminated": float64(res.Decontaminated)}
		evalMetrics(rep, m)
		if err := write(0, m); err != nil {
			return nil, err
		}
	}

	elapsed0 := st.Elapsed
	saved := res.Resumed // the newest checkpoint's step (0: none)
	checkpoint := func() error {
		saved = loop.Step
		if tb != nil {
			if err := tb.Flush(); err != nil {
				return err
			}
		}
		w, err := trainer.Weights()
		if err != nil {
			return err
		}
		o, err := trainer.OptimState()
		if err != nil {
			return err
		}
		return sess.Save(loop.Step, w, (*run.OptimState)(o), loopState{Loader: loop.Loader.State(), NonFinite: loop.NonFinite,
			Elapsed: elapsed0 + time.Since(start).Seconds()}, r.Log.Keep)
	}
	total := r.Train.Steps
	for loop.Step < total {
		if ctx.Err() != nil {
			res.Stopped = true
			break
		}
		sr, err := loop.RunStep()
		if err != nil {
			// Whatever failed, the last checkpoint stands; say so.
			if saved > 0 {
				return nil, fmt.Errorf("step %d: %w (the run resumes from its checkpoint of step %d: keel rl --resume %s)", loop.Step+1, err, saved, r.Out)
			}
			return nil, fmt.Errorf("step %d: %w (no checkpoint yet: the same command starts the run afresh)", loop.Step+1, err)
		}
		step := loop.Step
		m := sr.Metrics
		m["elapsed_s"] = elapsed0 + time.Since(start).Seconds()
		if evalEng != nil && (step == total || (r.Eval.Every > 0 && step%r.Eval.Every == 0)) {
			t := time.Now()
			rep, err := evaluateNow(step)
			if err != nil {
				return nil, err
			}
			evalMetrics(rep, m)
			m["time/eval"] = time.Since(t).Seconds()
			if step == total {
				res.After = rep
			}
		}
		if r.Log.SamplesEvery > 0 && (step%r.Log.SamplesEvery == 0 || step == 1) {
			if err := writeSamples(filepath.Join(r.Out, "samples"), step, tok, sr.Samples); err != nil {
				return nil, err
			}
		}
		if err := write(step, m); err != nil {
			return nil, err
		}
		res.LastStep = m
		if pr.Step != nil {
			pr.Step(step, total, m, time.Since(start))
		}
		if msg := guardMessage(r, m); msg != "" {
			if r.Guards.Action == "stop" {
				if err := checkpoint(); err != nil {
					return nil, err
				}
				return nil, fmt.Errorf("step %d: %s (guards.action = stop; checkpoint saved)", step, msg)
			}
			if pr.Warn != nil {
				pr.Warn(fmt.Sprintf("step %d: %s", step, msg))
			}
		}
		if r.Log.CheckpointEvery > 0 && step%r.Log.CheckpointEvery == 0 && step < total {
			if err := checkpoint(); err != nil {
				return nil, err
			}
		}
	}
	if err := checkpoint(); err != nil {
		return nil, err
	}
	res.Steps = loop.Step
	res.Elapsed = time.Since(start)
	res.PeakRSS = peakRSS()
	if res.Stopped {
		return res, nil
	}
	w, err := trainer.Weights()
	if err != nil {
		return nil, err
	}
	if err := sess.SaveModel(w, tok); err != nil {
		return nil, err
	}
	return res, nil
}

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

// loadPrompts reads or generates the prompt set and tokenizes it, checking
// every row has a verifier and fits the context.
func loadPrompts(r *Recipe, tok *tokenizer.Tokenizer, maxPos int) ([]Prompt, error) {
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
	if err := evaluate.CheckTasks(ex); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", where, r.Data.File, err)
	}
	out := make([]Prompt, len(ex))
	for i := range ex {
		ids := tok.Encode(tokenizer.ChatML(ex[i].Chat(), true))
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
			if err := enc.Encode(map[string]any{
				"group": s.Group, "task": s.Prompt.Example.Task, "prompt": s.Prompt.Example.Chat()[len(s.Prompt.Example.Chat())-1].Content,
				"answer": s.Prompt.Example.Answer, "response": tok.DecodeLenient(s.Response), "reward": s.Reward,
				"advantage": s.Advantage, "tokens": len(s.Response), "finish": s.Finish, "version": s.Version,
			}); err != nil {
				return err
			}
		}
		return nil
	})
}
