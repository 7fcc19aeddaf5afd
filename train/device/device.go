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
)

// Parse checks a device name and returns the GPU ordinal for "cuda" and
// "cuda:N", or -1 for "cpu" and "" (the CPU).
func Parse(name string) (int, error) { return kc.ParseDevice(name) }

// CheckPrecision reports a training precision the device's engine does
// not have: the CPU engine trains in float32; the GPU engine in fp32 or
// bf16 (its products).
func CheckPrecision(name, precision string) error {
	gpu, err := Parse(name)
	if err != nil {
		return err
	}
	switch {
	case precision == "" || precision == cuda.FP32:
		return nil
	case precision == cuda.BF16 && gpu >= 0:
		return nil
	case precision == cuda.BF16:
		return fmt.Errorf("precision bf16 is the GPU engine's (train.device: cuda); the CPU engine trains in fp32")
	}
	return fmt.Errorf("precision %q: want fp32 or bf16", precision)
}

// Trainer returns the training engine on device name for m, with AdamW
// of configuration cfg or restored from state (see train.NewTrainer), its
// products in precision (fp32, the default, or bf16 on a GPU).
func Trainer(name, precision string, m *model.Model, cfg train.AdamWConfig, state *train.OptimState) (train.Trainer, error) {
	if err := CheckPrecision(name, precision); err != nil {
		return nil, err
	}
	gpu, err := Parse(name)
	if err != nil {
		return nil, err
	}
	if gpu < 0 {
		return train.NewTrainer(m, cfg, state)
	}
	dev, err := kc.Open(gpu)
	if err != nil {
		return nil, fmt.Errorf("train.device %s: %w (keel device shows what keel finds)", name, err)
	}
	e, err := cuda.NewTrainer(dev, m, cfg, state)
	if err == nil {
		if err = e.SetPrecision(precision); err != nil {
			e.Close()
		}
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
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
