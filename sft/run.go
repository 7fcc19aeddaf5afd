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
	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
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
	start := time.Now()
	sess, err := run.OpenSession(r.Out) // locked: two runs on one directory would interleave
	if err != nil {
		return nil, err
	}
	defer sess.Close()
	if err := writeRecipe(filepath.Join(r.Out, "recipe.yaml"), r); err != nil {
		return nil, err
	}
	tok, err := loadTokenizer(r)
	if err != nil {
		return nil, err
	}
	var m *model.Model
	var st loopState
	if ck := sess.Resumed; ck != nil {
		m = ck.Model
		if err := sess.State(&st); err != nil {
			return nil, err
		}
	} else if m, err = newModel(r); err != nil {
		return nil, err
	}
	if m.Config.VocabSize < tok.VocabSize() {
		return nil, fmt.Errorf("model vocab_size %d is smaller than the tokenizer's %d tokens", m.Config.VocabSize, tok.VocabSize())
	}
	examples, err := trainingData(r, tok, m.Config.MaxPositionEmbeddings)
	if err != nil {
		return nil, err
	}
	var optim *train.AdamW
	if sess.Resumed != nil {
		optim = sess.Resumed.Optim
	}
	tr, err := NewTrainer(m, examples, r.Train, optim)
	if err != nil {
		return nil, err
	}
	tr.Batches.Seek(st.Position)
	startStep := int(tr.Optim.Step)
	metrics, err := sess.OpenMetrics(true)
	if err != nil {
		return nil, err
	}
	res := &RunResult{ModelDir: filepath.Join(r.Out, "model")}
	checkpoint := func() error {
		return sess.Save(int(tr.Optim.Step), m, tr.Optim, loopState{Position: tr.Batches.Position(), Elapsed: st.Elapsed + time.Since(start).Seconds()}, r.Log.Keep)
	}
	var window struct {
		loss, aux, gnorm float64
		steps, tokens    int
		dur              time.Duration
	}
	total := r.Train.Steps
	loopStart := time.Now()
	for step := startStep + 1; step <= total; step++ {
		if ctx.Err() != nil {
			res.Stopped = true
			break
		}
		s, err := tr.Step()
		if errors.Is(err, ErrNonFinite) {
			metrics.Write(map[string]any{"step": step, "skipped": "non-finite gradient norm"})
			continue
		}
		if err != nil {
			return nil, err
		}
		window.loss += s.Loss
		window.aux += s.AuxLoss
		window.gnorm += s.GradNorm
		window.tokens += s.Tokens
		window.dur += s.Duration
		window.steps++
		if step%r.Log.Every == 0 || step == total {
			n := float64(window.steps)
			rec := map[string]any{
				"step": step, "loss": window.loss / n, "grad_norm": window.gnorm / n, "lr": s.LR,
				"tokens_per_s": float64(window.tokens) / window.dur.Seconds(), "aux_loss": window.aux / n,
				"elapsed_s": st.Elapsed + time.Since(start).Seconds(),
			}
			if err := metrics.Write(rec); err != nil {
				return nil, err
			}
			res.FinalLoss = window.loss / n
			if progress != nil {
				done := step - startStep
				eta := time.Duration(float64(time.Since(loopStart)) / float64(done) * float64(total-step))
				fmt.Fprintf(progress, "\rstep %d/%d  loss %.4f  %.0f tok/s  ETA %s   ", step, total, res.FinalLoss,
					float64(window.tokens)/window.dur.Seconds(), eta.Round(time.Second))
			}
			window = struct {
				loss, aux, gnorm float64
				steps, tokens    int
				dur              time.Duration
			}{}
		}
		if step%r.Log.CheckpointEvery == 0 && step < total {
			if err := checkpoint(); err != nil {
				return nil, err
			}
		}
	}
	if progress != nil {
		fmt.Fprintln(progress)
	}
	if err := checkpoint(); err != nil {
		return nil, err
	}
	res.Steps = int(tr.Optim.Step)
	res.Elapsed = time.Since(start)
	if res.Stopped {
		return res, nil
	}
	if err := model.Save(res.ModelDir, m, "f32"); err != nil {
		return nil, err
	}
	if err := tok.WriteFile(filepath.Join(res.ModelDir, tokenizer.FileName)); err != nil {
		return nil, err
	}
	if r.Eval != nil {
		rep, err := evalHeldOut(r, m, tok)
		if err != nil {
			return nil, err
		}
		res.Eval = rep
		ov := rep.Overall()
		metrics.Write(map[string]any{"step": res.Steps, fmt.Sprintf("eval/avg@%d", rep.K): ov.AvgAtK, fmt.Sprintf("eval/pass@%d", rep.K): ov.PassAtK})
		if err := atomicfile.Write(filepath.Join(r.Out, "eval.json"), func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		}); err != nil {
			return nil, err
		}
	}
	return res, nil
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
		if spec.Styles, err = data.ParseStyles(g.Style); err != nil {
			return nil, fmt.Errorf("data.generate.style: %w", err)
		}
		if ex, err = data.Generate(spec); err != nil {
			return nil, fmt.Errorf("data.generate: %w", err)
		}
	}
	out := make([]Example, 0, len(ex))
	for i := range ex {
		if ex[i].Response == "" {
			return nil, fmt.Errorf("data: example %d has no response to train on", i)
		}
		e := Example{
			Prompt:   tok.Encode(tokenizer.ChatML(ex[i].Chat(), true)),
			Response: tok.Encode(ex[i].Response + tokenizer.ImEnd),
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
