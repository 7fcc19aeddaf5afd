package rl

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/keel-rl/keel/run"
)

// SweepRun is one run of a grid: a recipe file at one seed.
type SweepRun struct {
	Recipe string // the recipe file
	Seed   uint64
	Dir    string // its run directory
	Sets   []string
}

// SweepEvent reports a run starting or ending.
type SweepEvent struct {
	Run      SweepRun
	Index    int // from 0, in grid order
	Total    int
	State    string // "start", "skip" (already finished), "done", "stopped", "failed"
	Resumed  int    // the step a started run resumes from
	Result   *Result
	Err      error
	Elapsed  time.Duration // of this run
	Finished int           // runs finished so far (skipped ones included)
	ETA      time.Duration // for the runs left, from the mean time of those run so far
}

// Grid expands recipe files and directories (every *.yaml in them, in name
// order) into runs: one per recipe and seed, in the directory
// out/NAME-sSEED where NAME is the recipe file's name without .yaml.
// Each run gets its seed and directory through overrides, after sets.
func Grid(paths []string, seeds []uint64, out string, sets []string) ([]SweepRun, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		m, err := filepath.Glob(filepath.Join(p, "*.yaml"))
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%s: no *.yaml recipes", p)
		}
		sort.Strings(m)
		files = append(files, m...)
	}
	if len(seeds) == 0 {
		seeds = []uint64{1}
	}
	seen := map[string]string{}
	var runs []SweepRun
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		if prev, ok := seen[name]; ok {
			return nil, fmt.Errorf("recipes %s and %s share the name %s: their runs would share directories", prev, f, name)
		}
		seen[name] = f
		for _, s := range seeds {
			dir := filepath.Join(out, fmt.Sprintf("%s-s%d", name, s))
			r := SweepRun{Recipe: f, Seed: s, Dir: dir}
			r.Sets = append(append([]string(nil), sets...), fmt.Sprintf("seed=%d", s), "out="+dir)
			// Check every recipe before anything runs.
			if _, err := ReadRecipe(f, r.Sets); err != nil {
				return nil, err
			}
			runs = append(runs, r)
		}
	}
	return runs, nil
}

// finished reports whether a run directory holds a completed run (its
// final model directory is written last).
func finished(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "model", "config.json"))
	return err == nil
}

// Sweep runs a grid with up to jobs runs at a time. Finished runs are
// skipped and interrupted ones resume from their checkpoints, so a killed
// sweep picks up where it stopped. Cancelling ctx stops every run after
// its current step (checkpointed). It returns the first run error, after
// the other runs have ended; events (may be nil) hears of every start
// and end, one call at a time.
func Sweep(ctx context.Context, runs []SweepRun, jobs int, events func(SweepEvent)) error {
	if jobs < 1 {
		jobs = 1
	}
	var mu sync.Mutex
	finishedN, ran := 0, 0
	var ranTime time.Duration
	emit := func(e SweepEvent) {
		mu.Lock()
		defer mu.Unlock()
		e.Total = len(runs)
		switch e.State {
		case "skip":
			finishedN++
		case "done":
			finishedN++
			ran++
			ranTime += e.Elapsed
		}
		e.Finished = finishedN
		if ran > 0 {
			left := len(runs) - finishedN
			e.ETA = time.Duration(float64(ranTime) / float64(ran) * float64(left) / float64(jobs))
		}
		if events != nil {
			events(e)
		}
	}
	next := make(chan int)
	var firstErr error
	var wg sync.WaitGroup
	for range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				sr := runs[i]
				if finished(sr.Dir) {
					emit(SweepEvent{Run: sr, Index: i, State: "skip"})
					continue
				}
				r, err := ReadRecipe(sr.Recipe, sr.Sets)
				if err == nil {
					t := time.Now()
					resume := run.HasCheckpoint(filepath.Join(sr.Dir, run.CheckpointsDir))
					emit(SweepEvent{Run: sr, Index: i, State: "start"})
					var res *Result
					res, err = Run(ctx, r, resume, Progress{})
					ev := SweepEvent{Run: sr, Index: i, Result: res, Err: err, Elapsed: time.Since(t)}
					switch {
					case err != nil:
						ev.State = "failed"
					case res.Stopped:
						ev.State = "stopped"
					default:
						ev.State = "done"
						ev.Resumed = res.Resumed
					}
					emit(ev)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%s (seed %d): %w", sr.Recipe, sr.Seed, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range runs {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
