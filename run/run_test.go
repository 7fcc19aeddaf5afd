package run

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

func TestMetricsAppendAndTornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	l, err := OpenMetrics(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 3; s++ {
		if err := l.Write(map[string]any{"step": s, "loss": 1.0 / float64(s), "nan": math.NaN()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if want := `{"loss":1,"nan":null,"step":1}` + "\n"; !strings.HasPrefix(string(b), want) {
		t.Fatalf("first line %q, want %q", strings.SplitAfter(string(b), "\n")[0], want)
	}
	// A crash in the middle of a write leaves a torn line.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"step":4,"lo`)
	f.Close()
	if recs, err := ReadMetrics(path); err != nil || len(recs) != 3 {
		t.Fatalf("ReadMetrics with a torn line: %d records, %v", len(recs), err)
	}
	l, err = OpenMetrics(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(map[string]any{"step": 4})
	l.Close()
	recs, err := ReadMetrics(path)
	if err != nil || len(recs) != 4 || recs[3]["step"] != 4.0 {
		t.Fatalf("after reopening: %v, %v", recs, err)
	}
	// Resuming from the checkpoint of step 2 drops steps 3 and 4.
	l, err = OpenMetrics(path, 2)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(map[string]any{"step": 3, "again": true})
	l.Close()
	recs, _ = ReadMetrics(path)
	if len(recs) != 3 || recs[2]["again"] != true {
		t.Fatalf("after resuming at step 2: %v", recs)
	}
}

func TestMetricsRejectsForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	os.WriteFile(path, []byte("{\"step\":1}\nhello world\n"), 0o644)
	_, err := OpenMetrics(path, -1)
	if err == nil || !strings.Contains(err.Error(), "metrics.jsonl:2") {
		t.Fatalf("err = %v, want one naming line 2", err)
	}
	if b, _ := os.ReadFile(path); len(b) != 23 {
		t.Fatalf("the file was modified: %q", b)
	}
}

func testModel(t *testing.T) *model.Model {
	cfg, err := model.Preset("tiny-moe", 32)
	if err != nil {
		t.Fatal(err)
	}
	m := model.New(cfg)
	model.Init(m, 7)
	return m
}

func TestCheckpointRoundTrip(t *testing.T) {
	root := filepath.Join(t.TempDir(), "checkpoints")
	m := testModel(t)
	o := &OptimState{Step: 2, M: make([]float32, len(m.Arena)), V: make([]float32, len(m.Arena)),
		Config: json.RawMessage(`{"Beta1":0.8,"Beta2":0.95}`)}
	for i := range o.M {
		o.M[i] = float32(math.Sin(float64(i)))
		o.V[i] = float32(math.Cos(float64(i)) * math.Cos(float64(i)))
	}
	state := json.RawMessage(`{"rng":[1,2,3],"cursor":17}`)
	if _, err := SaveCheckpoint(root, &Checkpoint{Step: 2, Model: m, Optim: o, State: state}, 0); err != nil {
		t.Fatal(err)
	}
	c, err := LoadLatest(root)
	if err != nil {
		t.Fatal(err)
	}
	if c.Step != 2 || string(c.State) != string(state) {
		t.Fatalf("step %d state %s", c.Step, c.State)
	}
	for i := range m.Arena {
		if c.Model.Arena[i] != m.Arena[i] || c.Optim.M[i] != o.M[i] || c.Optim.V[i] != o.V[i] {
			t.Fatalf("element %d differs after the round trip", i)
		}
	}
	if c.Optim.Step != 2 || string(c.Optim.Config) != string(o.Config) {
		t.Fatalf("optimiser step %d config %s", c.Optim.Step, c.Optim.Config)
	}
	// Moments that do not fit the model, and a configuration that is not
	// JSON, are refused.
	bad := *o
	bad.V = bad.V[1:]
	if _, err := SaveCheckpoint(root, &Checkpoint{Step: 3, Model: m, Optim: &bad}, 0); err == nil {
		t.Fatal("moments of different lengths saved")
	}
	bad = *o
	bad.Config = json.RawMessage("{beta")
	if _, err := SaveCheckpoint(root, &Checkpoint{Step: 3, Model: m, Optim: &bad}, 0); err == nil {
		t.Fatal("a configuration that is not JSON saved")
	}
	small := testModel(t)
	small.Arena = small.Arena[:0]
	if _, err := loadOptim(filepath.Join(root, StepDir(2), optimFile), small); err == nil || !strings.Contains(err.Error(), "adamw.m") {
		t.Fatalf("moments for another model: err = %v", err)
	}
}

// A crash can leave a temporary directory (before the rename) or a latest
// pointer at a deleted directory: loading falls back to the newest
// complete checkpoint, and pruning keeps the newest ones.
func TestCheckpointCrashLeftovers(t *testing.T) {
	root := filepath.Join(t.TempDir(), "checkpoints")
	if _, err := LoadLatest(root); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty root: err = %v", err)
	}
	m := testModel(t)
	for _, s := range []int{5, 10, 15} {
		if _, err := SaveCheckpoint(root, &Checkpoint{Step: s, Model: m}, 2); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, StepDir(5))); !os.IsNotExist(err) {
		t.Errorf("step 5 not pruned")
	}
	// An interrupted save of step 20: no COMPLETE marker, never renamed.
	os.MkdirAll(filepath.Join(root, ".tmp-"+StepDir(20)), 0o755)
	// A save renamed but without the pointer update, and incomplete.
	os.MkdirAll(filepath.Join(root, StepDir(25)), 0o755)
	c, err := LoadLatest(root)
	if err != nil || c.Step != 15 || c.Optim != nil {
		t.Fatalf("LoadLatest = step %v, %v", c, err)
	}
	os.RemoveAll(filepath.Join(root, StepDir(15)))
	c, err = LoadLatest(root)
	if err != nil || c.Step != 10 {
		t.Fatalf("with latest deleted: %v, %v", c, err)
	}
	if _, err := Load(filepath.Join(root, StepDir(25))); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("Load of an incomplete checkpoint: %v", err)
	}
	if _, err := SaveCheckpoint(root, &Checkpoint{Step: 30, Model: m}, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".tmp-"+StepDir(20))); !os.IsNotExist(err) {
		t.Errorf("stray temporary directory not removed")
	}
}
