package run

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/keel-rl/keel/model"
)

// A session locks its directory, resumes from the newest checkpoint with
// its state, and cuts the metrics log back to that checkpoint.
func TestSessionResume(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	s, err := OpenSession(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Resumed != nil || s.Step() != 0 {
		t.Fatalf("fresh directory resumed from %d", s.Step())
	}
	if _, err := OpenSession(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("second session on a locked directory: %v", err)
	}
	m, err := s.OpenMetrics(true)
	if err != nil {
		t.Fatal(err)
	}
	cfg := model.Config{Architecture: model.ArchQwen3, VocabSize: 8, HiddenSize: 4, IntermediateSize: 8, NumHiddenLayers: 1,
		NumAttentionHeads: 1, NumKeyValueHeads: 1, HeadDim: 4, RMSNormEps: 1e-6, RopeTheta: 1e4, MaxPositionEmbeddings: 8}
	mod := model.New(cfg)
	model.Init(mod, 1)
	opt := &OptimState{Step: 2, M: make([]float32, len(mod.Arena)), V: make([]float32, len(mod.Arena)), Config: json.RawMessage(`{}`)}
	for step := 1; step <= 3; step++ {
		if err := m.Write(map[string]any{"step": step}); err != nil {
			t.Fatal(err)
		}
		if step == 2 {
			if err := s.Save(2, mod, opt, map[string]int{"cursor": 7}, 2); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = OpenSession(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Step() != 2 || s.Resumed.Optim == nil {
		t.Fatalf("resumed from step %d (optimiser %v), want 2", s.Step(), s.Resumed.Optim != nil)
	}
	var st struct{ Cursor int }
	if err := s.State(&st); err != nil || st.Cursor != 7 {
		t.Fatalf("state %+v, %v", st, err)
	}
	if _, err := s.OpenMetrics(true); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadMetrics(filepath.Join(dir, MetricsFile))
	if err != nil || len(recs) != 2 {
		t.Fatalf("after resuming from step 2 the log holds %d records (%v), want steps 1 and 2", len(recs), err)
	}
}

// A fresh session asked to discard starts an empty log; otherwise it keeps
// what is there.
func TestSessionFreshMetrics(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, MetricsFile), []byte("{\"step\": 1}\n{\"step\": 2}\n"), 0o644)
	s, err := OpenSession(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenMetrics(false); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if recs, _ := ReadMetrics(filepath.Join(dir, MetricsFile)); len(recs) != 2 {
		t.Fatalf("kept %d records, want 2", len(recs))
	}
	s, _ = OpenSession(dir)
	if _, err := s.OpenMetrics(true); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if recs, _ := ReadMetrics(filepath.Join(dir, MetricsFile)); len(recs) != 0 {
		t.Fatalf("discarded log holds %d records", len(recs))
	}
}
