// Package bench measures keel's engines the way `keel bench` reports them:
// GEMM rates and whole training steps (forward, backward, clipping, AdamW)
// on the model presets, with model-FLOP utilisation against the GEMM peak
// measured in the same run.
package bench

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/device"
)

// GemmShape is one (M, K, N) matrix product shape.
type GemmShape struct{ M, K, N int }

// GemmShapes are the shapes `keel bench` reports: the engines' typical
// products (2,048 token rows against hidden sizes 256-1024) and two cubes.
var GemmShapes = []GemmShape{
	{2048, 256, 256}, {2048, 256, 1024}, {2048, 1024, 256}, {512, 512, 512}, {1024, 1024, 1024},
}

// TrainResult is the throughput of one model preset's training step.
type TrainResult struct {
	Preset        string
	Params        int
	Tokens        int     // tokens per step (sequences × length)
	FwdTokensPerS float64 // forward only (log-probs and entropies)
	TokensPerS    float64 // forward + backward + clip + AdamW
	FwdFLOPs      float64 // model FLOPs per token, forward
	TrainGFLOPS   float64 // achieved model GFLOP/s of the training step (3 × forward FLOPs)
	// On a GPU: the most bytes the training steps' activations and
	// scratch took (train/cuda's PeakActivations), the device memory
	// behind them (its allocator's size classes), and what train/memplan
	// planned for them (Budget.Activations).
	ActivationBytes, ActivationHeldBytes, PlannedActivationBytes int64 `json:",omitempty"`
}

// activationPeaker is a training engine that measures its activations'
// peak (train/cuda.Engine).
type activationPeaker interface {
	ResetPeak()
	PeakActivations() (asked, held int64)
}

// Train builds preset at the given vocabulary with a fixed seed, and times
// forward-only passes and full training steps on seqs random sequences of
// seqLen tokens for about d each, returning the best rates seen.
func Train(preset string, vocab, seqs, seqLen int, d time.Duration) (TrainResult, error) {
	return TrainOn(TrainSpec{Device: "cpu", Preset: preset, Vocab: vocab, Seqs: seqs, SeqLen: seqLen, Time: d})
}

// TrainSpec is one row of the training table: where, which model, what
// batch, for how long.
type TrainSpec struct {
	Device    string // cpu, cuda or cuda:N (train/device)
	Precision string // fp32 (the default) or bf16 (GPU)
	Recompute bool   // activation checkpointing (GPU)
	Preset    string
	Layers    int // 0: the preset's
	Vocab     int
	Seqs      int
	SeqLen    int
	Time      time.Duration
}

// TrainOn times the training engine spec.Device names, as Train does the
// CPU engine's. A GPU engine's Forward and Step return after the device
// has finished (they copy results back), so wall-clock rates are its own.
func TrainOn(spec TrainSpec) (TrainResult, error) {
	preset, vocab, seqs, seqLen, d := spec.Preset, spec.Vocab, spec.Seqs, spec.SeqLen, spec.Time
	cfg, err := model.Preset(preset, vocab)
	if err != nil {
		return TrainResult{}, err
	}
	if spec.Layers > 0 {
		cfg.NumHiddenLayers = spec.Layers
		if err := cfg.Validate(); err != nil {
			return TrainResult{}, err
		}
	}
	m := model.New(cfg)
	model.Init(m, 1)
	// The Trainer contract, as the RL loop and keel sft drive it.
	var eng train.Trainer
	opt := device.Options{Device: spec.Device, Precision: spec.Precision, Recompute: spec.Recompute}
	if eng, err = device.Trainer(opt, m, train.DefaultAdamWConfig(), nil); err != nil {
		return TrainResult{}, err
	}
	defer eng.Close()
	r := rand.New(rand.NewPCG(7, 7))
	batch := make([][]int32, seqs)
	coef := make([][]float32, seqs)
	for i := range batch {
		batch[i] = make([]int32, seqLen)
		for j := range batch[i] {
			batch[i][j] = int32(r.IntN(vocab))
		}
		coef[i] = make([]float32, seqLen-1)
		for j := range coef[i] {
			coef[i][j] = (r.Float32() - 0.5) / float32(seqs)
		}
	}
	fwd := func() error {
		_, err := eng.Forward(batch, train.ForwardOptions{})
		return err
	}
	step := func() error {
		eng.ZeroGrad()
		if _, err := eng.Forward(batch, train.ForwardOptions{Backward: true}); err != nil {
			return err
		}
		if err := eng.Backward(train.Loss{LogProb: coef}); err != nil {
			return err
		}
		// Clipping folded into the update, as an RL step does it.
		_, err := eng.Step(1e-5, 1.0)
		return err
	}
	tokens := seqs * seqLen
	res := TrainResult{Preset: preset, Params: m.NumParams(), Tokens: tokens, FwdFLOPs: train.FLOPsPerToken(cfg, seqLen)}
	if res.FwdTokensPerS, err = bestRate(fwd, tokens, d); err != nil {
		return res, fmt.Errorf("%s forward: %w", preset, err)
	}
	peaker, measures := eng.(activationPeaker)
	if measures {
		peaker.ResetPeak()
	}
	if res.TokensPerS, err = bestRate(step, tokens, d); err != nil {
		return res, fmt.Errorf("%s training step: %w", preset, err)
	}
	if measures {
		res.ActivationBytes, res.ActivationHeldBytes = peaker.PeakActivations()
		if plan, err := opt.Plan(&cfg, tokens); err == nil && plan != nil {
			res.PlannedActivationBytes = plan.Activations()
		}
	}
	res.TrainGFLOPS = 3 * res.FwdFLOPs * res.TokensPerS / 1e9
	return res, nil
}

// bestRate runs f once to warm up, then repeatedly for about d (at least
// three times), and returns the best tokens per second of a single call.
func bestRate(f func() error, tokens int, d time.Duration) (float64, error) {
	if err := f(); err != nil {
		return 0, err
	}
	best := 0.0
	start := time.Now()
	for i := 0; i < 3 || time.Since(start) < d; i++ {
		t0 := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		if r := float64(tokens) / time.Since(t0).Seconds(); r > best {
			best = r
		}
	}
	return best, nil
}
