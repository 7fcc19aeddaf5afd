package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// keel report --compare A,B (repeatable, before or after the run
// directories) puts each comparison on the page; a bad pair or an unknown
// arm is an error.
func TestReportCompare(t *testing.T) {
	root := t.TempDir()
	for name, final := range map[string]float64{"a-s1": 0.42, "a-s2": 0.41, "a-s3": 0.43, "b-s1": 0.40, "b-s2": 0.40, "b-s3": 0.40, "c-s1": 0.1} {
		d := filepath.Join(root, "grid", name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i, v := range []float64{0.3, final} {
			j, _ := json.Marshal(map[string]any{"step": 10 * i, "eval/avg@8": v, "reward/mean": v})
			fmt.Fprintf(&b, "%s\n", j)
		}
		if err := os.WriteFile(filepath.Join(d, "metrics.jsonl"), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(root, "r.html")
	if err := runReport([]string{"--compare", "a,b", filepath.Join(root, "grid"), "--out", out, "--compare", "c,a"}); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<td>a</td><td>b</td><td>final</td><td>3</td><td>s1 +2.00, s2 +1.00, s3 +3.00</td><td>+2.00</td><td>[-0.48, +4.48]</td>",
		"<td>c</td><td>a</td><td>final</td><td>1</td>", "unpaired, left out: a-s2, a-s3"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range [][]string{{"--compare", "a"}, {"--compare", "a,a"}, {"--compare", "a,b,c"}, {"--compare", "a,zz"}} {
		if err := runReport(append(bad, filepath.Join(root, "grid"), "--out", out)); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// A paper grid's report compares the two arms it runs at more seeds, and
// MiniRL against MiniRL without IS where it has both.
func TestPaperComparisons(t *testing.T) {
	for _, g := range paperSuite(false) {
		if g.Name == "offpolicy-n4-fp4" || g.Name == "onpolicy-fp4" || g.Name == "onpolicy-fp4-lr3e-4" {
			var dirs []string
			switch g.Name {
			case "offpolicy-n4-fp4":
				dirs = []string{"x/r2-s1", "x/r3-s1", "x/r2-s2", "x/r3-s2", "x/clip-s1"}
			default:
				dirs = []string{"x/minirl-s1", "x/minirl-no-is-s1", "x/minirl-r3-s1"}
			}
			got := paperComparisons(g, dirs)
			want := [][2]string{{"minirl", "minirl-no-is"}}
			if g.Name == "offpolicy-n4-fp4" {
				want = [][2]string{{"r2", "r3"}}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %v, want %v", g.Name, got, want)
			}
		}
	}
	if got := paperComparisons(paperGrid{Name: "coldstart-terse"}, []string{"x/from-terse-s1"}); len(got) != 0 {
		t.Errorf("coldstart: %v", got)
	}
}
