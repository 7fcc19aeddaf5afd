package main

import (
	"strings"
	"testing"
)

// Bad decode flags are refused before any measurement runs (a typo must
// not cost the minutes of the training benchmarks first): with an unknown
// preset also given, the flag's error comes first.
func TestBenchFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--decode-group", "3", "--decode-slots", "64"}, "--decode-group 3 does not divide --decode-slots 64"},
		{[]string{"--decode-group", "0"}, "--decode-group 0 does not divide"},
		{[]string{"--decode-slots", "64,x"}, `--decode-slots: "x" is not a positive count`},
		{[]string{"--decode-precisions", "fp16"}, "--decode-precisions"},
		{[]string{"--len", "1"}, "--len must be at least 2"},
	} {
		args := append([]string{"--presets", "no-such-preset", "--no-gemm"}, c.args...)
		if err := runBench(args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.want)
		}
	}
}
