package bench

import (
	"testing"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/train"
)

func TestTrainReportsConsistentRates(t *testing.T) {
	for _, p := range []string{"tiny-dense", "tiny-moe"} {
		r, err := Train(p, 32, 2, 8, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg, _ := model.Preset(p, 32)
		if want := model.New(cfg).NumParams(); r.Params != want {
			t.Errorf("%s: params %d, want %d", p, r.Params, want)
		}
		if r.Tokens != 16 || r.FwdFLOPs != train.FLOPsPerToken(cfg, 8) {
			t.Errorf("%s: tokens %d, flops %g", p, r.Tokens, r.FwdFLOPs)
		}
		if !(r.TokensPerS > 0 && r.FwdTokensPerS > 0) {
			t.Errorf("%s: non-positive rates %+v", p, r)
		}
		if got, want := r.TrainGFLOPS, 3*r.FwdFLOPs*r.TokensPerS/1e9; got != want {
			t.Errorf("%s: train GFLOP/s %g, want %g", p, got, want)
		}
	}
}

func TestTrainRejectsUnknownPreset(t *testing.T) {
	if _, err := Train("no-such-model", 32, 1, 4, 0); err == nil {
		t.Fatal("want an error for an unknown preset")
	}
}

// The serving benchmark runs every path and counts what it sent.
func TestServeCountsRequests(t *testing.T) {
	r, err := Serve("tiny-moe", 128, rollout.FP8, 4, 8, 8, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed != 0 || r.Requests != 2*4 || r.EngineTokensPerS <= 0 || r.GenerateTokensPerS <= 0 || r.StreamTokensPerS <= 0 {
		t.Errorf("%+v", r)
	}
	if !(r.GenerateP50 > 0 && r.GenerateP99 >= r.GenerateP50 && r.StreamP99 >= r.StreamP50 && r.WeightWrite > 0 && r.WeightLoad > 0) {
		t.Errorf("latencies and sync times %+v", r)
	}
	if quantile([]float64{3, 1, 2, 4}, 0.5) != 2 || quantile([]float64{3, 1, 2, 4}, 0.99) != 4 || quantile(nil, 0.5) != 0 {
		t.Error("quantile")
	}
}
