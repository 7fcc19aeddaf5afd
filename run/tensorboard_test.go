package run

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// crc32cBitwise is CRC-32C computed one bit at a time from the reflected
// Castagnoli polynomial, independent of hash/crc32's tables (and of the
// writer's code path), so the known-answer tests check the algorithm and
// the test reader does not share the writer's checksum code.
func crc32cBitwise(b []byte) uint32 {
	crc := ^uint32(0)
	for _, c := range b {
		crc ^= uint32(c)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x82f63b78
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

// testMask is the TFRecord mask, written out separately from maskCRC.
func testMask(crc uint32) uint32 {
	rot := crc>>15 | crc<<17
	return rot + 0xa282ead8
}

func TestCRC32CKnownAnswers(t *testing.T) {
	// RFC 3720, appendix B.4.
	zeros := make([]byte, 32)
	ones := bytes.Repeat([]byte{0xff}, 32)
	asc := make([]byte, 32)
	desc := make([]byte, 32)
	for i := range asc {
		asc[i] = byte(i)
		desc[i] = byte(31 - i)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want uint32
	}{
		{"zeros", zeros, 0x8a9136aa},
		{"ones", ones, 0x62a8ab43},
		{"ascending", asc, 0x46dd794e},
		{"descending", desc, 0x113fdb5c},
		{"123456789", []byte("123456789"), 0xe3069283}, // the CRC catalogue's check value
	} {
		if got := crc32.Checksum(tc.in, castagnoli); got != tc.want {
			t.Errorf("%s: hash/crc32 Castagnoli = %#08x, want %#08x", tc.name, got, tc.want)
		}
		if got := crc32cBitwise(tc.in); got != tc.want {
			t.Errorf("%s: bitwise CRC-32C = %#08x, want %#08x", tc.name, got, tc.want)
		}
		if got, want := maskedCRC(tc.in), testMask(tc.want); got != want {
			t.Errorf("%s: maskedCRC = %#08x, want %#08x", tc.name, got, want)
		}
	}

	// The mask by hand: rotate right by 15, then add 0xa282ead8 modulo 2^32.
	//   0x8a9136aa >> 15         = 0x00011522
	//   0x8a9136aa << 17 mod 2^32 = 0x6d540000
	//   rotated                  = 0x6d551522
	//   + 0xa282ead8             = 0x1_0fd7fffa -> 0x0fd7fffa (carry dropped)
	for _, tc := range []struct{ crc, want uint32 }{
		{0, 0xa282ead8},
		{1, 0xa284ead8}, // bit 0 rotates to bit 17
		{0x8a9136aa, 0x0fd7fffa},
	} {
		if got := maskCRC(tc.crc); got != tc.want {
			t.Errorf("maskCRC(%#08x) = %#08x, want %#08x", tc.crc, got, tc.want)
		}
	}
}

// tbEvent is an Event as the test reader decodes it.
type tbEvent struct {
	wallTime    float64
	step        int64
	fileVersion string
	tags        []string
	values      []float32
}

// readTFRecords splits an event file into records, checking the framing
// and both checksums. A short or corrupt record is an error: that is how a
// torn file shows.
func readTFRecords(b []byte) ([][]byte, error) {
	var recs [][]byte
	for off := 0; off < len(b); {
		if len(b)-off < 12 {
			return recs, fmt.Errorf("record %d at %d: torn header (%d bytes)", len(recs), off, len(b)-off)
		}
		hdr := b[off : off+12]
		if got, want := binary.LittleEndian.Uint32(hdr[8:]), testMask(crc32cBitwise(hdr[:8])); got != want {
			return recs, fmt.Errorf("record %d at %d: length CRC %#08x, want %#08x", len(recs), off, got, want)
		}
		n := binary.LittleEndian.Uint64(hdr[:8])
		if n > uint64(len(b)-off-12) || uint64(len(b)-off-12)-n < 4 {
			return recs, fmt.Errorf("record %d at %d: torn data (%d bytes declared, %d left)", len(recs), off, n, len(b)-off-12)
		}
		data := b[off+12 : off+12+int(n)]
		if got, want := binary.LittleEndian.Uint32(b[off+12+int(n):]), testMask(crc32cBitwise(data)); got != want {
			return recs, fmt.Errorf("record %d at %d: data CRC %#08x, want %#08x", len(recs), off, got, want)
		}
		recs = append(recs, data)
		off += 12 + int(n) + 4
	}
	return recs, nil
}

func decodeEvent(b []byte) (tbEvent, error) {
	var ev tbEvent
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ev, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			ev.wallTime, b = math.Float64frombits(v), b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			ev.step, b = int64(v), b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			ev.fileVersion, b = v, b[n:]
		case num == 5 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			b = b[n:]
			if err := decodeSummary(v, &ev); err != nil {
				return ev, err
			}
		default:
			return ev, fmt.Errorf("unexpected Event field %d (wire type %d)", num, typ)
		}
	}
	return ev, nil
}

func decodeSummary(b []byte, ev *tbEvent) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num != 1 || typ != protowire.BytesType {
			return fmt.Errorf("unexpected Summary field %d (wire type %d)", num, typ)
		}
		val, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		b = b[n+m:]
		var (
			tag            string
			simple         float32
			hasTag, hasVal bool
		)
		for len(val) > 0 {
			num, typ, n := protowire.ConsumeTag(val)
			if n < 0 {
				return protowire.ParseError(n)
			}
			val = val[n:]
			switch {
			case num == 1 && typ == protowire.BytesType:
				s, n := protowire.ConsumeString(val)
				if n < 0 {
					return protowire.ParseError(n)
				}
				tag, hasTag, val = s, true, val[n:]
			case num == 2 && typ == protowire.Fixed32Type:
				v, n := protowire.ConsumeFixed32(val)
				if n < 0 {
					return protowire.ParseError(n)
				}
				simple, hasVal, val = math.Float32frombits(v), true, val[n:]
			default:
				return fmt.Errorf("unexpected Summary.Value field %d (wire type %d)", num, typ)
			}
		}
		if !hasTag || !hasVal {
			return fmt.Errorf("Summary.Value without tag or simple_value")
		}
		ev.tags = append(ev.tags, tag)
		ev.values = append(ev.values, simple)
	}
	return nil
}

func readEventFile(path string) ([]tbEvent, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	recs, err := readTFRecords(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	evs := make([]tbEvent, len(recs))
	for i, r := range recs {
		if evs[i], err = decodeEvent(r); err != nil {
			return nil, fmt.Errorf("%s: record %d: %w", path, i, err)
		}
	}
	return evs, nil
}

func onlyEventFile(t *testing.T, dir string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	if err != nil || len(m) != 1 {
		t.Fatalf("event files in %s: %v, %v", dir, m, err)
	}
	return m[0]
}

func TestEventsRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tb", "nested")
	before := time.Now()
	w, err := OpenEvents(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := onlyEventFile(t, dir)
	if path != w.Path() {
		t.Errorf("Path() = %s, file is %s", w.Path(), path)
	}
	name := filepath.Base(path)
	parts := strings.SplitN(name, ".", 5)
	if len(parts) != 5 || parts[3] == "" || parts[4] == "" || strings.ContainsAny(parts[4], "/ \\") {
		t.Errorf("event file name %q is not events.out.tfevents.<seconds>.<host>", name)
	}

	// The header event must be on disk before the first Scalars call, so
	// TensorBoard recognises the file at once.
	if evs, err := readEventFile(path); err != nil || len(evs) != 1 || evs[0].fileVersion != "brain.Event:2" {
		t.Fatalf("after OpenEvents: %+v, %v", evs, err)
	}

	wall := time.Unix(1700000000, 250_000_000)
	steps := []struct {
		step int64
		vals map[string]float64
	}{
		{0, map[string]float64{"loss": 2.5}},
		{1, map[string]float64{"loss": 1.25, "lr": 3e-4, "a/b": -7, "nan": math.NaN(), "inf": math.Inf(1)}},
		{1 << 40, map[string]float64{"loss": 0.1}},
		{-1, map[string]float64{}}, // odd, but must round-trip (int64 as a 10-byte varint)
	}
	for i, s := range steps {
		if err := w.Scalars(s.step, wall.Add(time.Duration(i)*time.Second), s.vals); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := w.Scalars(5, wall, map[string]float64{"x": 1}); err == nil {
		t.Error("Scalars after Close succeeded")
	}

	evs, err := readEventFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1+len(steps) {
		t.Fatalf("%d events, want %d", len(evs), 1+len(steps))
	}
	head := evs[0]
	if head.fileVersion != "brain.Event:2" || head.step != 0 || len(head.tags) != 0 {
		t.Errorf("first event %+v", head)
	}
	if lo, hi := float64(before.Unix())-1, float64(time.Now().Unix())+1; head.wallTime < lo || head.wallTime > hi {
		t.Errorf("first event wall_time %f not in [%f, %f]", head.wallTime, lo, hi)
	}
	want := [][]struct {
		tag string
		v   float32
	}{
		{{"loss", 2.5}},
		{{"a/b", -7}, {"inf", float32(math.Inf(1))}, {"loss", 1.25}, {"lr", float32(3e-4)}, {"nan", float32(math.NaN())}},
		{{"loss", float32(0.1)}},
		{},
	}
	for i, s := range steps {
		ev := evs[i+1]
		if ev.step != s.step {
			t.Errorf("event %d: step %d, want %d", i+1, ev.step, s.step)
		}
		if wt := 1700000000.25 + float64(i); ev.wallTime != wt {
			t.Errorf("event %d: wall_time %f, want %f", i+1, ev.wallTime, wt)
		}
		if ev.fileVersion != "" {
			t.Errorf("event %d: file_version %q", i+1, ev.fileVersion)
		}
		if len(ev.tags) != len(want[i]) {
			t.Errorf("event %d: tags %v, want %v", i+1, ev.tags, want[i])
			continue
		}
		for j, wv := range want[i] {
			got := ev.values[j]
			same := math.Float32bits(got) == math.Float32bits(wv.v) ||
				(math.IsNaN(float64(got)) && math.IsNaN(float64(wv.v)))
			if ev.tags[j] != wv.tag || !same {
				t.Errorf("event %d value %d: %s=%v, want %s=%v", i+1, j, ev.tags[j], got, wv.tag, wv.v)
			}
		}
	}
}

func TestEventsGoldenBytes(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenEvents(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := w.Path()
	first, _ := os.ReadFile(path)
	if err := w.Scalars(3, time.Unix(1, 500_000_000), map[string]float64{"a": 0.5}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	all, _ := os.ReadFile(path)
	if !bytes.HasPrefix(all, first) {
		t.Fatal("header record changed after later writes")
	}
	got := all[len(first):]

	// Event{wall_time: 1.5, step: 3, summary: {value: [{tag: "a", simple_value: 0.5}]}}
	// built by hand from the wire format: a tag byte is field<<3 | wire type
	// (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
	value := []byte{
		0x0a, 0x01, 'a', // field 1 (tag), bytes, length 1
		0x15, 0x00, 0x00, 0x00, 0x3f, // field 2 (simple_value), fixed32, 0.5f = 0x3f000000 LE
	}
	summary := append([]byte{0x0a, byte(len(value))}, value...) // field 1 (value), bytes
	event := []byte{
		0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f, // field 1 (wall_time), fixed64, 1.5 = 0x3ff8000000000000 LE
		0x10, 0x03, // field 2 (step), varint 3
	}
	event = append(event, 0x2a, byte(len(summary))) // field 5 (summary), bytes
	event = append(event, summary...)
	if len(event) != 23 {
		t.Fatalf("hand-built event is %d bytes, want 23", len(event))
	}
	lenBytes := []byte{23, 0, 0, 0, 0, 0, 0, 0}
	var want []byte
	want = append(want, lenBytes...)
	want = binary.LittleEndian.AppendUint32(want, testMask(crc32cBitwise(lenBytes)))
	want = append(want, event...)
	want = binary.LittleEndian.AppendUint32(want, testMask(crc32cBitwise(event)))

	if !bytes.Equal(got, want) {
		t.Fatalf("record bytes\n got % x\nwant % x", got, want)
	}
}

func TestEventsTornFile(t *testing.T) {
	dir := t.TempDir()
	w, err := OpenEvents(dir)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(1); s <= 3; s++ {
		if err := w.Scalars(s, time.Now(), map[string]float64{"loss": float64(s)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := w.Path()
	full, _ := os.ReadFile(path)
	recs, err := readTFRecords(full)
	if err != nil || len(recs) != 4 {
		t.Fatalf("intact file: %d records, %v", len(recs), err)
	}
	lastLen := 12 + len(recs[3]) + 4
	// Cut the last record at every point: inside its header, its data and
	// its trailing CRC. Each must be reported, with the complete records
	// before it still returned.
	for cut := 1; cut < lastLen; cut++ {
		recs, err := readTFRecords(full[:len(full)-cut])
		if err == nil {
			t.Fatalf("cut %d bytes: no error", cut)
		}
		if len(recs) != 3 {
			t.Fatalf("cut %d bytes: %d complete records before the torn one, want 3", cut, len(recs))
		}
	}
	// A flipped bit in the data fails the data CRC.
	bad := bytes.Clone(full)
	bad[len(bad)-6] ^= 0x01
	if _, err := readTFRecords(bad); err == nil || !strings.Contains(err.Error(), "data CRC") {
		t.Errorf("corrupt data: %v", err)
	}
	// A torn file on disk is reported naming it.
	if err := os.WriteFile(path, full[:len(full)-2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readEventFile(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "torn") {
		t.Errorf("torn file: %v", err)
	}
}

func TestEventsNameClash(t *testing.T) {
	dir := t.TempDir()
	// Two writers opened within the same second must not share a file.
	var ws []*EventWriter
	for range 3 {
		w, err := OpenEvents(dir)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	seen := map[string]bool{}
	for _, w := range ws {
		if seen[w.Path()] {
			t.Errorf("two writers share %s", w.Path())
		}
		seen[w.Path()] = true
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := readEventFile(w.Path()); err != nil {
			t.Error(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenEvents(filepath.Join(dir, "f")); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "f")) {
		t.Errorf("OpenEvents on a regular file: %v", err)
	}
}
