package testmodel

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"runtime"
)

// QwenTokenizerJSON returns Qwen3's tokenizer.json, the gzipped copy in
// tokenizer/testdata that tests of several packages share, found from this
// file's place in the repository whatever the test's working directory.
func QwenTokenizerJSON() ([]byte, error) {
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "..", "tokenizer", "testdata", "qwen3-tokenizer.json.gz")
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(z)
}
