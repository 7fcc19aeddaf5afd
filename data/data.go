// Package data reads and writes keel's data sets: problems with their
// ground-truth answers (for RL and evaluation) and, for supervised cold
// starts, reference responses. Files are JSONL, one example per line, or
// Parquet, in keel's plain layout (task, prompt, answer, response) or in
// verl's (data_source, prompt as a chat list, reward_model.ground_truth).
package data

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/tokenizer"
)

// Example is one data-set row.
type Example struct {
	// ID identifies the row when the file gives one ("id", or verl's
	// extra_info.index); it may be empty.
	ID string `json:"id,omitempty"`
	// Task names the verifier (verl's data_source).
	Task       string `json:"task"`
	Difficulty int    `json:"difficulty,omitempty"`
	// Prompt is the question as plain text; Messages, when set, is the
	// prompt as a chat (it then takes precedence).
	Prompt   string              `json:"prompt,omitempty"`
	Messages []tokenizer.Message `json:"messages,omitempty"`
	// Answer is the ground truth the verifier checks.
	Answer string `json:"answer"`
	// Response is a reference solution (supervised data only).
	Response string `json:"response,omitempty"`
	Style    string `json:"style,omitempty"`
	// Extra is the row's extra_info object (verl's) as compact JSON, which
	// an external reward program and an environment server receive: a
	// JSONL row's as written, a Parquet row's scalar fields and nested
	// structs (lists inside it are not read). WriteParquet writes only
	// split and index.
	Extra json.RawMessage `json:"extra_info,omitempty"`
}

// Chat returns the prompt as chat messages: Messages, or one user message
// holding Prompt.
func (e *Example) Chat() []tokenizer.Message {
	if len(e.Messages) > 0 {
		return e.Messages
	}
	return []tokenizer.Message{{Role: "user", Content: e.Prompt}}
}

// rawExample accepts keel's field names and verl's: prompt as a string or
// a chat list, the answer as "answer", "ground_truth" or
// reward_model.ground_truth, the task as "task" or "data_source".
type rawExample struct {
	ID          json.RawMessage `json:"id"`
	Task        *string         `json:"task"`
	DataSource  *string         `json:"data_source"`
	Difficulty  json.RawMessage `json:"difficulty"`
	Prompt      json.RawMessage `json:"prompt"`
	Messages    json.RawMessage `json:"messages"`
	Answer      json.RawMessage `json:"answer"`
	GroundTruth json.RawMessage `json:"ground_truth"`
	RewardModel *struct {
		GroundTruth json.RawMessage `json:"ground_truth"`
	} `json:"reward_model"`
	ExtraInfo json.RawMessage `json:"extra_info"`
	Response  *string         `json:"response"`
	Style     *string         `json:"style"`
}

// rawMessage is one chat message as read, to tell a missing field from an
// empty one.
type rawMessage struct {
	Role    *string `json:"role"`
	Content *string `json:"content"`
}

// given reports whether a field is present and not null.
func given(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" }

// scalarText reads a JSON string or number as text (a number keeps its
// literal spelling: 42 gives "42").
func scalarText(m json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(m, &s) == nil {
		return s, true
	}
	var n json.Number
	if json.Unmarshal(m, &n) == nil {
		return n.String(), true
	}
	return "", false
}

// groundTruth reads a ground truth: a string, a number, or TinyZero's
// Countdown struct {"target": T, "numbers": [n1, ...]}, which becomes
// keel's "T|n1,n2,...".
func groundTruth(m json.RawMessage) (string, bool) {
	if s, ok := scalarText(m); ok {
		return s, true
	}
	var cd struct {
		Target  *json.Number  `json:"target"`
		Numbers []json.Number `json:"numbers"`
	}
	if json.Unmarshal(m, &cd) != nil || cd.Target == nil || len(cd.Numbers) == 0 {
		return "", false
	}
	nums := make([]string, len(cd.Numbers))
	for i, n := range cd.Numbers {
		nums[i] = n.String()
	}
	return cd.Target.String() + "|" + strings.Join(nums, ","), true
}

func (r *rawExample) example() (Example, error) {
	var e Example
	switch {
	case r.Task != nil:
		e.Task = *r.Task
	case r.DataSource != nil:
		e.Task = *r.DataSource
	default:
		return e, errors.New(`missing field "task" (or "data_source")`)
	}
	if e.Task == "" {
		return e, errors.New(`field "task" (or "data_source") is empty`)
	}
	var answer json.RawMessage
	name := "answer"
	switch {
	case given(r.Answer):
		answer = r.Answer
	case given(r.GroundTruth):
		answer, name = r.GroundTruth, "ground_truth"
	case r.RewardModel != nil && given(r.RewardModel.GroundTruth):
		answer, name = r.RewardModel.GroundTruth, "reward_model.ground_truth"
	default:
		return e, errors.New(`missing field "answer" (or "ground_truth", "reward_model.ground_truth")`)
	}
	var ok bool
	if e.Answer, ok = groundTruth(answer); !ok {
		return e, fmt.Errorf(`field %q: want a string or a number`, name)
	}
	prompt := r.Prompt
	if !given(prompt) {
		prompt = r.Messages
	}
	switch {
	case !given(prompt):
		return e, errors.New(`missing field "prompt"`)
	case prompt[0] == '"':
		if err := json.Unmarshal(prompt, &e.Prompt); err != nil {
			return e, fmt.Errorf(`field "prompt": %v`, err)
		}
		if e.Prompt == "" {
			return e, errors.New(`field "prompt" is empty`)
		}
	case prompt[0] == '[':
		var msgs []rawMessage
		if err := json.Unmarshal(prompt, &msgs); err != nil {
			return e, fmt.Errorf(`field "prompt": want a string or a list of {"role", "content"}: %v`, err)
		}
		if len(msgs) == 0 {
			return e, errors.New(`field "prompt" is an empty chat`)
		}
		for i, m := range msgs {
			switch {
			case m.Role == nil || *m.Role == "":
				return e, fmt.Errorf(`field "prompt"[%d]: missing "role"`, i)
			case m.Content == nil:
				return e, fmt.Errorf(`field "prompt"[%d]: missing "content"`, i)
			}
			e.Messages = append(e.Messages, tokenizer.Message{Role: *m.Role, Content: *m.Content})
		}
	default:
		return e, errors.New(`field "prompt": want a string or a list of {"role", "content"}`)
	}
	// Optional fields. A difficulty that is not an integer (some data sets
	// use words) is ignored rather than refused.
	if given(r.Difficulty) {
		if d, ok := scalarText(r.Difficulty); ok {
			e.Difficulty, _ = strconv.Atoi(d)
		}
	}
	var extra struct {
		Index json.RawMessage `json:"index"`
	}
	if given(r.ExtraInfo) {
		if err := json.Unmarshal(r.ExtraInfo, &extra); err != nil {
			return e, fmt.Errorf(`field "extra_info": want an object: %v`, err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, r.ExtraInfo); err == nil {
			e.Extra = buf.Bytes()
		}
	}
	switch {
	case given(r.ID):
		e.ID, _ = scalarText(r.ID)
	case given(extra.Index):
		e.ID, _ = scalarText(extra.Index)
	}
	if r.Response != nil {
		e.Response = *r.Response
	}
	if r.Style != nil {
		e.Style = *r.Style
	}
	return e, nil
}

// ReadJSONL reads a JSONL data set. A malformed line or a missing field is
// an error naming the file and line. Blank lines are skipped.
func ReadJSONL(path string) ([]Example, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readJSONL(f, path)
}

func readJSONL(r io.Reader, path string) ([]Example, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var out []Example
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if len(bytes.TrimSpace(b)) > 0 {
			var raw rawExample
			dec := json.NewDecoder(bytes.NewReader(b))
			if jerr := dec.Decode(&raw); jerr != nil {
				return nil, fmt.Errorf("%s:%d: invalid JSON object: %v", path, line, jerr)
			}
			if rest := bytes.TrimSpace(b[dec.InputOffset():]); len(rest) > 0 {
				return nil, fmt.Errorf("%s:%d: invalid JSON object: text after the object (one object per line)", path, line)
			}
			e, xerr := raw.example()
			if xerr != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line, xerr)
			}
			out = append(out, e)
		}
		if err == io.EOF {
			break
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no examples", path)
	}
	return out, nil
}

// Read reads a data set, choosing the format by extension: .jsonl (or
// .json lines) or .parquet.
func Read(path string) ([]Example, error) {
	switch {
	case strings.HasSuffix(path, ".jsonl"), strings.HasSuffix(path, ".json"):
		return ReadJSONL(path)
	case strings.HasSuffix(path, ".parquet"):
		return ReadParquet(path)
	}
	return nil, fmt.Errorf("%s: unknown data format (want .jsonl or .parquet)", path)
}

// Write writes a data set, choosing the format by extension: .jsonl in
// keel's layout, .parquet in verl's.
func Write(path string, ex []Example) error {
	switch {
	case strings.HasSuffix(path, ".jsonl"):
		return WriteJSONL(path, ex)
	case strings.HasSuffix(path, ".parquet"):
		return WriteParquet(path, ex)
	}
	return fmt.Errorf("%s: unknown data format (want .jsonl or .parquet)", path)
}

// WriteJSONL writes examples to path in keel's layout, crash safe.
func WriteJSONL(path string, ex []Example) error {
	return atomicfile.Write(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false) // "x=1 -> x" stays readable
		for i := range ex {
			if err := enc.Encode(&ex[i]); err != nil {
				return err
			}
		}
		return nil
	})
}
