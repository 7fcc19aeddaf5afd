package data

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/parquet-go/parquet-go"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/tokenizer"
)

// verlRow is verl's parquet layout (as its data preprocessing scripts
// write it), plus keel's optional response, style and difficulty columns.
type verlRow struct {
	DataSource  string        `parquet:"data_source"`
	Prompt      []verlMessage `parquet:"prompt,list"`
	Ability     string        `parquet:"ability"`
	RewardModel verlReward    `parquet:"reward_model"`
	ExtraInfo   verlExtra     `parquet:"extra_info"`
	Response    string        `parquet:"response,optional"`
	Style       string        `parquet:"style,optional"`
	Difficulty  int64         `parquet:"difficulty,optional"`
}

type verlMessage struct {
	Role    string `parquet:"role"`
	Content string `parquet:"content"`
}

type verlReward struct {
	Style       string `parquet:"style"`
	GroundTruth string `parquet:"ground_truth"`
}

type verlExtra struct {
	Split string `parquet:"split"`
	Index int64  `parquet:"index"`
}

// plainRow is the plain layout: prompt and answer strings.
type plainRow struct {
	Task       string `parquet:"task,optional"`
	DataSource string `parquet:"data_source,optional"`
	Prompt     string `parquet:"prompt"`
	Answer     string `parquet:"answer"`
	Response   string `parquet:"response,optional"`
	Difficulty int64  `parquet:"difficulty,optional"`
}

// ReadParquet reads a Parquet data set in verl's layout (data_source,
// prompt as a list of {role, content}, reward_model.ground_truth) or a
// plain one (prompt and answer strings, task or data_source). A missing
// column is an error naming the file and the column; a row without a
// prompt or task names the row.
func ReadParquet(path string) ([]Example, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := parquet.OpenFile(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: not a Parquet file: %v", path, err)
	}
	schema := f.Schema()
	has := func(col ...string) bool {
		if len(col) == 1 { // a top-level field, leaf or group
			for _, f := range schema.Fields() {
				if f.Name() == col[0] {
					return true
				}
			}
			return false
		}
		_, ok := schema.Lookup(col...)
		return ok
	}
	var out []Example
	switch {
	case !has("prompt"):
		return nil, fmt.Errorf("%s: missing column \"prompt\"", path)
	case has("prompt", "list", "element", "content"):
		for _, c := range [][]string{{"data_source"}, {"reward_model", "ground_truth"}} {
			if !has(c...) {
				return nil, fmt.Errorf("%s: verl layout without column %q", path, joinPath(c))
			}
		}
		rows, err := parquet.Read[verlRow](bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		for i, r := range rows {
			e := Example{Task: r.DataSource, Answer: r.RewardModel.GroundTruth, Response: r.Response, Style: r.Style, Difficulty: int(r.Difficulty)}
			for _, m := range r.Prompt {
				e.Messages = append(e.Messages, tokenizer.Message{Role: m.Role, Content: m.Content})
			}
			if err := checkRow(&e); err != nil {
				return nil, fmt.Errorf("%s: row %d: %v", path, i, err)
			}
			out = append(out, e)
		}
	default:
		if !has("answer") {
			return nil, fmt.Errorf("%s: missing column \"answer\" (or verl's reward_model.ground_truth with a chat prompt)", path)
		}
		if !has("task") && !has("data_source") {
			return nil, fmt.Errorf("%s: missing column \"task\" (or \"data_source\")", path)
		}
		rows, err := parquet.Read[plainRow](bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		for i, r := range rows {
			e := Example{Task: r.Task, Prompt: r.Prompt, Answer: r.Answer, Response: r.Response, Difficulty: int(r.Difficulty)}
			if e.Task == "" {
				e.Task = r.DataSource
			}
			if err := checkRow(&e); err != nil {
				return nil, fmt.Errorf("%s: row %d: %v", path, i, err)
			}
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no examples", path)
	}
	return out, nil
}

func joinPath(c []string) string {
	s := c[0]
	for _, x := range c[1:] {
		s += "." + x
	}
	return s
}

func checkRow(e *Example) error {
	switch {
	case e.Task == "":
		return fmt.Errorf("empty task (data_source)")
	case e.Prompt == "" && len(e.Messages) == 0:
		return fmt.Errorf("empty prompt")
	}
	return nil
}

// WriteParquet writes examples in verl's layout (so verl can train on keel's
// generated data), with keel's response, style and difficulty as extra
// columns, crash safe.
func WriteParquet(path string, ex []Example) error {
	rows := make([]verlRow, len(ex))
	for i, e := range ex {
		r := verlRow{DataSource: e.Task, Ability: "math", RewardModel: verlReward{Style: "rule", GroundTruth: e.Answer},
			ExtraInfo: verlExtra{Split: "train", Index: int64(i)}, Response: e.Response, Style: e.Style, Difficulty: int64(e.Difficulty)}
		for _, m := range e.Chat() {
			r.Prompt = append(r.Prompt, verlMessage{Role: m.Role, Content: m.Content})
		}
		rows[i] = r
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		pw := parquet.NewGenericWriter[verlRow](w)
		if _, err := pw.Write(rows); err != nil {
			return err
		}
		return pw.Close()
	})
}
