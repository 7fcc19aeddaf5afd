package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/keel-rl/keel/internal/sysmem"
	"github.com/keel-rl/keel/model"
)

func init() {
	register(command{
		name:    "init",
		summary: "create a randomly initialised model from a preset (config.json + model.safetensors)",
		run:     func(args []string) error { return runInit(args, os.Stdout) },
	})
}

const initUsage = `usage: keel init --preset NAME --vocab N --out DIR [--layers N] [--seed S] [--dtype f32|bf16] [--force]

Writes a Hugging Face model directory (config.json, model.safetensors) holding
a freshly initialised Qwen3 or Qwen3-MoE model: normal(0, 0.02) weights,
residual output projections scaled by 1/sqrt(2·layers), norms at 1. The same
seed gives the same bits on every machine. DIR must be empty or absent unless
--force is given. --layers changes the preset's number of decoder layers (for
instance a few-layer qwen3-30b-a3b, whose 48 layers hold 30.5 billion
parameters); the weights are allocated in memory in float32 before they are
written.

presets: %s

flags:
`

func runInit(args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("init", flag.ContinueOnError)
	fset.Usage = func() {
		fmt.Fprintf(fset.Output(), initUsage, strings.Join(model.PresetNames(), ", "))
		fset.PrintDefaults()
	}
	preset := fset.String("preset", "", "model preset: "+strings.Join(model.PresetNames(), ", "))
	vocab := fset.Int("vocab", 0, "vocabulary size (the tokenizer's)")
	layers := fset.Int("layers", 0, "number of decoder layers (0: the preset's)")
	seed := fset.Uint64("seed", 1, "random seed")
	out := fset.String("out", "", "output directory")
	dtype := fset.String("dtype", "f32", "stored weight type: f32 or bf16")
	force := fset.Bool("force", false, "write into a non-empty directory, replacing its model files")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case fset.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fset.Arg(0))
	case *preset == "":
		return fmt.Errorf("--preset is required (one of %s)", strings.Join(model.PresetNames(), ", "))
	case *vocab <= 0:
		return fmt.Errorf("--vocab is required and must be positive, got %d", *vocab)
	case *out == "":
		return errors.New("--out is required")
	case *dtype != "f32" && *dtype != "bf16":
		return fmt.Errorf("--dtype %q: want f32 or bf16", *dtype)
	}
	cfg, err := initConfig(*preset, *vocab, *layers)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(*out)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case len(entries) > 0 && !*force:
		return fmt.Errorf("%s is not empty; use --force to overwrite its model files", *out)
	}
	if n, err := cfg.NumParams(); err == nil {
		if mem, ok := sysmem.Total(); ok && uint64(n)*4 > mem {
			return fmt.Errorf("--preset %s with %d layers has %s parameters: %.1f GB in float32, more than this machine's %.1f GB of memory (use --layers to make fewer)",
				*preset, cfg.NumHiddenLayers, groupDigits(int(n)), float64(n)*4/1e9, float64(mem)/1e9)
		}
	}
	m := model.New(cfg)
	model.Init(m, *seed)
	if err := model.Save(*out, m, *dtype); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (%s, %d layers, vocab %d) to %s: %s parameters, %s weights, seed %d\n",
		*preset, cfg.Architecture, cfg.NumHiddenLayers, cfg.VocabSize, *out, groupDigits(m.NumParams()), *dtype, *seed)
	return nil
}

// initConfig returns the configuration keel init writes: the preset with
// the vocabulary and, when layers is not 0, that many decoder layers.
func initConfig(preset string, vocab, layers int) (model.Config, error) {
	if layers < 0 {
		return model.Config{}, fmt.Errorf("--layers must be positive (or 0 for the preset's), got %d", layers)
	}
	cfg, err := model.Preset(preset, vocab)
	if err != nil {
		return model.Config{}, err
	}
	if layers > 0 {
		cfg.NumHiddenLayers = layers
		if err := cfg.Validate(); err != nil {
			return model.Config{}, fmt.Errorf("--layers %d: %w", layers, err)
		}
	}
	return cfg, nil
}

// groupDigits formats n with thousands separators: 1234567 -> "1,234,567".
func groupDigits(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
