package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
)

func init() {
	register(command{name: "eval", summary: "avg@k and pass@k of a model on a data set of verifiable problems", run: runEval})
}

const evalUsage = `usage: keel eval --model DIR --data FILE.jsonl|.parquet [--k 8] [--json FILE] [flags]

Samples k responses per problem (ChatML prompt, stop at <|im_end|>) with
the rollout engine and scores each with its task's verifier. Prints
avg@k (accuracy averaged over the samples) and pass@k (some sample right)
overall, per task and per task/difficulty. The model directory needs a
tokenizer.json (keel sft writes one).

With --env, each problem is an episode of a multi-turn environment (as a
recipe's env section: tools, guess, or http with --env-url), --max-new-
tokens bounding each turn; a sample's reward is its episode's.

flags:
`

func runEval(args []string) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), evalUsage); fs.PrintDefaults() }
	dir := fs.String("model", "", "model directory (with tokenizer.json)")
	path := fs.String("data", "", "data set (.jsonl or .parquet, keel's or verl's layout) with prompts and answers")
	k := fs.Int("k", 8, "samples per problem")
	temp := fs.Float64("temperature", 1, "sampling temperature")
	maxNew := fs.Int("max-new-tokens", 256, "longest response")
	seed := fs.Uint64("seed", 1, "random seed")
	prec := fs.String("precision", "exact", "rollout precision")
	jsonOut := fs.String("json", "", "also write the report as JSON")
	show := fs.Int("show", 0, "print the responses to the first N problems")
	var es rl.EnvSettings
	fs.StringVar(&es.Name, "env", "", "multi-turn environment: tools, guess or http")
	fs.StringVar(&es.URL, "env-url", "", "--env http: the environment server's base URL")
	fs.IntVar(&es.MaxTurns, "max-turns", 0, "--env: the model's turns per episode (default 4)")
	fs.IntVar(&es.MaxTokens, "max-tokens", 0, "--env: an episode's tokens after the prompt (default max-turns x max-new-tokens)")
	fs.StringVar(&es.SystemPrompt, "system-prompt", "", "--env: full, compact or none (default full)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *dir == "" || *path == "" || fs.NArg() > 0 {
		return errors.New("usage: keel eval --model DIR --data FILE.jsonl|.parquet [--k 8]")
	}
	p, err := rollout.ParsePrecision(*prec)
	if err != nil {
		return fmt.Errorf("--precision: %w", err)
	}
	var ep *evaluate.Episodes
	if es.Name != "" {
		e, system, b, err := rl.OpenEnvironment(&es, *maxNew)
		if err != nil {
			return err
		}
		ep = &evaluate.Episodes{Env: e, Budgets: b, System: system, AnyTask: es.Name == rl.EnvHTTP}
	}
	rep, err := evalModelEpisodes(*dir, *path, p, *k, rollout.Sampling{Temperature: *temp, MaxNewTokens: *maxNew, Seed: *seed}, ep)
	if err != nil {
		return err
	}
	for i, s := range rep.Samples[:min(*show, len(rep.Samples))] {
		fmt.Printf("#%d %s [answer %s]\n", i, s.Example.Chat()[len(s.Example.Chat())-1].Content, s.Example.Answer)
		for j, r := range s.Responses {
			fmt.Printf("  reward %.0f: %q\n", s.Rewards[j], r)
		}
	}
	rep.Print(os.Stdout)
	if *jsonOut != "" {
		return atomicfile.Write(*jsonOut, func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		})
	}
	return nil
}

// evalModel samples k responses per problem of the data set at path from
// the model in dir, with the rollout engine at precision prec, and scores
// them (keel eval, and keel paper's cross-evaluations).
func evalModel(dir, path string, prec rollout.Precision, k int, s rollout.Sampling) (*evaluate.Report, error) {
	return evalModelEpisodes(dir, path, prec, k, s, nil)
}

// evalModelEpisodes is evalModel, over episodes of ep's environment when
// ep is not nil.
func evalModelEpisodes(dir, path string, prec rollout.Precision, k int, s rollout.Sampling, ep *evaluate.Episodes) (*evaluate.Report, error) {
	m, err := model.Load(dir)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	ex, err := data.Read(path)
	if err != nil {
		return nil, err
	}
	// An environment served over HTTP scores rows of any task.
	if err := evaluate.CheckTasks(ex); err != nil && (ep == nil || !ep.AnyTask) {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	maxLen := m.Config.MaxPositionEmbeddings
	if maxLen <= 0 {
		maxLen = 2048
	}
	e, err := rollout.New(m, rollout.Options{Precision: prec, Slots: 64, MaxLen: min(maxLen, 4096)})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	if ep != nil {
		return evaluate.RunEpisodes(e, tok, ex, k, s, *ep)
	}
	return evaluate.Run(e, tok, ex, k, s)
}
