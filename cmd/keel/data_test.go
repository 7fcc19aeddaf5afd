package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/tasks"
)

func TestDataGenDeterministicAndVerifiable(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--task", "arithmetic,countdown,linear", "--n", "60", "--difficulty", "1-5", "--style", "mixed", "--seed", "7"}
	for _, ext := range []string{".jsonl", ".parquet"} {
		a, b, c := filepath.Join(dir, "a"+ext), filepath.Join(dir, "b"+ext), filepath.Join(dir, "c"+ext)
		for _, out := range []string{a, b} {
			if err := runData(append([]string{"gen", "--out", out}, args...), &bytes.Buffer{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := runData(append([]string{"gen", "--out", c}, append(args, "--seed", "8")...), &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		ba, _ := os.ReadFile(a)
		bb, _ := os.ReadFile(b)
		bc, _ := os.ReadFile(c)
		if !bytes.Equal(ba, bb) || len(ba) == 0 {
			t.Fatalf("%s: the same flags gave different files", ext)
		}
		if bytes.Equal(ba, bc) {
			t.Fatalf("%s: another seed gave the same file", ext)
		}
		ex, err := data.Read(a)
		if err != nil || len(ex) != 60 {
			t.Fatalf("%d examples, %v", len(ex), err)
		}
		seen := map[string]bool{}
		for _, e := range ex {
			seen[e.Task+" "+e.Style] = true
			if tasks.Score(e.Task, e.Answer, e.Response) != 1 {
				t.Fatalf("reference solution does not verify: %+v", e)
			}
		}
		if len(seen) != 9 {
			t.Fatalf("tasks and styles not mixed: %v", seen)
		}
	}
	// --style none: problems only; a single style.
	p := filepath.Join(dir, "none.jsonl")
	if err := runData([]string{"gen", "--task", "linear", "--n", "3", "--style", "none", "--out", p}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if ex, err := data.Read(p); err != nil || ex[0].Response != "" || ex[0].Task != "linear" {
		t.Fatalf("style none: %+v %v", ex, err)
	}
	if err := runData([]string{"gen", "--task", "countdown", "--n", "3", "--style", "terse", "--difficulty", "4", "--out", p}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, e := range must(data.Read(p)) {
		if e.Style != "terse" || e.Difficulty != 4 || !strings.HasPrefix(e.Response, "Answer: ") || strings.Contains(e.Response, "\n") {
			t.Fatalf("terse: %+v", e)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestDataShow(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d.jsonl")
	ex := []data.Example{
		{Task: "arithmetic", Difficulty: 1, Prompt: "Compute 2+3.", Answer: "5", Response: "2+3 = 5\nAnswer: 5", Style: "chain"},
		{Task: "linear", Prompt: "Solve x+1=2.", Answer: "1"},
	}
	if err := data.WriteJSONL(p, ex); err != nil {
		t.Fatal(err)
	}
	want := "#0 arithmetic (difficulty 1) answer \"5\"\n  user: Compute 2+3.\n  response (chain):\n    2+3 = 5\n    Answer: 5\n2 examples in " + p + "\n"
	for _, args := range [][]string{{"show", p, "--n", "1"}, {"show", "--n", "1", p}} {
		var out bytes.Buffer
		if err := runData(args, &out); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Fatalf("%v:\n%s\nwant\n%s", args, out.String(), want)
		}
	}
	var out bytes.Buffer
	if err := runData([]string{"show", p}, &out); err != nil || !strings.Contains(out.String(), "#1 linear (difficulty 0) answer \"1\"\n  user: Solve x+1=2.\n2 examples") {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"show"}, "usage: keel data show"},
		{[]string{"show", p, "extra"}, `unexpected argument "extra"`},
		{[]string{"show", filepath.Join(dir, "none.jsonl")}, "none.jsonl"},
	} {
		if err := runData(c.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
}

func TestDataScore(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d.jsonl")
	ex := []data.Example{
		{Task: "arithmetic", Difficulty: 1, Prompt: "Compute 2+3.", Answer: "5", Response: "Answer: 5"},
		{Task: "countdown", Difficulty: 2, Prompt: "Use 2 3 4 to make 14.", Answer: "14|2,3,4", Response: "Answer: 2+3*4"},
		{Task: "countdown", Difficulty: 2, Prompt: "Use 2 3 4 to make 20.", Answer: "20|2,3,4", Response: "Answer: 2*3*4"},
	}
	if err := data.WriteJSONL(p, ex); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runData([]string{"score", p}, &out); err != nil {
		t.Fatal(err)
	}
	want := "3 rows, 1 response(s) each\n" +
		"all                   2/3      accuracy 0.667\n" +
		"arithmetic            1/1      accuracy 1.000\n" +
		"arithmetic d1         1/1      accuracy 1.000\n" +
		"countdown             1/2      accuracy 0.500\n" +
		"countdown d2          1/2      accuracy 0.500\n"
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
	// Two responses per row from a file: avg@2.
	rp := filepath.Join(dir, "r.jsonl")
	var lines []string
	for _, r := range []string{"Answer: 5", "Answer: 6", "Answer: 3*4+2", "nothing", `\boxed{(2+3)*4}`, "Answer: (2+3)*4 = 20"} {
		b, _ := json.Marshal(map[string]string{"response": r})
		lines = append(lines, string(b))
	}
	os.WriteFile(rp, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	out.Reset()
	if err := runData([]string{"score", p, "--responses", rp}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "3 rows, 2 response(s) each\nall                   4/6      accuracy 0.667\narithmetic            1/2      accuracy 0.500\n") {
		t.Fatalf("avg@2:\n%s", out.String())
	}
	bad := filepath.Join(dir, "bad.jsonl")
	for _, c := range []struct {
		body, want string
	}{
		{lines[0] + "\n" + lines[1] + "\n", "bad.jsonl: 2 responses for the 3 rows"},
		{lines[0] + "\n\n" + `{"text": "x"}` + "\n", `bad.jsonl:3: missing field "response"`},
		{lines[0] + "\n" + `{"response": 5}` + "\n", "bad.jsonl:2: invalid JSON"},
		{"\n", "bad.jsonl: no responses"},
	} {
		os.WriteFile(bad, []byte(c.body), 0o644)
		if err := runData([]string{"score", p, "--responses", bad}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.body, err, c.want)
		}
	}
	noResp := filepath.Join(dir, "q.jsonl")
	data.WriteJSONL(noResp, []data.Example{{Task: "linear", Prompt: "Solve x=1.", Answer: "1"}})
	if err := runData([]string{"score", noResp}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "q.jsonl: row 0 has no response") {
		t.Errorf("no responses: %v", err)
	}
	// A task without a verifier is an error, not a silent 0.
	unknown := filepath.Join(dir, "u.jsonl")
	data.WriteJSONL(unknown, []data.Example{ex[0], {Task: "chess", Prompt: "?", Answer: "1", Response: "1"}})
	if err := runData([]string{"score", unknown}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `u.jsonl: row 1: no verifier for task "chess"`) {
		t.Errorf("unknown task: %v", err)
	}
}

// Real math data in verl's layout (data_source, prompt as a chat,
// reward_model.ground_truth) scores with the math and gsm8k verifiers;
// --out writes one verdict per response with the extracted answer.
func TestDataScoreMathVerdicts(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "verl.jsonl")
	rows := []string{
		`{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in all?"}], "ability": "math", "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"split": "test", "index": 7}}`,
		`{"data_source": "HuggingFaceH4/MATH-500", "prompt": [{"role": "user", "content": "Convert (0,3) to polar coordinates."}], "reward_model": {"ground_truth": "\\left( 3, \\frac{\\pi}{2} \\right)"}}`,
		`{"data_source": "math_dapo", "prompt": [{"role": "user", "content": "Find 1+2+...+8."}], "reward_model": {"ground_truth": "36"}}`,
	}
	os.WriteFile(p, []byte(strings.Join(rows, "\n")+"\n"), 0o644)
	rp := filepath.Join(dir, "r.jsonl")
	var lines []string
	for _, r := range []string{
		"48/2 = 24, 48+24 = 72\n#### 72", "#### 72 or 73",
		`The polar coordinates are $\boxed{(3, \frac{\pi}{2})}$.`, `$\boxed{(3, 90^\circ)}$`,
		"Answer: 36", `\boxed{36} or maybe \boxed{35}`,
	} {
		b, _ := json.Marshal(map[string]string{"response": r})
		lines = append(lines, string(b))
	}
	os.WriteFile(rp, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	vp := filepath.Join(dir, "verdicts.jsonl")
	var out bytes.Buffer
	if err := runData([]string{"score", p, "--responses", rp, "--out", vp}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "3 rows, 2 response(s) each\n"+
		"all                            3/6      accuracy 0.500\n"+
		"HuggingFaceH4/MATH-500         1/2      accuracy 0.500\n") {
		t.Fatalf("%s", out.String())
	}
	b, err := os.ReadFile(vp)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"row":0,"sample":0,"id":"7","task":"openai/gsm8k","truth":"72","extracted":"72","extracted_ok":true,"verdict":1}
{"row":0,"sample":1,"id":"7","task":"openai/gsm8k","truth":"72","extracted":"72 or 73","extracted_ok":true,"verdict":0}
{"row":1,"sample":0,"task":"HuggingFaceH4/MATH-500","truth":"\\left( 3, \\frac{\\pi}{2} \\right)","extracted":"(3, \\frac{\\pi}{2})","extracted_ok":true,"verdict":1}
{"row":1,"sample":1,"task":"HuggingFaceH4/MATH-500","truth":"\\left( 3, \\frac{\\pi}{2} \\right)","extracted":"(3, 90^\\circ)","extracted_ok":true,"verdict":0}
{"row":2,"sample":0,"task":"math_dapo","truth":"36","extracted":"36","extracted_ok":true,"verdict":1}
{"row":2,"sample":1,"task":"math_dapo","truth":"36","extracted":"35","extracted_ok":false,"verdict":0}
`
	if string(b) != want {
		t.Fatalf("verdicts:\n%s\nwant\n%s", b, want)
	}
}

func TestDataGenErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.jsonl")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"gen", "--task", "chess", "--out", out}, "unknown task"},
		{[]string{"gen", "--out", out}, "--task is required"},
		{[]string{"gen", "--task", "linear"}, "--out is required"},
		{[]string{"gen", "--task", "linear", "--n", "0", "--out", out}, "--n 0"},
		{[]string{"gen", "--task", "linear", "--difficulty", "0-2", "--out", out}, "difficulty 0"},
		{[]string{"gen", "--task", "linear", "--difficulty", "easy", "--out", out}, "--difficulty"},
		{[]string{"gen", "--task", "linear", "--style", "poem", "--out", out}, "unknown style"},
		{[]string{"gen", "--task", "linear", "--out", "x.csv"}, ".parquet"},
		{[]string{"gen", "--task", "linear", "--out", out, "stray"}, `unexpected argument "stray"`},
		{[]string{"gen", "--bogus"}, "bogus"},
		{[]string{"frobnicate"}, "unknown subcommand"},
		{nil, "usage: keel data gen"},
	} {
		if err := runData(c.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed gen left a file")
	}
	var help bytes.Buffer
	if err := runData([]string{"help"}, &help); err != nil || !strings.Contains(help.String(), "keel data score") {
		t.Errorf("help: %v %q", err, help.String())
	}
}

func TestDataSolve(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	body := `{"data_source": "countdown", "prompt": [{"role": "user", "content": "Using [3, 8, 1] make 24."}], "reward_model": {"ground_truth": {"target": 24, "numbers": [3, 8, 1]}}}
{"task": "linear", "prompt": "Solve 2x=3.", "answer": "1"}
{"task": "arithmetic", "prompt": "Compute 9+65.", "answer": "74"}
`
	os.WriteFile(in, []byte(body), 0o644)
	out := filepath.Join(dir, "out.parquet")
	if err := runData([]string{"solve", in, "--out", out}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "in.jsonl: row 1: linear problem") {
		t.Fatalf("unsolvable row: %v", err)
	}
	var msg bytes.Buffer
	if err := runData([]string{"solve", in, "--out", out, "--skip", "--style", "scratch"}, &msg); err != nil {
		t.Fatal(err)
	}
	if msg.String() != "2 of 3 rows with reference solutions in "+out+"\n" {
		t.Fatalf("%q", msg.String())
	}
	ex, err := data.Read(out)
	if err != nil || len(ex) != 2 {
		t.Fatalf("%+v %v", ex, err)
	}
	if ex[0].Response != "3*8 = 24\nAnswer: 3*8" || ex[1].Response != "add 60: 9+60 = 69\nadd 5: 69+5 = 74\nAnswer: 74" || ex[1].Style != "scratch" {
		t.Fatalf("responses: %+v", ex)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"solve", in}, "--out is required"},
		{[]string{"solve", "--out", out}, "usage: keel data solve"},
		{[]string{"solve", in, "--out", filepath.Join(dir, "x.txt")}, ".parquet"},
		{[]string{"solve", in, "--out", out, "--style", "poem"}, "unknown style"},
	} {
		if err := runData(c.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
}
