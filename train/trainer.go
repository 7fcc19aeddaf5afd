package train

import (
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
//     data, valid until the next Step or Close. Neither may be modified.
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
// checkpoint), exactly where state left it (its configuration wins, so a
// resumed run continues the run it resumes). The moments are allocated at
// the first Step or OptimState, so an engine that only scores (a
// reference model) never pays for them.
func NewTrainer(m *model.Model, cfg AdamWConfig, state *OptimState) (*Engine, error) {
	if state != nil {
		if err := json.Unmarshal(state.Config, &cfg); err != nil {
			return nil, fmt.Errorf("train: optimiser state: configuration: %w", err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := New(m)
	e.optCfg = cfg
	if state != nil {
		o, err := NewAdamW(m, cfg)
		if err != nil {
			return nil, err
		}
		if len(state.M) != len(o.M) || len(state.V) != len(o.V) {
			return nil, fmt.Errorf("train: optimiser state has %d first and %d second moments, the model has %d parameters", len(state.M), len(state.V), len(o.M))
		}
		if state.Step < 0 {
			return nil, fmt.Errorf("train: optimiser state at step %d", state.Step)
		}
		copy(o.M, state.M)
		copy(o.V, state.V)
		o.Step = state.Step
		e.optim = o
	}
	return e, nil
}

// Config returns the model's architecture.
func (e *Engine) Config() *model.Config { return &e.Model.Config }

// adamw returns the engine's optimiser, creating it with zero moments on
// first use.
func (e *Engine) adamw() (*AdamW, error) {
	if e.optim == nil {
		cfg := e.optCfg
		if cfg == (AdamWConfig{}) {
			cfg = DefaultAdamWConfig()
		}
		o, err := NewAdamW(e.Model, cfg)
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
