package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/keel-rl/keel/rl"
)

func init() {
	register(command{name: "sweep", summary: "run a grid of RL recipes over seeds, resumably", run: runSweep})
}

const sweepUsage = `usage: keel sweep DIR|RECIPE... [--seeds 1,2,3] [--jobs J] [--out DIR] [--set key=value ...]

Runs every recipe (a directory stands for its *.yaml files) at every seed,
each in OUT/NAME-sSEED (NAME: the recipe file's name), up to J at a time.
Finished runs are skipped and interrupted ones resume from their last
checkpoint, so the same command continues a sweep that was stopped or
killed. --set overrides apply to every run. One line per run as it starts
and ends, with the overall ETA.
`

func runSweep(args []string) error {
	fs := flag.NewFlagSet("sweep", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), sweepUsage); fs.PrintDefaults() }
	seedList := fs.String("seeds", "1", "comma-separated seeds")
	jobs := fs.Int("jobs", 1, "runs at a time (they share the machine's cores)")
	out := fs.String("out", "runs/sweep", "directory of the runs")
	var sets multiFlag
	fs.Var(&sets, "set", "override a key in every recipe (repeatable)")
	paths, help, err := parseInterleaved(fs, args)
	if help || err != nil {
		return err
	}
	if len(paths) == 0 {
		return errors.New("usage: keel sweep DIR|RECIPE... (see keel sweep -h)")
	}
	if *jobs < 1 {
		return fmt.Errorf("--jobs %d, want >= 1", *jobs)
	}
	var seeds []uint64
	for _, f := range strings.Split(*seedList, ",") {
		s, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil || s == 0 {
			return fmt.Errorf("--seeds: %q is not a positive integer", f)
		}
		seeds = append(seeds, s)
	}
	runs, err := rl.Grid(paths, seeds, *out, sets)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("keel sweep: %d runs (%d recipes x %d seeds) in %s, %d at a time\n", len(runs), len(runs)/len(seeds), len(seeds), *out, *jobs)
	start := time.Now()
	err = rl.Sweep(ctx, runs, *jobs, func(e rl.SweepEvent) {
		fmt.Println(sweepLine(e))
	})
	if errors.Is(err, context.Canceled) {
		fmt.Println("stopped; the same command continues the sweep")
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Printf("sweep done in %s\n", time.Since(start).Round(time.Second))
	return nil
}

// sweepLine is one line of progress.
func sweepLine(e rl.SweepEvent) string {
	head := fmt.Sprintf("[%d/%d] %s", e.Finished, e.Total, e.Run.Dir)
	var b strings.Builder
	b.WriteString(head)
	switch e.State {
	case "start":
		b.WriteString(" started")
	case "skip":
		b.WriteString(" finished before: skipped")
	case "failed":
		fmt.Fprintf(&b, " failed after %s: %v", e.Elapsed.Round(time.Second), e.Err)
	case "stopped":
		fmt.Fprintf(&b, " stopped after step %d (checkpointed)", e.Result.Steps)
	case "done":
		fmt.Fprintf(&b, " done in %s", e.Elapsed.Round(time.Second))
		if e.Resumed > 0 {
			fmt.Fprintf(&b, " (resumed from step %d)", e.Resumed)
		}
		if r := e.Result; r != nil && r.After != nil {
			a := r.After.Overall()
			if r.Before != nil {
				fmt.Fprintf(&b, ", held-out avg@%d %.3f -> %.3f", r.After.K, r.Before.Overall().AvgAtK, a.AvgAtK)
			} else {
				fmt.Fprintf(&b, ", held-out avg@%d %.3f", r.After.K, a.AvgAtK)
			}
		}
	}
	if e.State != "start" && e.ETA > 0 && e.Finished < e.Total {
		fmt.Fprintf(&b, "; ETA %s", e.ETA.Round(time.Second))
	}
	return b.String()
}
