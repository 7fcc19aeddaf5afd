package env

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/keel-rl/keel/tasks"
)

func TestCalculate(t *testing.T) {
	nines := strings.Repeat("9", 40)
	for _, c := range []struct{ expr, want string }{
		{"4821+397", "5218"},
		{" 4821 + 397 ", "5218"},
		{"1+2*3", "7"},
		{"(1+2)*3", "9"},
		{"10-4-3", "3"},   // left to right
		{"100/10/5", "2"}, // left to right
		{"2*3/4", "1.5"},
		{"8-2*3+1", "3"},
		{"12-20", "-8"},
		{"-3", "-3"},
		{"-(-3)", "3"},
		{"--4", "4"},
		{"2*-3", "-6"},
		{"1-(-1)", "2"},
		{"-2*-2", "4"},
		{"7/3", "7/3"},
		{"-7/3", "-7/3"},
		{"14/6", "7/3"}, // reduced
		{"1/6", "1/6"},
		{"1/3+1/6", "0.5"},
		{"1/3*3", "1"},
		{"1/8", "0.125"},
		{"-1/8", "-0.125"},
		{"10/4", "2.5"},
		{"1/1024", "0.0009765625"},
		{"0.1+0.2", "0.3"},
		{".5+.25", "0.75"},
		{"2.50*4", "10"},
		{"3.14159*2", "6.28318"},
		{"0/5", "0"},
		{"-0", "0"},
		{"007", "7"},
		{"((((1))))", "1"},
		{"\t(1 +\n2)\r", "3"},
		{"123456789*987654321", "121932631112635269"},
		{nines + "+1", "1" + strings.Repeat("0", 40)},
		{nines + "*" + nines, strings.Repeat("9", 39) + "8" + strings.Repeat("0", 39) + "1"},
		{"0." + strings.Repeat("0", 38) + "1", "0." + strings.Repeat("0", 38) + "1"},
		{strings.Repeat("(", 32) + "1" + strings.Repeat(")", 32), "1"},
	} {
		got, err := Calculate(c.expr)
		if err != nil || got != c.want {
			t.Errorf("Calculate(%q) = %q, %v; want %q", c.expr, got, err, c.want)
		}
	}
}

func TestCalculateErrors(t *testing.T) {
	nines := strings.Repeat("9", 40)
	for _, c := range []struct{ expr, want string }{
		{"", "unexpected end of expression"},
		{"   ", "unexpected end of expression"},
		{"1+", "unexpected end of expression"},
		{"1/0", "division by zero"},
		{"1/(2-2)", "division by zero"},
		{"0/0", "division by zero"},
		{"2^3", `unexpected '^' at offset 1`},
		{"2**3", `unexpected '*' at offset 2`},
		{"(1+2", "missing ')'"},
		{"(1+2]", `unexpected ']' at offset 4`},
		{"1+2)", `unexpected ')' at offset 3`},
		{"()", `unexpected ')' at offset 1`},
		{"2(3)", `unexpected '(' at offset 1`},
		{"1e5", `unexpected 'e' at offset 1`},
		{"+5", `unexpected '+' at offset 0`},
		{"x", `unexpected 'x' at offset 0`},
		{"3×4", `unexpected '×' at offset 1`},
		{"1,000", `unexpected ',' at offset 1`},
		{"5.", "a digit must follow '.' at offset 1"},
		{"1.2.3", `unexpected '.' at offset 3`},
		{".", `unexpected '.' at offset 0`},
		{"1+" + nines + "9", "number at offset 2 longer than 40 digits"},
		{"1." + nines, "longer than 40 digits"},
		{strings.Repeat("1", 201), "expression longer than 200 bytes"},
		{strings.Repeat("(", 33) + "1" + strings.Repeat(")", 33), "nested more than 32 deep"},
		{strings.Repeat("-", 33) + "1", "nested more than 32 deep"},
		{nines + "*" + nines + "*" + nines, "more than 100 digits"},
		{"1/" + nines + "/" + nines + "/" + nines, "more than 100 digits"},
	} {
		got, err := Calculate(c.expr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Calculate(%q) = %q, %v; want an error holding %q", c.expr, got, err, c.want)
		}
	}
}

// TestCalculateVerifiers checks the output format's purpose: a model that
// copies the calculator's result into its answer line is scored correct
// by each verifier that reads such an answer.
func TestCalculateVerifiers(t *testing.T) {
	for _, c := range []struct{ task, truth, expr string }{
		{"arithmetic", "5218", "4821+397"},
		{"arithmetic", "-8", "12-20"},
		{"arithmetic", "1564", "68*23"},
		{"linear", "-25", "(4-(-21))*(-1)"},
		{"gsm8k", "72", "48+48/2"},
		{"gsm8k", "2.5", "10/4"},
		{"gsm8k", "0.125", "1/8"},
		{"math", `\frac{7}{3}`, "14/6"},
		{"math", `-\frac{1}{6}`, "1/3-1/2"},
		{"math", `\frac{1}{8}`, "1/8"},
		{"math", "2.5", "5/2"},
	} {
		out, err := Calculate(c.expr)
		if err != nil {
			t.Fatal(err)
		}
		if s := tasks.Score(c.task, c.truth, "Answer: "+out); s != 1 {
			t.Errorf("%s: Calculate(%q) = %q scores %g against %q, want 1", c.task, c.expr, out, s, c.truth)
		}
	}
}

func TestCalculatorTool(t *testing.T) {
	tool := Calculator()
	for _, c := range []struct{ args, want, err string }{
		{`{"expression": "1+2"}`, "3", ""},
		{`{"expression": 12}`, "12", ""},
		{`{"expression": 1.50}`, "1.5", ""},
		{`{"expression": -4}`, "-4", ""},
		{`{}`, "", `missing argument "expression"`},
		{`{"expr": "1"}`, "", `unknown argument "expr" (want "expression")`},
		{`{"expression": "1", "b": 2, "a": 1}`, "", `unknown argument "a"`},
		{`{"expression": null}`, "", `argument "expression" is null, want a string`},
		{`{"expression": ["1"]}`, "", `argument "expression" is ["1"], want a string`},
		{`{"expression": true}`, "", `argument "expression" is true, want a string`},
		{`[]`, "", `arguments []: want {"expression": "..."}`},
		{`null`, "", `want {"expression": "..."}`},
		{`{"expression": "1/0"}`, "", "division by zero"},
	} {
		got, err := tool.Call(context.Background(), json.RawMessage(c.args))
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s: %q, %v; want %q", c.args, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %q, %v; want an error holding %q", c.args, got, err, c.err)
		}
	}
}

// TestCalculateBounded runs pathological expressions, each within the
// byte bound, and wants each answered quickly.
func TestCalculateBounded(t *testing.T) {
	nines := strings.Repeat("9", 40)
	for _, expr := range []string{
		strings.Repeat("(", 100) + strings.Repeat(")", 100),
		strings.Repeat("-", 200),
		strings.Repeat("9*", 99) + "9",
		nines + strings.Repeat("*"+nines[:19], 8),
		strings.Repeat("1/3/", 49) + "3",
		"1/" + strings.Repeat("7*", 99) + "7",
		strings.Repeat("0.1*", 49) + "0.1",
		strings.Repeat(".1/", 66) + "7",
	} {
		t0 := time.Now()
		out, err := Calculate(expr)
		if d := time.Since(t0); d > time.Second {
			t.Errorf("Calculate(%q) took %v", expr, d)
		}
		if len(out) > 210 {
			t.Errorf("Calculate(%q) = %q (%d bytes), %v", expr, out, len(out), err)
		}
	}
}

func FuzzCalculate(f *testing.F) {
	for _, s := range []string{"1+2*3", "(1.5-.25)/-3", "7/3", "2(3)", "((1)", "1/0", strings.Repeat("9*", 30) + "9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		t0 := time.Now()
		out, err := Calculate(expr)
		if d := time.Since(t0); d > time.Second {
			t.Errorf("Calculate(%q) took %v", expr, d)
		}
		if err != nil {
			return
		}
		// A result reads back as itself when it fits the bounds.
		if len(out) <= maxExprDigits {
			again, err := Calculate(out)
			if err != nil || again != out {
				t.Errorf("Calculate(%q) = %q, which reads back as %q, %v", expr, out, again, err)
			}
		}
	})
}
