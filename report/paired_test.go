package report

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// The 97.5% quantiles of Student's t against a printed table.
func TestTCrit95(t *testing.T) {
	for df, want := range map[int]float64{1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 7: 2.365, 10: 2.228,
		20: 2.086, 29: 2.045, 30: 2.042, 60: 2.000, 100: 1.984} {
		if got := tCrit95(df); math.Abs(got-want) > 5e-4 {
			t.Errorf("t(%d) = %.4f, want %.3f", df, got, want)
		}
	}
	if got := tCrit95(100000); math.Abs(got-1.95996) > 1e-4 {
		t.Errorf("t(1e5) = %.5f, want the normal limit 1.95996", got)
	}
}

// Differences by hand. 0.02, 0.01, 0.03: mean 0.02, sd 0.01, half-width
// 4.303 * 0.01 / sqrt(3) = 0.02484, so [-0.00484, 0.04484]: not
// established. 0.02, 0.025, 0.03: mean 0.025, sd 0.005, half-width
// 4.303 * 0.005 / sqrt(3) = 0.01242, so [0.01258, 0.03742]: A above B;
// negated: B above A.
func TestDiffOf(t *testing.T) {
	near := func(got, want float64) bool { return math.Abs(got-want) < 2e-5 }
	d := DiffOf([]float64{0.02, 0.01, 0.03})
	if !near(d.Mean, 0.02) || !near(d.Lo, -0.00484) || !near(d.Hi, 0.04484) || d.WinsA != 3 || d.Verdict() != "not established" {
		t.Errorf("%+v %s", d, d.Verdict())
	}
	d = DiffOf([]float64{0.02, 0.025, 0.03})
	if !near(d.Mean, 0.025) || !near(d.Lo, 0.01258) || !near(d.Hi, 0.03742) || d.Verdict() != "A above B" {
		t.Errorf("%+v %s", d, d.Verdict())
	}
	d = DiffOf([]float64{-0.02, -0.025, -0.03})
	if !near(d.Lo, -0.03742) || !near(d.Hi, -0.01258) || d.WinsB != 3 || d.Verdict() != "B above A" {
		t.Errorf("%+v %s", d, d.Verdict())
	}
	d = DiffOf([]float64{0.01, 0, -0.02})
	if d.WinsA != 1 || d.WinsB != 1 || d.Ties != 1 || d.Verdict() != "not established" {
		t.Errorf("%+v %s", d, d.Verdict())
	}
	d = DiffOf([]float64{0.03})
	if d.Mean != 0.03 || !math.IsNaN(d.Lo) || !math.IsNaN(d.Hi) || d.Verdict() != "n = 1: a direction, not a finding" {
		t.Errorf("%+v %s", d, d.Verdict())
	}
	if d := DiffOf(nil); d.Verdict() != "no paired seeds" {
		t.Errorf("%+v", d)
	}
}

// Two arms: a at seeds 1, 2, 3, 4, b at 1, 2, 3, 5. Seeds 4 and 5 are
// unpaired; the final and best differences are the hand-computed cases of
// TestDiffOf.
func TestCompare(t *testing.T) {
	root := t.TempDir()
	// Each run evaluates at steps 0, 10, 20: start, best, final.
	run := func(name string, start, best, final float64) string {
		d := filepath.Join(root, name)
		writeRun(t, d, []map[string]any{
			{"step": 0, "eval/avg@8": start},
			{"step": 10, "eval/avg@8": best, "eval/avg@8/linear": 0.99},
			{"step": 20, "eval/avg@8": final},
		})
		return d
	}
	dirs := []string{
		run("b-s1", 0.3, 0.50, 0.40), run("a-s1", 0.3, 0.52, 0.42),
		run("b-s2", 0.3, 0.50, 0.40), run("a-s2", 0.3, 0.525, 0.41),
		run("b-s3", 0.3, 0.50, 0.40), run("a-s3", 0.3, 0.53, 0.43),
		run("a-s4", 0.3, 0.9, 0.9), run("b-s5", 0.3, 0.1, 0.1),
	}
	runs, err := Load(dirs)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compare(runs, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Seeds) != 3 || p.Seeds[0] != 1 || p.Seeds[2] != 3 || strings.Join(p.Unpaired, ",") != "a-s4,b-s5" {
		t.Fatalf("seeds %v, unpaired %v", p.Seeds, p.Unpaired)
	}
	if p.Final.Verdict() != "not established" || p.Best.Verdict() != "A above B" {
		t.Errorf("final %+v, best %+v", p.Final, p.Best)
	}
	md := PairedMarkdown(p)
	t.Logf("\n%s", md)
	for _, want := range []string{
		"| arm A | arm B | held-out | seeds paired | A - B per seed (points) | mean | 95% t interval | wins A / B / ties | verdict |",
		"| a | b | final | 3 | s1 +2.00, s2 +1.00, s3 +3.00 | +2.00 | [-0.48, +4.48] | 3 / 0 / 0 | not established |",
		"| a | b | best | 3 | s1 +2.00, s2 +2.50, s3 +3.00 | +2.50 | [+1.26, +3.74] | 3 / 0 / 0 | A above B |",
		"unpaired, left out: a-s4, b-s5",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// One paired seed: a direction only.
	one, err := Compare(runs[:2], "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if md := PairedMarkdown(one); !strings.Contains(md, "| a | b | final | 1 | s1 +2.00 | +2.00 | undefined | 1 / 0 / 0 | n = 1: a direction, not a finding |") {
		t.Errorf("one seed:\n%s", md)
	}
	page := string(HTML("t", runs, nil, p))
	if !strings.Contains(page, "<td>[-0.48, +4.48]</td><td>3 / 0 / 0</td><td>not established</td>") || !strings.Contains(page, "a-s4, b-s5") {
		t.Errorf("page lacks the comparison:\n%s", page)
	}
	if _, err := Compare(runs, "a", "c"); err == nil || !strings.Contains(err.Error(), "arms: a, b") {
		t.Errorf("unknown arm: %v", err)
	}
	dup, err := Load([]string{dirs[1], dirs[1], dirs[0]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compare(dup, "a", "b"); err == nil {
		t.Error("a seed twice: no error")
	}
}
