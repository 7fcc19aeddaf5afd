package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/rollout"
)

// parseFlags parses args; help reports that -h was asked for (the usage
// has been printed and the command should return nil).
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	err = fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return true, nil
	}
	return false, err
}

// writeOutput runs write on standard output (buffered) when path is empty,
// else on path, crash safe: a reader never sees a half-written file.
func writeOutput(path string, write func(io.Writer) error) error {
	if path == "" {
		w := bufio.NewWriter(os.Stdout)
		if err := write(w); err != nil {
			return err
		}
		return w.Flush()
	}
	return atomicfile.Write(path, write)
}

// writeJSONFile writes v as indented JSON to path, crash safe.
func writeJSONFile(path string, v any) error {
	return atomicfile.Write(path, func(w io.Writer) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	})
}

// parsePrecisions reads a comma-separated list of rollout precisions, an
// error naming flag.
func parsePrecisions(list, flag string) ([]rollout.Precision, error) {
	var out []rollout.Precision
	for _, s := range strings.Split(list, ",") {
		p, err := rollout.ParsePrecision(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		out = append(out, p)
	}
	return out, nil
}
