package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/tasks"
)

func init() {
	register(command{name: "data", summary: "generate task data sets, show them, score or solve them",
		run: func(args []string) error { return runData(args, os.Stdout) }})
}

const dataUsage = `usage: keel data gen --task NAME[,NAME...] --n N [--difficulty D] [--style S] [--seed S] --out FILE.jsonl|.parquet
       keel data show FILE [--n N]
       keel data score FILE [--responses FILE.jsonl] [--out VERDICTS.jsonl]
       keel data solve FILE --out FILE.jsonl|.parquet [--style S] [--seed S] [--skip]

gen draws problems of the built-in task families (%s)
with their ground truth and, unless --style none, a reference solution in
a style: terse (the answer line only), scratch (a step-by-step
scratchpad), chain (one line of intermediate results), a comma list, or
mixed (one drawn per example). Tasks are used in turn; the difficulty
(1..5, a range "1-3" or a list "1,4") is drawn per example. The same flags
give the same file, byte for byte, and a larger --n extends a smaller one.
.jsonl files are keel's layout (task, difficulty, prompt, answer,
response, style); .parquet files are verl's (data_source, prompt as a chat
list, reward_model.ground_truth, extra_info) with keel's columns added.

show prints the first examples of a data set (.jsonl or .parquet, keel's
or verl's layout).

score runs each row's verifier on its response field, or on the responses
in --responses, a JSONL file of {"response": "..."} objects: one per row,
or k per row (all of row 0's, then row 1's, ...) for avg@k. It prints the
accuracy overall, per task and per task and difficulty. Besides the
generated families, rows of real math data sets verify by their task or
data_source: math (MATH, MATH-500, DAPO-Math-17k, AIME, NuminaMath: verl's
names such as lighteval/MATH, math_dapo, aime*, numina_*) and gsm8k
(openai/gsm8k). --out writes one JSON line per scored response: the row,
the sample, the task, the ground truth, the final answer the verifier
extracted and its verdict, to audit a verifier.

solve adds reference solutions to a data set that has none (a user's, or
verl's: a Countdown needs only its ground truth "T|n1,n2,..." or TinyZero's
{target, numbers}; arithmetic and linear prompts must be in keel's form),
for supervised cold starts on the user's own problems. A row that cannot be
solved is an error naming it, or dropped with --skip.
`

func runData(args []string, stdout io.Writer) error {
	usage := fmt.Sprintf(dataUsage, strings.Join(tasks.Names(), ", "))
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "gen":
		return runDataGen(args[1:], usage)
	case "show":
		return runDataShow(args[1:], stdout, usage)
	case "score":
		return runDataScore(args[1:], stdout, usage)
	case "solve":
		return runDataSolve(args[1:], stdout, usage)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown subcommand %q\n\n%s", args[0], usage)
}

// newDataFlags makes a flag set for a data subcommand whose -h prints the
// command's usage and the set's flags.
func newDataFlags(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("data "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage+"\nflags of "+name+":\n")
		fs.PrintDefaults()
	}
	return fs
}

// parseWithPath parses flags given before or after one positional FILE.
func parseWithPath(fs *flag.FlagSet, args []string) (path string, help bool, err error) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		path, args = args[0], args[1:]
	}
	if help, err = parseFlags(fs, args); help || err != nil {
		return "", help, err
	}
	rest := fs.Args()
	if path == "" && len(rest) > 0 {
		path, rest = rest[0], rest[1:]
		if help, err = parseFlags(fs, rest); help || err != nil {
			return "", help, err
		}
		rest = fs.Args()
	}
	if len(rest) > 0 {
		return "", false, fmt.Errorf("unexpected argument %q", rest[0])
	}
	return path, false, nil
}

func runDataGen(args []string, usage string) error {
	fs := newDataFlags("gen", usage)
	task := fs.String("task", "", "task families, comma-separated: "+strings.Join(tasks.Names(), ", "))
	n := fs.Int("n", 1000, "examples")
	diff := fs.String("difficulty", "1-3", "difficulty: N, N-M or a comma list (1..5)")
	style := fs.String("style", "mixed", "solution style: terse, scratch, chain, a comma list, mixed, tool (episodes of the environments), or none")
	seed := fs.Uint64("seed", 1, "random seed")
	out := fs.String("out", "", "output file: .jsonl, or .parquet in verl's layout")
	useTool := fs.Float64("teacher-tool", 0.5, "--style tool: the probability that a demonstration calls the calculator (else it computes in its head)")
	bisect := fs.Float64("teacher-bisect", 0.5, "--style tool: the probability that a guessing demonstration bisects at a turn (else it guesses at random within the range left)")
	maxTurns := fs.Int("max-turns", 6, "--style tool: the most turns of a demonstration")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *task == "":
		return fmt.Errorf("--task is required (%s)", strings.Join(tasks.Names(), ", "))
	case *n < 1:
		return fmt.Errorf("--n %d: want at least 1", *n)
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
	if *style == "tool" || slices.Contains(spec.Tasks, "guess") {
		if *style != "tool" && *style != "none" {
			return fmt.Errorf("--style %s: guessing games have demonstrations of style tool only (or none)", *style)
		}
		if !(*useTool >= 0 && *useTool <= 1) || !(*bisect >= 0 && *bisect <= 1) {
			return errors.New("--teacher-tool and --teacher-bisect are probabilities in [0, 1]")
		}
		ex, err := env.GenerateDemos(context.Background(), env.DemoSpec{Tasks: spec.Tasks, N: *n, Difficulties: spec.Difficulties,
			Seed: *seed, Demos: *style == "tool", UseTool: *useTool, Bisect: *bisect, MaxTurns: *maxTurns})
		if err != nil {
			return err
		}
		return data.Write(*out, ex)
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

func runDataShow(args []string, stdout io.Writer, usage string) error {
	fs := newDataFlags("show", usage)
	n := fs.Int("n", 5, "examples to show")
	path, help, err := parseWithPath(fs, args)
	if help || err != nil {
		return err
	}
	if path == "" {
		return errors.New("usage: keel data show FILE [--n N]")
	}
	ex, err := data.Read(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	for i, e := range ex[:max(0, min(*n, len(ex)))] {
		id := ""
		if e.ID != "" {
			id = " id " + e.ID
		}
		fmt.Fprintf(w, "#%d%s %s (difficulty %d) answer %q\n", i, id, e.Task, e.Difficulty, e.Answer)
		for _, m := range e.Chat() {
			fmt.Fprintf(w, "  %s: %s\n", m.Role, indent(m.Content))
		}
		if e.Response != "" {
			fmt.Fprintf(w, "  response (%s):\n    %s\n", e.Style, indent(e.Response))
		}
	}
	fmt.Fprintf(w, "%d examples in %s\n", len(ex), path)
	return w.Flush()
}

func indent(s string) string { return strings.ReplaceAll(s, "\n", "\n    ") }

func runDataSolve(args []string, stdout io.Writer, usage string) error {
	fs := newDataFlags("solve", usage)
	style := fs.String("style", "mixed", "solution style: terse, scratch, chain, a comma list, or mixed")
	seed := fs.Uint64("seed", 1, "random seed (the style drawn per row)")
	out := fs.String("out", "", "output file: .jsonl, or .parquet in verl's layout")
	skip := fs.Bool("skip", false, "drop rows that cannot be solved instead of failing")
	path, help, err := parseWithPath(fs, args)
	if help || err != nil {
		return err
	}
	switch {
	case path == "":
		return errors.New("usage: keel data solve FILE --out FILE [--style S]")
	case *out == "":
		return errors.New("--out is required")
	case !strings.HasSuffix(*out, ".jsonl") && !strings.HasSuffix(*out, ".parquet"):
		return fmt.Errorf("--out %s: keel writes .jsonl or .parquet (verl's layout) data sets", *out)
	}
	styles, err := data.ParseStyles(*style)
	if err != nil {
		return fmt.Errorf("--style: %w", err)
	}
	ex, err := data.Read(path)
	if err != nil {
		return err
	}
	solved, err := data.AddResponses(ex, styles, *seed, *skip)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if len(solved) == 0 {
		return fmt.Errorf("%s: no row could be solved", path)
	}
	if err := data.Write(*out, solved); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d of %d rows with reference solutions in %s\n", len(solved), len(ex), *out)
	return nil
}

func runDataScore(args []string, stdout io.Writer, usage string) error {
	fs := newDataFlags("score", usage)
	respPath := fs.String("responses", "", `JSONL of {"response": "..."}, k per row; default: the data's response field`)
	outPath := fs.String("out", "", "write one JSON line per scored response (row, task, truth, extracted answer, verdict) to this file")
	path, help, err := parseWithPath(fs, args)
	if help || err != nil {
		return err
	}
	if path == "" {
		return errors.New("usage: keel data score FILE [--responses FILE.jsonl] [--out VERDICTS.jsonl]")
	}
	ex, err := data.Read(path)
	if err != nil {
		return err
	}
	if err := evaluate.CheckTasks(ex); err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	var resp []string
	if *respPath != "" {
		if resp, err = readResponses(*respPath); err != nil {
			return err
		}
		if len(resp)%len(ex) != 0 {
			return fmt.Errorf("%s: %d responses for the %d rows of %s: want k per row", *respPath, len(resp), len(ex), path)
		}
	} else {
		for i, e := range ex {
			if e.Response == "" {
				return fmt.Errorf("%s: row %d has no response (give --responses FILE)", path, i)
			}
			resp = append(resp, e.Response)
		}
	}
	k := len(resp) / len(ex)
	type tally struct{ right, n float64 }
	groups := map[string]*tally{}
	add := func(key string, r float64) {
		t := groups[key]
		if t == nil {
			t = &tally{}
			groups[key] = t
		}
		t.right += r
		t.n++
	}
	var verdicts []verdict
	for i, r := range resp {
		e := ex[i/k]
		s := tasks.Score(e.Task, e.Answer, r)
		add("all", s)
		add(e.Task, s)
		add(fmt.Sprintf("%s d%d", e.Task, e.Difficulty), s)
		if *outPath != "" {
			got, ok := tasks.Extract(e.Task, r)
			verdicts = append(verdicts, verdict{Row: i / k, Sample: i % k, ID: e.ID, Task: e.Task,
				Truth: e.Answer, Extracted: got, ExtractOK: ok, Verdict: s})
		}
	}
	if *outPath != "" {
		if err := writeVerdicts(*outPath, verdicts); err != nil {
			return err
		}
	}
	keys := make([]string, 0, len(groups))
	for key := range groups {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(a, b int) bool {
		if (keys[a] == "all") != (keys[b] == "all") {
			return keys[a] == "all"
		}
		return keys[a] < keys[b]
	})
	w := bufio.NewWriter(stdout)
	fmt.Fprintf(w, "%d rows, %d response(s) each\n", len(ex), k)
	width := 16 // long data_source names widen the column
	for _, key := range keys {
		width = max(width, len(key))
	}
	for _, key := range keys {
		t := groups[key]
		fmt.Fprintf(w, "%-*s %6.0f/%-6.0f accuracy %.3f\n", width, key, t.right, t.n, t.right/t.n)
	}
	return w.Flush()
}

// verdict is one line of keel data score --out: a scored response and
// what its verifier read from it.
type verdict struct {
	Row    int    `json:"row"`    // the data row, from 0
	Sample int    `json:"sample"` // the response's index among the row's k
	ID     string `json:"id,omitempty"`
	Task   string `json:"task"`
	Truth  string `json:"truth"` // the ground truth
	// Extracted is the final answer the verifier read; ExtractOK is false
	// when there was none or the verifier refused the response (boxed
	// answers that disagree).
	Extracted string  `json:"extracted"`
	ExtractOK bool    `json:"extracted_ok"`
	Verdict   float64 `json:"verdict"` // the reward: 1 right, 0 wrong
}

// writeVerdicts writes verdicts as JSONL, crash safe.
func writeVerdicts(path string, vs []verdict) error {
	return atomicfile.Write(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		for i := range vs {
			if err := enc.Encode(&vs[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// readResponses reads a JSONL file of {"response": "..."} objects; an
// error names the file and line.
func readResponses(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for i, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r struct {
			Response *string `json:"response"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("%s:%d: invalid JSON object: %v", path, i+1, err)
		}
		if r.Response == nil {
			return nil, fmt.Errorf(`%s:%d: missing field "response"`, path, i+1)
		}
		out = append(out, *r.Response)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no responses", path)
	}
	return out, nil
}
