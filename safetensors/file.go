package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// File is an open safetensors file. Its methods read tensor data on demand
// with ReadAt; it is safe for concurrent reads.
type File struct {
	path   string
	f      *os.File
	hdr    *Header
	byName map[string]int
}

// Open opens and validates the safetensors file at path. Only the header is
// read; tensor data is read by ReadFloat32 and ReadRaw.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sf, err := openFile(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return sf, nil
}

func openFile(path string, f *os.File) (*File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	hdr, err := ReadHeader(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	sf := &File{path: path, f: f, hdr: hdr, byName: make(map[string]int, len(hdr.Tensors))}
	for i, t := range hdr.Tensors {
		sf.byName[t.Name] = i
	}
	return sf, nil
}

// ReadHeader reads and validates the header of a safetensors file of size
// bytes held by r.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	if size < 8 {
		return nil, fmt.Errorf("%d bytes is too short for a safetensors file (8-byte header length missing)", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("reading the header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > uint64(size-8) {
		return nil, fmt.Errorf("header length %d runs past the end of the %d-byte file", n, size)
	}
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	js := make([]byte, n)
	if _, err := r.ReadAt(js, 8); err != nil {
		return nil, fmt.Errorf("reading the header: %v", err)
	}
	dataStart := 8 + int64(n)
	hdr, err := ParseHeader(js, size-dataStart)
	if err != nil {
		return nil, err
	}
	hdr.DataStart = dataStart
	return hdr, nil
}

// Close closes the file.
func (f *File) Close() error { return f.f.Close() }

// Path returns the path the file was opened from, for error messages.
func (f *File) Path() string { return f.path }

// Tensors returns the file's tensors in data order. The slice is shared; do
// not modify it.
func (f *File) Tensors() []TensorInfo { return f.hdr.Tensors }

// Metadata returns the __metadata__ object, nil when absent.
func (f *File) Metadata() map[string]string { return f.hdr.Metadata }

// Info returns the description of tensor name.
func (f *File) Info(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.hdr.Tensors[i], true
}

// ReadRaw returns the raw little-endian bytes of tensor name.
func (f *File) ReadRaw(name string) ([]byte, error) {
	t, ok := f.Info(name)
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	buf := make([]byte, t.End-t.Begin)
	if _, err := f.f.ReadAt(buf, f.hdr.DataStart+t.Begin); err != nil {
		return nil, fmt.Errorf("%s: tensor %q: %v", f.path, name, err)
	}
	return buf, nil
}

// chunkBytes is how much tensor data ReadFloat32 reads at a time, so that
// converting a large tensor needs no second full-size buffer.
const chunkBytes = 1 << 20

// ReadFloat32 reads tensor name, which must be F32, BF16 or F16, into dst,
// converting to float32. len(dst) must equal the tensor's element count.
func (f *File) ReadFloat32(name string, dst []float32) error {
	t, ok := f.Info(name)
	if !ok {
		return fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	if int64(len(dst)) != t.NumElements() {
		return fmt.Errorf("%s: tensor %q has %d elements (shape %v), destination holds %d", f.path, name, t.NumElements(), t.Shape, len(dst))
	}
	var conv func(dst []float32, src []byte)
	switch t.DType {
	case F32:
		conv = func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
			}
		}
	case BF16:
		conv = func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = Float32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
			}
		}
	case F16:
		conv = func(dst []float32, src []byte) {
			for i := range dst {
				dst[i] = Float32FromF16(binary.LittleEndian.Uint16(src[2*i:]))
			}
		}
	default:
		return fmt.Errorf("%s: tensor %q has dtype %s; only F32, BF16 and F16 convert to float32", f.path, name, t.DType)
	}
	es := t.DType.Size()
	per := chunkBytes / es
	buf := make([]byte, min(len(dst), per)*es)
	off := f.hdr.DataStart + t.Begin
	for lo := 0; lo < len(dst); lo += per {
		hi := min(lo+per, len(dst))
		b := buf[:(hi-lo)*es]
		if _, err := f.f.ReadAt(b, off+int64(lo*es)); err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("file truncated")
			}
			return fmt.Errorf("%s: tensor %q: %v", f.path, name, err)
		}
		conv(dst[lo:hi], b)
	}
	return nil
}
