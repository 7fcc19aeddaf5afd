package model

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/keel-rl/keel/safetensors"
)

// ConfigFileName is the Hugging Face model configuration file name.
const ConfigFileName = "config.json"

// Load reads a Hugging Face model directory: config.json and the weights in
// model.safetensors or in the shards of model.safetensors.index.json, in
// F32, BF16 or F16 (converted to float32). Every tensor of the model must
// be present with its exact shape and no other tensor may be (a tied model
// may still carry lm_head.weight, which is then checked and ignored, and
// rotary inv_freq buffers some exporters add are ignored). Errors name the
// tensor and the file.
func Load(dir string) (*Model, error) {
	cfg, err := ReadConfig(filepath.Join(dir, ConfigFileName))
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	// Compare sizes before allocating, so a config.json that does not belong
	// to these weights (say, a huge vocab_size) fails without first
	// allocating its whole arena. Smaller gaps (a missing tensor) get the
	// precise per-tensor errors below.
	var have int64
	for _, name := range ck.Names() {
		info, _, _ := ck.Info(name)
		have += info.NumElements()
	}
	if need, _ := cfg.paramCount(); need > 2*have+1<<24 {
		return nil, fmt.Errorf("%s: %s describes %d parameters but the checkpoint holds only %d values: config and weights do not match",
			dir, ConfigFileName, need, have)
	}
	m := New(cfg)
	want := map[string]*Param{}
	for _, p := range m.Params() {
		want[p.Name] = p
	}
	for _, name := range ck.Names() {
		info, file, _ := ck.Info(name)
		p, ok := want[name]
		switch {
		case ok:
		case name == "lm_head.weight" && cfg.TieWordEmbeddings:
			p = m.Embed // shape check only
		case strings.HasSuffix(name, ".rotary_emb.inv_freq"):
			continue
		default:
			return nil, fmt.Errorf("%s: unexpected tensor %q: %s has no such parameter", file, name, describe(cfg))
		}
		if !slices.Equal(info.Shape, p.Shape) {
			return nil, fmt.Errorf("%s: tensor %q has shape %v, want %v for this config", file, name, info.Shape, p.Shape)
		}
		if name == "lm_head.weight" && cfg.TieWordEmbeddings {
			continue
		}
		if err := ck.ReadFloat32(name, p.Data); err != nil {
			return nil, err
		}
		delete(want, name)
	}
	if len(want) > 0 {
		var missing []string
		for n := range want {
			missing = append(missing, n)
		}
		slices.Sort(missing)
		more := ""
		if len(missing) > 3 {
			more = fmt.Sprintf(" and %d more", len(missing)-3)
			missing = missing[:3]
		}
		return nil, fmt.Errorf("%s: checkpoint is missing tensor %s%s", dir, strings.Join(quote(missing), ", "), more)
	}
	return m, nil
}

func quote(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = fmt.Sprintf("%q", x)
	}
	return out
}

func describe(c Config) string {
	if c.Architecture == ArchQwen3MoE {
		return fmt.Sprintf("%s with %d layers and %d experts", c.Architecture, c.NumHiddenLayers, c.NumExperts)
	}
	return fmt.Sprintf("%s with %d layers", c.Architecture, c.NumHiddenLayers)
}

// SaveOptions controls Save.
type SaveOptions struct {
	// DType of the stored weights: "f32" (default) or "bf16" (rounded to
	// nearest even; the in-memory model is unchanged).
	DType string
	// MaxShardBytes, when positive, splits the weights into shards of at
	// most this many bytes with a model.safetensors.index.json, as
	// transformers does for large models. Zero writes one model.safetensors.
	MaxShardBytes int64
}

// Save writes m to dir (created if needed) as a Hugging Face model
// directory: config.json and model.safetensors, in dtype "f32" or "bf16".
func Save(dir string, m *Model, dtype string) error {
	return SaveWith(dir, m, SaveOptions{DType: dtype})
}

// SaveWith is Save with options. Each file is written atomically (temporary
// file, fsync, rename): the weights first, config.json last. Weight files
// of the other layout left from an earlier save into dir (a single file
// after a sharded save or the reverse, and stale shards) are removed once
// the new weights are in place. A tied LM head is not stored, as
// transformers does.
func SaveWith(dir string, m *Model, opt SaveOptions) error {
	var dt safetensors.DType
	var torchDType string
	switch strings.ToLower(opt.DType) {
	case "", "f32", "float32":
		dt, torchDType = safetensors.F32, "float32"
	case "bf16", "bfloat16":
		dt, torchDType = safetensors.BF16, "bfloat16"
	default:
		return fmt.Errorf("save %s: dtype %q is not supported (f32 or bf16)", dir, opt.DType)
	}
	if err := m.Config.Validate(); err != nil {
		return fmt.Errorf("save %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ts := make([]safetensors.Tensor, 0, len(m.Params()))
	for _, p := range m.Params() {
		ts = append(ts, safetensors.Tensor{Name: p.Name, Shape: p.Shape, Data: p.Data})
	}
	meta := map[string]string{"format": "pt"}
	keep := map[string]bool{}
	if opt.MaxShardBytes > 0 {
		names, err := safetensors.WriteSharded(dir, ts, dt, opt.MaxShardBytes, meta)
		if err != nil {
			return err
		}
		for _, n := range names {
			keep[n] = true
		}
		keep[safetensors.IndexFileName] = true
	} else {
		if err := safetensors.WriteFile(filepath.Join(dir, safetensors.SingleFileName), ts, dt, meta); err != nil {
			return err
		}
		keep[safetensors.SingleFileName] = true
	}
	if err := removeStaleWeights(dir, keep); err != nil {
		return err
	}
	return m.Config.WriteFile(filepath.Join(dir, ConfigFileName), torchDType)
}

// removeStaleWeights deletes the weight files of dir that keep does not
// list: model.safetensors, its index and model-*-of-*.safetensors shards.
func removeStaleWeights(dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		weights := n == safetensors.SingleFileName || n == safetensors.IndexFileName ||
			(strings.HasPrefix(n, "model-") && strings.Contains(n, "-of-") && strings.HasSuffix(n, ".safetensors"))
		if !weights || keep[n] || e.IsDir() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
