package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/device"
)

func init() {
	register(command{
		name:    "logprobs",
		summary: "score token sequences: per-token log-probabilities (and MoE routes)",
		run:     runLogprobs,
	})
}

// lpInput is one input line.
type lpInput struct {
	Tokens *[]int32 `json:"tokens"`
}

// lpOutput is one output line. Routes[pos][layer] holds the k experts of
// position pos in the layer-th MoE layer (decoder layers that are MoE, in
// order), in descending router probability.
type lpOutput struct {
	LogProbs []float32 `json:"logprobs"`
	Routes   [][][]int `json:"routes,omitempty"`
}

const lpUsage = `usage: keel logprobs --model DIR --input FILE.jsonl [--output FILE] [--batch-tokens N] [--device cpu|cuda] [--precision fp32|bf16]

Scores every sequence of FILE.jsonl (one {"tokens": [ids]} object per line)
with the training engine in float32 and writes one line per input line:
{"logprobs": [...]} where logprobs[i] = log p(tokens[i+1] | tokens[0..i]),
plus, for MoE models, "routes": routes[pos][layer] = the k expert ids chosen
at that position in that MoE layer (MoE layers only, in model order), in
descending router probability. Blank input lines are skipped.

flags:
`

func runLogprobs(args []string) error {
	fs := flag.NewFlagSet("logprobs", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), lpUsage)
		fs.PrintDefaults()
	}
	dir := fs.String("model", "", "Hugging Face model directory (config.json, model.safetensors)")
	in := fs.String("input", "", "JSONL file of {\"tokens\": [ids]} lines")
	out := fs.String("output", "", "output JSONL file (default: standard output)")
	batchTokens := fs.Int("batch-tokens", 8192, "tokens per forward pass (sequences are never split)")
	dev := fs.String("device", "cpu", "the training engine's device: cpu, cuda or cuda:N")
	prec := fs.String("precision", "fp32", "the engine's products: fp32, or bf16 (GPU)")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *dir == "":
		return errors.New("--model is required")
	case *in == "":
		return errors.New("--input is required")
	case *batchTokens <= 0:
		return fmt.Errorf("--batch-tokens = %d, want > 0", *batchTokens)
	}
	if err := (device.Options{Device: *dev, Precision: *prec}).Check(); err != nil {
		return fmt.Errorf("--device %s --precision %s: %w", *dev, *prec, err)
	}
	m, err := model.Load(*dir)
	if err != nil {
		return err
	}
	seqs, err := lpReadInput(*in, &m.Config)
	if err != nil {
		return err
	}
	if *dev == "cpu" && *prec == "fp32" {
		return writeOutput(*out, func(w io.Writer) error { return lpScore(w, m, seqs, *batchTokens) })
	}
	eng, err := device.Trainer(device.Options{Device: *dev, Precision: *prec}, m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		return err
	}
	defer eng.Close()
	return writeOutput(*out, func(w io.Writer) error { return lpScoreOn(w, eng, m, seqs, *batchTokens) })
}

// lpReadInput reads and validates every line before any work, so that a bad
// line fails fast with its file and line number.
func lpReadInput(path string, cfg *model.Config) ([][]int32, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var seqs [][]int32
	for line := 1; ; line++ {
		b, err := r.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if len(bytes.TrimSpace(b)) > 0 {
			seq, perr := lpParseLine(b, cfg)
			if perr != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line, perr)
			}
			seqs = append(seqs, seq)
		}
		if err == io.EOF {
			break
		}
	}
	if len(seqs) == 0 {
		return nil, fmt.Errorf("%s: no sequences", path)
	}
	return seqs, nil
}

func lpParseLine(b []byte, cfg *model.Config) ([]int32, error) {
	var in lpInput
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("invalid JSON object: %v", err)
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value on the line")
	}
	if in.Tokens == nil {
		return nil, errors.New(`missing field "tokens" (want {"tokens": [ids]})`)
	}
	toks := *in.Tokens
	if len(toks) == 0 {
		return nil, errors.New(`field "tokens" is empty`)
	}
	for i, id := range toks {
		if id < 0 || int(id) >= cfg.VocabSize {
			return nil, fmt.Errorf(`field "tokens"[%d]: token %d out of the vocabulary [0, %d)`, i, id, cfg.VocabSize)
		}
	}
	if cfg.MaxPositionEmbeddings > 0 && len(toks) > cfg.MaxPositionEmbeddings {
		return nil, fmt.Errorf(`field "tokens": %d tokens, more than max_position_embeddings = %d`, len(toks), cfg.MaxPositionEmbeddings)
	}
	return toks, nil
}

// lpScore runs the sequences through the CPU training engine in batches
// of about batchTokens tokens and writes one JSON line per sequence, in
// input order. The engine is batch invariant, so the batching does not
// change any value.
func lpScore(w io.Writer, m *model.Model, seqs [][]int32, batchTokens int) error {
	return lpScoreOn(w, train.New(m), m, seqs, batchTokens)
}

// lpScoreOn is lpScore with the engine eng.
func lpScoreOn(w io.Writer, eng train.Trainer, m *model.Model, seqs [][]int32, batchTokens int) error {
	moe := len(m.Config.MoELayers()) > 0
	enc := json.NewEncoder(w)
	for lo := 0; lo < len(seqs); {
		hi, n := lo, 0
		for hi < len(seqs) && (hi == lo || n+len(seqs[hi]) <= batchTokens) {
			n += len(seqs[hi])
			hi++
		}
		res, err := eng.Forward(seqs[lo:hi], train.ForwardOptions{Record: moe, NoEntropy: true})
		if err != nil {
			return err
		}
		for s := range res.LogProbs {
			o := lpOutput{LogProbs: res.LogProbs[s]}
			if moe {
				o.Routes = res.Routes[s].Nested()
			}
			if err := enc.Encode(o); err != nil {
				return err
			}
		}
		lo = hi
	}
	return nil
}
