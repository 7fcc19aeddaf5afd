package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/rl"
)

func init() {
	register(command{name: "rl", summary: "reinforcement learning from a recipe (no arguments: the built-in quickstart)", run: runRL})
}

const rlUsage = `usage: keel rl [--recipe FILE.yaml] [--set key=value ...] [--name NAME]
       keel rl --resume RUN_DIR [--servers URL,...]

Runs RL (MiniRL and its neighbours, Routing Replay, on- and off-policy) as
the recipe describes; README "RL recipes" lists every key. Without
--recipe it runs the built-in quickstart (MiniRL on models/tiny-moe-base
with an fp8 rollout, held-out accuracy before and after) in a fresh
runs/quickstart[-N].

The run directory (runs/NAME, or the recipe's out) receives recipe.yaml
(resolved), metrics.jsonl, tensorboard/, samples/, checkpoints/ and, at the
end, model/ (a Hugging Face model directory with tokenizer.json). Ctrl-C
stops after the current step with a checkpoint; --resume continues it.
A run whose rollout is remote can resume on other servers (--servers):
where the samples come from, not what is trained, may change between a
stop and its resumption.
`

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runRL(args []string) error {
	fs := flag.NewFlagSet("rl", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), rlUsage); fs.PrintDefaults() }
	path := fs.String("recipe", "", "recipe YAML file (default: the built-in quickstart)")
	name := fs.String("name", "", "run name: the run directory is runs/NAME")
	resume := fs.String("resume", "", "continue the run in this directory from its last checkpoint")
	quiet := fs.Bool("quiet", false, "no progress line")
	servers := fs.String("servers", "", "comma-separated rollout server URLs (rollout.servers; with --resume, replacing the run's)")
	var sets multiFlag
	fs.Var(&sets, "set", "override a recipe key: --set train.steps=10 (repeatable)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see keel rl -h)", fs.Arg(0))
	}
	var r *rl.Recipe
	var err error
	switch {
	case *resume != "":
		if *path != "" || *name != "" || len(sets) > 0 {
			return errors.New("--resume takes the run's own recipe: give no --recipe, --name or --set")
		}
		over := []string{"out=" + *resume}
		if *servers != "" {
			saved, err := rl.ReadRecipe(filepath.Join(*resume, rl.RecipeFile), over)
			if err != nil {
				return err
			}
			if len(saved.Rollout.Servers) == 0 {
				return fmt.Errorf("--servers: the run in %s samples with its in-process engine; its rollout cannot move to servers", *resume)
			}
			over = append(over, serversOverride(*servers))
		}
		if r, err = rl.ReadRecipe(filepath.Join(*resume, rl.RecipeFile), over); err != nil {
			return err
		}
	case *path != "":
		if *servers != "" {
			// The servers run their own precision.
			sets = append(sets, serversOverride(*servers), "rollout.precision=")
		}
		if *name != "" {
			sets = append([]string{"name=" + *name, "out=runs/" + *name}, sets...)
		}
		if r, err = rl.ReadRecipe(*path, sets); err != nil {
			return err
		}
	default:
		if *servers != "" {
			sets = append(sets, serversOverride(*servers), "rollout.precision=")
		}
		if *name != "" {
			sets = append([]string{"name=" + *name, "out=runs/" + *name}, sets...)
		} else {
			sets = append([]string{"out=" + freshRunDir("runs/quickstart")}, sets...)
		}
		if r, err = rl.ParseRecipe(rl.Quickstart, sets); err != nil {
			return fmt.Errorf("built-in quickstart: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	live := !*quiet && term.IsTerminal(int(os.Stderr.Fd()))
	fmt.Println(rlHeader(r))
	pr := rl.Progress{
		Eval: func(step int, rep *evaluate.Report) {
			if live {
				fmt.Fprint(os.Stderr, "\r\033[K")
			}
			ov := rep.Overall()
			when := "after step " + fmt.Sprint(step)
			if step == 0 {
				when = "before training"
			}
			fmt.Printf("held-out %s: avg@%d %.3f  pass@%d %.3f\n", when, rep.K, ov.AvgAtK, rep.K, ov.PassAtK)
		},
		Warn: func(msg string) {
			if live {
				fmt.Fprint(os.Stderr, "\r\033[K")
			}
			fmt.Fprintln(os.Stderr, "warning:", msg)
		},
	}
	if live {
		pr.Step = func(step, total int, m map[string]float64, elapsed time.Duration) {
			progressLine(os.Stderr, step, total, m, elapsed)
		}
	}
	res, err := rl.Run(ctx, r, *resume != "", pr)
	if live {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
	if err != nil {
		return err
	}
	if res.Stopped {
		fmt.Printf("stopped after step %d; continue with: keel rl --resume %s\n", res.Steps, res.Dir)
		return nil
	}
	fmt.Printf("trained %d steps in %s (peak memory %.0f MB); run directory %s, model %s\n",
		res.Steps, res.Elapsed.Round(time.Second), float64(res.PeakRSS)/(1<<20), res.Dir, res.ModelDir)
	if res.Before != nil && res.After != nil {
		b, a := res.Before.Overall(), res.After.Overall()
		fmt.Printf("held-out avg@%d %.3f -> %.3f (%+.1f points), pass@%d %.3f -> %.3f\n",
			res.After.K, b.AvgAtK, a.AvgAtK, 100*(a.AvgAtK-b.AvgAtK), res.After.K, b.PassAtK, a.PassAtK)
	}
	return nil
}

// progressLine rewrites one terminal line with the step's headline numbers.
func progressLine(w io.Writer, step, total int, m map[string]float64, elapsed time.Duration) {
	eta := time.Duration(float64(elapsed) / float64(step) * float64(total-step))
	turns := ""
	if t, ok := m["env/turns"]; ok {
		turns = fmt.Sprintf("  turns %.2f", t)
	}
	fmt.Fprintf(w, "\r\033[Kstep %d/%d  reward %.3f  acc %.3f%s  k3 %.2e  entropy %.3f  %.0f tok/s  ETA %s",
		step, total, m["reward/mean"], m["accuracy"], turns, m["train_infer/k3"], m["entropy"],
		m["tokens_per_s/rollout"], eta.Round(time.Second))
}

// freshRunDir returns base, or base-2, base-3, ... : the first that does
// not exist yet.
func freshRunDir(base string) string {
	dir := base
	for i := 2; ; i++ {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return dir
		}
		dir = fmt.Sprintf("%s-%d", base, i)
	}
}

// serversOverride is the recipe override of --servers URL,URL.
func serversOverride(list string) string {
	var urls []string
	for _, u := range strings.Split(list, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, strconv.Quote(u))
		}
	}
	return "rollout.servers=[" + strings.Join(urls, ", ") + "]"
}

// rlHeader is keel rl's first line: the recipe in short.
func rlHeader(r *rl.Recipe) string {
	ro := r.Rollout.Precision
	if n := len(r.Rollout.Servers); n > 0 {
		ro = fmt.Sprintf("remote (%d %s server(s))", n, r.Rollout.ServerKind)
	} else if ro == "exact" && r.Train.Precision == "bf16" {
		// exact is the fp32 training engine's kernels: against a bf16
		// trainer the discrepancy is bf16's, not zero. Say so up front.
		ro += " (the fp32 trainer's kernels: train.precision bf16 makes the discrepancy bf16's, not 0)"
	}
	switch {
	case r.Rollout.Staleness > 0:
		ro += fmt.Sprintf(" %d step(s) ahead", r.Rollout.Staleness)
	case r.Rollout.MaxStaleness > 0:
		ro += fmt.Sprintf(" up to %d step(s) ahead", r.Rollout.MaxStaleness)
		if r.Rollout.Partial == rl.PartialSwitch {
			ro += ", switching weights mid-sequence"
		}
	}
	samples := "samples"
	if r.Env.On() {
		samples = fmt.Sprintf("episodes of %s (at most %d turns, %d tokens)", r.Env.Name, r.Env.MaxTurns, r.Env.MaxTokens)
	}
	return fmt.Sprintf("keel rl: %s, %s rollout, %d steps of %d prompts x %d %s in %d mini-batch(es), replay %s -> %s",
		r.Algorithm.Objective, ro, r.Train.Steps, r.Train.PromptsPerStep, r.Train.GroupSize, samples,
		r.Train.MiniBatches, r.Algorithm.Replay, r.Out)
}
