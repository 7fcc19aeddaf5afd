package jsonfix

import (
	"encoding/json"
	"testing"
)

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

func TestCheckKeys(t *testing.T) {
	keys := []string{"done", "reward"}
	m := map[string]json.RawMessage{"done": json.RawMessage("true")}
	if err := CheckKeys(m, keys); err != nil {
		t.Fatal(err)
	}
	m["Reward"] = json.RawMessage("1")
	if err := CheckKeys(m, keys); err == nil || err.Error() != `unknown key "Reward" (keys are case-sensitive: want "reward")` {
		t.Fatalf("err = %v", err)
	}
	delete(m, "Reward")
	m["score"] = json.RawMessage("1")
	if err := CheckKeys(m, keys); err == nil || err.Error() != `unknown key "score" (want done, reward)` {
		t.Fatalf("err = %v", err)
	}
	if !IsNull(json.RawMessage(" null ")) || IsNull(json.RawMessage(`"null"`)) {
		t.Fatal("IsNull")
	}
}
