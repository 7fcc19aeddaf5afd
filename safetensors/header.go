// Package safetensors reads and writes Hugging Face safetensors files and
// sharded checkpoints (model.safetensors.index.json), the format real Qwen3
// checkpoints ship in. Files are read with ReadAt, so only the tensors asked
// for are touched and files larger than memory are fine. Every number in a
// header is checked before use: a malformed file is an error naming the file
// and the tensor, never a panic or an out-of-range read.
//
// A file is an 8-byte little-endian header length N, N bytes of a JSON object
// mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the byte after the header), an optional
// "__metadata__" object of string values, then the tensor bytes. As in the
// reference implementation, the tensors must tile the data section exactly:
// no overlaps and no holes.
package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"
)

// MaxHeaderSize bounds the JSON header, as the reference implementation
// does (100 MB); it stops a corrupt length from causing a huge allocation.
const MaxHeaderSize = 100 << 20

// DType is a safetensors element type name, e.g. "F32".
type DType string

// The element types this package converts to and from float32.
const (
	F32  DType = "F32"
	BF16 DType = "BF16"
	F16  DType = "F16"
)

// dtypeSizes lists every byte-sized dtype of the format, so that a file with
// integer or float8 tensors still parses (their sizes are checked) even
// though only F32, BF16 and F16 convert to float32.
var dtypeSizes = map[DType]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E4M3FN": 1, "F8_E8M0": 1,
	"U16": 2, "I16": 2, "F16": 2, "BF16": 2,
	"U32": 4, "I32": 4, "F32": 4,
	"U64": 8, "I64": 8, "F64": 8, "C64": 8,
}

// Size returns the size in bytes of one element of d, or 0 when d is not a
// dtype this package knows.
func (d DType) Size() int { return dtypeSizes[d] }

// TensorInfo describes one tensor of a file. Begin and End are byte offsets
// into the data section, which starts at Header.DataStart in the file.
type TensorInfo struct {
	Name       string
	DType      DType
	Shape      []int
	Begin, End int64
}

// NumElements returns the product of the shape (1 for a scalar).
func (t *TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Header is a parsed and validated safetensors header.
type Header struct {
	Tensors   []TensorInfo      // sorted by Begin
	Metadata  map[string]string // the __metadata__ object; nil when absent
	DataStart int64             // file offset of the data section: 8 + header length
}

// ParseHeader parses and validates the JSON header of a safetensors file
// whose data section holds dataSize bytes. Errors do not name the file; the
// callers that know it add it.
func ParseHeader(js []byte, dataSize int64) (*Header, error) {
	if len(js) > MaxHeaderSize {
		return nil, fmt.Errorf("header of %d bytes exceeds the %d-byte limit", len(js), MaxHeaderSize)
	}
	if !utf8.Valid(js) {
		return nil, errors.New("header is not valid UTF-8")
	}
	if len(js) == 0 || js[0] != '{' {
		return nil, errors.New("header does not start with '{'")
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil { // the opening brace
		return nil, fmt.Errorf("header JSON: %v", err)
	}
	h := &Header{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("header JSON: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("header JSON: expected a tensor name, got %v", tok)
		}
		if seen[name] {
			return nil, fmt.Errorf("tensor %q: name appears twice in the header", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("tensor %q: header JSON: %v", name, err)
		}
		if name == "__metadata__" {
			if h.Metadata, err = parseMetadata(raw); err != nil {
				return nil, err
			}
			continue
		}
		t, err := parseEntry(name, raw)
		if err != nil {
			return nil, err
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("header JSON: %v", err)
	}
	// Only spaces (the format's padding) may follow the object.
	if len(bytes.Trim(js[dec.InputOffset():], " \t\r\n")) != 0 {
		return nil, errors.New("header JSON: trailing data after the object")
	}
	if err := checkLayout(h.Tensors, dataSize); err != nil {
		return nil, err
	}
	return h, nil
}

func parseMetadata(raw json.RawMessage) (map[string]string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, errors.New(`"__metadata__": expected an object of strings`)
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf(`"__metadata__" key %q: expected a string value`, k)
		}
		out[k] = s
	}
	return out, nil
}

// parseEntry decodes one tensor entry and checks that its byte range has
// exactly the size its dtype and shape call for.
func parseEntry(name string, raw json.RawMessage) (TensorInfo, error) {
	var e struct {
		DType       *string       `json:"dtype"`
		Shape       []json.Number `json:"shape"`
		DataOffsets []json.Number `json:"data_offsets"`
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&e); err != nil {
		return TensorInfo{}, fmt.Errorf("tensor %q: expected an object with dtype, shape and data_offsets: %v", name, err)
	}
	t := TensorInfo{Name: name}
	switch {
	case e.DType == nil:
		return t, fmt.Errorf("tensor %q: missing dtype", name)
	case e.Shape == nil:
		return t, fmt.Errorf("tensor %q: missing shape", name)
	case e.DataOffsets == nil:
		return t, fmt.Errorf("tensor %q: missing data_offsets", name)
	}
	t.DType = DType(*e.DType)
	size := t.DType.Size()
	if size == 0 {
		return t, fmt.Errorf("tensor %q: unknown dtype %q", name, *e.DType)
	}
	bytesNeeded := uint64(size)
	t.Shape = make([]int, len(e.Shape))
	for i, n := range e.Shape {
		v, err := parseUint(n)
		if err != nil || v > maxDim {
			return t, fmt.Errorf("tensor %q: shape[%d] = %s is not a valid dimension", name, i, n)
		}
		t.Shape[i] = int(v)
		hi, lo := bits.Mul64(bytesNeeded, v)
		if hi != 0 || lo > math.MaxInt64 {
			return t, fmt.Errorf("tensor %q: shape %v is too large", name, e.Shape)
		}
		bytesNeeded = lo
	}
	if len(e.DataOffsets) != 2 {
		return t, fmt.Errorf("tensor %q: data_offsets must be [begin, end], got %d numbers", name, len(e.DataOffsets))
	}
	b, err1 := parseUint(e.DataOffsets[0])
	en, err2 := parseUint(e.DataOffsets[1])
	if err1 != nil || err2 != nil || b > math.MaxInt64 || en > math.MaxInt64 {
		return t, fmt.Errorf("tensor %q: data_offsets %v are not valid offsets", name, e.DataOffsets)
	}
	if en < b {
		return t, fmt.Errorf("tensor %q: data_offsets [%d, %d] end before they begin", name, b, en)
	}
	if en-b != bytesNeeded {
		return t, fmt.Errorf("tensor %q: data_offsets [%d, %d] hold %d bytes but %s%v needs %d", name, b, en, en-b, t.DType, t.Shape, bytesNeeded)
	}
	t.Begin, t.End = int64(b), int64(en)
	return t, nil
}

// maxDim bounds one dimension so that it always fits in an int.
const maxDim = 1 << 48

func parseUint(n json.Number) (uint64, error) {
	return strconv.ParseUint(string(n), 10, 64)
}

// checkLayout sorts ts by offset and checks that they tile [0, dataSize)
// exactly.
func checkLayout(ts []TensorInfo, dataSize int64) error {
	slices.SortStableFunc(ts, func(a, b TensorInfo) int {
		if a.Begin != b.Begin {
			if a.Begin < b.Begin {
				return -1
			}
			return 1
		}
		if a.End < b.End {
			return -1
		} else if a.End > b.End {
			return 1
		}
		return 0
	})
	var pos int64
	for i, t := range ts {
		switch {
		case t.Begin < pos:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q", t.Name, t.Begin, t.End, ts[i-1].Name)
		case t.Begin > pos:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] leave a hole at bytes [%d, %d)", t.Name, t.Begin, t.End, pos, t.Begin)
		case t.End > dataSize:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] run past the end of the data (%d bytes)", t.Name, t.Begin, t.End, dataSize)
		}
		pos = t.End
	}
	if pos != dataSize {
		return fmt.Errorf("the tensors cover %d bytes but the data section holds %d", pos, dataSize)
	}
	return nil
}
