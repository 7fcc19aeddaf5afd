package run

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/safetensors"
)

// Checkpoint is what a run needs to resume exactly: the step reached, the
// model (float32 master weights), the optimiser and the loop's own state
// (random generator, data position, ...), which the loop encodes as JSON.
type Checkpoint struct {
	Step  int
	Model *model.Model
	Optim *OptimState     // nil when the run has no optimiser state
	State json.RawMessage // nil or any JSON value
}

// OptimState is an AdamW optimiser's state as plain data, whatever engine
// kept it: the steps taken, the two moments (one entry per element of the
// model's arena, in its order) and the hyper-parameters as the trainer
// encodes them (JSON, kept verbatim). A checkpoint stores it in
// optim.safetensors (tensors adamw.m and adamw.v, metadata step and
// config).
type OptimState struct {
	Step   int64
	M, V   []float32
	Config json.RawMessage
}

// ErrNoCheckpoint is returned by LoadLatest when root holds no complete
// checkpoint.
var ErrNoCheckpoint = errors.New("no checkpoint")

const (
	latestFile   = "latest"
	completeFile = "COMPLETE"
	optimFile    = "optim.safetensors"
	stateFile    = "state.json"
)

// StepDir is the name of step's checkpoint directory.
func StepDir(step int) string { return fmt.Sprintf("step-%08d", step) }

// SaveCheckpoint writes c to root/step-NNNNNNNN (a Hugging Face model
// directory plus optim.safetensors and state.json) and points root/latest
// at it, crash safe: everything is written into a temporary directory,
// fsynced, marked complete and renamed into place, and only then is latest
// replaced. A crash at any moment leaves the previous checkpoint intact and
// latest pointing at a complete one. keep > 0 deletes all but the newest
// keep checkpoints afterwards. It returns the checkpoint's directory.
func SaveCheckpoint(root string, c *Checkpoint, keep int) (string, error) {
	if c.Model == nil {
		return "", errors.New("checkpoint: no model")
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	name := StepDir(c.Step)
	final := filepath.Join(root, name)
	tmp := filepath.Join(root, ".tmp-"+name)
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := model.Save(tmp, c.Model, "f32"); err != nil {
		return "", err
	}
	if c.Optim != nil {
		if err := saveOptim(filepath.Join(tmp, optimFile), c.Optim); err != nil {
			return "", err
		}
	}
	state := c.State
	if state == nil {
		state = json.RawMessage("null")
	}
	meta, err := json.Marshal(struct {
		Step  int             `json:"step"`
		State json.RawMessage `json:"state"`
	}{c.Step, state})
	if err != nil {
		return "", fmt.Errorf("checkpoint state: %w", err)
	}
	if err := writeFile(filepath.Join(tmp, stateFile), meta); err != nil {
		return "", err
	}
	if err := writeFile(filepath.Join(tmp, completeFile), []byte(name+"\n")); err != nil {
		return "", err
	}
	if err := os.RemoveAll(final); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	syncDir(root)
	if err := writeFile(filepath.Join(root, latestFile), []byte(name+"\n")); err != nil {
		return "", err
	}
	if keep > 0 {
		if err := prune(root, keep); err != nil {
			return final, err
		}
	}
	return final, nil
}

func writeFile(path string, b []byte) error {
	return atomicfile.Write(path, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// saveOptim stores the optimiser's moments as float32 tensors and its step
// and hyper-parameters as metadata.
func saveOptim(path string, o *OptimState) error {
	if len(o.M) != len(o.V) {
		return fmt.Errorf("checkpoint: optimiser state has %d first and %d second moments", len(o.M), len(o.V))
	}
	if !json.Valid(o.Config) {
		return fmt.Errorf("checkpoint: optimiser configuration %.60q is not JSON", o.Config)
	}
	n := len(o.M)
	ts := []safetensors.Tensor{
		{Name: "adamw.m", Shape: []int{n}, Data: o.M},
		{Name: "adamw.v", Shape: []int{n}, Data: o.V},
	}
	meta := map[string]string{"step": strconv.FormatInt(o.Step, 10), "config": string(o.Config)}
	return safetensors.WriteFile(path, ts, safetensors.F32, meta)
}

// loadOptim reads the optimiser state saved for m.
func loadOptim(path string, m *model.Model) (*OptimState, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	meta := f.Metadata()
	cfg := []byte(meta["config"])
	var obj map[string]any
	if err := json.Unmarshal(cfg, &obj); err != nil {
		return nil, fmt.Errorf("%s: metadata config: %v", path, err)
	}
	step, err := strconv.ParseInt(meta["step"], 10, 64)
	if err != nil || step < 0 {
		return nil, fmt.Errorf("%s: metadata step %q is not a step count", path, meta["step"])
	}
	n := len(m.Arena)
	o := &OptimState{Step: step, M: make([]float32, n), V: make([]float32, n), Config: cfg}
	for _, t := range []struct {
		name string
		dst  []float32
	}{{"adamw.m", o.M}, {"adamw.v", o.V}} {
		info, ok := f.Info(t.name)
		if !ok {
			return nil, fmt.Errorf("%s: tensor %s is missing", path, t.name)
		}
		if info.NumElements() != int64(len(t.dst)) {
			return nil, fmt.Errorf("%s: tensor %s has %d elements, the model has %d parameters", path, t.name, info.NumElements(), len(t.dst))
		}
		if err := f.ReadFloat32(t.name, t.dst); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// LoadLatest loads the checkpoint root/latest points at. If latest is
// missing or points at an incomplete directory (a crash between the rename
// and the pointer update, or a deleted directory), it falls back to the
// newest complete step-* directory. It returns ErrNoCheckpoint (wrapped)
// when there is none.
func LoadLatest(root string) (*Checkpoint, error) {
	if b, err := os.ReadFile(filepath.Join(root, latestFile)); err == nil {
		name := strings.TrimSpace(string(b))
		if isStepDir(name) && complete(filepath.Join(root, name)) {
			return Load(filepath.Join(root, name))
		}
	}
	steps, err := completeSteps(root)
	if err != nil {
		return nil, err
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("%s: %w", root, ErrNoCheckpoint)
	}
	return Load(filepath.Join(root, steps[len(steps)-1]))
}

// HasCheckpoint reports whether root holds a complete checkpoint, without
// loading it.
func HasCheckpoint(root string) bool {
	steps, err := completeSteps(root)
	return err == nil && len(steps) > 0
}

// Load reads one checkpoint directory written by SaveCheckpoint.
func Load(dir string) (*Checkpoint, error) {
	if !complete(dir) {
		return nil, fmt.Errorf("%s: incomplete checkpoint (no %s marker)", dir, completeFile)
	}
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	var meta struct {
		Step  *int            `json:"step"`
		State json.RawMessage `json:"state"`
	}
	if err := json.Unmarshal(b, &meta); err != nil || meta.Step == nil {
		return nil, fmt.Errorf("%s: %s is not a checkpoint state (%v)", dir, stateFile, err)
	}
	m, err := model.Load(dir)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Step: *meta.Step, Model: m}
	if string(meta.State) != "null" {
		c.State = meta.State
	}
	if _, err := os.Stat(filepath.Join(dir, optimFile)); err == nil {
		if c.Optim, err = loadOptim(filepath.Join(dir, optimFile), m); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func isStepDir(name string) bool {
	rest, ok := strings.CutPrefix(name, "step-")
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}

func complete(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, completeFile))
	return err == nil
}

// completeSteps lists root's complete checkpoint directories, oldest first.
func completeSteps(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && isStepDir(e.Name()) && complete(filepath.Join(root, e.Name())) {
			names = append(names, e.Name())
		}
	}
	sort.Slice(names, func(i, j int) bool {
		a, _ := strconv.Atoi(names[i][5:])
		b, _ := strconv.Atoi(names[j][5:])
		return a < b
	})
	return names, nil
}

// prune deletes all but the newest keep complete checkpoints, and stray
// temporary directories of interrupted saves.
func prune(root string, keep int) error {
	names, err := completeSteps(root)
	if err != nil {
		return err
	}
	for i := 0; i+keep < len(names); i++ {
		if err := os.RemoveAll(filepath.Join(root, names[i])); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), ".tmp-step-") {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
