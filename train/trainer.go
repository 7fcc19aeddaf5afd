package train

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/keel-rl/keel/model"
)

// Trainer is what the RL loop and supervised training need of a training
// engine, and all they may touch: a forward over whole sequences, the
// backward of a loss, an optimiser step with clipping, and the weights and
// optimiser state for a weight push or a checkpoint. The optimiser lives
// inside the engine (as llm.c keeps it inside the model), so that an engine
// whose weights sit on a device updates them there; the CPU Engine is one,
// a CUDA engine another.
//
// The contract a Trainer keeps, whatever its device:
//   - Forward returns log π of every next token (and entropies and routes
//     as the options ask) and keeps what Backward needs; Backward
//     accumulates the gradient of the Loss into the engine's gradient, so
//     several Forward/Backward pairs make one accumulated step;
//   - Step applies AdamW at lr to the accumulated gradient clipped to a
//     global norm of maxNorm (0: none) and returns the norm before
//     clipping; a non-finite norm returns ErrNonFinite and leaves weights
//     and optimiser state as they were. The gradient is not cleared:
//     ZeroGrad starts the next accumulation;
//   - Weights and OptimState describe the engine's state as plain host
//     data, valid until the next Step or Close. Neither may be modified;
//   - a Result belongs to the caller: it outlives later calls (the loop
//     keeps log-probs and routes across forwards), so an engine that
//     stages outputs in reused buffers copies them out.
//
// A Trainer is not safe for concurrent use.
type Trainer interface {
	// Config is the model's architecture.
	Config() *model.Config
	Forward(seqs [][]int32, opt ForwardOptions) (*Result, error)
	Backward(l Loss) error
	ZeroGrad()
	Step(lr, maxNorm float64) (gradNorm float64, err error)
	// Steps counts the optimiser steps applied so far (restored ones
	// included): a learning-rate schedule's position.
	Steps() int64
	Weights() (*model.Model, error)
	OptimState() (*OptimState, error)
	// Close releases what the engine holds (device memory, buffers).
	Close() error
}

// OptimState is an AdamW optimiser's whole state as plain data, what a
// checkpoint stores and a resumed Trainer starts from: the number of steps
// taken, the two moments (one entry per element of the model's arena, in
// model.Model.Arena's order) and the hyper-parameters, an AdamWConfig as
// JSON. Its fields are run.OptimState's, so that a checkpoint converts one
// into the other without package run knowing any engine.
type OptimState struct {
	Step   int64
	M, V   []float32
	Config json.RawMessage
}

var _ Trainer = (*Engine)(nil)

// NewTrainer returns the CPU engine for m with an AdamW optimiser inside
// it: of configuration cfg with zero moments, or, given state (from a
// checkpoint), exactly where state left it: its configuration, not cfg, so
// that a resumed run continues the run it resumes, and its moments, which
// the engine takes over (no copy: the caller must not use them again). The
// moments of a fresh optimiser are allocated at the first Step or
// OptimState, so an engine that only scores (a reference model) never
// pays for them.
func NewTrainer(m *model.Model, cfg AdamWConfig, state *OptimState) (*Engine, error) {
	if state != nil {
		var err error
		if cfg, err = decodeAdamW(state.Config); err != nil {
			return nil, fmt.Errorf("train: optimiser state: %w", err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := New(m)
	e.optCfg = &cfg
	if state != nil {
		o, err := restoreAdamW(m, cfg, state)
		if err != nil {
			return nil, fmt.Errorf("train: optimiser state: %w", err)
		}
		e.optim = o
	}
	return e, nil
}

// AdamW returns the optimiser configuration the state was saved with: a
// resumed engine continues with it, whatever its device.
func (s *OptimState) AdamW() (AdamWConfig, error) { return decodeAdamW(s.Config) }

// decodeAdamW reads an AdamWConfig as OptimState.Config holds it: every
// field named as AdamWConfig names it, nothing else.
func decodeAdamW(b json.RawMessage) (AdamWConfig, error) {
	var cfg AdamWConfig
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("configuration %.80q: %v", b, err)
	}
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		return cfg, errors.New("configuration is null")
	}
	return cfg, nil
}

// restoreAdamW builds the optimiser of state over its moments.
func restoreAdamW(m *model.Model, cfg AdamWConfig, state *OptimState) (*AdamW, error) {
	o, err := newAdamW(m, cfg, false)
	if err != nil {
		return nil, err
	}
	if n := len(m.Arena); len(state.M) != n || len(state.V) != n {
		return nil, fmt.Errorf("%d first and %d second moments, the model has %d parameters", len(state.M), len(state.V), n)
	}
	if state.Step < 0 {
		return nil, fmt.Errorf("at step %d", state.Step)
	}
	o.M, o.V, o.Step = state.M, state.V, state.Step
	return o, nil
}

// Config returns the model's architecture (nil without a model).
func (e *Engine) Config() *model.Config {
	if e.Model == nil {
		return nil
	}
	return &e.Model.Config
}

// adamw returns the engine's optimiser, creating it with zero moments on
// first use. An engine made by New has none: it only scores.
func (e *Engine) adamw() (*AdamW, error) {
	if e.optim == nil {
		if e.optCfg == nil {
			return nil, errors.New("train: the engine has no optimiser (build it with NewTrainer)")
		}
		o, err := NewAdamW(e.Model, *e.optCfg)
		if err != nil {
			return nil, err
		}
		e.optim = o
	}
	return e.optim, nil
}

// Step applies one AdamW step at lr to the accumulated gradient clipped to
// maxNorm (0: no clipping) and returns the gradient norm before clipping;
// with a non-finite norm it returns ErrNonFinite and changes nothing.
func (e *Engine) Step(lr, maxNorm float64) (float64, error) {
	o, err := e.adamw()
	if err != nil {
		return 0, err
	}
	e.valid = false // the weights change: the saved forward no longer matches them
	return o.ClippedStep(e.Model.Arena, e.Grad.Arena, lr, maxNorm)
}

// Steps counts the optimiser steps applied so far.
func (e *Engine) Steps() int64 {
	if e.optim == nil {
		return 0
	}
	return e.optim.Step
}

// Weights returns the engine's model itself (no copy): the CPU engine's
// weights are already host memory.
func (e *Engine) Weights() (*model.Model, error) {
	if e.Model == nil {
		return nil, errors.New("train: engine has no model")
	}
	return e.Model, nil
}

// OptimState returns the optimiser's state, sharing the engine's moments
// (no copy).
func (e *Engine) OptimState() (*OptimState, error) {
	o, err := e.adamw()
	if err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(o.Config)
	if err != nil {
		return nil, err
	}
	return &OptimState{Step: o.Step, M: o.M, V: o.V, Config: cfg}, nil
}

// Close drops the saved activations and scratch buffers; the model stays
// the caller's.
func (e *Engine) Close() error {
	e.fw, e.valid = nil, false
	e.pool.mu.Lock()
	e.pool.free = nil
	e.pool.mu.Unlock()
	return nil
}

// Snapshot returns what a checkpoint of t stores: its weights and its
// optimiser state (plain host data, valid until t's next Step).
func Snapshot(t Trainer) (*model.Model, *OptimState, error) {
	w, err := t.Weights()
	if err != nil {
		return nil, nil, err
	}
	o, err := t.OptimState()
	if err != nil {
		return nil, nil, err
	}
	return w, o, nil
}
