package sft

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// Recipe is a supervised run, as a YAML file describes it. Unknown keys are
// errors naming the key and line.
type Recipe struct {
	// Out is the run directory: model/ (the result, a Hugging Face model
	// directory with tokenizer.json), metrics.jsonl, checkpoints/.
	Out   string      `yaml:"out"`
	Model ModelSpec   `yaml:"model"`
	Data  DataSpec    `yaml:"data"`
	Train Config      `yaml:"train"`
	Eval  *EvalSpec   `yaml:"eval"`
	Log   LogSettings `yaml:"log"`
}

// ModelSpec is the starting model: a fresh preset or an existing directory.
type ModelSpec struct {
	Path   string `yaml:"path"`    // an existing model directory, or
	Preset string `yaml:"preset"`  // a preset to initialise
	Vocab  int    `yaml:"vocab"`   // fresh models: vocabulary (default 128)
	Seed   uint64 `yaml:"seed"`    // fresh models: initialisation seed
	MaxLen int    `yaml:"max_len"` // fresh models: max_position_embeddings (default 512)
}

// DataSpec is the training data: a file, or generated from the built-in
// tasks.
type DataSpec struct {
	File     string   `yaml:"file"`
	Generate *GenSpec `yaml:"generate"`
}

// GenSpec generates training data from the built-in task families.
type GenSpec struct {
	Tasks      []string `yaml:"tasks"`
	N          int      `yaml:"n"`
	Difficulty string   `yaml:"difficulty"` // "1-3", "2", "1,4"
	Style      string   `yaml:"style"`      // terse, scratch, chain, a comma list, mixed, or tool (episodes of the environments)
	Seed       uint64   `yaml:"seed"`
}

// EvalSpec is the held-out evaluation at the end of the run.
type EvalSpec struct {
	Tasks        []string `yaml:"tasks"` // default: the training tasks
	N            int      `yaml:"n"`     // problems
	Difficulty   string   `yaml:"difficulty"`
	K            int      `yaml:"k"` // samples per problem
	Seed         uint64   `yaml:"seed"`
	MaxNewTokens int      `yaml:"max_new_tokens"`
}

// LogSettings control the metrics log and checkpoints.
type LogSettings struct {
	Every           int `yaml:"every"`            // metrics every N steps (default 10)
	CheckpointEvery int `yaml:"checkpoint_every"` // default 200
	Keep            int `yaml:"keep"`             // checkpoints kept (default 2)
}

// ReadRecipe parses a recipe file strictly.
func ReadRecipe(path string) (*Recipe, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := ParseRecipe(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// ParseRecipe parses recipe YAML: unknown keys and type errors name the
// line; missing required settings are errors.
func ParseRecipe(b []byte) (*Recipe, error) {
	var r Recipe
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty recipe")
		}
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return &r, r.check()
}

func (r *Recipe) check() error {
	if r.Out == "" {
		return errors.New("out: the run directory is required")
	}
	m := &r.Model
	switch {
	case m.Path == "" && m.Preset == "":
		return errors.New("model: give path (an existing model) or preset (a fresh one)")
	case m.Path != "" && m.Preset != "":
		return errors.New("model: give path or preset, not both")
	}
	if m.Vocab == 0 {
		m.Vocab = 128
	}
	if m.MaxLen == 0 {
		m.MaxLen = 512
	}
	d := &r.Data
	switch {
	case d.File == "" && d.Generate == nil:
		return errors.New("data: give file or generate")
	case d.File != "" && d.Generate != nil:
		return errors.New("data: give file or generate, not both")
	}
	if g := d.Generate; g != nil {
		if len(g.Tasks) == 0 || g.N <= 0 {
			return errors.New("data.generate: tasks and n (> 0) are required")
		}
		if g.Difficulty == "" {
			g.Difficulty = "1-3"
		}
		if g.Style == "" {
			g.Style = "mixed"
		}
	}
	r.Train.Defaults()
	if err := r.Train.Validate(); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if e := r.Eval; e != nil {
		if e.N <= 0 {
			e.N = 200
		}
		if e.K <= 0 {
			e.K = 4
		}
		if e.Difficulty == "" {
			e.Difficulty = "1-5"
		}
		if e.MaxNewTokens <= 0 {
			e.MaxNewTokens = 256
		}
		if e.Seed == 0 {
			e.Seed = 1_000_003 // away from the training data's seeds
		}
	}
	if r.Log.Every <= 0 {
		r.Log.Every = 10
	}
	if r.Log.CheckpointEvery <= 0 {
		r.Log.CheckpointEvery = 200
	}
	if r.Log.Keep <= 0 {
		r.Log.Keep = 2
	}
	return nil
}
