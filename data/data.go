// Package data reads and writes keel's data sets: problems with their
// ground-truth answers (for RL and evaluation) and, for supervised cold
// starts, reference responses. Files are JSONL, one example per line, in
// keel's plain layout or in the field names verl's data sets use.
package data

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/tokenizer"
)

// Example is one data-set row.
type Example struct {
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
	Task        *string         `json:"task"`
	DataSource  *string         `json:"data_source"`
	Difficulty  int             `json:"difficulty"`
	Prompt      json.RawMessage `json:"prompt"`
	Messages    json.RawMessage `json:"messages"`
	Answer      *string         `json:"answer"`
	GroundTruth *string         `json:"ground_truth"`
	RewardModel *struct {
		GroundTruth *string `json:"ground_truth"`
	} `json:"reward_model"`
	Response *string `json:"response"`
	Style    string  `json:"style"`
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
	switch {
	case r.Answer != nil:
		e.Answer = *r.Answer
	case r.GroundTruth != nil:
		e.Answer = *r.GroundTruth
	case r.RewardModel != nil && r.RewardModel.GroundTruth != nil:
		e.Answer = *r.RewardModel.GroundTruth
	default:
		return e, errors.New(`missing field "answer" (or "ground_truth", "reward_model.ground_truth")`)
	}
	prompt := r.Prompt
	if len(prompt) == 0 || string(prompt) == "null" {
		prompt = r.Messages
	}
	switch {
	case len(prompt) == 0 || string(prompt) == "null":
		return e, errors.New(`missing field "prompt"`)
	case prompt[0] == '"':
		if err := json.Unmarshal(prompt, &e.Prompt); err != nil {
			return e, fmt.Errorf(`field "prompt": %v`, err)
		}
	case prompt[0] == '[':
		if err := json.Unmarshal(prompt, &e.Messages); err != nil {
			return e, fmt.Errorf(`field "prompt": want a string or a list of {"role", "content"}: %v`, err)
		}
		if len(e.Messages) == 0 {
			return e, errors.New(`field "prompt" is an empty chat`)
		}
		for i, m := range e.Messages {
			if m.Role == "" {
				return e, fmt.Errorf(`field "prompt"[%d]: missing "role"`, i)
			}
		}
	default:
		return e, errors.New(`field "prompt": want a string or a list of {"role", "content"}`)
	}
	e.Difficulty, e.Style = r.Difficulty, r.Style
	if r.Response != nil {
		e.Response = *r.Response
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
		for i := range ex {
			if err := enc.Encode(&ex[i]); err != nil {
				return err
			}
		}
		return nil
	})
}
