package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/report"
	"github.com/keel-rl/keel/rl"
)

func init() {
	register(command{name: "rescore", summary: "score two arms' final models again, paired by seed, apart from the evaluator's noise", run: runRescore})
}

const rescoreUsage = `usage: keel rescore RUN_DIR... --compare A,B [--factor 4] [--seed 7] [--out DIR]

The held-out score a run logs is eval.k samples of each problem on the
run's own sampling seed, so the evaluation's noise (about a point at k = 8
over 300 problems) adds to the spread between seeds. keel rescore takes
the final models of arms A and B (runs named NAME-sSEED, as keel sweep
names them; a directory of runs stands for them all), scores each again
under the exact engine with --factor times its eval.k samples on one
sampling seed for every model, and prints their paired comparison A - B
(per seed, mean, 95% Student-t interval, wins, verdict) as keel report
--compare does. It also scores A's first model at its own k on five more
sampling seeds, whose spread is the evaluator's own noise in a logged
score. Each evaluation is kept in OUT (default: the runs' directory with
-rescored appended, where keel paper keeps its own), so a stopped rescore
resumes; the tables go to OUT/table.md.
`

func runRescore(args []string) error {
	fs := flag.NewFlagSet("rescore", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), rescoreUsage); fs.PrintDefaults() }
	var compare compareFlag
	fs.Var(&compare, "compare", "`A,B`: the two arms to score again, paired by seed")
	factor := fs.Int("factor", rescoreFactor, "samples per problem, as a multiple of each run's eval.k")
	seed := fs.Uint64("seed", crossEvalSeed, "the sampling seed of every rescored model")
	out := fs.String("out", "", "directory of the evaluations and table.md (default: the runs' directory + \"-rescored\")")
	dirs, help, err := parseInterleaved(fs, args)
	if help || err != nil {
		return err
	}
	if len(dirs) == 0 || len(compare) != 1 {
		return errors.New("usage: keel rescore RUN_DIR... --compare A,B (see keel rescore -h)")
	}
	if *factor < 1 {
		return fmt.Errorf("--factor %d: want at least 1", *factor)
	}
	runs, err := seededRuns(dirs)
	if err != nil {
		return err
	}
	arms := map[string]bool{}
	for _, r := range runs {
		arms[seedSuffix.ReplaceAllString(filepath.Base(r.Dir), "")] = true
	}
	for _, a := range compare[0] {
		if !arms[a] {
			return fmt.Errorf("--compare: no run of arm %q among the runs given (arms: %s)", a, strings.Join(slices.Sorted(maps.Keys(arms)), ", "))
		}
	}
	dir := *out
	if dir == "" {
		dir = "rescored" // runs in the working directory
		if parent := filepath.Dir(runs[0].Dir); parent != "." {
			dir = parent + "-rescored"
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err = rescoreArms(ctx, runs, compare[0][0], compare[0][1], dir, *factor, *seed)
	if errors.Is(err, context.Canceled) {
		fmt.Println("stopped; the same command continues the rescoring")
		return nil
	}
	return err
}

// seededRuns expands keel rescore's arguments (as keel report's) into runs
// with the seed their NAME-sSEED directory names.
func seededRuns(dirs []string) ([]rl.SweepRun, error) {
	paths, err := runDirs(dirs)
	if err != nil {
		return nil, err
	}
	var runs []rl.SweepRun
	for _, p := range paths {
		m := seedSuffix.FindString(filepath.Base(p))
		if m == "" {
			return nil, fmt.Errorf("%s: not named NAME-sSEED, so it is no seed of an arm", p)
		}
		s, err := strconv.ParseUint(m[2:], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: seed: %w", p, err)
		}
		runs = append(runs, rl.SweepRun{Dir: p, Seed: s})
	}
	return runs, nil
}

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
	_, err := rescoreArms(ctx, p.runs, arm(p.grid.MorePaths[0]), arm(p.grid.MorePaths[1]),
		filepath.Join(out, p.grid.Name+"-rescored"), rescoreFactor, crossEvalSeed)
	return err
}

// rescoreArms scores the final models of arms a and b among runs (named
// NAME-sSEED) under the exact engine at factor times their eval.k on one
// sampling seed, and the first one's at its own k on evaluatorSeeds; it
// prints the paired table and the evaluator's noise, writes them to
// dir/table.md and returns them. Each evaluation is cached in dir as
// RUN.json, so a stopped rescoring resumes where it was.
func rescoreArms(ctx context.Context, runs []rl.SweepRun, a, b, dir string, factor int, seed uint64) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	scores := map[string]map[int]float64{a: {}, b: {}}
	var first *rl.Recipe // the evaluator's noise is measured on arm a's first model
	var firstModel string
	k := 0
	for _, run := range runs {
		name := seedSuffix.ReplaceAllString(filepath.Base(run.Dir), "")
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
			return "", err
		}
		if rec.Eval.Skip {
			return "", fmt.Errorf("%s: rescoring needs eval.file", run.Dir)
		}
		switch {
		case k == 0:
			k = rec.Eval.K
		case rec.Eval.K != k:
			return "", fmt.Errorf("%s: eval.k %d, other runs %d: rescoring compares models scored alike", run.Dir, rec.Eval.K, k)
		}
		if first == nil && name == a {
			first, firstModel = rec, model
		}
		avg, err := cachedEval(ctx, model, filepath.Join(dir, filepath.Base(run.Dir)+".json"), rec, "exact", factor*k, seed)
		if err != nil {
			return "", err
		}
		scores[name][int(run.Seed)] = avg
	}
	if first == nil {
		return "", fmt.Errorf("no finished run of arm %q to rescore", a)
	}
	var noise []float64
	for _, s := range evaluatorSeeds {
		avg, err := cachedEval(ctx, firstModel, filepath.Join(dir, fmt.Sprintf("evaluator-seed%d.json", s)), first, "exact", k, s)
		if err != nil {
			return "", err
		}
		noise = append(noise, avg)
	}
	table := rescoredTable(a, b, scores, factor*k, seed) + evaluatorLine(firstModel, k, noise)
	fmt.Print(table)
	return table, atomicfile.Write(filepath.Join(dir, "table.md"), func(w io.Writer) error {
		_, err := io.WriteString(w, table)
		return err
	})
}

// rescoredTable is the paired comparison A - B of the rescored final
// models over the seeds both arms have.
func rescoredTable(a, b string, scores map[string]map[int]float64, k int, seed uint64) string {
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
	fmt.Fprintf(&bld, "Rescored final models (exact engine, avg@%d, sampling seed %d for every model; A - B in points)\n\n", k, seed)
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
