package jsonfix

import "testing"

func TestQuoteNonFinite(t *testing.T) {
	for in, want := range map[string]string{
		`{"a": 1}`:                         `{"a": 1}`,
		`{"r": NaN, "s": Infinity}`:        `{"r": "NaN", "s": "Infinity"}`,
		`[-Infinity, 2]`:                   `["-Infinity", 2]`,
		`{"t": "NaN and Infinity \" NaN"}`: `{"t": "NaN and Infinity \" NaN"}`,
		`{"t": "a\\", "r": NaN}`:           `{"t": "a\\", "r": "NaN"}`,
		`{"NaN": Infinity}`:                `{"NaN": "Infinity"}`,
	} {
		if got := string(QuoteNonFinite([]byte(in))); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
