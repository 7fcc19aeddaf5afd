package report

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// Summaries by hand: two seeds of one arm, 20 steps each, so the last
// tenth is two steps and the entropy's smoothing window two steps.
func TestSummarize(t *testing.T) {
	root := t.TempDir()
	for seed, off := range map[string]float64{"1": 0, "2": 0.1} {
		var recs []map[string]any
		recs = append(recs, map[string]any{"step": 0, "eval/avg@8": 0.3 + off, "eval/avg@8/linear": 0.9})
		for s := 1; s <= 20; s++ {
			r := map[string]any{"step": s, "reward/mean": float64(s) / 100, "entropy": 1 - float64(s)/40 + off,
				"train_infer/k3": 0.01 + off, "routing/infer_vs_old": 0.2}
			if s == 10 {
				r["eval/avg@8"] = 0.5 + off
				r["entropy"] = 0.0 + off // a dip: smoothed with its neighbour
			}
			if s == 20 {
				r["eval/avg@8"] = 0.4 + off
			}
			recs = append(recs, r)
		}
		writeRun(t, filepath.Join(root, "arm-s"+seed), recs)
	}
	runs, err := Load([]string{filepath.Join(root, "arm-s1"), filepath.Join(root, "arm-s2")})
	if err != nil {
		t.Fatal(err)
	}
	sums := Summarize(runs)
	if len(sums) != 1 || sums[0].Arm != "arm" || sums[0].Runs != 2 {
		t.Fatalf("%+v", sums)
	}
	s := sums[0]
	near := func(name string, got Stat, mean, lo, hi float64) {
		t.Helper()
		if math.Abs(got.Mean-mean) > 1e-12 || math.Abs(got.Lo-lo) > 1e-12 || math.Abs(got.Hi-hi) > 1e-12 || got.N != 2 {
			t.Errorf("%s = %+v, want mean %v [%v, %v]", name, got, mean, lo, hi)
		}
	}
	near("start", s.EvalStart, 0.35, 0.3, 0.4)
	near("final", s.EvalFinal, 0.45, 0.4, 0.5)
	near("best", s.EvalBest, 0.55, 0.5, 0.6)
	near("reward", s.RewardEnd, 0.195, 0.195, 0.195) // steps 19, 20
	e := (1 - 19.0/40 + 1 - 20.0/40) / 2
	near("entropy end", s.EntropyEnd, e+0.05, e, e+0.1)
	// Windows of two: the dip at step 10 pairs with step 9 (1-9/40) or step
	// 11 (1-11/40), the lower.
	m := (0 + 1 - 11.0/40) / 2
	near("entropy min", s.EntropyMin, m+0.05, m, m+0.1)
	near("k3", s.K3, 0.06, 0.01, 0.11)
	md := Markdown(sums)
	if !strings.Contains(md, "| arm | 2 | 0.350 [0.300, 0.400] | 0.450 [0.400, 0.500] |") {
		t.Errorf("markdown:\n%s", md)
	}
	if (Stat{N: 1, Mean: 0.5}).String() != "0.500" || (Stat{}).String() != "-" || (Stat{N: 1, Mean: 2e-5}).String() != "2.00e-05" {
		t.Error("Stat.String")
	}
}
