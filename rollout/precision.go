// Package rollout is keel's inference engine: batched KV-cache sampling
// with continuous batching, per-token log-probabilities, MoE routes and a
// numeric precision that can be dialled from exactly the training engine's
// arithmetic to float8 weights and activations (docs/method.md §1: the
// training-inference discrepancy). It shares kernels with the training
// engine but not code paths: the discrepancy between the two is the object
// of study.
package rollout

import (
	"fmt"
	"strings"
)

// Precision selects the rollout engine's arithmetic: the discrepancy dial.
type Precision int

const (
	// Exact reproduces the training engine's forward bit for bit: the same
	// batch-invariant kernels in the same order, so log mu equals the
	// training engine's log pi_old on the same tokens and the MoE routes
	// are identical (at temperature 1).
	Exact Precision = iota
	// FP32 is float32 throughout with the engine's own attention kernel
	// (a one-pass online softmax, as inference engines decode), so results
	// differ from the training engine's in the last bits: a tiny natural
	// discrepancy.
	FP32
	// BF16 rounds the inputs of every matrix product (weights and
	// activations, the LM head and the MoE router included) to bfloat16
	// and accumulates in float32. The KV cache is bfloat16 too, as in
	// engines serving bf16 models, with the engine's own attention kernel
	// (float32 arithmetic on the widened keys and values).
	BF16
	// FP8 quantises weights to float8 e4m3 with one scale per output
	// channel and activations with one scale per token, accumulating in
	// float32 (on the bf16 kernel, where every e4m3 value is exact). The
	// KV cache and attention are BF16's.
	FP8
	// FP4 is a stress setting beyond what the paper ran: weights in
	// NVFP4's form (float4 e2m1 values with an e4m3 scale per block of 16
	// inputs, kernels.PackNVFP4), activations, KV cache and attention as
	// in FP8. Its train-infer discrepancy is several times FP8's, which
	// makes the effects of the IS correction and of routing replay
	// visible on models small enough for this machine (REPRODUCTION.md).
	FP4
)

var precisionNames = [...]string{"exact", "fp32", "bf16", "fp8", "fp4"}

// String returns the precision's name as recipes and flags spell it.
func (p Precision) String() string {
	if p < 0 || int(p) >= len(precisionNames) {
		return fmt.Sprintf("Precision(%d)", int(p))
	}
	return precisionNames[p]
}

// ParsePrecision reads a precision name: exact, fp32, bf16, fp8 or fp4.
func ParsePrecision(s string) (Precision, error) {
	for i, n := range precisionNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return Precision(i), nil
		}
	}
	return 0, fmt.Errorf("unknown precision %q (want exact, fp32, bf16, fp8 or fp4)", s)
}
