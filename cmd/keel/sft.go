package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/keel-rl/keel/sft"
)

func init() {
	register(command{name: "sft", summary: "supervised training (cold start) from a recipe", run: runSFT})
}

const sftUsage = `usage: keel sft --recipe FILE.yaml

Trains a model on (prompt, response) pairs, the loss on response tokens
only, as the recipe describes (see recipes/). The run directory (the
recipe's out) receives recipe.yaml, metrics.jsonl, checkpoints/ and, at the
end, model/ (a Hugging Face model directory with tokenizer.json) and
eval.json. A run that finds checkpoints in its directory resumes from the
newest; Ctrl-C stops it after the current step with a checkpoint.
`

func runSFT(args []string) error {
	fs := flag.NewFlagSet("sft", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), sftUsage); fs.PrintDefaults() }
	path := fs.String("recipe", "", "recipe YAML file")
	quiet := fs.Bool("quiet", false, "no progress line")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *path == "" || fs.NArg() > 0 {
		return errors.New("usage: keel sft --recipe FILE.yaml")
	}
	r, err := sft.ReadRecipe(*path)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	progress := os.Stderr
	if *quiet {
		progress = nil
	}
	res, err := sft.Run(ctx, r, progress)
	if err != nil {
		return err
	}
	if res.Stopped {
		fmt.Printf("stopped at step %d; run the same command to resume from %s/checkpoints\n", res.Steps, r.Out)
		return nil
	}
	fmt.Printf("trained %d steps in %s, final loss %.4f; model in %s\n", res.Steps, res.Elapsed.Round(1e9), res.FinalLoss, res.ModelDir)
	if res.Eval != nil {
		fmt.Printf("\nheld-out evaluation (%s/eval.json):\n", r.Out)
		res.Eval.Print(os.Stdout)
	}
	return nil
}
