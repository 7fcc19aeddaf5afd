package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if len(rows) != 5 || rows[0].Precision != "exact" || rows[3].Precision != "fp8" || rows[4].Precision != "fp4" {
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
		{[]string{"--model", dir, "--input", good, "--precision", "exact,fp6"}, "unknown precision"},
		{[]string{"--model", dir}, "--input is required"},
		{[]string{"--input", good}, "--model is required"},
		{[]string{"--model", dir, "--input", bad}, "bad.jsonl:2"},
		{[]string{"--model", dir, "--input", good, "--top-p", "2"}, "top-p"},
		{[]string{"--model", dir, "--input", good, "--device", "cuda", "--precision", "exact,fp32"}, "--device cuda --precision fp32"},
		{[]string{"--model", dir, "--input", good, "--device", "tpu"}, "want cpu, cuda"},
	} {
		if err := runProbe(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one mentioning %q", c.args, err, c.want)
		}
	}
}
