// Package run owns what a training run leaves on disk: the metrics log
// (metrics.jsonl, one JSON object per step) and checkpoints (model,
// optimiser and loop state) that survive a crash or Ctrl-C at any moment,
// so a run can always resume from its last checkpoint with a log that
// agrees with it.
package run

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// MetricsLog appends one JSON object per line to a metrics file. Each
// record is written with a single write call, so a crash can at worst leave
// one torn last line, which OpenMetrics removes.
type MetricsLog struct {
	f    *os.File
	path string
	buf  bytes.Buffer
}

// OpenMetrics opens (creating if needed) the metrics log at path for
// appending. A torn last line left by a crash is cut off. When keepUpTo is
// >= 0 (resuming from the checkpoint of that step), records whose "step" is
// above it are cut off too, so the log never runs ahead of the state it is
// resumed from; pass -1 to keep every complete record.
func OpenMetrics(path string, keepUpTo int) (*MetricsLog, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	keep, err := validPrefix(f, path, keepUpTo)
	if err == nil {
		err = f.Truncate(keep)
	}
	if err == nil {
		_, err = f.Seek(keep, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &MetricsLog{f: f, path: path}, nil
}

// validPrefix returns the length of the part of the log to keep: complete
// lines, up to the first record with a step above keepUpTo. A complete
// line that is not a JSON object is an error (the file is not a metrics
// log, or was edited by hand): better to stop than to cut a user's data.
func validPrefix(r io.Reader, path string, keepUpTo int) (int64, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var off int64
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if len(b) == 0 || b[len(b)-1] != '\n' {
			if err != nil && !errors.Is(err, io.EOF) {
				return 0, err
			}
			return off, nil // EOF, possibly after a torn line
		}
		var rec struct {
			Step *float64 `json:"step"`
		}
		if len(bytes.TrimSpace(b)) > 0 {
			if jerr := json.Unmarshal(b, &rec); jerr != nil {
				return 0, fmt.Errorf("%s:%d: not a metrics record: %v", path, line, jerr)
			}
			if keepUpTo >= 0 && rec.Step != nil && *rec.Step > float64(keepUpTo) {
				return off, nil
			}
		}
		off += int64(len(b))
	}
}

// Write appends one record. Non-finite floats (a diverged loss) are
// written as null rather than failing the run, since JSON has no NaN.
func (l *MetricsLog) Write(rec map[string]any) error {
	clean := make(map[string]any, len(rec))
	for k, v := range rec {
		clean[k] = finiteOrNil(v)
	}
	l.buf.Reset()
	enc := json.NewEncoder(&l.buf)
	if err := enc.Encode(clean); err != nil { // sorted keys, trailing newline
		return fmt.Errorf("%s: %w", l.path, err)
	}
	if _, err := l.f.Write(l.buf.Bytes()); err != nil {
		return fmt.Errorf("%s: %w", l.path, err)
	}
	return nil
}

func finiteOrNil(v any) any {
	switch x := v.(type) {
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
	case float32:
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil
		}
	}
	return v
}

// Sync flushes the log to stable storage (call it with every checkpoint).
func (l *MetricsLog) Sync() error { return l.f.Sync() }

// Close syncs and closes the log.
func (l *MetricsLog) Close() error {
	err := l.f.Sync()
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadMetrics reads every complete record of a metrics log (a torn last
// line is ignored), for reports and tests.
func ReadMetrics(path string) ([]map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for i, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 || line[len(line)-1] != '\n' || len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, i+1, err)
		}
		out = append(out, rec)
	}
	return out, nil
}
