// Package cuda is keel's training engine on an NVIDIA GPU: a train.Trainer
// whose weights, gradients, optimiser state and activations live in device
// memory and whose every operation is one of keel's CUDA kernels
// (kernels/cuda), so the RL loop and keel sft drive it as they drive the
// CPU engine.
//
// By default it computes in float32 with keel's own batch-invariant
// kernels (a sequence's log-probs are the same bits alone and inside any
// batch): the mode that is checked against the CPU engine and that the
// exact GPU rollout pairs with. It trains the Qwen3 and Qwen3-MoE layouts (routing on the device by the CPU engine's
// own scans, replay R2 and R3, the load-balancing loss); the bf16 mode
// computes the products in cuBLASLt (bf16.go), and recomputation keeps
// one layer's activations.
package cuda

import (
	"fmt"
	"math"
	"os"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// Engine is the GPU training engine. It is not safe for concurrent use.
type Engine struct {
	cfg    model.Config
	dev    *kc.Device
	host   *model.Model // the weights' host copy Weights returns
	params []*model.Param
	offs   map[*model.Param]int // element offset of each parameter in the arena

	w, g Buffer // weights and gradients: the model's arena layout, float32
	m, v Buffer // AdamW moments, allocated at the first Step or OptimState

	optCfg train.AdamWConfig
	step   int64

	ops *kc.Ops
	// pool serves every step's activations and scratch, so that the steps
	// after the first allocate and free nothing on the device.
	pool   *kc.Pool
	rope   ropeTables
	fw     *fwdState
	valid  bool
	hostOK bool           // host holds the device weights
	bf     *kc.BF16Linear // the bf16 mode's products; nil in fp32
	// recompute keeps only each layer's input from the forward (and, with
	// flash.cu, its attention output and log-sum-exp) and recomputes the
	// layer's other activations in the backward (activation
	// checkpointing): one layer's activations in memory instead of all.
	recompute bool
	// headChunkRows, when positive, replaces headChunk's choice (tests
	// cover several chunks with it).
	headChunkRows int
	// unfusedQK takes the bf16 mode's q and k gradients back through RoPE
	// and their norms kernel by kernel, as the float32 mode does (tests
	// compare the fused pass, norm_rope_bwd_bf16, with it).
	unfusedQK bool
	// keepLogits says whether the bf16 mode's forward keeps its logits for
	// the backward: keepAuto where they fit (headKeeps), keepNever at
	// KEEL_HEAD_KEEP=0 (the backward recomputes them, as before), keepAlways
	// in tests.
	keepLogits int
	// keptPeak is the largest kept logits since ResetPeak, in bytes.
	keptPeak int64
	// expertsPerLaunch runs the bf16 mode's expert products in the
	// forward one cuBLASLt product per expert, the grouping's offsets
	// brought to the host for it (KEEL_MOE_GROUP=host, read by
	// moeForward): the other side of check.sh's A/B against the grouped
	// products on the tensor cores.
	expertsPerLaunch bool
}

// SetRecompute turns activation checkpointing on or off (from the next
// Forward). The gradients are the same bits either way: the backward
// recomputes each layer with the same kernels on the same input (but for
// flash.cu's attention, whose outputs the forward keeps).
func (e *Engine) SetRecompute(on bool) { e.recompute = on }

func errorf(format string, a ...any) error { return fmt.Errorf("train/cuda: "+format, a...) }

// Buffer is a span of device memory.
type Buffer = kc.Buffer

var _ train.Trainer = (*Engine)(nil)

// NewTrainer puts m on dev with an AdamW optimiser of configuration cfg,
// or, given state (from a checkpoint, of either engine), exactly where
// state left it: its configuration and moments. The host model m is not
// kept: Weights returns a copy downloaded from the device.
func NewTrainer(dev *kc.Device, m *model.Model, cfg train.AdamWConfig, state *train.OptimState) (*Engine, error) {
	if state != nil {
		var err error
		if cfg, err = state.AdamW(); err != nil {
			return nil, fmt.Errorf("train/cuda: optimiser state: %w", err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := m.Config
	if err := train.CheckForward(&c, [][]int32{{0}}, train.ForwardOptions{}); err != nil {
		return nil, err
	}
	if dev == nil {
		return nil, fmt.Errorf("train/cuda: no device")
	}
	// Offsets come from the engine's own host model, whose arena has m's
	// layout (model.New lays every model of a configuration out alike).
	host := model.New(c)
	e := &Engine{cfg: c, dev: dev, host: host, params: host.Params(), offs: map[*model.Param]int{}, optCfg: cfg, ops: kc.NewOps(dev),
		pool: kc.NewPool(dev)}
	if os.Getenv("KEEL_HEAD_KEEP") == "0" {
		e.keepLogits = keepNever
	}
	off := 0
	for _, p := range e.params {
		e.offs[p] = off
		off += p.Size()
	}
	if off != len(m.Arena) {
		return nil, fmt.Errorf("train/cuda: parameters cover %d of %d arena elements", off, len(m.Arena))
	}
	var err error
	if e.w, err = e.alloc(len(m.Arena)); err != nil {
		return nil, err
	}
	if e.g, err = e.alloc(len(m.Arena)); err != nil {
		e.Close()
		return nil, err
	}
	if err := kc.Upload(dev, e.w, m.Arena); err != nil {
		e.Close()
		return nil, err
	}
	if err := dev.Zero(e.g); err != nil {
		e.Close()
		return nil, err
	}
	if state != nil {
		if n := len(m.Arena); len(state.M) != n || len(state.V) != n {
			e.Close()
			return nil, fmt.Errorf("train/cuda: optimiser state has %d first and %d second moments, the model has %d parameters", len(state.M), len(state.V), n)
		}
		if err := e.moments(); err != nil {
			e.Close()
			return nil, err
		}
		if err := kc.Upload(dev, e.m, state.M); err != nil {
			e.Close()
			return nil, err
		}
		if err := kc.Upload(dev, e.v, state.V); err != nil {
			e.Close()
			return nil, err
		}
		e.step = state.Step
	}
	return e, nil
}

// alloc allocates floats float32s on the device: for what lives as long
// as the engine (weights, gradients, moments); a step's buffers come from
// scratch.
func (e *Engine) alloc(floats int) (Buffer, error) {
	return e.allocFrom(e.dev, floats)
}

// scratch is alloc from the engine's Pool, for a step's buffers (freed
// into it with e.pool.Free).
func (e *Engine) scratch(floats int) (Buffer, error) {
	return e.allocFrom(e.pool, floats)
}

func (e *Engine) allocFrom(m kc.Memory, floats int) (Buffer, error) {
	b, err := m.Alloc(int64(max(floats, 1)) * 4)
	if kc.IsOutOfMemory(err) {
		free, total, _ := e.dev.MemInfo()
		return b, fmt.Errorf("train/cuda: %w: %.2f GiB asked, %.2f of %.2f GiB free (see train/memplan for what a model needs)",
			err, float64(floats)*4/(1<<30), float64(free)/(1<<30), float64(total)/(1<<30))
	}
	return b, err
}

// moments allocates the AdamW moments at zero, once.
func (e *Engine) moments() error {
	if e.m.Ptr != 0 {
		return nil
	}
	n := len(e.host.Arena)
	var err error
	if e.m, err = e.alloc(n); err != nil {
		return err
	}
	if e.v, err = e.alloc(n); err != nil {
		return err
	}
	if err := e.dev.Zero(e.m); err != nil {
		return err
	}
	return e.dev.Zero(e.v)
}

// param returns the device span of p in buffer b (weights or gradients).
func (e *Engine) param(b Buffer, p *model.Param) Buffer {
	return sub(b, e.offs[p], p.Size())
}

// qkvJoined says whether layer l's q, k and v weights lie back to back in
// the arena, in that order (model.New's): their products are then one,
// in the forward (kernels/cuda's merged products) and in the backward,
// over qkvJoint's spans.
func (e *Engine) qkvJoined(l *model.Layer) bool {
	q, k, v := e.offs[l.Q], e.offs[l.K], e.offs[l.V]
	return k == q+l.Q.Size() && v == k+l.K.Size()
}

// qkvJoint is the span of b (the weights' or the gradients' arena) that
// holds layer l's q, k and v weights (qkvJoined).
func (e *Engine) qkvJoint(b Buffer, l *model.Layer) Buffer {
	return sub(b, e.offs[l.Q], l.Q.Size()+l.K.Size()+l.V.Size())
}

// sub is the span of n floats at element offset off of b.
func sub(b Buffer, off, n int) Buffer {
	return Buffer{Ptr: b.Ptr + uint64(off)*4, Size: int64(n) * 4}
}

// Config returns the model's architecture.
func (e *Engine) Config() *model.Config { return &e.cfg }

// ZeroGrad clears the accumulated gradient.
func (e *Engine) ZeroGrad() {
	if err := e.dev.Zero(e.g); err != nil {
		panic(fmt.Sprintf("train/cuda: ZeroGrad: %v", err)) // a device that cannot memset is lost
	}
}

// Steps counts the optimiser steps applied so far.
func (e *Engine) Steps() int64 { return e.step }

// Weights downloads the device weights into the engine's host model and
// returns it (valid until the next Step).
func (e *Engine) Weights() (*model.Model, error) {
	if !e.hostOK {
		if err := kc.Download(e.dev, e.host.Arena, e.w); err != nil {
			return nil, err
		}
		e.hostOK = true
	}
	return e.host, nil
}

// OptimState downloads the optimiser's state.
func (e *Engine) OptimState() (*train.OptimState, error) {
	if err := e.moments(); err != nil {
		return nil, err
	}
	n := len(e.host.Arena)
	s := &train.OptimState{Step: e.step, M: make([]float32, n), V: make([]float32, n)}
	if err := kc.Download(e.dev, s.M, e.m); err != nil {
		return nil, err
	}
	if err := kc.Download(e.dev, s.V, e.v); err != nil {
		return nil, err
	}
	var err error
	s.Config, err = jsonConfig(e.optCfg)
	return s, err
}

// Close frees the engine's device memory; the device stays open.
func (e *Engine) Close() error {
	if e.fw != nil {
		e.fw.free(e.pool)
		e.fw = nil
	}
	e.pool.Release()
	e.rope.free(e.dev)
	e.freeBF16()
	for _, b := range []*Buffer{&e.w, &e.g, &e.m, &e.v} {
		if b.Ptr != 0 {
			e.dev.Free(*b)
			*b = Buffer{}
		}
	}
	e.valid = false
	return nil
}

// Step applies one AdamW step at lr to the accumulated gradient clipped to
// maxNorm (0: none) and returns the norm before clipping, or
// train.ErrNonFinite, changing nothing, when the norm is not finite. The
// per-step constants are the CPU optimiser's, and the kernel its float32
// operations, so the two engines take the same step.
func (e *Engine) Step(lr, maxNorm float64) (float64, error) {
	if math.IsNaN(lr) || math.IsInf(lr, 0) || lr < 0 {
		return 0, fmt.Errorf("adamw: learning rate %g, want a finite value >= 0", lr)
	}
	norm, err := e.gradNorm()
	if err != nil {
		return 0, err
	}
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm, train.ErrNonFinite
	}
	if err := e.moments(); err != nil {
		return 0, err
	}
	e.valid, e.hostOK = false, false
	c := e.optCfg
	t := float64(e.step + 1)
	bc1, bc2 := 1-math.Pow(c.Beta1, t), 1-math.Pow(c.Beta2, t)
	scale := float32(train.ClipCoef(norm, maxNorm))
	if e.bf != nil {
		e.bf.Stale() // until every run has written its copy (a failed launch leaves it stale)
	}
	for _, r := range e.decayRuns() {
		decay := float32(1)
		if r.decays {
			decay = float32(1 - lr*c.WeightDecay)
		}
		w, g, m, v := sub(e.w, r.off, r.n), sub(e.g, r.off, r.n), sub(e.m, r.off, r.n), sub(e.v, r.off, r.n)
		grid, consts := kc.Dim3{X: min((r.n+255)/256, 4096)}, []any{int64(r.n), scale, decay, float32(c.Beta1), float32(1 - c.Beta1),
			float32(c.Beta2), float32(1 - c.Beta2), float32(lr / bc1), float32(1 / math.Sqrt(bc2)), float32(c.Eps)}
		var err error
		if e.bf != nil { // the bf16 copy of the weights in the same pass
			var w16 Buffer
			if w16, err = e.bf.Copy16(w); err == nil {
				err = e.ops.Launch("optim.cu", "adamw_bf16", grid, kc.Dim3{X: 256}, append([]any{w, w16, g, m, v}, consts...)...)
			}
		} else {
			err = e.ops.Launch("optim.cu", "adamw", grid, kc.Dim3{X: 256}, append([]any{w, g, m, v}, consts...)...)
		}
		if err != nil {
			return 0, err
		}
	}
	if err := e.dev.Sync(); err != nil {
		return 0, err
	}
	e.step++
	if e.bf != nil {
		e.bf.Fresh() // the runs cover the arena: every weight's copy was written
	}
	return norm, nil
}

// decayRun is a span of the arena whose parameters AdamW updates alike:
// with weight decay or without.
type decayRun struct {
	off, n int
	decays bool
}

// decayRuns splits the arena (the parameters in order) into the fewest
// runs of parameters with the same decay, one AdamW launch each: every
// element's arithmetic is the same as a launch per parameter, in far
// fewer launches (an MoE layer's experts are one run).
func (e *Engine) decayRuns() []decayRun {
	var runs []decayRun
	for _, p := range e.params {
		decays := e.optCfg.DecayVectors || len(p.Shape) > 1
		if k := len(runs) - 1; k >= 0 && runs[k].decays == decays && runs[k].off+runs[k].n == e.offs[p] {
			runs[k].n += p.Size()
			continue
		}
		runs = append(runs, decayRun{off: e.offs[p], n: p.Size(), decays: decays})
	}
	return runs
}

// gradNorm is the global gradient norm: sums of squares in float64 over
// blocks of 8192 elements, then the blocks in order.
func (e *Engine) gradNorm() (float64, error) {
	n := len(e.host.Arena)
	nb := (n + 8191) / 8192
	part, err := e.pool.Alloc(int64(nb+1) * 8)
	if err != nil {
		return 0, err
	}
	defer e.pool.Free(part)
	out := Buffer{Ptr: part.Ptr + uint64(nb)*8, Size: 8}
	if err := e.ops.Launch("optim.cu", "sumsq_blocks", kc.Dim3{X: nb}, kc.Dim3{X: 256}, part, e.g, int64(n)); err != nil {
		return 0, err
	}
	if err := e.ops.Launch("optim.cu", "sum_f64", kc.Dim3{X: 1}, kc.Dim3{X: 256}, out, part, nb); err != nil {
		return 0, err
	}
	s := make([]float64, 1)
	if err := kc.Download(e.dev, s, out); err != nil {
		return 0, err
	}
	return math.Sqrt(s[0]), nil
}

// Gradients downloads the accumulated gradient, in the arena's layout.
func (e *Engine) Gradients() ([]float32, error) {
	g := make([]float32, len(e.host.Arena))
	return g, kc.Download(e.dev, g, e.g)
}

// DeviceWeights returns the device and the float32 weights (the model's
// arena layout), valid until the next Step: a rollout backend on the same
// GPU copies them device to device (kernels/cuda.DeviceWeights).
func (e *Engine) DeviceWeights() (*kc.Device, Buffer) { return e.dev, e.w }
