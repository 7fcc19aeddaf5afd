package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/sft"
)

func init() {
	register(command{name: "paper", summary: "reproduce the paper's findings in miniature (the whole suite, or --quick)", run: runPaper})
}

const paperUsage = `usage: keel paper [--quick] [--out DIR] [--jobs J] [--only GRID,...]

Runs the reproduction suite of REPRODUCTION.md: every grid of
recipes/paper/ over its seeds (as keel sweep does, in OUT/GRID/NAME-sSEED),
the cold-start models first (keel sft), then one report per grid
(OUT/GRID.html, PNGs in OUT/GRID-charts/). After the on-policy fp4 grids, the
final models of MiniRL and MiniRL without IS (and the base model) are
scored under the exact engine and under the rollout's precision with one
seed for all (OUT/GRID-crosseval/table.md). Finished runs are skipped and
interrupted ones resume, so the same command continues a stopped suite.
--quick runs only the on-policy comparison that carries the paper's main
finding (MiniRL with and without its IS correction, and with R3, at three
times the recipes' learning rate), at one seed: about 10 minutes here.
`

// stressPrecision is the named rollout stress setting of the suite's
// stressed grids (REPRODUCTION.md): NVFP4-style weights, whose train-infer
// discrepancy is about 9 times fp8's on tiny-moe-base.
const stressPrecision = "fp4"

// paperGrid is one sweep of the suite and its report.
type paperGrid struct {
	Name  string   // runs in OUT/NAME, report OUT/NAME.html
	Paths []string // recipes, or directories of recipes
	Seeds []uint64
	Sets  []string
	// SFT is a cold-start recipe run first, into OUT/sft-STYLE (its out
	// without "coldstart-sft-"); the grid's model.path is set to that
	// run's model/.
	SFT string
	// CrossEval names arms whose final models (and the base model) are
	// scored again after the grid, under the exact engine and under the
	// rollout's precision with one seed for all: what separates MiniRL
	// from MiniRL without its IS correction (REPRODUCTION.md, finding 1).
	CrossEval []string
	// MorePaths are arms of the grid also run at MoreSeeds: a comparison
	// that carries a claim gets eight paired seeds without multiplying the
	// whole grid.
	MorePaths []string
	MoreSeeds []uint64
}

// paperSuite lists the suite's grids; quick keeps the on-policy
// comparison of the main finding at one seed: MiniRL with and without its
// IS correction (and with R3) at three times the learning rate, where
// dropping the correction costs about 3 points (REPRODUCTION.md).
func paperSuite(quick bool) []paperGrid {
	stress := "rollout.precision=" + stressPrecision
	seeds := []uint64{1, 2, 3}
	// The comparisons that carry a claim run at eight paired seeds: three
	// are too few to tell a point from noise (REPRODUCTION.md).
	more := []uint64{2, 3, 4, 5, 6, 7, 8}
	lr3 := []string{"train.lr=3.0e-4", "train.min_lr=3.0e-5"}
	op := func(arm string) string { return "recipes/paper/onpolicy/" + arm + ".yaml" }
	if quick {
		return []paperGrid{{Name: "quick-onpolicy-" + stressPrecision + "-lr3e-4",
			Paths: []string{op("minirl"), op("minirl-no-is"), op("minirl-r3")},
			Seeds: []uint64{1}, Sets: append([]string{stress}, lr3...), CrossEval: []string{"minirl", "minirl-no-is"}}}
	}
	g := []paperGrid{
		{Name: "onpolicy-" + stressPrecision, Paths: []string{"recipes/paper/onpolicy"}, Seeds: seeds, Sets: []string{stress},
			// Length normalisation against none, at eight seeds.
			MorePaths: []string{op("minirl-lennorm"), op("minirl")}, MoreSeeds: more[2:],
			CrossEval: []string{"minirl", "minirl-no-is"}},
		{Name: "onpolicy-fp8", Paths: []string{"recipes/paper/onpolicy"}, Seeds: []uint64{1}},
		{Name: "onpolicy-exact", Paths: []string{"recipes/paper/onpolicy/minirl.yaml", "recipes/paper/onpolicy/minirl-no-is.yaml"},
			Seeds: []uint64{1}, Sets: []string{"rollout.precision=exact"}},
	}
	for _, n := range []int{2, 4, 8} {
		grid := paperGrid{Name: fmt.Sprintf("offpolicy-n%d-%s", n, stressPrecision),
			Paths: []string{fmt.Sprintf("recipes/paper/offpolicy-n%d", n)}, Seeds: []uint64{1}, Sets: []string{stress}}
		if n > 2 {
			// R2 against R3, the paper's claim at N = 4 and 8.
			grid.MorePaths = []string{fmt.Sprintf("recipes/paper/offpolicy-n%d/r2.yaml", n), fmt.Sprintf("recipes/paper/offpolicy-n%d/r3.yaml", n)}
			grid.MoreSeeds = more
		}
		g = append(g, grid)
	}
	// The off-policy grid's instabilities need the policy to move away
	// from pi_old within a step: the same N = 8 grid at three and ten
	// times the learning rate (REPRODUCTION.md, finding 2).
	n8 := func(arm string) string { return "recipes/paper/offpolicy-n8/" + arm + ".yaml" }
	g = append(g,
		paperGrid{Name: "offpolicy-n8-" + stressPrecision + "-lr3e-4", Paths: []string{n8("no-clip"), n8("clip"), n8("r2"), n8("r3")},
			Seeds: []uint64{1}, Sets: append([]string{stress}, lr3...),
			MorePaths: []string{n8("no-clip"), n8("clip")}, MoreSeeds: more},
		paperGrid{Name: "offpolicy-n8-" + stressPrecision + "-lr1e-3", Paths: []string{"recipes/paper/offpolicy-n8"},
			Seeds: []uint64{1}, Sets: []string{stress, "train.lr=1.0e-3", "train.min_lr=1.0e-4"}})
	// The same search for the on-policy finding: without the IS correction
	// nothing collapses at lr 1e-4, so MiniRL with and without it (and
	// with R3) at three times the learning rate.
	g = append(g, paperGrid{Name: "onpolicy-" + stressPrecision + "-lr3e-4",
		Paths: []string{op("minirl"), op("minirl-no-is"), op("minirl-r3"), op("minirl-no-is-r3")},
		Seeds: []uint64{1}, Sets: append([]string{stress}, lr3...),
		MorePaths: []string{op("minirl"), op("minirl-no-is")}, MoreSeeds: more,
		CrossEval: []string{"minirl", "minirl-no-is"}})
	// Staleness from asynchrony (the rollout k steps ahead) against the
	// off-policy grids' staleness from N mini-batches.
	for _, k := range []int{1, 2, 4} {
		g = append(g, paperGrid{Name: fmt.Sprintf("async-k%d-%s", k, stressPrecision), Paths: []string{"recipes/paper/async"},
			Seeds: seeds, Sets: []string{stress, fmt.Sprintf("rollout.staleness=%d", k)}})
	}
	// The same at three times the learning rate, where the on-policy runs
	// need the IS correction most: MiniRL against MiniRL without it, the
	// rollout k steps ahead, at eight paired seeds.
	for _, k := range []int{1, 4} {
		g = append(g, paperGrid{Name: fmt.Sprintf("async-k%d-%s-lr3e-4", k, stressPrecision),
			Paths: []string{"recipes/paper/async/minirl.yaml", "recipes/paper/async/minirl-no-is.yaml"}, Seeds: []uint64{1},
			Sets:      append([]string{stress, fmt.Sprintf("rollout.staleness=%d", k)}, lr3...),
			MorePaths: []string{"recipes/paper/async/minirl.yaml", "recipes/paper/async/minirl-no-is.yaml"}, MoreSeeds: more})
	}
	for _, style := range []string{"terse", "scratch", "chain"} {
		g = append(g, paperGrid{Name: "coldstart-" + style,
			Paths: []string{"recipes/paper/coldstart/from-" + style + ".yaml"}, Seeds: []uint64{1},
			SFT: "recipes/paper/coldstart-sft/sft-" + style + ".yaml"})
	}
	// "Prolonged" RL from the same three models: four times the steps
	// (the models are trained once, in OUT/sft-STYLE).
	for _, style := range []string{"terse", "scratch", "chain"} {
		g = append(g, paperGrid{Name: "coldstart-" + style + "-long",
			Paths: []string{"recipes/paper/coldstart/from-" + style + ".yaml"}, Seeds: []uint64{1},
			Sets: []string{"train.steps=704", "eval.every=50"},
			SFT:  "recipes/paper/coldstart-sft/sft-" + style + ".yaml"})
	}
	return g
}

func runPaper(args []string) error {
	fs := flag.NewFlagSet("paper", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), paperUsage); fs.PrintDefaults() }
	quick := fs.Bool("quick", false, "only the main on-policy comparison, one seed (about 10 minutes here)")
	out := fs.String("out", "runs/paper", "directory of the suite's runs and reports")
	jobs := fs.Int("jobs", 2, "runs at a time (they share the machine's cores)")
	only := fs.String("only", "", "comma-separated grid names to run (default: all)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("keel paper takes no arguments (got %q); see keel paper -h", fs.Args())
	}
	if *jobs < 1 {
		return fmt.Errorf("--jobs %d, want >= 1", *jobs)
	}
	suite, err := selectGrids(paperSuite(*quick), *only)
	if err != nil {
		return err
	}
	plans, err := planSuite(suite, *out)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	total := 0
	for _, p := range plans {
		total += len(p.runs)
	}
	fmt.Printf("keel paper: %d grids, %d RL runs in %s, %d at a time\n", len(plans), total, *out, *jobs)
	for _, p := range plans {
		if p.grid.SFT != "" {
			err := runSuiteSFT(ctx, p)
			if errors.Is(err, context.Canceled) {
				fmt.Println("stopped; the same command continues the suite")
				return nil
			}
			if err != nil {
				return err
			}
		}
		fmt.Printf("== %s (%s elapsed)\n", p.grid.Name, time.Since(start).Round(time.Second))
		err := rl.Sweep(ctx, p.runs, *jobs, func(e rl.SweepEvent) { fmt.Println(sweepLine(e)) })
		if errors.Is(err, context.Canceled) {
			fmt.Println("stopped; the same command continues the suite")
			return nil
		}
		if err != nil {
			return err
		}
		dirs := make([]string, len(p.runs))
		for i, r := range p.runs {
			dirs[i] = r.Dir
		}
		page := filepath.Join(*out, p.grid.Name+".html")
		if _, _, err := writeReport("keel paper: "+p.grid.Name, dirs, page, 10, paperComparisons(p.grid, dirs)); err != nil {
			return err
		}
		fmt.Printf("report -> %s\n", page)
		if err := rescore(ctx, p, *out); err != nil {
			if errors.Is(err, context.Canceled) {
				fmt.Println("stopped; the same command continues the suite")
				return nil
			}
			return err
		}
		if len(p.grid.CrossEval) > 0 {
			err := crossEval(ctx, p, *out)
			if errors.Is(err, context.Canceled) {
				fmt.Println("stopped; the same command continues the suite")
				return nil
			}
			if err != nil {
				return err
			}
		}
	}
	fmt.Printf("suite done in %s\n", time.Since(start).Round(time.Second))
	if *quick {
		fmt.Println("one seed shows a direction, not a finding: the full suite compares arms over eight paired seeds")
	}
	return nil
}

// selectGrids keeps the grids named in only (comma-separated; empty: all).
func selectGrids(suite []paperGrid, only string) ([]paperGrid, error) {
	if strings.TrimSpace(only) == "" {
		return suite, nil
	}
	var out []paperGrid
	for _, name := range strings.Split(only, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, g := range suite {
			if g.Name == name {
				out, found = append(out, g), true
			}
		}
		if !found {
			var names []string
			for _, g := range suite {
				names = append(names, g.Name)
			}
			return nil, fmt.Errorf("--only: no grid %q (grids: %s)", name, strings.Join(names, ", "))
		}
	}
	return out, nil
}

// suitePlan is a grid with its runs resolved and checked.
type suitePlan struct {
	grid   paperGrid
	runs   []rl.SweepRun
	sftOut string // the cold-start SFT run directory, if any
}

// planSuite resolves every grid's runs before anything runs, so a bad
// recipe stops the suite at once rather than an hour in.
func planSuite(suite []paperGrid, out string) ([]suitePlan, error) {
	var plans []suitePlan
	for _, g := range suite {
		p := suitePlan{grid: g}
		sets := g.Sets
		if g.SFT != "" {
			r, err := sft.ReadRecipe(g.SFT)
			if err != nil {
				return nil, err
			}
			p.sftOut = filepath.Join(out, "sft-"+strings.TrimPrefix(filepath.Base(r.Out), "coldstart-sft-"))
			sets = append(append([]string(nil), sets...), "model.path="+filepath.Join(p.sftOut, "model"))
		}
		runs, err := rl.Grid(g.Paths, g.Seeds, filepath.Join(out, g.Name), sets)
		if err != nil {
			return nil, fmt.Errorf("grid %s: %w", g.Name, err)
		}
		if len(g.MorePaths) > 0 {
			more, err := rl.Grid(g.MorePaths, g.MoreSeeds, filepath.Join(out, g.Name), sets)
			if err != nil {
				return nil, fmt.Errorf("grid %s: %w", g.Name, err)
			}
			runs = append(runs, more...)
		}
		dirs := map[string]bool{}
		arms := map[string]bool{}
		for _, r := range runs {
			if dirs[r.Dir] {
				return nil, fmt.Errorf("grid %s: run %s twice (MoreSeeds overlaps Seeds?)", g.Name, r.Dir)
			}
			dirs[r.Dir] = true
			arms[strings.TrimSuffix(filepath.Base(r.Dir), fmt.Sprintf("-s%d", r.Seed))] = true
		}
		for _, a := range g.CrossEval {
			if !arms[a] {
				return nil, fmt.Errorf("grid %s: cross-evaluated arm %q is not one of its runs", g.Name, a)
			}
		}
		p.runs = runs
		plans = append(plans, p)
	}
	return plans, nil
}

// runSuiteSFT trains a grid's cold-start model unless it is there.
func runSuiteSFT(ctx context.Context, p suitePlan) error {
	if _, err := os.Stat(filepath.Join(p.sftOut, "model", "config.json")); err == nil {
		fmt.Printf("[sft] %s finished before: skipped\n", p.sftOut)
		return nil
	}
	r, err := sft.ReadRecipe(p.grid.SFT)
	if err != nil {
		return err
	}
	r.Out = p.sftOut
	fmt.Printf("[sft] %s started (%s)\n", p.sftOut, p.grid.SFT)
	res, err := sft.Run(ctx, r, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", p.grid.SFT, err)
	}
	if res.Stopped {
		return context.Canceled
	}
	fmt.Printf("[sft] %s done in %s, final loss %.4f\n", p.sftOut, res.Elapsed.Round(time.Second), res.FinalLoss)
	return nil
}
