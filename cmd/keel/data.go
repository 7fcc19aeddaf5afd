package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tasks"
)

func init() {
	register(command{name: "data", summary: "generate task data sets (keel data gen) and show them", run: runData})
}

const dataUsage = `usage: keel data gen --task NAME[,NAME...] --n N [--difficulty D] [--style S] [--seed S] --out FILE.jsonl|.parquet
       keel data show FILE [--n N]

gen draws problems of the built-in task families (%s) with their ground
truth and, unless --style none, a reference solution in a style (terse,
scratch, chain, or mixed). Difficulty is 1..5, a range "1-3" or a list.
The same flags give the same file, byte for byte.
`

func runData(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf(dataUsage, strings.Join(tasks.Names(), ", "))
	}
	switch args[0] {
	case "gen":
		return runDataGen(args[1:])
	case "show":
		return runDataShow(args[1:])
	}
	return fmt.Errorf("unknown subcommand %q\n\n"+dataUsage, args[0], strings.Join(tasks.Names(), ", "))
}

func runDataGen(args []string) error {
	fs := flag.NewFlagSet("data gen", flag.ContinueOnError)
	task := fs.String("task", "", "task families, comma-separated: "+strings.Join(tasks.Names(), ", "))
	n := fs.Int("n", 1000, "examples")
	diff := fs.String("difficulty", "1-3", "difficulty: N, N-M or a comma list (1..5)")
	style := fs.String("style", "mixed", "solution style: terse, scratch, chain, a comma list, mixed, or none")
	seed := fs.Uint64("seed", 1, "random seed")
	out := fs.String("out", "", "output file: .jsonl, or .parquet in verl's layout")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *task == "":
		return errors.New("--task is required")
	case *out == "":
		return errors.New("--out is required")
	case !strings.HasSuffix(*out, ".jsonl") && !strings.HasSuffix(*out, ".parquet"):
		return fmt.Errorf("--out %s: keel writes .jsonl or .parquet (verl's layout) data sets", *out)
	}
	spec := data.GenSpec{N: *n, Seed: *seed}
	for _, t := range strings.Split(*task, ",") {
		spec.Tasks = append(spec.Tasks, strings.TrimSpace(t))
	}
	var err error
	if spec.Difficulties, err = data.ParseDifficulties(*diff); err != nil {
		return fmt.Errorf("--difficulty: %w", err)
	}
	if *style != "none" {
		if spec.Styles, err = data.ParseStyles(*style); err != nil {
			return fmt.Errorf("--style: %w", err)
		}
	}
	ex, err := data.Generate(spec)
	if err != nil {
		return err
	}
	return data.Write(*out, ex)
}

func runDataShow(args []string) error {
	fs := flag.NewFlagSet("data show", flag.ContinueOnError)
	n := fs.Int("n", 5, "examples to show")
	var path string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		path, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if path == "" {
		return errors.New("usage: keel data show FILE [--n N]")
	}
	ex, err := data.Read(path)
	if err != nil {
		return err
	}
	for i, e := range ex[:min(*n, len(ex))] {
		fmt.Printf("#%d %s (difficulty %d) answer %q\n", i, e.Task, e.Difficulty, e.Answer)
		for _, m := range e.Chat() {
			fmt.Printf("  %s: %s\n", m.Role, m.Content)
		}
		if e.Response != "" {
			fmt.Printf("  response (%s):\n    %s\n", e.Style, strings.ReplaceAll(e.Response, "\n", "\n    "))
		}
	}
	fmt.Printf("%d examples in %s\n", len(ex), path)
	return nil
}
