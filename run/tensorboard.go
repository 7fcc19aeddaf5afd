package run

// A TensorBoard event-file writer, written by hand so that a run can be
// watched in TensorBoard without depending on TensorFlow or on a generated
// protobuf package: an event file is a TFRecord stream of serialised Event
// messages, and the two or three messages we need are small enough to
// encode field by field with protowire.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// EventWriter appends Events to one TensorBoard event file. It is not safe
// for concurrent use. Records are buffered; Flush makes them visible to a
// running TensorBoard and Close makes them durable.
type EventWriter struct {
	f    *os.File
	path string
	bw   *bufio.Writer
	buf  []byte // reused encoding buffer for one Event
	sum  []byte // reused encoding buffer for one Summary
	err  error  // first write error; the stream is unusable after it
}

// Field numbers from tensorflow/core/util/event.proto and
// tensorflow/core/framework/summary.proto.
const (
	eventWallTime    protowire.Number = 1 // double
	eventStep        protowire.Number = 2 // int64
	eventFileVersion protowire.Number = 3 // string
	eventSummary     protowire.Number = 5 // Summary

	summaryValue protowire.Number = 1 // repeated Summary.Value

	valueTag         protowire.Number = 1 // string
	valueSimpleValue protowire.Number = 2 // float
)

// eventsFileVersion is the version string TensorBoard expects in the first
// Event of every file.
const eventsFileVersion = "brain.Event:2"

// OpenEvents creates dir if needed and a new event file in it named
// events.out.tfevents.<unix seconds>.<hostname>, the pattern TensorBoard
// scans for, and writes the file_version Event TensorBoard expects first.
// The file is created exclusively: if a file of that name already exists
// (two writers opened in the same second), a numeric suffix is added
// rather than interleaving two streams in one file, which would corrupt
// both.
func OpenEvents(dir string) (*EventWriter, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	now := time.Now()
	base := fmt.Sprintf("events.out.tfevents.%d.%s", now.Unix(), eventHostname())
	var (
		f    *os.File
		path string
		err  error
	)
	for i := 0; i < 1000; i++ {
		path = filepath.Join(dir, base)
		if i > 0 {
			path += "." + strconv.Itoa(i)
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	w := &EventWriter{f: f, path: path, bw: bufio.NewWriterSize(f, 1<<16)}
	w.buf = appendWallTime(w.buf[:0], now)
	w.buf = protowire.AppendTag(w.buf, eventFileVersion, protowire.BytesType)
	w.buf = protowire.AppendString(w.buf, eventsFileVersion)
	w.writeRecord(w.buf) // an error is kept in w.err
	w.Flush()
	if w.err != nil {
		f.Close()
		os.Remove(path)
		return nil, w.err
	}
	return w, nil
}

// eventHostname is the host name made safe for a file name: anything but
// letters, digits, '.', '-' and '_' becomes '_'.
func eventHostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, h)
}

// Path is the event file's path.
func (w *EventWriter) Path() string { return w.path }

// Scalars writes one Event at step holding one scalar per key of values,
// in sorted key order so files are reproducible. Non-finite values are
// written as they are: TensorBoard plots NaN and Inf, and a diverged loss
// is worth seeing.
func (w *EventWriter) Scalars(step int64, wall time.Time, values map[string]float64) error {
	if w.err != nil {
		return w.err
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	w.sum = w.sum[:0]
	for _, k := range keys {
		// Value: tag (field 1, bytes) and simple_value (field 2, fixed32).
		n := protowire.SizeTag(valueTag) + protowire.SizeBytes(len(k)) +
			protowire.SizeTag(valueSimpleValue) + protowire.SizeFixed32()
		w.sum = protowire.AppendTag(w.sum, summaryValue, protowire.BytesType)
		w.sum = protowire.AppendVarint(w.sum, uint64(n))
		w.sum = protowire.AppendTag(w.sum, valueTag, protowire.BytesType)
		w.sum = protowire.AppendString(w.sum, k)
		w.sum = protowire.AppendTag(w.sum, valueSimpleValue, protowire.Fixed32Type)
		w.sum = protowire.AppendFixed32(w.sum, math.Float32bits(float32(values[k])))
	}
	w.buf = appendWallTime(w.buf[:0], wall)
	if step != 0 { // proto3: a zero scalar is not encoded
		w.buf = protowire.AppendTag(w.buf, eventStep, protowire.VarintType)
		w.buf = protowire.AppendVarint(w.buf, uint64(step))
	}
	w.buf = protowire.AppendTag(w.buf, eventSummary, protowire.BytesType)
	w.buf = protowire.AppendBytes(w.buf, w.sum)
	return w.writeRecord(w.buf)
}

// appendWallTime appends an Event's wall_time: seconds since the epoch as
// a double, the unit TensorBoard's time axis uses.
func appendWallTime(b []byte, t time.Time) []byte {
	b = protowire.AppendTag(b, eventWallTime, protowire.Fixed64Type)
	// Whole and fractional seconds are converted apart: UnixNano as a
	// float64 would already have lost precision (2^53 ns is 104 days).
	sec := float64(t.Unix()) + float64(t.Nanosecond())/1e9
	return protowire.AppendFixed64(b, math.Float64bits(sec))
}

// writeRecord frames data as one TFRecord: uint64 length, masked CRC-32C
// of the length, data, masked CRC-32C of the data, all little endian. The
// length has its own checksum so a reader can tell a torn or corrupt
// header from a huge record before trying to read it.
func (w *EventWriter) writeRecord(data []byte) error {
	if w.err != nil {
		return w.err
	}
	var hdr [12]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(hdr[8:], maskedCRC(hdr[:8]))
	var tail [4]byte
	binary.LittleEndian.PutUint32(tail[:], maskedCRC(data))
	for _, b := range [][]byte{hdr[:], data, tail[:]} {
		if _, err := w.bw.Write(b); err != nil {
			w.err = fmt.Errorf("%s: %w", w.path, err)
			return w.err
		}
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is the TFRecord checksum: CRC-32C, rotated and offset so that
// a CRC computed over data that itself contains CRCs is not trivially
// related to them.
func maskedCRC(b []byte) uint32 { return maskCRC(crc32.Checksum(b, castagnoli)) }

func maskCRC(crc uint32) uint32 { return (crc>>15 | crc<<17) + 0xa282ead8 }

// Flush writes buffered records to the file, so a running TensorBoard
// sees them.
func (w *EventWriter) Flush() error {
	if w.err != nil {
		return w.err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("%s: %w", w.path, err)
	}
	return w.err
}

// Close flushes, syncs and closes the file.
func (w *EventWriter) Close() error {
	if w.f == nil {
		return nil
	}
	err := w.Flush()
	if serr := w.f.Sync(); err == nil && serr != nil {
		err = fmt.Errorf("%s: %w", w.path, serr)
	}
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("%s: %w", w.path, cerr)
	}
	w.f = nil
	if w.err == nil {
		w.err = fmt.Errorf("%s: event writer is closed", w.path)
	}
	return err
}
