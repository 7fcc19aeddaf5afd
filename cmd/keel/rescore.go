package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/report"
	"github.com/keel-rl/keel/rl"
)

// rescoreFactor multiplies a grid's eval.k when its final models are
// scored again.
const rescoreFactor = 4

// evaluatorSeeds are the sampling seeds on which one final model is scored
// at the run's own k, to show how much the evaluation alone moves a score.
var evaluatorSeeds = []uint64{11, 12, 13, 14, 15}

// rescore separates the evaluator's noise from the seeds'. The held-out
// score a run logs is k samples of each problem on the run's own sampling
// seed: the evaluation's own noise (about a point at k = 8 over 300
// problems) adds to the spread between seeds, and two equal models scored
// on different random numbers differ by it. So the final models of the
// arms a grid compares (its MorePaths) are scored again under the exact
// engine with rescoreFactor times the samples, on one sampling seed for
// every model (the same random numbers cancel part of what remains), and
// their paired comparison printed; and one model is scored at the run's k
// on several seeds, whose spread is the evaluator's noise in a logged
// score. Reports are kept in OUT/GRID-rescored/ (a stopped suite does not
// redo them); the tables go to OUT/GRID-rescored/table.md.
func rescore(ctx context.Context, p suitePlan, out string) error {
	if len(p.grid.MorePaths) != 2 {
		return nil
	}
	arm := func(path string) string { return strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)) }
	a, b := arm(p.grid.MorePaths[0]), arm(p.grid.MorePaths[1])
	dir := filepath.Join(out, p.grid.Name+"-rescored")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	scores := map[string]map[int]float64{a: {}, b: {}}
	var first *rl.Recipe
	var firstModel string
	k := 0
	for _, run := range p.runs {
		name := strings.TrimSuffix(filepath.Base(run.Dir), fmt.Sprintf("-s%d", run.Seed))
		if name != a && name != b {
			continue
		}
		model := filepath.Join(run.Dir, "model")
		if _, err := os.Stat(filepath.Join(model, "config.json")); err != nil {
			fmt.Printf("[rescore] %s has no final model: skipped\n", run.Dir)
			continue
		}
		rec, err := rl.ReadRecipe(filepath.Join(run.Dir, "recipe.yaml"), nil)
		if err != nil {
			return err
		}
		if rec.Eval.Skip {
			return fmt.Errorf("%s: rescoring needs eval.file", run.Dir)
		}
		if first == nil {
			first, firstModel, k = rec, model, rec.Eval.K
		}
		avg, err := cachedEval(ctx, model, filepath.Join(dir, filepath.Base(run.Dir)+".json"), rec, "exact", rescoreFactor*k, crossEvalSeed)
		if err != nil {
			return err
		}
		scores[name][int(run.Seed)] = avg
	}
	if first == nil {
		return nil
	}
	var noise []float64
	for _, seed := range evaluatorSeeds {
		avg, err := cachedEval(ctx, firstModel, filepath.Join(dir, fmt.Sprintf("evaluator-seed%d.json", seed)), first, "exact", k, seed)
		if err != nil {
			return err
		}
		noise = append(noise, avg)
	}
	table := rescoredTable(a, b, scores, rescoreFactor*k) + evaluatorLine(firstModel, k, noise)
	fmt.Print(table)
	return atomicfile.Write(filepath.Join(dir, "table.md"), func(w io.Writer) error {
		_, err := io.WriteString(w, table)
		return err
	})
}

// rescoredTable is the paired comparison A - B of the rescored final
// models over the seeds both arms have.
func rescoredTable(a, b string, scores map[string]map[int]float64, k int) string {
	var seeds []int
	for s := range scores[a] {
		if _, ok := scores[b][s]; ok {
			seeds = append(seeds, s)
		}
	}
	sort.Ints(seeds)
	var d []float64
	var per []string
	for _, s := range seeds {
		x := scores[a][s] - scores[b][s]
		d = append(d, x)
		per = append(per, fmt.Sprintf("s%d %+.2f", s, 100*x))
	}
	diff := report.DiffOf(d)
	ci := "undefined"
	if len(d) > 1 {
		ci = fmt.Sprintf("[%+.2f, %+.2f]", 100*diff.Lo, 100*diff.Hi)
	}
	var bld strings.Builder
	fmt.Fprintf(&bld, "Rescored final models (exact engine, avg@%d, sampling seed %d for every model; A - B in points)\n\n", k, crossEvalSeed)
	bld.WriteString("| arm A | arm B | seeds paired | A - B per seed | mean | 95% t interval | wins A / B / ties | verdict |\n|---|---|---:|---|---:|---|---|---|\n")
	fmt.Fprintf(&bld, "| %s | %s | %d | %s | %+.2f | %s | %d / %d / %d | %s |\n\n", a, b, len(d), strings.Join(per, ", "),
		100*diff.Mean, ci, diff.WinsA, diff.WinsB, diff.Ties, diff.Verdict())
	return bld.String()
}

// evaluatorLine says how much the evaluation alone moves one model's
// score: its avg@k on several sampling seeds.
func evaluatorLine(model string, k int, v []float64) string {
	var mean, ss float64
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	sd := math.Sqrt(ss / float64(max(len(v)-1, 1)))
	vals := make([]string, len(v))
	for i, x := range v {
		vals[i] = fmt.Sprintf("%.3f", x)
	}
	return fmt.Sprintf("The evaluator's own noise: %s scored at avg@%d on %d sampling seeds: %s (mean %.3f, standard deviation %.2f points).\n",
		model, k, len(v), strings.Join(vals, ", "), mean, 100*sd)
}
