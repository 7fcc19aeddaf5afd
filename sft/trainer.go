package sft

import (
	"fmt"
	"math"
	"time"

	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/device"
)

// Config holds the optimisation settings of a supervised run.
type Config struct {
	Steps       int     `yaml:"steps"`        // optimiser steps
	BatchTokens int     `yaml:"batch_tokens"` // tokens (prompt and response) per step
	LR          float64 `yaml:"lr"`           // peak learning rate
	MinLR       float64 `yaml:"min_lr"`       // cosine floor
	Warmup      int     `yaml:"warmup"`       // warm-up steps
	Schedule    string  `yaml:"schedule"`     // "cosine" (default) or "constant"
	WeightDecay float64 `yaml:"weight_decay"`
	Beta1       float64 `yaml:"beta1"`
	Beta2       float64 `yaml:"beta2"`
	ClipNorm    float64 `yaml:"clip_norm"` // global gradient-norm clip; 0 disables
	AuxLoss     float64 `yaml:"aux_loss"`  // MoE load-balancing coefficient
	Seed        uint64  `yaml:"seed"`      // data order
	// Device is where the training engine runs: cpu (the default), cuda
	// or cuda:N.
	Device string `yaml:"device"`
	// Precision of the products: fp32 (the default) or bf16 (GPU).
	Precision string `yaml:"precision,omitempty"`
	// Recompute turns on activation checkpointing (GPU).
	Recompute bool `yaml:"recompute,omitempty"`
}

// Engine returns the training engine's options.
func (c Config) Engine() device.Options {
	return device.Options{Device: c.Device, Precision: c.Precision, Recompute: c.Recompute}
}

// Defaults fills unset fields with values that train the built-in presets
// from scratch well on the synthetic tasks.
func (c *Config) Defaults() {
	if c.BatchTokens == 0 {
		c.BatchTokens = 8192
	}
	if c.LR == 0 {
		c.LR = 3e-3
	}
	if c.Schedule == "" {
		c.Schedule = train.ScheduleCosine
	}
	if c.Warmup == 0 {
		c.Warmup = min(100, c.Steps/10)
	}
	if c.MinLR == 0 && c.Schedule == train.ScheduleCosine {
		c.MinLR = c.LR / 10
	}
	if c.Beta1 == 0 {
		c.Beta1 = 0.9
	}
	if c.Beta2 == 0 {
		c.Beta2 = 0.95
	}
	if c.ClipNorm == 0 {
		c.ClipNorm = 1
	}
}

// schedule returns the learning-rate schedule of c.
func (c *Config) schedule() train.Schedule {
	return train.Schedule{Kind: c.Schedule, PeakLR: c.LR, WarmupSteps: c.Warmup, TotalSteps: c.Steps, MinLR: c.MinLR}
}

// Validate reports settings that cannot train.
func (c *Config) Validate() error {
	if c.Steps <= 0 {
		return fmt.Errorf("sft: steps = %d, want > 0", c.Steps)
	}
	if c.BatchTokens <= 0 {
		return fmt.Errorf("sft: batch_tokens = %d, want > 0", c.BatchTokens)
	}
	if !(c.AuxLoss >= 0) || math.IsInf(c.AuxLoss, 0) {
		return fmt.Errorf("sft: aux_loss = %g, want a finite value >= 0", c.AuxLoss)
	}
	if err := c.schedule().Validate(); err != nil {
		return fmt.Errorf("sft: %w", err)
	}
	if _, err := device.Parse(c.Device); err != nil {
		return fmt.Errorf("sft: train.device: %w", err)
	}
	if err := c.Engine().Check(); err != nil {
		return fmt.Errorf("sft: train: %w", err)
	}
	return c.AdamW().Validate()
}

// AdamW returns the optimiser's hyper-parameters for the training engine,
// defaults filled.
func (c Config) AdamW() train.AdamWConfig {
	c.Defaults()
	return train.AdamWConfig{Beta1: c.Beta1, Beta2: c.Beta2, Eps: 1e-8, WeightDecay: c.WeightDecay}
}

// Stats describe one optimiser step.
type Stats struct {
	Step       int
	Loss       float64 // mean negative log-likelihood of the batch's response tokens
	Tokens     int     // tokens in the batch (prompt and response)
	Targets    int     // response tokens (the loss's denominator)
	Examples   int
	GradNorm   float64 // before clipping
	LR         float64
	AuxLoss    float64
	Duration   time.Duration
	TokensPerS float64
}

// Trainer runs supervised optimiser steps on one model, through its
// training engine.
type Trainer struct {
	Engine  train.Trainer
	Batches *Batcher
	cfg     Config
}

// ErrNonFinite reports a step whose gradient norm was NaN or infinite; the
// weights are left as they were.
var ErrNonFinite = train.ErrNonFinite

// NewTrainer returns a trainer over data on the training engine eng (a
// fresh one, or one restored from a checkpoint, built with cfg.AdamW()).
func NewTrainer(eng train.Trainer, data []Example, cfg Config) (*Trainer, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	mc := eng.Config()
	for i, e := range data {
		for _, tok := range append(append([]int32(nil), e.Prompt...), e.Response...) {
			if tok < 0 || int(tok) >= mc.VocabSize {
				return nil, fmt.Errorf("sft: example %d: token %d outside the model's vocabulary of %d", i, tok, mc.VocabSize)
			}
		}
		if e.Len() > mc.MaxPositionEmbeddings && mc.MaxPositionEmbeddings > 0 {
			return nil, fmt.Errorf("sft: example %d has %d tokens, more than max_position_embeddings = %d", i, e.Len(), mc.MaxPositionEmbeddings)
		}
	}
	b, err := NewBatcher(data, cfg.BatchTokens, cfg.Seed)
	if err != nil {
		return nil, err
	}
	return &Trainer{Engine: eng, Batches: b, cfg: cfg}, nil
}

// Config returns the settings in use, defaults filled.
func (t *Trainer) Config() Config { return t.cfg }

// Step runs one optimiser step on the next batch: forward, backward of the
// mean response-token NLL (plus the weighted MoE auxiliary loss), global
// norm clipping and AdamW at the schedule's learning rate.
func (t *Trainer) Step() (Stats, error) {
	start := time.Now()
	batch := t.Batches.Next()
	seqs, coef, targets := Sequences(batch)
	t.Engine.ZeroGrad()
	res, err := t.Engine.Forward(seqs, train.ForwardOptions{NoEntropy: true, Backward: true})
	if err != nil {
		return Stats{}, err
	}
	var nll float64
	for s := range seqs {
		for i, c := range coef[s] {
			if c != 0 {
				nll -= float64(res.LogProbs[s][i])
			}
		}
	}
	if err := t.Engine.Backward(train.Loss{LogProb: coef, Aux: t.cfg.AuxLoss}); err != nil {
		return Stats{}, err
	}
	step := int(t.Engine.Steps()) + 1
	st := Stats{Step: step, Loss: nll / float64(targets), Targets: targets, Examples: len(batch), AuxLoss: res.AuxLoss, LR: t.cfg.schedule().LR(step)}
	for _, s := range seqs {
		st.Tokens += len(s)
	}
	st.GradNorm, err = t.Engine.Step(st.LR, t.cfg.ClipNorm)
	if err != nil {
		return st, err
	}
	st.Duration = time.Since(start)
	st.TokensPerS = float64(st.Tokens) / st.Duration.Seconds()
	return st, nil
}

// Sequences turns a batch into the engine's inputs: the token sequences,
// the per-token loss coefficients (−1/N on the predictions of the N
// response tokens not masked, 0 elsewhere; coef[s][i] weighs
// log p(seq[i+1])) and N. A response token at position 0 (no prompt) has
// no prediction and is not counted.
func Sequences(batch []Example) (seqs [][]int32, coef [][]float32, targets int) {
	trained := func(e Example, j int) bool { return j >= max(len(e.Prompt), 1) && !e.masked(j-len(e.Prompt)) }
	for _, e := range batch {
		for j := range e.Len() {
			if trained(e, j) {
				targets++
			}
		}
	}
	w := float32(-1 / float64(max(targets, 1)))
	for _, e := range batch {
		s := make([]int32, 0, e.Len())
		s = append(append(s, e.Prompt...), e.Response...)
		c := make([]float32, len(s)-1)
		for j := 1; j < len(s); j++ {
			if trained(e, j) {
				c[j-1] = w
			}
		}
		seqs = append(seqs, s)
		coef = append(coef, c)
	}
	return seqs, coef, targets
}
