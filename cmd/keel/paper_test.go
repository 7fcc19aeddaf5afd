package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/rl"
)

// Every grid of the suite resolves against the repository's recipes, run
// directories never collide, cold-start grids train from their own SFT
// model, and --quick is the one-seed on-policy comparison.
func TestPaperSuitePlans(t *testing.T) {
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	if err := os.Chdir("../.."); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	plans, err := planSuite(paperSuite(false), out)
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{}
	total := 0
	for _, p := range plans {
		for _, r := range p.runs {
			if dirs[r.Dir] {
				t.Errorf("run directory %s twice", r.Dir)
			}
			dirs[r.Dir] = true
			total++
			rec, err := rl.ReadRecipe(r.Recipe, r.Sets)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(p.grid.Name, stressPrecision) && rec.Rollout.Precision != stressPrecision {
				t.Errorf("%s: precision %s in a stressed grid", r.Dir, rec.Rollout.Precision)
			}
			if p.grid.SFT != "" && rec.Model.Path != filepath.Join(p.sftOut, "model") {
				t.Errorf("%s: model %s, want the grid's SFT model under %s", r.Dir, rec.Model.Path, p.sftOut)
			}
		}
	}
	// R2 and R3 at N = 4 and 8 have three seeds; the other arms one.
	for _, d := range []string{"offpolicy-n4-fp4/r2-s3", "offpolicy-n8-fp4/r3-s2", "offpolicy-n8-fp4/clip-s1"} {
		if !dirs[filepath.Join(out, d)] {
			t.Errorf("no run %s", d)
		}
	}
	if dirs[filepath.Join(out, "offpolicy-n8-fp4/clip-s2")] || dirs[filepath.Join(out, "offpolicy-n2-fp4/r2-s2")] {
		t.Error("extra seeds beyond R2 and R3 at N = 4, 8")
	}
	// The asynchronous grids run the rollout k steps ahead.
	for _, p := range plans {
		if !strings.HasPrefix(p.grid.Name, "async-k") {
			continue
		}
		for _, r := range p.runs {
			rec, err := rl.ReadRecipe(r.Recipe, r.Sets)
			if err != nil {
				t.Fatal(err)
			}
			if want := p.grid.Name[len("async-k") : len("async-k")+1]; rec.Rollout.Staleness != int(want[0]-'0') {
				t.Errorf("%s: staleness %d in grid %s", r.Dir, rec.Rollout.Staleness, p.grid.Name)
			}
		}
	}
	if total < 40 {
		t.Errorf("the suite has %d RL runs", total)
	}
	quick, err := planSuite(paperSuite(true), out)
	if err != nil {
		t.Fatal(err)
	}
	if len(quick) != 1 || len(quick[0].runs) != 3 {
		t.Fatalf("--quick: %d grids", len(quick))
	}
	for _, r := range quick[0].runs {
		rec, err := rl.ReadRecipe(r.Recipe, r.Sets)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Train.LR != 3e-4 || rec.Rollout.Precision != stressPrecision || r.Seed != 1 {
			t.Errorf("--quick run %s: lr %g, precision %s, seed %d", r.Dir, rec.Train.LR, rec.Rollout.Precision, r.Seed)
		}
	}
	if _, err := selectGrids(paperSuite(false), "onpolicy-fp8, nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("--only with an unknown grid: %v", err)
	}
	if g, err := selectGrids(paperSuite(false), "onpolicy-fp8"); err != nil || len(g) != 1 {
		t.Errorf("--only onpolicy-fp8: %v, %v", g, err)
	}
	minirl := []string{"recipes/paper/onpolicy/minirl.yaml"}
	if _, err := planSuite([]paperGrid{{Name: "x", Paths: minirl, Seeds: []uint64{1, 2}, MorePaths: minirl, MoreSeeds: []uint64{2}}}, out); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("MoreSeeds overlapping Seeds: %v", err)
	}
	if _, err := planSuite([]paperGrid{{Name: "x", Paths: minirl, Seeds: []uint64{1}, CrossEval: []string{"minirl-no-is"}}}, out); err == nil || !strings.Contains(err.Error(), `"minirl-no-is"`) {
		t.Errorf("cross-evaluating an arm the grid lacks: %v", err)
	}
}
