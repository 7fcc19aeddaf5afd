package data

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

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

// WriteParquet writes examples in verl's layout (so verl can train on keel's
// generated data): data_source, prompt as a list of {role, content},
// ability, reward_model {style: "rule", ground_truth}, extra_info {split,
// index}, with keel's response, style and difficulty as extra columns,
// crash safe. extra_info.index is the example's ID when that is an
// integer, else its row number from 0.
func WriteParquet(path string, ex []Example) error {
	rows := make([]verlRow, len(ex))
	for i, e := range ex {
		idx := int64(i)
		if v, err := strconv.ParseInt(e.ID, 10, 64); err == nil {
			idx = v
		}
		r := verlRow{DataSource: e.Task, Ability: "math", RewardModel: verlReward{Style: "rule", GroundTruth: e.Answer},
			ExtraInfo: verlExtra{Split: "train", Index: idx}, Response: e.Response, Style: e.Style, Difficulty: int64(e.Difficulty)}
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

// ReadParquet reads a Parquet data set. The columns are found by name
// whatever else the file holds, required or optional, so files written by
// pandas/pyarrow (either list naming), Spark or keel all read:
//
//   - the task: "task" or "data_source";
//   - the prompt: "prompt" (or "messages") as a string, or as verl's list
//     of {role, content};
//   - the ground truth: "answer", "ground_truth" or verl's
//     reward_model.ground_truth, a string or a number; a ground truth
//     struct {target, numbers} (TinyZero's Countdown) becomes keel's
//     "TARGET|n1,n2,...";
//   - optional: "response", "style", "difficulty" (an integer; another type
//     is ignored), and an ID from "id" or extra_info.index.
//
// A missing column is an error naming the file and the column; a null task,
// prompt or ground truth names the file and the row (counted from 0, as
// pandas and verl's extra_info.index count).
func ReadParquet(path string) (ex []Example, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	// parquet-go trusts a file's metadata; a corrupt file must still be an
	// error, not a crash.
	defer func() {
		if r := recover(); r != nil {
			ex, err = nil, fmt.Errorf("%s: corrupt Parquet file: %v", path, r)
		}
	}()
	if err := checkFooter(f, st.Size()); err != nil {
		return nil, fmt.Errorf("%s: not a Parquet file: %v", path, err)
	}
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: not a Parquet file: %v", path, err)
	}
	lay, err := findLayout(pf.Schema())
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	byCol := make([][]parquet.Value, len(pf.Schema().Columns()))
	buf := make([]parquet.Row, 128)
	row := 0
	for _, rg := range pf.RowGroups() {
		rows := rg.Rows()
		for {
			n, rerr := rows.ReadRows(buf)
			for _, r := range buf[:n] {
				for i := range byCol {
					byCol[i] = byCol[i][:0]
				}
				for _, v := range r {
					if c := v.Column(); c >= 0 && c < len(byCol) {
						byCol[c] = append(byCol[c], v)
					}
				}
				e, err := lay.example(byCol)
				if err != nil {
					rows.Close()
					return nil, fmt.Errorf("%s: row %d: %v", path, row, err)
				}
				ex = append(ex, e)
				row++
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				rows.Close()
				return nil, fmt.Errorf("%s: row %d: %v", path, row, rerr)
			}
			if n == 0 {
				break
			}
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
	}
	if len(ex) == 0 {
		return nil, fmt.Errorf("%s: no examples", path)
	}
	return ex, nil
}

// checkFooter checks a Parquet file's frame: "PAR1" at both ends and a
// metadata length that fits in the file. parquet-go allocates the
// metadata's claimed length before reading it, so a damaged length would
// otherwise cost gigabytes.
func checkFooter(r io.ReaderAt, size int64) error {
	if size < 12 {
		return fmt.Errorf("%d bytes, too short", size)
	}
	var head, tail [8]byte
	if _, err := r.ReadAt(head[:4], 0); err != nil {
		return err
	}
	if _, err := r.ReadAt(tail[:], size-8); err != nil {
		return err
	}
	if string(head[:4]) != "PAR1" || string(tail[4:]) != "PAR1" {
		return errors.New(`no "PAR1" magic at its start and end`)
	}
	if n := int64(binary.LittleEndian.Uint32(tail[:4])); n > size-12 {
		return fmt.Errorf("footer claims %d bytes of metadata in a %d-byte file", n, size)
	}
	return nil
}

// column is one leaf column of a Parquet file.
type column struct {
	name   string // dotted path, for messages
	index  int    // column index; -1: absent
	maxDef int    // definition level of a present value
	elem   int    // for a list leaf: the definition level of an element
	// levels[k], for the leaves under extra_info, is the definition level
	// at which the k-th field of the path is defined (a value below it:
	// that field is null).
	levels []int
}

var absent = column{index: -1}

// layout says which columns hold an Example's fields.
type layout struct {
	task, prompt, answer      column // scalars
	role, content             column // the prompt as a chat list
	target, numbers           column // a {target, numbers} ground truth
	response, style, diff, id column
	// extra are the scalar leaves under extra_info (nested structs
	// included; lists are not read).
	extra []column
}

// findLayout finds the columns of each field, by name.
func findLayout(s *parquet.Schema) (*layout, error) {
	leaves := map[string]column{} // dotted path -> scalar or list leaf
	for _, p := range s.Columns() {
		leaf, ok := s.Lookup(p...)
		if !ok {
			continue
		}
		c := column{name: strings.Join(p, "."), index: leaf.ColumnIndex, maxDef: leaf.MaxDefinitionLevel, elem: -1}
		if leaf.MaxRepetitionLevel > 1 {
			continue // nested lists: nothing keel reads
		}
		if leaf.MaxRepetitionLevel == 1 {
			c.elem = elemLevel(s, p)
		}
		leaves[c.name] = c
	}
	scalar := func(names ...string) column {
		for _, n := range names {
			if c, ok := leaves[n]; ok && c.elem < 0 {
				return c
			}
		}
		return absent
	}
	// list finds the leaf NAME.<list>.<element>.FIELD of a list of
	// structs (or the legacy NAME.<group>.FIELD, or a bare repeated group
	// NAME.FIELD).
	list := func(name, field string) column {
		for p, c := range leaves {
			parts := strings.Split(p, ".")
			if c.elem >= 0 && parts[0] == name && parts[len(parts)-1] == field && len(parts) <= 4 {
				return c
			}
		}
		return absent
	}
	// listScalar finds the leaf of a list of scalars NAME.<list>.<element>.
	listScalar := func(name string) column {
		for p, c := range leaves {
			if c.elem >= 0 && strings.HasPrefix(p, name+".") && strings.Count(p[len(name)+1:], ".") <= 1 {
				return c
			}
		}
		return absent
	}
	l := &layout{
		task:     scalar("task", "data_source"),
		prompt:   scalar("prompt", "messages"),
		answer:   scalar("answer", "ground_truth", "reward_model.ground_truth"),
		role:     absent,
		content:  absent,
		target:   absent,
		numbers:  absent,
		response: scalar("response"),
		style:    scalar("style"),
		diff:     scalar("difficulty"),
		id:       scalar("id", "extra_info.index"),
	}
	if l.prompt.index < 0 {
		for _, name := range []string{"prompt", "messages"} {
			if l.role, l.content = list(name, "role"), list(name, "content"); l.role.index >= 0 && l.content.index >= 0 {
				break
			}
		}
	}
	for p, c := range leaves {
		if strings.HasPrefix(p, "extra_info.") && c.elem < 0 {
			c.levels = pathLevels(s, strings.Split(p, "."))
			l.extra = append(l.extra, c)
		}
	}
	sort.Slice(l.extra, func(i, j int) bool { return l.extra[i].index < l.extra[j].index })
	if l.answer.index < 0 {
		l.target = scalar("reward_model.ground_truth.target")
		l.numbers = listScalar("reward_model.ground_truth.numbers")
	}
	switch {
	case l.task.index < 0:
		return nil, errors.New(`missing column "data_source" (or "task")`)
	case l.prompt.index < 0 && (l.role.index < 0 || l.content.index < 0):
		return nil, errors.New(`missing column "prompt" (a string, or a list of {role, content})`)
	case l.answer.index < 0 && (l.target.index < 0 || l.numbers.index < 0):
		return nil, errors.New(`missing column "reward_model.ground_truth" (or "answer", "ground_truth")`)
	}
	return l, nil
}

// pathLevels returns, for each field on path, the definition level at
// which it is defined: the number of optional or repeated fields down to
// and including it.
func pathLevels(s *parquet.Schema, path []string) []int {
	fields, level := s.Fields(), 0
	out := make([]int, 0, len(path))
	for _, name := range path {
		var f parquet.Field
		for _, x := range fields {
			if x.Name() == name {
				f = x
				break
			}
		}
		if f == nil {
			break
		}
		if f.Optional() || f.Repeated() {
			level++
		}
		out = append(out, level)
		fields = f.Fields()
	}
	return out
}

// elemLevel is the definition level at which an element of the list on
// path exists: the number of optional or repeated fields down to and
// including the repeated one.
func elemLevel(s *parquet.Schema, path []string) int {
	fields, level := s.Fields(), 0
	for _, name := range path {
		var f parquet.Field
		for _, x := range fields {
			if x.Name() == name {
				f = x
				break
			}
		}
		if f == nil {
			return -1
		}
		if f.Optional() || f.Repeated() {
			level++
		}
		if f.Repeated() {
			return level
		}
		fields = f.Fields()
	}
	return -1
}

// scalar reads column c of one row: ok is false when the value is null or
// the column is absent.
func (c column) scalar(byCol [][]parquet.Value) (string, bool, error) {
	if c.index < 0 || len(byCol[c.index]) == 0 {
		return "", false, nil
	}
	v := byCol[c.index][0]
	if v.IsNull() || v.DefinitionLevel() < c.maxDef {
		return "", false, nil
	}
	s, err := text(v)
	if err != nil {
		return "", false, fmt.Errorf("column %q: %v", c.name, err)
	}
	return s, true, nil
}

// list reads column c, a list leaf, of one row: the elements' values, with
// ok false for a null element. A null or empty list gives no elements.
func (c column) list(byCol [][]parquet.Value) (vals []string, present []bool, err error) {
	for _, v := range byCol[c.index] {
		if v.DefinitionLevel() < c.elem {
			continue // the list itself is null or empty
		}
		if v.IsNull() || v.DefinitionLevel() < c.maxDef {
			vals, present = append(vals, ""), append(present, false)
			continue
		}
		s, err := text(v)
		if err != nil {
			return nil, nil, fmt.Errorf("column %q: %v", c.name, err)
		}
		vals, present = append(vals, s), append(present, true)
	}
	return vals, present, nil
}

// text renders a Parquet value as a string: strings as they are, numbers
// in decimal.
func text(v parquet.Value) (string, error) {
	switch v.Kind() {
	case parquet.ByteArray, parquet.FixedLenByteArray:
		return string(v.ByteArray()), nil
	case parquet.Int32:
		return strconv.FormatInt(int64(v.Int32()), 10), nil
	case parquet.Int64:
		return strconv.FormatInt(v.Int64(), 10), nil
	case parquet.Float:
		return strconv.FormatFloat(float64(v.Float()), 'g', -1, 32), nil
	case parquet.Double:
		return strconv.FormatFloat(v.Double(), 'g', -1, 64), nil
	case parquet.Boolean:
		return strconv.FormatBool(v.Boolean()), nil
	}
	return "", fmt.Errorf("unsupported value type %s", v.Kind())
}

// example assembles one row's Example.
func (l *layout) example(byCol [][]parquet.Value) (Example, error) {
	var e Example
	var ok bool
	var err error
	if e.Task, ok, err = l.task.scalar(byCol); err != nil {
		return e, err
	} else if !ok || e.Task == "" {
		return e, fmt.Errorf("%s is null or empty", l.task.name)
	}
	if l.prompt.index >= 0 {
		if e.Prompt, ok, err = l.prompt.scalar(byCol); err != nil {
			return e, err
		} else if !ok || e.Prompt == "" {
			return e, fmt.Errorf("%s is null or empty", l.prompt.name)
		}
	} else {
		roles, rok, err := l.role.list(byCol)
		if err != nil {
			return e, err
		}
		contents, cok, err := l.content.list(byCol)
		if err != nil {
			return e, err
		}
		if len(roles) == 0 {
			return e, fmt.Errorf("%s is null or an empty chat", strings.Split(l.role.name, ".")[0])
		}
		if len(roles) != len(contents) {
			return e, fmt.Errorf("%s has %d roles but %d contents", strings.Split(l.role.name, ".")[0], len(roles), len(contents))
		}
		for i := range roles {
			if !rok[i] || roles[i] == "" {
				return e, fmt.Errorf("%s[%d] has no role", strings.Split(l.role.name, ".")[0], i)
			}
			if !cok[i] {
				return e, fmt.Errorf("%s[%d] has no content", strings.Split(l.role.name, ".")[0], i)
			}
			e.Messages = append(e.Messages, tokenizer.Message{Role: roles[i], Content: contents[i]})
		}
	}
	if l.answer.index >= 0 {
		if e.Answer, ok, err = l.answer.scalar(byCol); err != nil {
			return e, err
		} else if !ok {
			return e, fmt.Errorf("%s is null", l.answer.name)
		}
	} else {
		t, ok, err := l.target.scalar(byCol)
		if err != nil {
			return e, err
		} else if !ok {
			return e, fmt.Errorf("%s is null", l.target.name)
		}
		nums, present, err := l.numbers.list(byCol)
		if err != nil {
			return e, err
		}
		for i := range nums {
			if !present[i] {
				return e, fmt.Errorf("%s[%d] is null", l.numbers.name, i)
			}
		}
		if len(nums) == 0 {
			return e, fmt.Errorf("%s is null or empty", l.numbers.name)
		}
		e.Answer = t + "|" + strings.Join(nums, ",")
	}
	// Optional fields: a null is simply absent.
	if e.Response, _, err = l.response.scalar(byCol); err != nil {
		return e, err
	}
	if e.Style, _, err = l.style.scalar(byCol); err != nil {
		return e, err
	}
	if e.ID, _, err = l.id.scalar(byCol); err != nil {
		return e, err
	}
	if d, _, err := l.diff.scalar(byCol); err == nil {
		e.Difficulty, _ = strconv.Atoi(d)
	}
	if e.Extra, err = l.extraInfo(byCol); err != nil {
		return e, err
	}
	return e, nil
}

// extraInfo renders a row's extra_info struct as compact JSON (nil when
// the file has none or the row's is null): strings, numbers and booleans
// as themselves, nested structs as objects, a null field (or null nested
// struct) as null. Lists and maps inside it are not read; a column of a
// type JSON has no counterpart for (INT96 timestamps) is left out, and a
// non-finite float becomes a string.
func (l *layout) extraInfo(byCol [][]parquet.Value) (json.RawMessage, error) {
	if len(l.extra) == 0 {
		return nil, nil
	}
	root := map[string]any{}
	present := false
	for _, c := range l.extra {
		path := strings.Split(c.name, ".")
		if len(byCol[c.index]) == 0 || len(c.levels) != len(path) {
			continue
		}
		v := byCol[c.index][0]
		d := v.DefinitionLevel()
		// The shallowest field of the path that is null in this row.
		k := len(path)
		if v.IsNull() || d < c.maxDef {
			for k = 0; k < len(path) && c.levels[k] <= d; k++ {
			}
		}
		if k == 0 {
			continue // extra_info itself is null
		}
		present = true
		var val any
		if k == len(path) {
			jv, ok := jsonValue(v)
			if !ok {
				continue
			}
			val = jv
		} else {
			path = path[:k+1] // the null struct or field
		}
		m := root
		for _, key := range path[1 : len(path)-1] {
			sub, ok := m[key].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[key] = sub
			}
			m = sub
		}
		m[path[len(path)-1]] = val
	}
	if !present {
		return nil, nil
	}
	return json.Marshal(root)
}

// jsonValue is a Parquet value as encoding/json writes it; ok is false
// for a type JSON has no counterpart for.
func jsonValue(v parquet.Value) (any, bool) {
	switch v.Kind() {
	case parquet.ByteArray, parquet.FixedLenByteArray:
		return string(v.ByteArray()), true
	case parquet.Int32:
		return int64(v.Int32()), true
	case parquet.Int64:
		return v.Int64(), true
	case parquet.Float, parquet.Double:
		f := v.Double()
		if v.Kind() == parquet.Float {
			f = float64(v.Float())
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return strconv.FormatFloat(f, 'g', -1, 64), true
		}
		return f, true
	case parquet.Boolean:
		return v.Boolean(), true
	}
	return nil, false
}
