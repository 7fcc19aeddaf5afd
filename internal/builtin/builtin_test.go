package builtin

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// From a directory without the repository's files, the built-in paths
// resolve to byte-identical copies written under the cache directory; an
// existing path and an unknown one are returned as they are.
func TestResolve(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	wd, _ := os.Getwd()
	defer os.Chdir(wd)
	if err := os.Chdir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, file string }{
		{"models/tiny-moe-base", "model.safetensors"},
		{"models/tiny-moe-base", "tokenizer.json"},
		{"recipes/heldout-d2-4.jsonl", ""},
	} {
		for range 2 { // the second time finds the copy in place
			got, err := Resolve(c.path, cache)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Dir(got) == "." || !filepath.IsAbs(got) && got == c.path {
				t.Fatalf("%s resolved to %s", c.path, got)
			}
			a, err := os.ReadFile(filepath.Join(got, c.file))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(repo, c.path, c.file))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Fatalf("%s/%s: the embedded copy differs from the repository's", c.path, c.file)
			}
		}
	}
	if got, _ := Resolve("no/such/thing", cache); got != "no/such/thing" {
		t.Fatalf("unknown path resolved to %s", got)
	}
	os.MkdirAll("models/tiny-moe-base", 0o755)
	if got, _ := Resolve("models/tiny-moe-base", cache); got != "models/tiny-moe-base" {
		t.Fatalf("an existing directory resolved to %s", got)
	}
}
