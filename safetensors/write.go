package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/keel-rl/keel/internal/atomicfile"
)

// Tensor is a named float32 tensor to write.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

// WriteFile writes tensors to path as a safetensors file, converting the data
// to dtype (F32, or BF16 rounded to nearest even). Tensors are laid out in
// the order given. metadata becomes the "__metadata__" object (Hugging Face
// transformers expects {"format": "pt"}). The write is crash safe: the file
// appears at path complete or not at all (see atomicfile.Write).
func WriteFile(path string, tensors []Tensor, dtype DType, metadata map[string]string) error {
	hdr, err := encodeHeader(tensors, dtype, metadata)
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	return atomicfile.Write(path, func(w io.Writer) error {
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		buf := make([]byte, chunkBytes)
		for _, t := range tensors {
			if err := writeData(w, buf, t.Data, dtype); err != nil {
				return err
			}
		}
		return nil
	})
}

// encodeHeader returns the 8-byte length and the JSON header, padded with
// spaces so the data section starts 8-byte aligned.
func encodeHeader(tensors []Tensor, dtype DType, metadata map[string]string) ([]byte, error) {
	es := int64(0)
	switch dtype {
	case F32:
		es = 4
	case BF16:
		es = 2
	default:
		return nil, fmt.Errorf("cannot write dtype %q: only F32 and BF16 are supported", dtype)
	}
	var b bytes.Buffer
	b.WriteString("{")
	first := true
	sep := func() {
		if !first {
			b.WriteString(",")
		}
		first = false
	}
	if len(metadata) > 0 {
		m, err := json.Marshal(metadata) // sorted keys, so output is deterministic
		if err != nil {
			return nil, err
		}
		sep()
		b.WriteString(`"__metadata__":`)
		b.Write(m)
	}
	seen := make(map[string]bool, len(tensors))
	var off int64
	for _, t := range tensors {
		if t.Name == "" || t.Name == "__metadata__" {
			return nil, fmt.Errorf("invalid tensor name %q", t.Name)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tensor %q given twice", t.Name)
		}
		seen[t.Name] = true
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			n *= int64(d)
		}
		if n != int64(len(t.Data)) {
			return nil, fmt.Errorf("tensor %q: shape %v has %d elements but the data holds %d", t.Name, t.Shape, n, len(t.Data))
		}
		name, err := json.Marshal(t.Name)
		if err != nil {
			return nil, err
		}
		sep()
		b.Write(name)
		b.WriteString(`:{"dtype":"`)
		b.WriteString(string(dtype))
		b.WriteString(`","shape":[`)
		for i, d := range t.Shape {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(strconv.Itoa(d))
		}
		end := off + n*es
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	b.WriteString("}")
	for b.Len()%8 != 0 {
		b.WriteString(" ")
	}
	out := make([]byte, 8, 8+b.Len())
	binary.LittleEndian.PutUint64(out, uint64(b.Len()))
	return append(out, b.Bytes()...), nil
}

// writeData converts src to dtype chunk by chunk through buf and writes it.
func writeData(w io.Writer, buf []byte, src []float32, dtype DType) error {
	es := 4
	if dtype == BF16 {
		es = 2
	}
	per := len(buf) / es
	for lo := 0; lo < len(src); lo += per {
		hi := min(lo+per, len(src))
		b := buf[:(hi-lo)*es]
		if dtype == BF16 {
			for i, v := range src[lo:hi] {
				binary.LittleEndian.PutUint16(b[2*i:], BF16FromFloat32(v))
			}
		} else {
			for i, v := range src[lo:hi] {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}
