package main

import (
	"strings"
	"testing"

	"github.com/keel-rl/keel/rl"
)

// TestRLHeaderExactWithBF16 checks keel rl's first line says when the
// exact rollout cannot be exact: against a bf16 training engine.
func TestRLHeaderExactWithBF16(t *testing.T) {
	var r rl.Recipe
	r.Rollout.Precision = "exact"
	if h := rlHeader(&r); strings.Contains(h, "not 0") {
		t.Errorf("fp32 trainer: %q", h)
	}
	r.Train.Precision = "bf16"
	if h := rlHeader(&r); !strings.Contains(h, "exact (the fp32 trainer's kernels: train.precision bf16 makes the discrepancy bf16's, not 0)") {
		t.Errorf("bf16 trainer: %q", h)
	}
	r.Rollout.Precision = "bf16"
	if h := rlHeader(&r); strings.Contains(h, "not 0") {
		t.Errorf("bf16 rollout: %q", h)
	}
}
