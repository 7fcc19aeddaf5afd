// Package atomicfile writes files crash safe: a reader (or a restart after a
// crash or Ctrl-C) sees a file's old content or its new content, never a torn
// mix. Checkpoints, model files and metrics outputs are written through it.
package atomicfile

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Write creates path with the bytes write produces, crash safe: it
// writes a temporary file in the same directory, fsyncs it, renames it over
// path and fsyncs the directory. After a crash path holds either its old
// content or the new one, never a torn mix; a stray temporary file
// (".NAME.tmp-*") may remain.
func Write(path string, write func(w io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	if err = write(bw); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err = tmp.Chmod(0o644); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("%s: fsync: %w", path, err)
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir fsyncs a directory so a rename in it survives a crash. Some
// systems cannot fsync directories; that is not an error.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	_ = d.Sync() // best effort: not every file system syncs directories
	return nil
}
