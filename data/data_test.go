package data

import (
	"github.com/keel-rl/keel/tokenizer"
	"github.com/parquet-go/parquet-go"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRoundTripAndLayouts(t *testing.T) {
	dir := t.TempDir()
	ex := []Example{
		{Task: "arithmetic", Difficulty: 2, Prompt: "Compute 1+2.", Answer: "3", Response: "Answer: 3", Style: "terse"},
		{Task: "linear", Messages: []tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Solve x+1=3."}}, Answer: "2"},
	}
	p := filepath.Join(dir, "d.jsonl")
	if err := WriteJSONL(p, ex); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Response != "Answer: 3" || got[0].Difficulty != 2 || got[1].Messages[1].Content != "Solve x+1=3." {
		t.Fatalf("round trip: %+v", got)
	}
	if c := got[0].Chat(); len(c) != 1 || c[0].Role != "user" || c[0].Content != "Compute 1+2." {
		t.Fatalf("Chat() = %+v", c)
	}
	// verl's field names.
	verl := `{"data_source": "countdown", "prompt": [{"role": "user", "content": "Use 1 2 to make 3."}], "ability": "math", "reward_model": {"style": "rule", "ground_truth": "3|1,2"}, "extra_info": {"index": 0}}` + "\n"
	p2 := filepath.Join(dir, "verl.jsonl")
	os.WriteFile(p2, []byte(verl), 0o644)
	got, err = Read(p2)
	if err != nil || got[0].Task != "countdown" || got[0].Answer != "3|1,2" || got[0].Messages[0].Content != "Use 1 2 to make 3." {
		t.Fatalf("verl layout: %+v, %v", got, err)
	}
}

func TestErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ body, want string }{
		{`{"task": "a", "prompt": "p", "answer": "1"}` + "\n\n" + `{"task": "a", "prompt": "p"}`, "x.jsonl:3: missing field \"answer\""},
		{`{"prompt": "p", "answer": "1"}`, "x.jsonl:1: missing field \"task\""},
		{`{"task": "a", "answer": "1"}`, `x.jsonl:1: missing field "prompt"`},
		{`{"task": "a", "answer": "1", "prompt": 5}`, `x.jsonl:1: field "prompt"`},
		{`{"task": "a", "answer": "1", "prompt": [{"content": "x"}]}`, `missing "role"`},
		{`{"task": "a", "answer": "1", "prompt": "p"` + "\n", "x.jsonl:1: invalid JSON"},
		{"\n\n", "no examples"},
	} {
		p := filepath.Join(dir, "x.jsonl")
		os.WriteFile(p, []byte(c.body), 0o644)
		if _, err := Read(p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.body, err, c.want)
		}
	}
	if _, err := Read(filepath.Join(dir, "x.csv")); err == nil || !strings.Contains(err.Error(), "unknown data format") {
		t.Errorf("csv: %v", err)
	}
}

func TestParquetRoundTripAndErrors(t *testing.T) {
	dir := t.TempDir()
	ex, err := Generate(GenSpec{Tasks: []string{"countdown", "linear"}, N: 20, Difficulties: []int{1, 3}, Styles: []string{"scratch"}, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "d.parquet")
	if err := Write(p, ex); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ex) {
		t.Fatalf("%d rows, want %d", len(got), len(ex))
	}
	for i := range ex {
		c := got[i].Chat()
		if got[i].Task != ex[i].Task || got[i].Answer != ex[i].Answer || got[i].Response != ex[i].Response ||
			got[i].Difficulty != ex[i].Difficulty || len(c) != 1 || c[0].Content != ex[i].Prompt || c[0].Role != "user" {
			t.Fatalf("row %d: %+v, wrote %+v", i, got[i], ex[i])
		}
	}
	// A plain layout and a file missing a column.
	type plain struct {
		Task   string `parquet:"task"`
		Prompt string `parquet:"prompt"`
		Answer string `parquet:"answer"`
	}
	pp := filepath.Join(dir, "plain.parquet")
	if err := parquet.WriteFile(pp, []plain{{"linear", "Solve x+1=2.", "1"}}); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(pp); err != nil || got[0].Prompt != "Solve x+1=2." || got[0].Answer != "1" {
		t.Fatalf("plain layout: %+v, %v", got, err)
	}
	type noAnswer struct {
		Task   string `parquet:"task"`
		Prompt string `parquet:"prompt"`
	}
	pn := filepath.Join(dir, "bad.parquet")
	parquet.WriteFile(pn, []noAnswer{{"linear", "x"}})
	if _, err := Read(pn); err == nil || !strings.Contains(err.Error(), `bad.parquet: missing column "answer"`) {
		t.Fatalf("missing column: %v", err)
	}
	type emptyPrompt = plain
	pe := filepath.Join(dir, "empty.parquet")
	parquet.WriteFile(pe, []emptyPrompt{{"linear", "a", "1"}, {"linear", "", "1"}})
	if _, err := Read(pe); err == nil || !strings.Contains(err.Error(), "empty.parquet: row 1: empty prompt") {
		t.Fatalf("empty prompt: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "junk.parquet"), []byte("not parquet"), 0o644)
	if _, err := Read(filepath.Join(dir, "junk.parquet")); err == nil || !strings.Contains(err.Error(), "not a Parquet file") {
		t.Fatalf("junk: %v", err)
	}
}
