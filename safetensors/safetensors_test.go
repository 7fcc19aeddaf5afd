package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// build makes safetensors file bytes from a header string and data bytes.
func build(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func writeTemp(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHandMadeFile reads a file whose bytes are built by hand: an F32
// matrix, a BF16 vector and an F16 vector with known values.
func TestHandMadeFile(t *testing.T) {
	var data []byte
	for _, v := range []float32{1, -2, 0.5, 3.25, 0, 1e-3} { // "a": F32 [2,3]
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
	}
	// "b": BF16 [2]: 0x3F80 = 1.0, 0xC040 = -3.0
	data = binary.LittleEndian.AppendUint16(data, 0x3F80)
	data = binary.LittleEndian.AppendUint16(data, 0xC040)
	// "c": F16 [3]: 0x3C00 = 1.0, 0xC500 = -5.0, 0x0001 = 2^-24
	for _, h := range []uint16{0x3C00, 0xC500, 0x0001} {
		data = binary.LittleEndian.AppendUint16(data, h)
	}
	hdr := `{"__metadata__":{"format":"pt"},` +
		`"c":{"dtype":"F16","shape":[3],"data_offsets":[28,34]},` +
		`"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},` +
		`"b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]}}   `
	f, err := Open(writeTemp(t, build(hdr, data)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.Metadata()["format"]; got != "pt" {
		t.Errorf("metadata format = %q", got)
	}
	var names []string
	for _, ti := range f.Tensors() {
		names = append(names, ti.Name)
	}
	if !reflect.DeepEqual(names, []string{"a", "b", "c"}) {
		t.Errorf("tensors in data order = %v", names)
	}
	check := func(name string, want []float32) {
		t.Helper()
		got := make([]float32, len(want))
		if err := f.ReadFloat32(name, got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("a", []float32{1, -2, 0.5, 3.25, 0, 1e-3})
	check("b", []float32{1, -3})
	check("c", []float32{1, -5, float32(math.Ldexp(1, -24))})
	if err := f.ReadFloat32("a", make([]float32, 5)); err == nil {
		t.Error("reading 6 elements into 5 did not fail")
	}
	if err := f.ReadFloat32("zz", make([]float32, 1)); err == nil || !strings.Contains(err.Error(), "zz") {
		t.Errorf("missing tensor: err = %v", err)
	}
}

func TestBadFiles(t *testing.T) {
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "too short"},
		{"length past end", append(binary.LittleEndian.AppendUint64(nil, 1000), "{}"...), "runs past the end"},
		{"huge length", append(binary.LittleEndian.AppendUint64(nil, math.MaxUint64), "{}"...), "runs past the end"},
		{"not json", build("{abc", nil), "header JSON"},
		{"not object", build("[1]", nil), "does not start"},
		{"unknown dtype", build(`{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}}`, f32(1)), `unknown dtype "Q7"`},
		{"size mismatch", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, f32(1)), "needs 8"},
		{"past data", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32(1)), "past the end"},
		{"overlap", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "overlap"},
		{"hole", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "hole"},
		{"trailing data", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(2)), "cover 4 bytes"},
		{"duplicate", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "twice"},
		{"negative dim", build(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, f32(1)), "not a valid dimension"},
		{"float dim", build(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, f32(1)), "not a valid dimension"},
		{"reversed offsets", build(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, f32(1)), "end before"},
		{"missing dtype", build(`{"a":{"shape":[1],"data_offsets":[0,4]}}`, f32(1)), "missing dtype"},
		{"three offsets", build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, f32(1)), "[begin, end]"},
		{"overflowing shape", build(`{"a":{"dtype":"F32","shape":[281474976710656,281474976710656],"data_offsets":[0,4]}}`, f32(1)), "too large"},
		{"bad metadata", build(`{"__metadata__":{"k":1}}`, nil), "__metadata__"},
		{"garbage after", build(`{} x`, nil), "trailing"},
	}
	for _, c := range cases {
		_, err := Open(writeTemp(t, c.file))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", c.name, err, c.want)
			continue
		}
		if !strings.Contains(err.Error(), "x.safetensors") {
			t.Errorf("%s: error %q does not name the file", c.name, err)
		}
	}
}

func TestUnsupportedDTypeRead(t *testing.T) {
	p := writeTemp(t, build(`{"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.ReadFloat32("i", make([]float32, 1)); err == nil || !strings.Contains(err.Error(), "I64") {
		t.Errorf("err = %v", err)
	}
}

func TestBF16Rounding(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3F80},
		{-2, 0xC000},
		{float32(1 + math.Ldexp(1, -8)), 0x3F80},   // tie, down to even
		{float32(1 + 3*math.Ldexp(1, -8)), 0x3F82}, // tie, up to even
		{float32(1 + math.Ldexp(1, -8) + math.Ldexp(1, -20)), 0x3F81}, // just above the tie
		{math.MaxFloat32, 0x7F80},                                     // rounds to +Inf
		{float32(math.Inf(-1)), 0xFF80},
		{0, 0},
		{float32(math.Copysign(0, -1)), 0x8000},
	}
	for _, c := range cases {
		if got := BF16FromFloat32(c.in); got != c.want {
			t.Errorf("BF16FromFloat32(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if got := BF16FromFloat32(float32(math.NaN())); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("NaN -> %#04x, not a NaN", got)
	}
	// Against a float64 reference: the nearer of the two bf16 neighbours,
	// ties to the even one.
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		x := math.Float32frombits(r.Uint32())
		if x != x || math.IsInf(float64(x), 0) {
			continue
		}
		lo := uint16(math.Float32bits(x) >> 16)
		hi := lo + 1
		dlo := math.Abs(float64(Float32FromBF16(lo)) - float64(x))
		dhi := math.Abs(float64(Float32FromBF16(hi)) - float64(x))
		if hi&0x7f80 == 0x7f80 { // hi is ±Inf: its "value" is the next power of two
			dhi = math.Abs(math.Copysign(math.Ldexp(1, 128), float64(x)) - float64(x))
		}
		want := lo
		if dhi < dlo || (dhi == dlo && hi&1 == 0) {
			want = hi
		}
		if got := BF16FromFloat32(x); got != want {
			t.Fatalf("BF16FromFloat32(%g [%#08x]) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
		}
	}
}

// TestF16AllValues checks every half-precision bit pattern against a
// float64 evaluation of the IEEE 754 binary16 definition.
func TestF16AllValues(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		e := (h >> 10) & 0x1f
		m := float64(h & 0x3ff)
		var want float64
		switch {
		case e == 0x1f && m == 0:
			want = math.Inf(int(sign))
		case e == 0x1f:
			want = math.NaN()
		case e == 0:
			want = sign * m * math.Ldexp(1, -24)
		default:
			want = sign * (1 + m/1024) * math.Ldexp(1, e-15)
		}
		got := Float32FromF16(uint16(h))
		if math.IsNaN(want) {
			if got == got {
				t.Fatalf("F16 %#04x -> %g, want NaN", h, got)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("F16 %#04x -> %g, want %g", h, got, want)
		}
	}
}

func randTensors(r *rand.Rand) []Tensor {
	shapes := [][]int{{3, 5}, {7}, {}, {2, 0}, {4, 4, 2}}
	var ts []Tensor
	for i, s := range shapes {
		n := 1
		for _, d := range s {
			n *= d
		}
		d := make([]float32, n)
		for j := range d {
			d[j] = float32(r.NormFloat64())
		}
		ts = append(ts, Tensor{Name: "t" + string(rune('a'+i)) + ".weight", Shape: s, Data: d})
	}
	return ts
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ts := randTensors(r)
	// One tensor spanning several conversion chunks (chunkBytes each).
	big := Tensor{Name: "big", Shape: []int{3, 100001}, Data: make([]float32, 300003)}
	for i := range big.Data {
		big.Data[i] = float32(r.NormFloat64())
	}
	ts = append(ts, big)
	for _, dt := range []DType{F32, BF16} {
		p := filepath.Join(t.TempDir(), "m.safetensors")
		if err := WriteFile(p, ts, dt, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(p)
		if n := binary.LittleEndian.Uint64(raw); (8+n)%8 != 0 {
			t.Errorf("%s: data section not 8-byte aligned (header %d)", dt, n)
		}
		f, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range ts {
			info, ok := f.Info(tt.Name)
			if !ok || info.DType != dt || !reflect.DeepEqual(info.Shape, tt.Shape) {
				t.Fatalf("%s: info %+v", tt.Name, info)
			}
			got := make([]float32, len(tt.Data))
			if err := f.ReadFloat32(tt.Name, got); err != nil {
				t.Fatal(err)
			}
			for i, v := range tt.Data {
				want := v
				if dt == BF16 {
					want = Float32FromBF16(BF16FromFloat32(v))
				}
				if got[i] != want {
					t.Fatalf("%s %s[%d] = %g, want %g", dt, tt.Name, i, got[i], want)
				}
			}
		}
		f.Close()
		entries, _ := os.ReadDir(filepath.Dir(p))
		if len(entries) != 1 {
			t.Errorf("temporary files left behind: %v", entries)
		}
	}
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.safetensors")
	bad := [][]Tensor{
		{{Name: "a", Shape: []int{2}, Data: []float32{1}}},
		{{Name: "a", Shape: []int{1}, Data: []float32{1}}, {Name: "a", Shape: []int{1}, Data: []float32{1}}},
		{{Name: "__metadata__", Shape: []int{1}, Data: []float32{1}}},
	}
	for i, ts := range bad {
		if err := WriteFile(p, ts, F32, nil); err == nil {
			t.Errorf("case %d: no error", i)
		}
	}
	if err := WriteFile(p, nil, F16, nil); err == nil {
		t.Error("writing F16 did not fail")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed writes left files: %v", entries)
	}
}

func TestSharded(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ts := randTensors(r)
	dir := t.TempDir()
	// 60 bytes per shard: t.a (60 bytes) alone, then t.b (28) + t.c (4) + t.d (0), then t.e (128, oversize).
	names, err := WriteSharded(dir, ts, F32, 60, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 3 || names[0] != "model-00001-of-00003.safetensors" {
		t.Fatalf("shards = %v", names)
	}
	idx, err := ReadIndex(filepath.Join(dir, IndexFileName))
	if err != nil {
		t.Fatal(err)
	}
	if ts, _ := idx.Metadata["total_size"].(float64); ts != 4*(15+7+1+0+32) {
		t.Errorf("total_size = %v", idx.Metadata["total_size"])
	}
	c, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(c.Names()) != len(ts) {
		t.Fatalf("names = %v", c.Names())
	}
	for _, tt := range ts {
		got := make([]float32, len(tt.Data))
		if err := c.ReadFloat32(tt.Name, got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tt.Data) {
			t.Errorf("%s differs after the sharded round trip", tt.Name)
		}
	}
}

func TestShardedErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ts := randTensors(r)
	write := func(t *testing.T, idx Index) string {
		dir := t.TempDir()
		if _, err := WriteSharded(dir, ts, F32, 60, nil); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(idx)
		if err := os.WriteFile(filepath.Join(dir, IndexFileName), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	good := map[string]string{
		"ta.weight": ShardName(0, 3),
		"tb.weight": ShardName(1, 3), "tc.weight": ShardName(1, 3), "td.weight": ShardName(1, 3),
		"te.weight": ShardName(2, 3),
	}
	cases := []struct {
		name string
		edit func(m map[string]string)
		want string
	}{
		{"escape", func(m map[string]string) { m["ta.weight"] = "../x.safetensors" }, "not a file name"},
		{"missing shard", func(m map[string]string) { m["ta.weight"] = "nope.safetensors" }, "nope.safetensors"},
		{"missing tensor", func(m map[string]string) { m["zz"] = m["ta.weight"] }, `"zz"`},
		{"unlisted tensor", func(m map[string]string) { delete(m, "tb.weight") }, "not listed"},
		{"empty", func(m map[string]string) { clear(m) }, "empty"},
	}
	for _, c := range cases {
		m := maps.Clone(good)
		c.edit(m)
		dir := write(t, Index{WeightMap: m})
		_, err := OpenCheckpoint(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
	if _, err := OpenCheckpoint(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no model.safetensors") {
		t.Errorf("empty dir: err = %v", err)
	}
}

// FuzzHeader feeds arbitrary file bytes to the header reader: it must never
// panic, and whatever it accepts must be self-consistent.
func FuzzHeader(f *testing.F) {
	f.Add(build(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(build(`{"a":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},"b":{"dtype":"F16","shape":[],"data_offsets":[4,6]}}  `, make([]byte, 6)))
	f.Add(build(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}`, nil))
	f.Add(build(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{}}`, make([]byte, 4)))
	f.Add(build(`{}`, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{'})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ReadHeader(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		pos := h.DataStart
		for _, ti := range h.Tensors {
			if h.DataStart+ti.Begin != pos || ti.End < ti.Begin {
				t.Fatalf("accepted a gap or overlap at %q", ti.Name)
			}
			if ti.End-ti.Begin != ti.NumElements()*int64(ti.DType.Size()) {
				t.Fatalf("accepted a size mismatch at %q", ti.Name)
			}
			pos = h.DataStart + ti.End
		}
		if pos != int64(len(b)) {
			t.Fatalf("accepted tensors covering %d of %d bytes", pos, len(b))
		}
	})
}
