// Package device opens the training engine a recipe's train.device names:
// "cpu" (the default: the CPU engine, keel's reference) or "cuda" /
// "cuda:N" (the GPU engine on GPU N, 0 by default). The RL loop and keel
// sft reach either through train.Trainer, so there is one loop whatever
// the device, and a checkpoint of one resumes on the other.
package device

import (
	"fmt"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/cuda"
	"github.com/keel-rl/keel/train/memplan"
)

// Parse checks a device name and returns the GPU ordinal for "cuda" and
// "cuda:N", or -1 for "cpu" and "" (the CPU).
func Parse(name string) (int, error) { return kc.ParseDevice(name) }

// Options choose a training engine.
type Options struct {
	Device    string // cpu (or ""), cuda or cuda:N
	Precision string // the products: fp32 (or ""), or bf16 on a GPU
	Recompute bool   // activation checkpointing, on a GPU
}

// Check reports options no engine has: an unknown device, bf16 or
// recomputation on the CPU engine (which trains in float32 and keeps its
// activations), an unknown precision.
func (o Options) Check() error {
	gpu, err := Parse(o.Device)
	if err != nil {
		return err
	}
	switch {
	case o.Precision == "" || o.Precision == cuda.FP32:
	case o.Precision == cuda.BF16 && gpu >= 0:
	case o.Precision == cuda.BF16:
		return fmt.Errorf("precision bf16 is the GPU engine's (train.device: cuda); the CPU engine trains in fp32")
	default:
		return fmt.Errorf("precision %q: want fp32 or bf16", o.Precision)
	}
	if o.Recompute && gpu < 0 {
		return fmt.Errorf("recompute is the GPU engine's (train.device: cuda); the CPU engine keeps its activations")
	}
	return nil
}

// Trainer returns the training engine o names for m, with AdamW of
// configuration cfg or restored from state (see train.NewTrainer).
func Trainer(o Options, m *model.Model, cfg train.AdamWConfig, state *train.OptimState) (train.Trainer, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	gpu, err := Parse(o.Device)
	if err != nil {
		return nil, err
	}
	if gpu < 0 {
		return train.NewTrainer(m, cfg, state)
	}
	dev, err := kc.Open(gpu)
	if err != nil {
		return nil, fmt.Errorf("train.device %s: %w (keel device shows what keel finds)", o.Device, err)
	}
	e, err := cuda.NewTrainer(dev, m, cfg, state)
	if err == nil {
		if err = e.SetPrecision(o.Precision); err != nil {
			e.Close()
		}
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	e.SetRecompute(o.Recompute)
	return &gpuTrainer{Engine: e, dev: dev}, nil
}

// gpuTrainer closes its device with the engine.
type gpuTrainer struct {
	*cuda.Engine
	dev *kc.Device
}

func (t *gpuTrainer) Close() error {
	err := t.Engine.Close()
	if e := t.dev.Close(); err == nil {
		err = e
	}
	return err
}

// Plan returns the GPU memory the engine o names needs for a model of
// config c trained on micro-batches of up to tokens tokens (train/memplan),
// or nil on the CPU.
func (o Options) Plan(c *model.Config, tokens int) (*memplan.Budget, error) {
	gpu, err := Parse(o.Device)
	if err != nil || gpu < 0 {
		return nil, err
	}
	prec := o.Precision
	if prec == "" {
		prec = memplan.FP32
	}
	return memplan.Plan(c, memplan.Shape{Seqs: 1, SeqLen: tokens}, memplan.Mode{Precision: prec, Recompute: o.Recompute})
}
