package run

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/tokenizer"
)

// Session is a training run's hold on its directory, shared by `keel sft`
// and `keel rl`: the lock, the checkpoint it resumes from (if any), the
// metrics log cut back to that checkpoint, and saving new checkpoints so
// that the log and the checkpoint always agree.
type Session struct {
	Dir string
	// Resumed is the newest complete checkpoint found when the session
	// opened (nil for a fresh run).
	Resumed *Checkpoint
	Metrics *MetricsLog
	lock    *DirLock
}

// Checkpoints, metrics, the resolved recipe and the finished model live
// here inside a run directory.
const (
	RecipeFile     = "recipe.yaml"
	CheckpointsDir = "checkpoints"
	MetricsFile    = "metrics.jsonl"
	ModelDir       = "model"
)

// OpenSession locks dir (creating it) and loads its newest checkpoint. It
// does not open the metrics log: call OpenMetrics once the caller has
// decided whether to resume.
func OpenSession(dir string) (*Session, error) {
	lock, err := Lock(dir)
	if err != nil {
		return nil, err
	}
	s := &Session{Dir: dir, lock: lock}
	ck, err := LoadLatest(filepath.Join(dir, CheckpointsDir))
	switch {
	case err == nil:
		s.Resumed = ck
	case errors.Is(err, ErrNoCheckpoint):
	default:
		lock.Unlock()
		return nil, err
	}
	return s, nil
}

// Step is the step the session resumes from (0 when fresh).
func (s *Session) Step() int {
	if s.Resumed == nil {
		return 0
	}
	return s.Resumed.Step
}

// State decodes the resumed checkpoint's loop state into v (nothing when
// fresh or when the checkpoint has none).
func (s *Session) State(v any) error {
	if s.Resumed == nil || s.Resumed.State == nil {
		return nil
	}
	if err := json.Unmarshal(s.Resumed.State, v); err != nil {
		return fmt.Errorf("%s: checkpoint state: %w", filepath.Join(s.Dir, CheckpointsDir), err)
	}
	return nil
}

// OpenMetrics opens the metrics log. Resuming, it keeps the records up to
// the checkpoint's step (a crash after the checkpoint may have logged
// steps the resumed run will log again); fresh (no checkpoint), it starts
// an empty log when discard is set, else it keeps every complete record.
func (s *Session) OpenMetrics(discard bool) (*MetricsLog, error) {
	path := filepath.Join(s.Dir, MetricsFile)
	keep := s.Step()
	if s.Resumed == nil {
		keep = -1
		if discard {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
		}
	}
	m, err := OpenMetrics(path, keep)
	if err != nil {
		return nil, err
	}
	s.Metrics = m
	return m, nil
}

// Save syncs the metrics log, then writes a checkpoint of step (model,
// optimiser and the loop's state as JSON), keeping the newest keep.
func (s *Session) Save(step int, m *model.Model, o *OptimState, state any, keep int) error {
	b, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("checkpoint state: %w", err)
	}
	if s.Metrics != nil {
		if err := s.Metrics.Sync(); err != nil {
			return err
		}
	}
	_, err = SaveCheckpoint(filepath.Join(s.Dir, CheckpointsDir), &Checkpoint{Step: step, Model: m, Optim: o, State: b}, keep)
	return err
}

// ModelDir is where SaveModel writes a finished run's model.
func (s *Session) ModelDir() string { return filepath.Join(s.Dir, ModelDir) }

// SaveModel writes a finished run's model into ModelDir: a Hugging Face
// directory (config.json, float32 model.safetensors) with the run's
// tokenizer.json, which every tool that reads models (keel eval, keel
// serve, a later run, Hugging Face) loads as it is.
func (s *Session) SaveModel(m *model.Model, tok *tokenizer.Tokenizer) error {
	dir := s.ModelDir()
	if err := model.Save(dir, m, "f32"); err != nil {
		return err
	}
	return tok.WriteFile(filepath.Join(dir, tokenizer.FileName))
}

// Close closes the metrics log and releases the lock.
func (s *Session) Close() error {
	var err error
	if s.Metrics != nil {
		err = s.Metrics.Close()
	}
	if uerr := s.lock.Unlock(); err == nil {
		err = uerr
	}
	return err
}
