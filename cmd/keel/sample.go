package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	rolldevice "github.com/keel-rl/keel/rollout/device"
	"github.com/keel-rl/keel/tokenizer"
)

func init() {
	register(command{
		name:    "sample",
		summary: "generate responses with the rollout engine (log-probs, routes, precision modes)",
		run:     runSample,
	})
}

const sampleUsage = `usage: keel sample --model DIR --input FILE.jsonl [-n N] [--precision MODE] [flags]

Generates n responses per prompt with the rollout engine (KV cache,
continuous batching). FILE.jsonl holds one {"tokens": [ids]} prompt per
line. Each output line is one sample:
{"prompt": i, "sample": j, "tokens": [...], "logprobs": [...],
 "trunc_logprobs": [...] (with top-k / top-p), "routes": routes[pos][layer]
 (MoE: every position of prompt and response), "finish": "stop"|"length",
 "version": weight version}.
logprobs are log mu under the full softmax at the sampling temperature.

flags:
`

// sampleFlags are the sampling settings shared by sample and probe.
type sampleFlags struct {
	n, topK, maxNew, slots int
	temp, topP             float64
	stop                   string
	seed                   uint64
}

func (s *sampleFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&s.n, "n", 1, "samples per prompt")
	fs.Float64Var(&s.temp, "temperature", 1, "sampling temperature (0: greedy)")
	fs.IntVar(&s.topK, "top-k", 0, "keep the k most probable tokens (0: off)")
	fs.Float64Var(&s.topP, "top-p", 1, "keep the smallest set of tokens with this much probability (1: off)")
	fs.IntVar(&s.maxNew, "max-new-tokens", 128, "longest response")
	fs.StringVar(&s.stop, "stop", "", "comma-separated stop token ids")
	fs.Uint64Var(&s.seed, "seed", 1, "random seed (samples depend on it alone)")
	fs.IntVar(&s.slots, "slots", 64, "sequences decoded concurrently")
}

func (s *sampleFlags) sampling() (rollout.Sampling, error) {
	sp := rollout.Sampling{Temperature: s.temp, TopK: s.topK, TopP: s.topP, MaxNewTokens: s.maxNew, Seed: s.seed}
	if s.slots < 1 {
		return sp, fmt.Errorf("--slots = %d, want at least 1", s.slots)
	}
	for _, f := range strings.Split(s.stop, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		id, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return sp, fmt.Errorf("--stop: %q is not a token id", f)
		}
		sp.Stop = append(sp.Stop, int32(id))
	}
	return sp, nil
}

// engineOptions sizes an engine for the prompts: room for the longest
// prompt plus max-new-tokens, within the model's positions.
func (s *sampleFlags) engineOptions(cfg *model.Config, prompts [][]int32, p rollout.Precision) rollout.Options {
	longest := 0
	for _, q := range prompts {
		longest = max(longest, len(q))
	}
	maxLen := longest + s.maxNew
	if cfg.MaxPositionEmbeddings > 0 {
		maxLen = min(maxLen, cfg.MaxPositionEmbeddings)
	}
	return rollout.Options{Precision: p, Slots: max(1, min(s.slots, len(prompts)*s.n)), MaxLen: max(maxLen, 2)}
}

type sampleOutput struct {
	Prompt        int       `json:"prompt"`
	Sample        int       `json:"sample"`
	Tokens        []int32   `json:"tokens"`
	LogProbs      []float32 `json:"logprobs"`
	TruncLogProbs []float32 `json:"trunc_logprobs,omitempty"`
	Routes        [][][]int `json:"routes,omitempty"`
	Finish        string    `json:"finish"`
	Version       int64     `json:"version"`
	Text          string    `json:"text,omitempty"` // the decoded response (with --prompt)
}

func runSample(args []string) error {
	fs := flag.NewFlagSet("sample", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), sampleUsage)
		fs.PrintDefaults()
	}
	dir := fs.String("model", "", "Hugging Face model directory")
	in := fs.String("input", "", `JSONL file of {"tokens": [ids]} prompts`)
	prompt := fs.String("prompt", "", "a prompt as text (needs the model directory's tokenizer.json)")
	out := fs.String("output", "", "output JSONL file (default: standard output)")
	prec := fs.String("precision", "exact", "exact, fp32, bf16, fp8 or fp4")
	device := fs.String("device", "cpu", "where the engine decodes: cpu, cuda or cuda:N (the GPU runs exact, bf16, fp8 and fp4; not the CPU's fp32)")
	var sf sampleFlags
	sf.register(fs)
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *dir == "":
		return errors.New("--model is required")
	case *in == "" && *prompt == "":
		return errors.New("--input or --prompt is required")
	case *in != "" && *prompt != "":
		return errors.New("give --input or --prompt, not both")
	}
	p, err := rollout.ParsePrecision(*prec)
	if err != nil {
		return fmt.Errorf("--precision: %w", err)
	}
	if err := rolldevice.Check(*device, p); err != nil {
		return fmt.Errorf("--device: %w", err)
	}
	sp, err := sf.sampling()
	if err != nil {
		return err
	}
	m, err := model.Load(*dir)
	if err != nil {
		return err
	}
	var prompts [][]int32
	var tok *tokenizer.Tokenizer
	if *prompt != "" {
		if tok, err = tokenizer.Load(*dir); err == nil {
			if id, ok := tok.ID(tokenizer.ImEnd); ok {
				sp.Stop = append(sp.Stop, id)
			}
		}
		if prompts, err = textPrompts(*dir, *prompt); err != nil {
			return err
		}
	} else if prompts, err = lpReadInput(*in, &m.Config); err != nil {
		return err
	}
	e, err := rolldevice.Engine(*device, m, sf.engineOptions(&m.Config, prompts, p))
	if err != nil {
		return err
	}
	defer e.Close()
	samples, err := e.Generate(prompts, sf.n, sp)
	if err != nil {
		return err
	}
	write := func(w io.Writer) error {
		enc := json.NewEncoder(w)
		for _, s := range samples {
			o := sampleOutput{Prompt: s.Prompt, Sample: s.Index, Tokens: s.Tokens, LogProbs: s.LogProbs,
				TruncLogProbs: s.TruncLogProbs, Finish: s.Finish, Version: s.Version}
			if s.Routes != nil {
				o.Routes = s.Routes.Nested()
			}
			if tok != nil {
				o.Text = tok.DecodeLenient(s.Tokens)
			}
			if err := enc.Encode(o); err != nil {
				return err
			}
		}
		return nil
	}
	return writeOutput(*out, write)
}

// textPrompts tokenizes a text prompt with the model directory's
// tokenizer, as a ChatML user turn ready for the assistant's answer.
func textPrompts(dir, text string) ([][]int32, error) {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("--prompt needs a tokenizer.json in %s; give token ids with --input", dir)
		}
		return nil, err
	}
	return [][]int32{tok.Encode(tokenizer.UserPrompt(text))}, nil
}
