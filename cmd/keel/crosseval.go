package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/internal/builtin"
	"github.com/keel-rl/keel/report"
	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/rollout"
)

// crossEvalSeed is the sampling seed of every cross-evaluation: the
// models of a comparison are scored on the same random numbers, so their
// difference is not the evaluations' own noise.
const crossEvalSeed = 7

// crossScore is one model's held-out avg@k under one engine.
type crossScore struct {
	arm       string // "base" for the grid's starting model
	precision string
	avg       float64
}

// crossEval scores the final models of the grid's CrossEval arms, and the
// model they started from, under the exact engine and under the rollout's
// precision (each report kept in OUT/GRID-crosseval/, so a stopped suite
// does not redo them), then prints a Markdown table and writes it to
// OUT/GRID-crosseval/table.md.
func crossEval(ctx context.Context, p suitePlan, out string) error {
	dir := filepath.Join(out, p.grid.Name+"-crosseval")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var scores []crossScore
	var precisions []string
	k := 0
	for _, run := range p.runs {
		arm := strings.TrimSuffix(filepath.Base(run.Dir), fmt.Sprintf("-s%d", run.Seed))
		if !slices.Contains(p.grid.CrossEval, arm) {
			continue
		}
		if _, err := os.Stat(filepath.Join(run.Dir, "model", "config.json")); err != nil {
			fmt.Printf("[cross-eval] %s has no final model: skipped\n", run.Dir)
			continue
		}
		rec, err := rl.ReadRecipe(filepath.Join(run.Dir, "recipe.yaml"), nil)
		if err != nil {
			return err
		}
		if rec.Eval.Skip {
			return fmt.Errorf("%s: cross-evaluation needs eval.file", run.Dir)
		}
		if rec.Rollout.Precision == "exact" {
			return fmt.Errorf("%s: cross-evaluation compares the exact engine with the rollout's, and rollout.precision is exact", run.Dir)
		}
		if precisions == nil {
			precisions, k = []string{"exact", rec.Rollout.Precision}, rec.Eval.K
		} else if precisions[1] != rec.Rollout.Precision || k != rec.Eval.K {
			return fmt.Errorf("%s: rollout.precision %s, eval.k %d; the grid's other cross-evaluated runs have %s, %d",
				run.Dir, rec.Rollout.Precision, rec.Eval.K, precisions[1], k)
		}
		if len(scores) == 0 { // the base model, once
			base, err := builtin.Resolve(rec.Model.Path, "")
			if err != nil {
				return fmt.Errorf("%s: model.path: %w", run.Dir, err)
			}
			s, err := crossScores(ctx, base, "base", filepath.Join(dir, "base"), rec, precisions)
			if err != nil {
				return err
			}
			scores = append(scores, s...)
		}
		s, err := crossScores(ctx, filepath.Join(run.Dir, "model"), arm, filepath.Join(dir, filepath.Base(run.Dir)), rec, precisions)
		if err != nil {
			return err
		}
		scores = append(scores, s...)
	}
	if len(scores) == 0 {
		return nil
	}
	table := crossTable(scores, precisions, append([]string{"base"}, p.grid.CrossEval...))
	fmt.Printf("cross-evaluation (held-out avg@%d, seed %d for every model):\n%s", k, crossEvalSeed, table)
	return atomicfile.Write(filepath.Join(dir, "table.md"), func(w io.Writer) error {
		_, err := io.WriteString(w, table)
		return err
	})
}

// crossSettings is what a cached cross-evaluation was computed with; a
// report is reused only when they all match and the model is not newer.
type crossSettings struct {
	Model        string  `json:"model"`
	Precision    string  `json:"precision"`
	EvalFile     string  `json:"eval_file"`
	K            int     `json:"k"`
	Temperature  float64 `json:"temperature"`
	MaxNewTokens int     `json:"max_new_tokens"`
	Seed         uint64  `json:"seed"`
}

// crossReport is a cached cross-evaluation: its settings and scores.
type crossReport struct {
	Settings crossSettings    `json:"settings"`
	Scores   []evaluate.Score `json:"scores"`
}

// crossScores evaluates one model under each precision, reusing the
// report in PREFIX-PRECISION.json when an earlier suite wrote it with the
// same settings after the model was last written.
func crossScores(ctx context.Context, model, arm, prefix string, rec *rl.Recipe, precisions []string) ([]crossScore, error) {
	var out []crossScore
	for _, prec := range precisions {
		avg, err := cachedEval(ctx, model, prefix+"-"+prec+".json", rec, prec, rec.Eval.K, crossEvalSeed)
		if err != nil {
			return nil, err
		}
		out = append(out, crossScore{arm: arm, precision: prec, avg: avg})
	}
	return out, nil
}

// cachedEval returns a model's held-out avg@k on rec's evaluation set and
// settings, under precision prec with k samples per problem and sampling
// seed seed, reusing the report in file when an earlier suite wrote it
// with the same settings after the model was last written, and writing it
// there otherwise.
func cachedEval(ctx context.Context, model, file string, rec *rl.Recipe, prec string, k int, seed uint64) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	evalFile, err := builtin.Resolve(rec.Eval.File, "")
	if err != nil {
		return 0, fmt.Errorf("eval.file: %w", err)
	}
	weights, err := os.Stat(filepath.Join(model, "model.safetensors"))
	if err != nil {
		return 0, err
	}
	want := crossSettings{Model: model, Precision: prec, EvalFile: evalFile, K: k, Temperature: rec.Rollout.Temperature,
		MaxNewTokens: rec.Eval.MaxNewTokens, Seed: seed}
	var cached crossReport
	if b, err := os.ReadFile(file); err == nil {
		info, _ := os.Stat(file)
		if json.Unmarshal(b, &cached) != nil || cached.Settings != want || len(cached.Scores) == 0 || info.ModTime().Before(weights.ModTime()) {
			fmt.Printf("[eval] %s is stale or from other settings: evaluating again\n", file)
			cached = crossReport{}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	if cached.Scores == nil {
		p, err := rollout.ParsePrecision(prec)
		if err != nil {
			return 0, fmt.Errorf("%s: rollout.precision: %w", model, err)
		}
		fmt.Printf("[eval] %s under %s, k = %d, seed %d\n", model, prec, k, seed)
		r, err := evalModel(model, evalFile, p, k, rollout.Sampling{Temperature: want.Temperature, MaxNewTokens: want.MaxNewTokens, Seed: seed})
		if err != nil {
			return 0, fmt.Errorf("evaluating %s: %w", model, err)
		}
		cached = crossReport{Settings: want, Scores: r.Scores}
		if err := atomicfile.Write(file, func(w io.Writer) error { return json.NewEncoder(w).Encode(cached) }); err != nil {
			return 0, err
		}
	}
	return cached.Scores[0].AvgAtK, nil
}

// crossTable sums the scores up per arm (mean and [lowest, highest] over
// its seeds) under each precision, and the change from the first
// precision to the second, in points.
func crossTable(scores []crossScore, precisions []string, arms []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| model | seeds | %s | %s | %s - %s (points) |\n|---|---:|---:|---:|---:|\n",
		precisions[0], precisions[1], precisions[1], precisions[0])
	for _, arm := range arms {
		var by [2][]float64
		for _, s := range scores {
			for i, p := range precisions {
				if s.arm == arm && s.precision == p {
					by[i] = append(by[i], s.avg)
				}
			}
		}
		if len(by[0]) == 0 {
			continue
		}
		st0, st1 := report.StatOf(by[0]), report.StatOf(by[1])
		d := 100 * (st1.Mean - st0.Mean)
		if math.Abs(d) < 0.05 {
			d = 0 // no "-0.0"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %+.1f |\n", arm, st0.N, st0, st1, d)
	}
	return b.String()
}
