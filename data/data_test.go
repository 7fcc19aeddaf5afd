package data

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/keel-rl/keel/tasks"
	"github.com/keel-rl/keel/tokenizer"
)

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestJSONLRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ex := []Example{
		{ID: "a1", Task: "arithmetic", Difficulty: 2, Prompt: "Compute 1+2.", Answer: "3", Response: "Answer: 3", Style: "terse"},
		{Task: "linear", Messages: []tokenizer.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Solve x+1=3.\n"}}, Answer: "2"},
		{Task: "countdown", Prompt: "Use 1 2 to make 3.", Answer: "3|1,2", Response: "1+2=3\nAnswer: 1+2", Style: "chain", Difficulty: 1},
	}
	p := filepath.Join(dir, "d.jsonl")
	if err := WriteJSONL(p, ex); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ex) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, ex)
	}
	if c := got[0].Chat(); len(c) != 1 || c[0].Role != "user" || c[0].Content != "Compute 1+2." {
		t.Fatalf("Chat() = %+v", c)
	}
	b, _ := os.ReadFile(p)
	if first := strings.SplitN(string(b), "\n", 2)[0]; first != `{"id":"a1","task":"arithmetic","difficulty":2,"prompt":"Compute 1+2.","answer":"3","response":"Answer: 3","style":"terse"}` {
		t.Fatalf("keel's layout changed: %s", first)
	}
}

// verl's field names, and what other data sets put in them.
func TestJSONLOtherLayouts(t *testing.T) {
	dir := t.TempDir()
	body := strings.Join([]string{
		`{"data_source": "countdown", "prompt": [{"role": "user", "content": "Use 1 2 to make 3."}], "ability": "math", "reward_model": {"style": "rule", "ground_truth": "3|1,2"}, "extra_info": {"index": 7, "split": "test"}}`,
		`{"task": "arithmetic", "prompt": "Compute 40+2.", "answer": 42, "difficulty": "hard", "id": 12}`,
		`{"data_source": "countdown", "prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": {"target": 24, "numbers": [3, 8, 1]}}}`,
		`{"task": "linear", "messages": [{"role": "user", "content": ""}], "ground_truth": "-1.5", "difficulty": 3, "style": null}`,
		"",
	}, "\r\n")
	got, err := Read(write(t, dir, "v.jsonl", body))
	if err != nil {
		t.Fatal(err)
	}
	want := []Example{
		{ID: "7", Task: "countdown", Messages: []tokenizer.Message{{Role: "user", Content: "Use 1 2 to make 3."}}, Answer: "3|1,2", Extra: json.RawMessage(`{"index":7,"split":"test"}`)},
		{ID: "12", Task: "arithmetic", Prompt: "Compute 40+2.", Answer: "42"},
		{Task: "countdown", Messages: []tokenizer.Message{{Role: "user", Content: "x"}}, Answer: "24|3,8,1"},
		{Task: "linear", Messages: []tokenizer.Message{{Role: "user", Content: ""}}, Answer: "-1.5", Difficulty: 3},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("\n got %+v\nwant %+v", got, want)
	}
	if tasks.Score(got[2].Task, got[2].Answer, "Answer: 3*8*1") != 1 {
		t.Fatal("TinyZero's Countdown ground truth does not verify")
	}
}

func TestJSONLErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ body, want string }{
		{`{"task": "a", "prompt": "p", "answer": "1"}` + "\n\n" + `{"task": "a", "prompt": "p"}`, `x.jsonl:3: missing field "answer"`},
		{`{"prompt": "p", "answer": "1"}`, `x.jsonl:1: missing field "task"`},
		{`{"task": "", "prompt": "p", "answer": "1"}`, `x.jsonl:1: field "task" (or "data_source") is empty`},
		{`{"task": "a", "answer": "1"}`, `x.jsonl:1: missing field "prompt"`},
		{`{"task": "a", "answer": "1", "prompt": ""}`, `x.jsonl:1: field "prompt" is empty`},
		{`{"task": "a", "answer": "1", "prompt": 5}`, `x.jsonl:1: field "prompt"`},
		{`{"task": "a", "answer": "1", "prompt": []}`, `x.jsonl:1: field "prompt" is an empty chat`},
		{`{"task": "a", "answer": "1", "prompt": [{"content": "x"}]}`, `x.jsonl:1: field "prompt"[0]: missing "role"`},
		{`{"task": "a", "answer": "1", "prompt": [{"role": "user", "content": "x"}, {"role": "user"}]}`, `x.jsonl:1: field "prompt"[1]: missing "content"`},
		{`{"task": "a", "answer": null, "prompt": "p"}`, `x.jsonl:1: missing field "answer"`},
		{`{"task": "a", "answer": true, "prompt": "p"}`, `x.jsonl:1: field "answer": want a string or a number`},
		{`{"task": "a", "reward_model": {"ground_truth": [1]}, "prompt": "p"}`, `x.jsonl:1: field "reward_model.ground_truth": want a string`},
		{`{"task": "a", "reward_model": {"style": "rule"}, "prompt": "p"}`, `x.jsonl:1: missing field "answer"`},
		{`{"task": "a", "answer": "1", "prompt": "p"` + "\n", `x.jsonl:1: invalid JSON`},
		{`{"task": "a", "answer": "1", "prompt": "p"}` + "\n" + `[1, 2]`, `x.jsonl:2: invalid JSON`},
		{`{"task": "a", "answer": "1", "prompt": "p"} {"task": "b"}`, `x.jsonl:1: invalid JSON`},
		{`{"task": 5, "answer": "1", "prompt": "p"}`, `x.jsonl:1: invalid JSON`},
		{"\n\n", "x.jsonl: no examples"},
	} {
		p := write(t, dir, "x.jsonl", c.body)
		if _, err := Read(p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want %q", c.body, err, c.want)
		}
	}
	if _, err := Read(filepath.Join(dir, "x.csv")); err == nil || !strings.Contains(err.Error(), "unknown data format") {
		t.Errorf("csv: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "none.jsonl")); err == nil || !strings.Contains(err.Error(), "none.jsonl") {
		t.Errorf("missing file: %v", err)
	}
	if err := Write(filepath.Join(dir, "x.txt"), nil); err == nil {
		t.Error("wrote a .txt data set")
	}
}

func TestParquetRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ex, err := Generate(GenSpec{Tasks: []string{"countdown", "linear"}, N: 20, Difficulties: []int{1, 3}, Styles: []string{"scratch", "terse"}, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	ex = append(ex, Example{ID: "99", Task: "linear", Messages: []tokenizer.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "Solve x=1."}}, Answer: "1"})
	p := filepath.Join(dir, "d.parquet")
	if err := Write(p, ex); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]Example, len(ex))
	for i, e := range ex {
		// verl's layout: the prompt is always a chat, the ID the row
		// index unless it was an integer.
		e.Messages, e.Prompt = e.Chat(), ""
		if e.ID == "" {
			e.ID = strconv.Itoa(i)
		}
		// extra_info reads back as JSON: the split and index written.
		e.Extra = json.RawMessage(`{"index":` + e.ID + `,"split":"train"}`)
		want[i] = e
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	// The file is verl's layout, column for column.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range pf.Schema().Columns() {
		cols = append(cols, strings.Join(c, "."))
	}
	if got := strings.Join(cols, " "); got != "data_source prompt.list.element.role prompt.list.element.content ability reward_model.style reward_model.ground_truth extra_info.split extra_info.index response style difficulty" {
		t.Fatalf("columns: %s", got)
	}
}

// Layouts other tools write: pyarrow's (every column optional, lists
// named list.item or list.element, extra_info holding anything, numbers
// as ground truths), TinyZero's Countdown and a plain one.
type paMsg struct {
	Content *string `parquet:"content"`
	Role    *string `parquet:"role"`
}
type paItem struct {
	Item *paMsg `parquet:"item"`
}
type paChat struct {
	List []paItem `parquet:"list"`
}
type paReward struct {
	GroundTruth *int64  `parquet:"ground_truth"`
	Style       *string `parquet:"style"`
}
type paExtra struct {
	Answer   *string `parquet:"answer"`
	Index    *int64  `parquet:"index"`
	Question *string `parquet:"question"`
}
type paRow struct {
	DataSource  *string   `parquet:"data_source"`
	Prompt      *paChat   `parquet:"prompt"`
	Ability     *string   `parquet:"ability"`
	RewardModel *paReward `parquet:"reward_model"`
	ExtraInfo   *paExtra  `parquet:"extra_info"`
}

type tzNum struct {
	Element *int64 `parquet:"element"`
}
type tzNums struct {
	List []tzNum `parquet:"list"`
}
type tzTruth struct {
	Numbers *tzNums `parquet:"numbers"`
	Target  *int64  `parquet:"target"`
}
type tzReward struct {
	GroundTruth *tzTruth `parquet:"ground_truth"`
	Style       string   `parquet:"style"`
}
type tzRow struct {
	Target      int64             `parquet:"target"`
	Nums        []int64           `parquet:"nums,list"`
	DataSource  string            `parquet:"data_source"`
	Prompt      []paMsg           `parquet:"prompt,list"`
	RewardModel tzReward          `parquet:"reward_model"`
	ExtraInfo   struct{ I int64 } `parquet:"extra_info"`
}

func ptr[T any](v T) *T { return &v }

func chat(msgs ...string) *paChat {
	c := &paChat{}
	for i := 0; i+1 < len(msgs); i += 2 {
		c.List = append(c.List, paItem{&paMsg{Role: ptr(msgs[i]), Content: ptr(msgs[i+1])}})
	}
	return c
}

func TestParquetOtherLayouts(t *testing.T) {
	dir := t.TempDir()
	pa := filepath.Join(dir, "pyarrow.parquet")
	if err := parquet.WriteFile(pa, []paRow{
		{DataSource: ptr("arithmetic"), Prompt: chat("system", "Think.", "user", "Compute 40+2."), Ability: ptr("math"),
			RewardModel: &paReward{GroundTruth: ptr(int64(42)), Style: ptr("rule")},
			ExtraInfo:   &paExtra{Answer: ptr("42"), Index: ptr(int64(5)), Question: ptr("q")}},
		{DataSource: ptr("linear"), Prompt: chat("user", "Solve x+1=0."), RewardModel: &paReward{GroundTruth: ptr(int64(-1))}},
	}); err != nil {
		t.Fatal(err)
	}
	got, err := Read(pa)
	if err != nil {
		t.Fatal(err)
	}
	want := []Example{
		{ID: "5", Task: "arithmetic", Messages: []tokenizer.Message{{Role: "system", Content: "Think."}, {Role: "user", Content: "Compute 40+2."}}, Answer: "42",
			Extra: json.RawMessage(`{"answer":"42","index":5,"question":"q"}`)},
		{Task: "linear", Messages: []tokenizer.Message{{Role: "user", Content: "Solve x+1=0."}}, Answer: "-1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("pyarrow layout:\n got %+v\nwant %+v", got, want)
	}

	tz := filepath.Join(dir, "tinyzero.parquet")
	if err := parquet.WriteFile(tz, []tzRow{{Target: 24, Nums: []int64{3, 8, 1}, DataSource: "countdown",
		Prompt:      []paMsg{{Role: ptr("user"), Content: ptr("Using the numbers [3, 8, 1], create an equation that equals 24.")}},
		RewardModel: tzReward{GroundTruth: &tzTruth{Target: ptr(int64(24)), Numbers: &tzNums{[]tzNum{{ptr(int64(3))}, {ptr(int64(8))}, {ptr(int64(1))}}}}, Style: "rule"},
	}}); err != nil {
		t.Fatal(err)
	}
	got, err = Read(tz)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Answer != "24|3,8,1" || got[0].Task != "countdown" || !strings.HasPrefix(got[0].Messages[0].Content, "Using the numbers") {
		t.Fatalf("TinyZero layout: %+v", got)
	}
	if tasks.Score(got[0].Task, got[0].Answer, "<answer>(8*3)*1</answer>") != 1 {
		t.Fatal("TinyZero's Countdown does not verify")
	}

	type plain struct {
		Task       string `parquet:"task"`
		Prompt     string `parquet:"prompt"`
		Answer     string `parquet:"answer"`
		Difficulty int32  `parquet:"difficulty"`
		Response   string `parquet:"response"`
	}
	pp := filepath.Join(dir, "plain.parquet")
	if err := parquet.WriteFile(pp, []plain{{"linear", "Solve x+1=2.", "1", 2, "Answer: 1"}}); err != nil {
		t.Fatal(err)
	}
	got, err = Read(pp)
	if want := []Example{{Task: "linear", Prompt: "Solve x+1=2.", Answer: "1", Difficulty: 2, Response: "Answer: 1"}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("plain layout: %+v, %v", got, err)
	}
}

func TestParquetErrorsNameFileRowAndColumn(t *testing.T) {
	dir := t.TempDir()
	check := func(name string, rows any, want string) {
		t.Helper()
		p := filepath.Join(dir, name)
		var err error
		switch r := rows.(type) {
		case []paRow:
			err = parquet.WriteFile(p, r)
		case []struct {
			Task   string `parquet:"task"`
			Prompt string `parquet:"prompt"`
		}:
			err = parquet.WriteFile(p, r)
		case []struct {
			Prompt string `parquet:"prompt"`
			Answer string `parquet:"answer"`
		}:
			err = parquet.WriteFile(p, r)
		case []struct {
			Task   string `parquet:"task"`
			Answer string `parquet:"answer"`
		}:
			err = parquet.WriteFile(p, r)
		default:
			t.Fatalf("%T", rows)
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Read(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", name, err, want)
		}
	}
	good := paRow{DataSource: ptr("linear"), Prompt: chat("user", "p"), RewardModel: &paReward{GroundTruth: ptr(int64(1))}}
	row := func(f func(r *paRow)) []paRow {
		r := good
		f(&r)
		return []paRow{good, good, r}
	}
	check("a.parquet", row(func(r *paRow) { r.RewardModel = &paReward{} }), "a.parquet: row 2: reward_model.ground_truth is null")
	check("b.parquet", row(func(r *paRow) { r.RewardModel = nil }), "b.parquet: row 2: reward_model.ground_truth is null")
	check("c.parquet", row(func(r *paRow) { r.DataSource = nil }), "c.parquet: row 2: data_source is null or empty")
	check("d.parquet", row(func(r *paRow) { r.Prompt = nil }), "d.parquet: row 2: prompt is null or an empty chat")
	check("e.parquet", row(func(r *paRow) { r.Prompt = &paChat{} }), "e.parquet: row 2: prompt is null or an empty chat")
	check("f.parquet", row(func(r *paRow) {
		r.Prompt = &paChat{List: []paItem{{&paMsg{Role: ptr("user"), Content: ptr("a")}}, {&paMsg{Role: ptr("user")}}}}
	}), "f.parquet: row 2: prompt[1] has no content")
	check("g.parquet", row(func(r *paRow) {
		r.Prompt = &paChat{List: []paItem{{&paMsg{Content: ptr("a")}}}}
	}), "g.parquet: row 2: prompt[0] has no role")
	check("h.parquet", row(func(r *paRow) { r.Prompt = &paChat{List: []paItem{{nil}}} }), "h.parquet: row 2: prompt[0] has no role")
	check("i.parquet", []struct {
		Task   string `parquet:"task"`
		Prompt string `parquet:"prompt"`
	}{{"linear", "x"}}, `i.parquet: missing column "reward_model.ground_truth" (or "answer", "ground_truth")`)
	check("j.parquet", []struct {
		Prompt string `parquet:"prompt"`
		Answer string `parquet:"answer"`
	}{{"x", "1"}}, `j.parquet: missing column "data_source" (or "task")`)
	check("k.parquet", []struct {
		Task   string `parquet:"task"`
		Answer string `parquet:"answer"`
	}{{"x", "1"}}, `k.parquet: missing column "prompt"`)

	junk := write(t, dir, "junk.parquet", "not parquet")
	if _, err := Read(junk); err == nil || !strings.Contains(err.Error(), "junk.parquet: not a Parquet file") {
		t.Errorf("junk: %v", err)
	}
	if _, err := Read(filepath.Join(dir, "none.parquet")); err == nil || !strings.Contains(err.Error(), "none.parquet") {
		t.Errorf("missing file: %v", err)
	}
}

// Generation is pinned (the README's figures are reproduced from seeds):
// the same spec gives the same bytes, a larger N extends a smaller one,
// and every reference solution verifies.
func TestGeneratePinned(t *testing.T) {
	spec := GenSpec{Tasks: []string{"arithmetic", "countdown", "linear"}, N: 300, Difficulties: []int{1, 2, 3}, Styles: tasks.Styles, Seed: 1}
	ex, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range ex {
		if tasks.Score(e.Task, e.Answer, e.Response) != 1 {
			t.Fatalf("row %d: reference solution does not verify: %+v", i, e)
		}
	}
	var buf bytes.Buffer
	p := filepath.Join(t.TempDir(), "g.jsonl")
	if err := WriteJSONL(p, ex); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	buf.Write(b)
	if first := strings.SplitN(buf.String(), "\n", 2)[0]; first != `{"task":"arithmetic","difficulty":2,"prompt":"Compute 7-7.","answer":"0","response":"7-7 = 0\nAnswer: 0","style":"chain"}` {
		t.Errorf("first example changed: %s", first)
	}
	if h := fmt.Sprintf("%x", sha256.Sum256(buf.Bytes())); h != "8eb0e192be5f8c0ad865a5b1456857432acd8e54bedec2e184042ddc211b6476" {
		t.Errorf("generated data changed: sha256 %s", h)
	}
	spec.N = 30
	small, _ := Generate(spec)
	if !reflect.DeepEqual(small, ex[:30]) {
		t.Error("a smaller N is not a prefix of a larger one")
	}
	spec.Styles = nil
	for _, e := range must(Generate(spec)) {
		if e.Response != "" || e.Style != "" {
			t.Fatalf("no styles, but a response: %+v", e)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestGenSpecErrors(t *testing.T) {
	for _, c := range []struct {
		spec GenSpec
		want string
	}{
		{GenSpec{Tasks: []string{"linear"}, N: 0, Difficulties: []int{1}}, "n = 0"},
		{GenSpec{N: 1, Difficulties: []int{1}}, "no tasks"},
		{GenSpec{Tasks: []string{"chess"}, N: 1, Difficulties: []int{1}}, `unknown task "chess"`},
		{GenSpec{Tasks: []string{"linear"}, N: 1, Difficulties: []int{6}}, "difficulty 6 out of range"},
		{GenSpec{Tasks: []string{"linear"}, N: 1, Difficulties: []int{1}, Styles: []string{"poem"}}, `unknown style "poem"`},
	} {
		if _, err := Generate(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v, want %q", c.spec, err, c.want)
		}
	}
	for in, want := range map[string]string{"3": "[3]", "1-3": "[1 2 3]", "1, 4,2": "[1 4 2]", "2-2": "[2]"} {
		if d, err := ParseDifficulties(in); err != nil || fmt.Sprint(d) != want {
			t.Errorf("ParseDifficulties(%q) = %v, %v", in, d, err)
		}
	}
	for _, in := range []string{"", "x", "3-1", "1-", "-2", "1,,2", "0", "1-6", "1-1000000000000", "4,9"} {
		if _, err := ParseDifficulties(in); err == nil {
			t.Errorf("ParseDifficulties(%q) accepted", in)
		}
	}
	if s, err := ParseStyles("mixed"); err != nil || len(s) != 3 {
		t.Errorf("mixed: %v %v", s, err)
	}
	if s, err := ParseStyles("chain, terse"); err != nil || fmt.Sprint(s) != "[chain terse]" {
		t.Errorf("list: %v %v", s, err)
	}
}

// The JSONL reader never panics, and what it reads writes and reads back
// the same.
func FuzzReadJSONL(f *testing.F) {
	f.Add([]byte(`{"task": "a", "prompt": "p", "answer": "1"}`))
	f.Add([]byte(`{"data_source": "countdown", "prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": {"target": 24, "numbers": [3, 8, 1]}}, "extra_info": {"index": 3}}` + "\n"))
	f.Add([]byte(`{"task": "a", "prompt": "p", "answer": 1e3, "difficulty": "2", "id": null}` + "\n\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ex, err := readJSONL(bytes.NewReader(b), "f.jsonl")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.jsonl") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		p := filepath.Join(t.TempDir(), "r.jsonl")
		if err := WriteJSONL(p, ex); err != nil {
			t.Fatal(err)
		}
		back, err := ReadJSONL(p)
		if err != nil || !reflect.DeepEqual(back, ex) {
			t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, back, ex)
		}
	})
}

// The Parquet reader gives an error, never a crash or a hang, on damaged
// files.
func FuzzReadParquet(f *testing.F) {
	dir := f.TempDir()
	p := filepath.Join(dir, "seed.parquet")
	ex := []Example{{Task: "linear", Prompt: "Solve x=1.", Answer: "1", Response: "Answer: 1", Difficulty: 1}}
	if err := WriteParquet(p, ex); err != nil {
		f.Fatal(err)
	}
	seed, _ := os.ReadFile(p)
	f.Add(seed, 100, byte(1))
	f.Fuzz(func(t *testing.T, b []byte, at int, x byte) {
		if len(b) > 0 {
			b = bytes.Clone(b)
			b[(at%len(b)+len(b))%len(b)] ^= x
		}
		q := filepath.Join(t.TempDir(), "f.parquet")
		if err := os.WriteFile(q, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadParquet(q); err != nil && !strings.Contains(err.Error(), "f.parquet") {
			t.Fatalf("error does not name the file: %v", err)
		}
	})
}

func TestAddResponses(t *testing.T) {
	ex := []Example{
		{Task: "arithmetic", Prompt: "Compute 12*34.", Answer: "408"},
		{Task: "countdown", Messages: []tokenizer.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "Using [3, 8, 1] make 24."}}, Answer: "24|3,8,1"},
		{Task: "linear", Prompt: "Solve x=1.", Answer: "1", Response: "kept", Style: "mine"},
		{Task: "linear", Prompt: "Solve 2x=3.", Answer: "1"},
	}
	if _, err := AddResponses(ex, []string{"chain"}, 1, false); err == nil || !strings.Contains(err.Error(), "row 3: linear problem") {
		t.Fatalf("unsolvable row: %v", err)
	}
	got, err := AddResponses(ex, []string{"chain"}, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"12*34 = 12*30+12*4 = 360+48 = 408\nAnswer: 408", "3*8=24\nAnswer: 3*8", "kept"}
	if len(got) != 3 {
		t.Fatalf("%d rows kept, want 3", len(got))
	}
	for i, w := range want {
		if got[i].Response != w || (i < 2 && got[i].Style != "chain") {
			t.Errorf("row %d: %q (%s), want %q", i, got[i].Response, got[i].Style, w)
		}
	}
	if ex[0].Response != "" {
		t.Error("AddResponses changed its input")
	}
	a, _ := AddResponses(ex[:2], tasks.Styles, 7, false)
	b, _ := AddResponses(ex[:2], tasks.Styles, 7, false)
	if !reflect.DeepEqual(a, b) {
		t.Error("not reproducible")
	}
	if _, err := AddResponses(ex, []string{"poem"}, 1, true); err == nil {
		t.Error("unknown style accepted")
	}
	if _, err := AddResponses([]Example{{Task: "chess", Prompt: "p", Answer: "1"}}, []string{"terse"}, 1, false); err == nil || !strings.Contains(err.Error(), "row 0: unknown task") {
		t.Errorf("unknown task: %v", err)
	}
}

// verl's math data sets as its preprocessing scripts write them: GSM8K
// (examples/data_preprocess/gsm8k.py), MATH (math_dataset.py) and
// DAPO-Math-17k (a uuid as extra_info.index) read with their data_source
// as the task, and keel's math and gsm8k verifiers score them.
type mathReward struct {
	GroundTruth string `parquet:"ground_truth"`
	Style       string `parquet:"style"`
}
type mathExtra struct {
	Split string `parquet:"split"`
	Index string `parquet:"index"`
}
type mathRow struct {
	DataSource  string     `parquet:"data_source"`
	Prompt      []paMsg    `parquet:"prompt,list"`
	Ability     string     `parquet:"ability"`
	RewardModel mathReward `parquet:"reward_model"`
	ExtraInfo   mathExtra  `parquet:"extra_info"`
}

func TestParquetMathDataSets(t *testing.T) {
	p := filepath.Join(t.TempDir(), "math.parquet")
	user := func(s string) []paMsg { return []paMsg{{Role: ptr("user"), Content: ptr(s)}} }
	rows := []mathRow{
		{"openai/gsm8k", user("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May? Let's think step by step and output the final answer after \"####\"."),
			"math", mathReward{"72", "rule"}, mathExtra{"train", "0"}},
		{"DigitalLearningGmbH/MATH-lighteval", user(`What is the domain of $\sqrt{x-2}$? Let's think step by step and output the final answer within \boxed{}.`),
			"math", mathReward{`[2,\infty)`, "rule"}, mathExtra{"test", "1"}},
		{"math_dapo", user("Solve the following math problem step by step. The last line of your response should be of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nFind 1+2+...+8.\n\nRemember to put your answer on its own line after \"Answer:\""),
			"MATH", mathReward{"36", "rule-lighteval/MATH_v2"}, mathExtra{"", "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"}},
	}
	if err := parquet.WriteFile(p, rows); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[2].ID != "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079" || got[1].Answer != `[2,\infty)` || got[0].Task != "openai/gsm8k" {
		t.Fatalf("%+v", got)
	}
	for i, c := range []struct {
		right, wrong string
	}{
		{"48/2 = 24 in May, 48+24 = 72.\n#### 72", "#### 24"},
		{`We need $x \ge 2$, so the domain is $\boxed{[2, \infty)}$.`, `so $\boxed{(2, \infty)}$.`},
		{"The sum is 8*9/2 = 36.\nAnswer: 36", "Answer: 35"},
	} {
		if s := tasks.Score(got[i].Task, got[i].Answer, c.right); s != 1 {
			t.Errorf("%s: right answer scores %v", got[i].Task, s)
		}
		if s := tasks.Score(got[i].Task, got[i].Answer, c.wrong); s != 0 {
			t.Errorf("%s: wrong answer scores %v", got[i].Task, s)
		}
	}
}

type nestedMeta struct {
	Level *int64   `parquet:"level"`
	Score *float64 `parquet:"score"`
	Hard  *bool    `parquet:"hard"`
}
type nestedExtra struct {
	Split *string     `parquet:"split"`
	Meta  *nestedMeta `parquet:"meta"`
}
type nestedRow struct {
	DataSource string       `parquet:"data_source"`
	Prompt     string       `parquet:"prompt"`
	Answer     string       `parquet:"answer"`
	ExtraInfo  *nestedExtra `parquet:"extra_info"`
}

// extra_info reads as JSON whatever its fields: nested structs as
// objects, typed values, a null field or nested struct as null, a null
// extra_info as none.
func TestParquetExtraInfo(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.parquet")
	if err := parquet.WriteFile(p, []nestedRow{
		{DataSource: "gsm8k", Prompt: "q1", Answer: "1", ExtraInfo: &nestedExtra{Split: ptr("test"), Meta: &nestedMeta{Level: ptr(int64(3)), Score: ptr(0.5), Hard: ptr(true)}}},
		{DataSource: "gsm8k", Prompt: "q2", Answer: "2", ExtraInfo: &nestedExtra{Meta: &nestedMeta{Level: ptr(int64(1))}}},
		{DataSource: "gsm8k", Prompt: "q3", Answer: "3"},
		{DataSource: "gsm8k", Prompt: "q4", Answer: "4", ExtraInfo: &nestedExtra{Split: ptr("y")}},
	}); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`{"meta":{"hard":true,"level":3,"score":0.5},"split":"test"}`, `{"meta":{"hard":null,"level":1,"score":null},"split":null}`, ``,
		`{"meta":null,"split":"y"}`}
	for i, w := range want {
		if string(got[i].Extra) != w {
			t.Errorf("row %d: extra_info %s, want %s", i, got[i].Extra, w)
		}
	}
}
