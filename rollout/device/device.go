// Package device opens the in-process rollout engine a recipe's
// rollout.device names: "cpu" (the default) or "cuda" / "cuda:N" (the GPU
// backend, exact, bf16 and fp8 precision so far). The batcher, scheduler, seeds and
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
// together: the GPU backend decodes in exact, bf16 and fp8 precision, so far.
func Check(name string, p rollout.Precision) error {
	gpu, err := kc.ParseDevice(name)
	if err != nil {
		return err
	}
	if gpu >= 0 && p != rollout.Exact && p != rollout.BF16 && p != rollout.FP8 {
		return fmt.Errorf("the GPU rollout runs exact, bf16 and fp8 precision so far, not %v (set rollout.precision: exact, bf16 or fp8, or rollout.device: cpu)", p)
	}
	return nil
}
