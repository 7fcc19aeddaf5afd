// Package builtin resolves the paths of keel's built-in model and data
// (models/tiny-moe-base, recipes/heldout-d2-4.jsonl): from the working
// directory when they are there (a checkout of the repository), else from
// the copies embedded in the binary, written once under the user's cache
// directory. No download is ever needed.
package builtin

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/models"
	"github.com/keel-rl/keel/recipes"
)

// assets maps a built-in path (as recipes write it) to its embedded tree.
var assets = map[string]struct {
	fsys fs.FS
	name string
}{
	"models/tiny-moe-base":       {models.FS, "tiny-moe-base"},
	"recipes/heldout-d2-4.jsonl": {recipes.FS, "heldout-d2-4.jsonl"},
}

// Resolve returns p when it exists; when it does not and p names a
// built-in asset, the path of that asset's embedded copy, written under
// cacheDir (default: the user's cache directory, else the temporary one)
// if not there already. Any other p is returned as it is, for the caller's
// own "not found" error.
func Resolve(p, cacheDir string) (string, error) {
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	a, ok := assets[filepath.ToSlash(filepath.Clean(p))]
	if !ok {
		return p, nil
	}
	if cacheDir == "" {
		if d, err := os.UserCacheDir(); err == nil {
			cacheDir = filepath.Join(d, "keel", "builtin")
		} else {
			cacheDir = filepath.Join(os.TempDir(), "keel-builtin")
		}
	}
	dst := filepath.Join(cacheDir, filepath.FromSlash(filepath.ToSlash(filepath.Clean(p))))
	err := fs.WalkDir(a.fsys, a.name, func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(name, a.name), "/")
		out := dst
		if rel != "" {
			out = filepath.Join(dst, filepath.FromSlash(rel))
		}
		want, err := fs.ReadFile(a.fsys, name)
		if err != nil {
			return err
		}
		if have, err := os.ReadFile(out); err == nil && bytes.Equal(have, want) {
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		return atomicfile.Write(out, func(w io.Writer) error {
			_, err := w.Write(want)
			return err
		})
	})
	if err != nil {
		return "", fmt.Errorf("built-in %s: %w", p, err)
	}
	return dst, nil
}

// Names lists the built-in paths.
func Names() []string {
	var out []string
	for k := range assets {
		out = append(out, k)
	}
	return out
}
