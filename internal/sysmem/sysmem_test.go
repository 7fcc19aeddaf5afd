package sysmem

import "testing"

func TestParse(t *testing.T) {
	if n, ok := parse("MemFree: 5 kB\nMemTotal:       24576000 kB\n"); !ok || n != 24576000*1024 {
		t.Errorf("parse = %d, %v", n, ok)
	}
	if _, ok := parse("MemFree: 5 kB\n"); ok {
		t.Error("no MemTotal line gave a total")
	}
	if _, ok := parse("MemTotal: lots kB\n"); ok {
		t.Error("a bad number gave a total")
	}
}
