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
	rep, err := evalModel(*dir, *path, p, *k, rollout.Sampling{Temperature: *temp, MaxNewTokens: *maxNew, Seed: *seed})
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
	if err := evaluate.CheckTasks(ex); err != nil {
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
	return evaluate.Run(e, tok, ex, k, s)
}
