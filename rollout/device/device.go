// Package device opens the in-process rollout engine a recipe's
// rollout.device names: "cpu" (the default) or "cuda" / "cuda:N" (the GPU
// backend, exact, bf16, fp8 and fp4 precision). The batcher, scheduler, seeds and
// sampling are the same host code on either.
package device

import (
	"fmt"

	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/rollout/cuda"
)

// Engine returns a rollout engine for m with opt on device name.
func Engine(name string, m *model.Model, opt rollout.Options) (*rollout.Engine, error) {
	gpu, err := kc.ParseDevice(name)
	if err != nil {
		return nil, err
	}
	if gpu < 0 {
		return rollout.New(m, opt)
	}
	b, err := cuda.Open(gpu, m, opt)
	if err != nil {
		return nil, err
	}
	e, err := rollout.NewWithBackend(b)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("rollout on %s: %w", name, err)
	}
	return e, nil
}

// Check reports a device and precision the in-process engine cannot run
// together: the GPU backend decodes in exact, bf16, fp8 and fp4 precision (not the CPU's fp32).
func Check(name string, p rollout.Precision) error {
	gpu, err := kc.ParseDevice(name)
	if err != nil {
		return err
	}
	if gpu >= 0 && p == rollout.FP32 {
		return fmt.Errorf("precision fp32 is the CPU engine's own float32 kernels; on the GPU exact is float32 (set rollout.precision: exact, or rollout.device: cpu)")
	}
	return nil
}

// Memory returns the device memory Engine(name, ...) would take for a
// model of config c with opt, and whether name is a GPU: the CPU
// engine's memory is the host's, and counts for nothing here.
func Memory(name string, c *model.Config, opt rollout.Options) (cuda.Memory, bool, error) {
	gpu, err := kc.ParseDevice(name)
	if err != nil || gpu < 0 {
		return cuda.Memory{}, false, err
	}
	m, err := cuda.Plan(c, opt)
	return m, true, err
}

// Ordinal returns the GPU a device name selects, or -1 for the CPU.
func Ordinal(name string) (int, error) { return kc.ParseDevice(name) }
