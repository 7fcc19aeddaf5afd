package main

import (
	"strings"
	"testing"
)

// The rescored comparison by hand: A - B per seed over the seeds both
// arms have, their mean and Student-t interval (t = 4.303 for two degrees
// of freedom), and the evaluator's spread as a sample standard deviation.
func TestRescoredTable(t *testing.T) {
	scores := map[string]map[int]float64{
		"a": {1: 0.40, 2: 0.42, 3: 0.41, 9: 0.5},
		"b": {1: 0.38, 2: 0.41, 3: 0.37},
	}
	got := rescoredTable("a", "b", scores, 32)
	// d = 2, 1, 4 points: mean 2.33, sd 1.528, half-width 4.303 x 1.528 / sqrt(3) = 3.80.
	for _, want := range []string{"avg@32", "| a | b | 3 | s1 +2.00, s2 +1.00, s3 +4.00 | +2.33 | [-1.46, +6.13] | 3 / 0 / 0 | not established |"} {
		if !strings.Contains(got, want) {
			t.Fatalf("missing %q in\n%s", want, got)
		}
	}
	line := evaluatorLine("m", 8, []float64{0.30, 0.32, 0.31})
	if !strings.Contains(line, "mean 0.310, standard deviation 1.00 points") {
		t.Fatalf("%s", line)
	}
}
