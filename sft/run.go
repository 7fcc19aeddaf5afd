package sft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/device"
)

// RunResult is what a finished run reports.
type RunResult struct {
	Steps     int
	FinalLoss float64 // mean loss of the last logging window
	ModelDir  string
	Eval      *evaluate.Report
	Elapsed   time.Duration
	Stopped   bool // interrupted (ctx cancelled): checkpointed, resumable
}

// loopState is what a checkpoint saves besides the model and optimiser.
type loopState struct {
	Position Position `json:"position"`
	Elapsed  float64  `json:"elapsed_s"`
}

// Run executes a recipe. It resumes from the run directory's last
// checkpoint when there is one, writes metrics.jsonl and checkpoints as
// it goes, and on completion the model directory (with tokenizer.json)
// and, if the recipe asks, a held-out evaluation. Cancelling ctx stops it
// after the current step with a checkpoint. progress receives a status
// line per logging step (nil: none).
func Run(ctx context.Context, r *Recipe, progress io.Writer) (*RunResult, error) {
	rn := &runner{r: r, progress: progress, start: time.Now()}
	sess, err := run.OpenSession(r.Out) // locked: two runs on one directory would interleave
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	rn.sess = sess
	err = rn.open()
	if rn.eng != nil {
		defer rn.eng.Close()
	}
	if err != nil {
		return nil, err
	}
	if err := rn.loop(ctx); err != nil {
		return nil, err
	}
	return rn.finish()
}

// runner is one supervised run in progress: the session holding its
// directory, the training engine and the trainer stepping it, the metrics
// log and the statistics of the logging window under way.
type runner struct {
	r        *Recipe
	progress io.Writer
	start    time.Time // when Run began
	sess     *run.Session
	tok      *tokenizer.Tokenizer
	st       loopState // as resumed (zero when fresh)
	eng      train.Trainer
	tr       *Trainer
	metrics  *run.MetricsLog
	res      *RunResult

	startStep int       // the engine's step count when the loop began
	loopStart time.Time // when the loop began (for the ETA)
	win       window
}

// window sums the steps since the last logged record.
type window struct {
	loss, aux, gnorm float64
	steps, tokens    int
	dur              time.Duration
}

func (w *window) add(s Stats) {
	w.loss += s.Loss
	w.aux += s.AuxLoss
	w.gnorm += s.GradNorm
	w.tokens += s.Tokens
	w.dur += s.Duration
	w.steps++
}

// open writes the recipe, loads the tokenizer, the model (resumed or
// fresh) and the training data, and builds the engine, the trainer and
// the metrics log. rn.eng is set as soon as the engine exists, also when
// open fails after it, so that the caller closes it.
func (rn *runner) open() error {
	r, sess := rn.r, rn.sess
	if err := writeRecipe(filepath.Join(r.Out, run.RecipeFile), r); err != nil {
		return err
	}
	tok, err := loadTokenizer(r)
	if err != nil {
		return err
	}
	rn.tok = tok
	m, err := rn.loadModel()
	if err != nil {
		return err
	}
	if m.Config.VocabSize < tok.VocabSize() {
		return fmt.Errorf("model vocab_size %d is smaller than the tokenizer's %d tokens", m.Config.VocabSize, tok.VocabSize())
	}
	examples, err := trainingData(r, tok, m.Config.MaxPositionEmbeddings)
	if err != nil {
		return err
	}
	var optim *train.OptimState
	if sess.Resumed != nil {
		optim = (*train.OptimState)(sess.Resumed.Optim)
	}
	eng, err := device.Trainer(r.Train.Engine(), m, r.Train.AdamW(), optim)
	if err != nil && optim != nil {
		return fmt.Errorf("%s: checkpoint of step %d: %w", filepath.Join(r.Out, run.CheckpointsDir), sess.Step(), err)
	}
	if err != nil {
		return err
	}
	rn.eng = eng
	if rn.tr, err = NewTrainer(eng, examples, r.Train); err != nil {
		return err
	}
	rn.tr.Batches.Seek(rn.st.Position)
	rn.startStep = int(eng.Steps())
	if rn.metrics, err = sess.OpenMetrics(true); err != nil {
		return err
	}
	rn.res = &RunResult{ModelDir: sess.ModelDir()}
	return nil
}

// loadModel returns the resumed checkpoint's model, with its loop state
// decoded into rn.st, or a fresh one.
func (rn *runner) loadModel() (*model.Model, error) {
	if ck := rn.sess.Resumed; ck != nil {
		if err := rn.sess.State(&rn.st); err != nil {
			return nil, err
		}
		return ck.Model, nil
	}
	return newModel(rn.r)
}

// elapsed is the run's training time: the resumed runs' and this one's.
func (rn *runner) elapsed() float64 {
	return rn.st.Elapsed + time.Since(rn.start).Seconds()
}

// checkpoint saves the engine's weights and optimiser with the batcher's
// position.
func (rn *runner) checkpoint() error {
	w, o, err := train.Snapshot(rn.eng)
	if err != nil {
		return err
	}
	return rn.sess.Save(int(rn.eng.Steps()), w, (*run.OptimState)(o),
		loopState{Position: rn.tr.Batches.Position(), Elapsed: rn.elapsed()}, rn.r.Log.Keep)
}

// loop runs the steps left, logging and checkpointing as the recipe asks.
// A cancelled ctx stops it before the next step, marking the result
// stopped.
func (rn *runner) loop(ctx context.Context) error {
	total := rn.r.Train.Steps
	rn.loopStart = time.Now()
	for step := rn.startStep + 1; step <= total; step++ {
		if ctx.Err() != nil {
			rn.res.Stopped = true
			break
		}
		s, err := rn.tr.Step()
		if errors.Is(err, ErrNonFinite) {
			if err := rn.metrics.Write(map[string]any{"step": step, "skipped": "non-finite gradient norm"}); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		rn.win.add(s)
		if step%rn.r.Log.Every == 0 || step == total {
			if err := rn.logWindow(step, s.LR); err != nil {
				return err
			}
		}
		if step%rn.r.Log.CheckpointEvery == 0 && step < total {
			if err := rn.checkpoint(); err != nil {
				return err
			}
		}
	}
	return nil
}

// logWindow writes the window's metrics record at step (lr is the step's
// learning rate), prints the progress line and starts a new window.
func (rn *runner) logWindow(step int, lr float64) error {
	w := &rn.win
	n := float64(w.steps)
	rec := map[string]any{
		"step": step, "loss": w.loss / n, "grad_norm": w.gnorm / n, "lr": lr,
		"tokens_per_s": float64(w.tokens) / w.dur.Seconds(), "aux_loss": w.aux / n,
		"elapsed_s": rn.elapsed(),
	}
	if err := rn.metrics.Write(rec); err != nil {
		return err
	}
	rn.res.FinalLoss = w.loss / n
	if rn.progress != nil {
		total := rn.r.Train.Steps
		done := step - rn.startStep
		eta := time.Duration(float64(time.Since(rn.loopStart)) / float64(done) * float64(total-step))
		fmt.Fprintf(rn.progress, "\rstep %d/%d  loss %.4f  %.0f tok/s  ETA %s   ", step, total, rn.res.FinalLoss,
			float64(w.tokens)/w.dur.Seconds(), eta.Round(time.Second))
	}
	rn.win = window{}
	return nil
}

// finish ends the progress line and checkpoints; unless the run was
// stopped, it then saves the model and runs the held-out evaluation.
func (rn *runner) finish() (*RunResult, error) {
	if rn.progress != nil {
		fmt.Fprintln(rn.progress)
	}
	if err := rn.checkpoint(); err != nil {
		return nil, err
	}
	res := rn.res
	res.Steps = int(rn.eng.Steps())
	res.Elapsed = time.Since(rn.start)
	if res.Stopped {
		return res, nil
	}
	m, err := rn.eng.Weights()
	if err != nil {
		return nil, err
	}
	if err := rn.sess.SaveModel(m, rn.tok); err != nil {
		return nil, err
	}
	if rn.r.Eval != nil {
		if err := rn.evaluate(m); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// evaluate runs the held-out evaluation of m, logs its summary to the
// metrics and writes eval.json.
func (rn *runner) evaluate(m *model.Model) error {
	rep, err := evalHeldOut(rn.r, m, rn.tok)
	if err != nil {
		return err
	}
	rn.res.Eval = rep
	ov := rep.Overall()
	if err := rn.metrics.Write(map[string]any{"step": rn.res.Steps, fmt.Sprintf("eval/avg@%d", rep.K): ov.AvgAtK, fmt.Sprintf("eval/pass@%d", rep.K): ov.PassAtK}); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(rn.r.Out, "eval.json"), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	})
}

func writeRecipe(path string, r *Recipe) error {
	b, err := yaml.Marshal(r)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

func loadTokenizer(r *Recipe) (*tokenizer.Tokenizer, error) {
	if r.Model.Path != "" {
		p := filepath.Join(r.Model.Path, tokenizer.FileName)
		if _, err := os.Stat(p); err == nil {
			return tokenizer.Load(p)
		}
	}
	return tokenizer.NewChar(), nil
}

func newModel(r *Recipe) (*model.Model, error) {
	if r.Model.Path != "" {
		return model.Load(r.Model.Path)
	}
	cfg, err := model.Preset(r.Model.Preset, r.Model.Vocab)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	cfg.MaxPositionEmbeddings = r.Model.MaxLen
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m := model.New(cfg)
	model.Init(m, r.Model.Seed)
	return m, nil
}

// trainingData loads or generates the examples and tokenizes them in the
// ChatML layout: the prompt with the generation prompt, the response
// closed by <|im_end|>.
func trainingData(r *Recipe, tok *tokenizer.Tokenizer, maxLen int) ([]Example, error) {
	var ex []data.Example
	var err error
	if r.Data.File != "" {
		if ex, err = data.Read(r.Data.File); err != nil {
			return nil, err
		}
	} else {
		g := r.Data.Generate
		spec := data.GenSpec{Tasks: g.Tasks, N: g.N, Seed: g.Seed}
		if spec.Difficulties, err = data.ParseDifficulties(g.Difficulty); err != nil {
			return nil, fmt.Errorf("data.generate.difficulty: %w", err)
		}
		if g.Style == "tool" {
			// Episodes of the built-in environments, played by keel data
			// gen --style tool's teachers with its default settings.
			ex, err = env.GenerateDemos(context.Background(), env.DemoSpec{Tasks: g.Tasks, N: g.N, Difficulties: spec.Difficulties,
				Seed: g.Seed, Demos: true, UseTool: 0.5, Bisect: 0.5, MaxTurns: 6})
			if err != nil {
				return nil, fmt.Errorf("data.generate: %w", err)
			}
		} else {
			if spec.Styles, err = data.ParseStyles(g.Style); err != nil {
				return nil, fmt.Errorf("data.generate.style: %w", err)
			}
			if ex, err = data.Generate(spec); err != nil {
				return nil, fmt.Errorf("data.generate: %w", err)
			}
		}
	}
	out := make([]Example, 0, len(ex))
	for i := range ex {
		if ex[i].Response == "" {
			return nil, fmt.Errorf("data: example %d has no response to train on", i)
		}
		e := Example{Prompt: tok.Encode(tokenizer.ChatML(ex[i].Chat(), true))}
		// A multi-turn demonstration's observations are context, not
		// targets: each piece is encoded on its own, as the rollout
		// appends an environment's tokens to the model's.
		for _, seg := range env.SplitTrajectory(ex[i].Response + tokenizer.ImEnd) {
			ids := tok.Encode(seg.Text)
			if seg.Obs {
				e.Masked = append(e.Masked, [2]int{len(e.Response), len(e.Response) + len(ids)})
			}
			e.Response = append(e.Response, ids...)
		}
		if maxLen > 0 && e.Len() > maxLen {
			return nil, fmt.Errorf("data: example %d has %d tokens, more than the model's %d positions", i, e.Len(), maxLen)
		}
		out = append(out, e)
	}
	return out, nil
}

// evalHeldOut evaluates the trained model on freshly generated problems
// (the eval seed is not the training data's).
func evalHeldOut(r *Recipe, m *model.Model, tok *tokenizer.Tokenizer) (*evaluate.Report, error) {
	e := r.Eval
	ts := e.Tasks
	if len(ts) == 0 && r.Data.Generate != nil {
		ts = r.Data.Generate.Tasks
	}
	if len(ts) == 0 {
		return nil, errors.New("eval: tasks are required when training data comes from a file")
	}
	spec := data.GenSpec{Tasks: ts, N: e.N, Seed: e.Seed}
	var err error
	if spec.Difficulties, err = data.ParseDifficulties(e.Difficulty); err != nil {
		return nil, fmt.Errorf("eval.difficulty: %w", err)
	}
	ex, err := data.Generate(spec)
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	eng, err := rollout.New(m, rollout.Options{Slots: 64, MaxLen: m.Config.MaxPositionEmbeddings})
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	return evaluate.Run(eng, tok, ex, e.K, rollout.Sampling{Temperature: 1, MaxNewTokens: e.MaxNewTokens, Seed: e.Seed})
}
