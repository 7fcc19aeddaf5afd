package rollout

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"time"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// Options size an Engine. Memory is allocated once, for these limits.
type Options struct {
	Precision Precision
	// Slots is the number of sequences decoded concurrently (continuous
	// batching: a finished sequence's slot is refilled from the queue).
	// Default 64.
	Slots int
	// MaxLen is the longest sequence (prompt and response) the KV cache
	// holds. Default: the model's max_position_embeddings, capped at 1024.
	MaxLen int
	// StepRows caps the token rows of one forward step: one per decoding
	// sequence plus prompt rows being prefilled. Default max(Slots, 512);
	// at least Slots.
	StepRows int

	// On a GPU the backend sizes itself to the device's memory: it takes
	// at most MemoryFraction (0: 0.9) of what is free less Reserve bytes
	// (what the training engine will allocate on the same device after
	// it), and decodes with as many of Slots as fit there. Samples do not
	// depend on the number of slots, only the speed does. The CPU backend
	// ignores both.
	Reserve        int64
	MemoryFraction float64

	// OnStep, if set, is told of every forward step once its tokens are
	// taken, from the goroutine running Generate (or the Scheduler): for
	// measurement (keel bench's per-step decode figures).
	OnStep func(StepInfo)
}

// StepInfo describes one forward step of the engine.
type StepInfo struct {
	Rows       int   // token rows: one per decoding sequence, and prompt rows
	PromptRows int   // of which prompt rows being prefilled
	Context    int64 // the positions the rows attend to, summed (position + 1 a row)
	// Time is the step's wall time: the batch's setup, the backend's step
	// (with its device synchronisation), sampling and taking the tokens.
	Time time.Duration
}

// Engine is the rollout engine: the batcher (slots, continuous batching,
// prompt sharing, sampling with seeds, routes, weight versions) over a
// Backend that holds the weights and the KV cache and runs the forward
// steps. New builds it over the CPU backend; NewWithBackend over any. It
// is not safe for concurrent use (a Scheduler serves concurrent requests
// on one).
type Engine struct {
	b       Backend
	cfg     model.Config
	opt     Options
	version int64
	loadErr error // the last Load's failure: no step runs until one succeeds

	// pool runs the sampling of a step's output rows (New's engine
	// borrows the CPU backend's pool; NewWithBackend's owns one).
	pool    *kernels.Pool
	ownPool bool

	vocab int
	nMoE  int  // MoE layers
	draws bool // the backend draws untruncated policies' tokens (Drawer)

	batch StepBatch // the current step's rows and outputs
	gs    genState  // Generate's slots and scratch
}

// New builds an engine for m on the CPU backend (which copies m's weights
// in opt's precision; later changes to m are not seen until
// UpdateWeights).
func New(m *model.Model, opt Options) (*Engine, error) {
	b, err := newCPUBackend(m, opt)
	if err != nil {
		return nil, err
	}
	e, err := newEngine(b, b.pool, false)
	if err != nil {
		b.Close()
	}
	return e, err
}

// NewWithBackend builds an engine over b, whose sizes and precision
// (b.Options()) and model (b.Config()) it adopts and which it owns from
// then on: the engine's Close closes b (on error, b is left to the
// caller). The engine keeps the weight version (0 until UpdateWeights)
// and samples on its own worker goroutines.
func NewWithBackend(b Backend) (*Engine, error) {
	if b == nil {
		return nil, errors.New("rollout: no backend")
	}
	return newEngine(b, nil, true)
}

// newEngine builds the batcher over b, sampling on pool, or (own) on a
// pool of its own that its Close closes.
func newEngine(b Backend, pool *kernels.Pool, own bool) (*Engine, error) {
	c, opt := b.Config(), b.Options()
	err := c.Validate()
	if err == nil {
		err = opt.check()
	}
	if err == nil && (opt.Precision < Exact || opt.Precision > FP4) {
		err = fmt.Errorf("rollout: unknown precision %d", opt.Precision)
	}
	if err == nil && c.MaxPositionEmbeddings > 0 && opt.MaxLen > c.MaxPositionEmbeddings {
		err = fmt.Errorf("rollout: max length %d exceeds the model's max_position_embeddings %d", opt.MaxLen, c.MaxPositionEmbeddings)
	}
	if err != nil {
		return nil, err
	}
	if own {
		pool = kernels.NewPool(runtime.GOMAXPROCS(0))
	}
	e := &Engine{b: b, cfg: c, opt: opt, pool: pool, ownPool: own, vocab: c.VocabSize}
	if d, ok := b.(Drawer); ok {
		e.draws = d.Draws()
	}
	for i := 0; i < c.NumHiddenLayers; i++ {
		if c.IsMoELayer(i) {
			e.nMoE++
		}
	}
	e.batch = newStepBatch(&c, opt)
	e.allocGen()
	return e, nil
}

// Close closes the engine's backend (stopping its workers and dropping its
// KV cache) and its sampling workers; the engine must not be used
// afterwards. A second Close does nothing.
func (e *Engine) Close() {
	if e.b != nil {
		e.b.Close()
		e.b = nil
	}
	if e.ownPool && e.pool != nil {
		e.pool.Close()
	}
	e.pool = nil
	e.gs = genState{}
}

// Config returns the model configuration the engine serves.
func (e *Engine) Config() model.Config { return e.cfg }

// Options returns the engine's sizes and precision.
func (e *Engine) Options() Options { return e.opt }

// Version returns the weight version the engine holds (set by
// UpdateWeights; 0 after New).
func (e *Engine) Version() int64 { return e.version }

// UpdateWeights replaces the engine's weights with m's (the CPU backend
// re-packs or re-quantises them in place into the buffers it already
// holds), and records version, which every later sample carries. m must
// have the engine's configuration. It takes a context, as a push to
// remote servers does, so that the engine is a Sampler of the RL loop: the
// load is not interruptible, so ctx is only checked first (a cancelled
// ctx loads nothing). If the backend fails to load, the version is
// unchanged and Generate fails until an UpdateWeights succeeds.
func (e *Engine) UpdateWeights(ctx context.Context, m *model.Model, version int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rollout: UpdateWeights: %w", err)
	}
	if err := e.checkModel(m); err != nil {
		return err
	}
	if err := e.b.Load(m); err != nil {
		e.loadErr = fmt.Errorf("rollout: UpdateWeights: %w", err)
		return e.loadErr
	}
	e.loadErr = nil
	e.version = version
	return nil
}

// UpdateWeightsFrom loads new weights straight from src, a training
// engine, when the backend can take them from it without the host (a GPU
// backend and a GPU training engine on the same device: a device-to-device
// copy), and reports whether it did; if not, the caller pushes through
// UpdateWeights. src's configuration must be the engine's.
func (e *Engine) UpdateWeightsFrom(ctx context.Context, src any, version int64) (bool, error) {
	lf, ok := e.b.(interface{ LoadFrom(src any) (bool, error) })
	if !ok {
		return false, nil
	}
	if c, ok := src.(interface{ Config() *model.Config }); !ok || c.Config() == nil || !reflect.DeepEqual(*c.Config(), e.cfg) {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("rollout: UpdateWeightsFrom: %w", err)
	}
	done, err := lf.LoadFrom(src)
	if err != nil {
		e.loadErr = fmt.Errorf("rollout: UpdateWeightsFrom: %w", err)
		return false, e.loadErr
	}
	if done {
		e.loadErr = nil
		e.version = version
	}
	return done, nil
}

// checkModel refuses a model UpdateWeights cannot load. It reads only what
// New set, so any goroutine may call it.
func (e *Engine) checkModel(m *model.Model) error {
	if m == nil {
		return errors.New("rollout: UpdateWeights: no model")
	}
	if !reflect.DeepEqual(m.Config, e.cfg) {
		return errors.New("rollout: UpdateWeights: the model's configuration differs from the engine's")
	}
	return nil
}
