package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

// keel probe: exact reports zeros everywhere; the reduced precisions do
// not; the JSON file holds one row per precision in the order asked.
func TestProbeCommand(t *testing.T) {
	dir, _ := lpTestModel(t, true)
	in := lpWrite(t, "p.jsonl", `{"tokens": [1, 2, 3]}`+"\n"+`{"tokens": [4, 5, 6, 7]}`+"\n")
	js := filepath.Join(t.TempDir(), "probe.json")
	if err := runProbe([]string{"--model", dir, "--input", in, "--max-new-tokens", "16", "--json", js}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(js)
	var rows []probeRow
	if err := json.Unmarshal(b, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || rows[0].Precision != "exact" || rows[3].Precision != "fp8" {
		t.Fatalf("rows %+v", rows)
	}
	ex := rows[0]
	if ex.Samples != 8 || ex.Tokens == 0 || ex.K1 != 0 || ex.K3 != 0 || ex.MeanAbsDelta != 0 || ex.MaxAbsDelta != 0 ||
		ex.FracAbove01 != 0 || ex.PPLGap != 0 || ex.SurrogateGap != 0 ||
		len(ex.RoutingDisagree) != 1 || ex.RoutingDisagree[0] != 0 || ex.RoutingSetDiffers[0] != 0 {
		t.Fatalf("exact is not zero: %+v", ex)
	}
	if fp8 := rows[3]; !(fp8.MeanAbsDelta > 0) || !(fp8.K3 > 0) || !(fp8.MaxAbsDelta >= fp8.MeanAbsDelta) {
		t.Fatalf("fp8 shows no discrepancy: %+v", fp8)
	}
}

func TestProbeCommandErrors(t *testing.T) {
	dir, _ := lpTestModel(t, false)
	good := lpWrite(t, "good.jsonl", `{"tokens": [1, 2]}`+"\n")
	bad := lpWrite(t, "bad.jsonl", `{"tokens": [1, 2]}`+"\n"+`{"tokens": "x"}`+"\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", dir, "--input", good, "--precision", "exact,fp4"}, "unknown precision"},
		{[]string{"--model", dir}, "--input is required"},
		{[]string{"--input", good}, "--model is required"},
		{[]string{"--model", dir, "--input", bad}, "bad.jsonl:2"},
		{[]string{"--model", dir, "--input", good, "--top-p", "2"}, "top-p"},
	} {
		if err := runProbe(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one mentioning %q", c.args, err, c.want)
		}
	}
}

// setsDiffer counts positions whose expert sets differ, order ignored:
// hand-made routes of 3 positions in 2 layers, top-2.
func TestSetsDiffer(t *testing.T) {
	// IDs are position-major: (t·Layers + l)·K + slot.
	a := &model.Routes{Tokens: 3, Layers: 2, K: 2, IDs: []int32{
		0, 1 /* t0 l0 */, 2, 3 /* t0 l1 */, 1, 0 /* t1 l0 */, 2, 3 /* t1 l1 */, 4, 5 /* t2 l0 */, 6, 7 /* t2 l1 */}}
	b := &model.Routes{Tokens: 3, Layers: 2, K: 2, IDs: []int32{
		1, 0 /* same set */, 2, 4 /* differs */, 1, 0 /* same */, 3, 5 /* differs */, 4, 5 /* same */, 7, 6 /* same set */}}
	got := setsDiffer([]*model.Routes{a}, []*model.Routes{b})
	if len(got) != 2 || got[0] != 0 || got[1] != 2.0/3 {
		t.Fatalf("sets differ %v, want [0 0.667]", got)
	}
}
