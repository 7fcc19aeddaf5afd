package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
)

// The file names Hugging Face uses for single-file and sharded checkpoints.
const (
	SingleFileName = "model.safetensors"
	IndexFileName  = "model.safetensors.index.json"
)

// Index is the content of model.safetensors.index.json: which shard file
// holds each tensor. Metadata conventionally holds "total_size", the number
// of tensor data bytes over all shards.
type Index struct {
	Metadata  map[string]any    `json:"metadata,omitempty"`
	WeightMap map[string]string `json:"weight_map"`
}

// ReadIndex reads and checks a sharded checkpoint index: it must map at
// least one tensor, and every shard must be a plain file name in the index's
// own directory (no path separators), so an index cannot point elsewhere.
func ReadIndex(path string) (*Index, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var idx Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: weight_map is missing or empty", path)
	}
	for name, file := range idx.WeightMap {
		if file == "" || file != filepath.Base(file) || strings.ContainsAny(file, `/\`) || file == "." || file == ".." {
			return nil, fmt.Errorf("%s: weight_map[%q] = %q is not a file name in the checkpoint directory", path, name, file)
		}
	}
	return &idx, nil
}

// ShardName returns Hugging Face's name for shard i (0-based) of n.
func ShardName(i, n int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
}

// WriteSharded writes tensors into dir as a sharded checkpoint: shard files
// of at most maxShardBytes of tensor data each (a single larger tensor gets
// a shard of its own), then model.safetensors.index.json. Every file is
// written atomically and the index last, so a crash never leaves an index
// pointing at missing data. It returns the shard file names.
func WriteSharded(dir string, tensors []Tensor, dtype DType, maxShardBytes int64, metadata map[string]string) ([]string, error) {
	es := int64(dtype.Size())
	if dtype != F32 && dtype != BF16 {
		return nil, fmt.Errorf("%s: cannot write dtype %q: only F32 and BF16 are supported", dir, dtype)
	}
	if maxShardBytes <= 0 {
		return nil, fmt.Errorf("%s: shard size %d must be positive", dir, maxShardBytes)
	}
	var groups [][]Tensor
	var cur []Tensor
	var curBytes, total int64
	for _, t := range tensors {
		sz := int64(len(t.Data)) * es
		if len(cur) > 0 && curBytes+sz > maxShardBytes {
			groups = append(groups, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, t)
		curBytes += sz
		total += sz
	}
	if len(cur) > 0 || len(groups) == 0 {
		groups = append(groups, cur)
	}
	idx := Index{Metadata: map[string]any{"total_size": total}, WeightMap: map[string]string{}}
	var names []string
	for i, g := range groups {
		name := ShardName(i, len(groups))
		if err := WriteFile(filepath.Join(dir, name), g, dtype, metadata); err != nil {
			return nil, err
		}
		for _, t := range g {
			idx.WeightMap[t.Name] = name
		}
		names = append(names, name)
	}
	js, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return nil, err
	}
	err = atomicfile.Write(filepath.Join(dir, IndexFileName), func(w io.Writer) error {
		_, err := w.Write(append(js, '\n'))
		return err
	})
	return names, err
}

// Checkpoint is a directory's tensors, from model.safetensors or from the
// shards listed in model.safetensors.index.json, looked up by name.
type Checkpoint struct {
	files []*File
	where map[string]*File
	names []string
}

// OpenCheckpoint opens the tensors of a Hugging Face model directory. Like
// transformers, it prefers model.safetensors and falls back to the sharded
// index. With an index, each listed tensor must be in its shard and each
// shard may hold only tensors the index assigns to it.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	single := filepath.Join(dir, SingleFileName)
	if _, err := os.Stat(single); err == nil {
		f, err := Open(single)
		if err != nil {
			return nil, err
		}
		c := &Checkpoint{files: []*File{f}, where: map[string]*File{}}
		for _, t := range f.Tensors() {
			c.where[t.Name] = f
			c.names = append(c.names, t.Name)
		}
		sort.Strings(c.names)
		return c, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	indexPath := filepath.Join(dir, IndexFileName)
	idx, err := ReadIndex(indexPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: no %s or %s", dir, SingleFileName, IndexFileName)
	}
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{where: map[string]*File{}}
	byShard := map[string]*File{}
	shards := make([]string, 0)
	for _, s := range idx.WeightMap {
		if _, ok := byShard[s]; !ok {
			byShard[s] = nil
			shards = append(shards, s)
		}
	}
	sort.Strings(shards)
	for _, s := range shards {
		f, err := Open(filepath.Join(dir, s))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: shard listed in %s: %w", filepath.Join(dir, s), IndexFileName, err)
		}
		byShard[s] = f
		c.files = append(c.files, f)
		for _, t := range f.Tensors() {
			if want, ok := idx.WeightMap[t.Name]; !ok || want != s {
				c.Close()
				if !ok {
					return nil, fmt.Errorf("%s: tensor %q is not listed in %s", f.Path(), t.Name, indexPath)
				}
				return nil, fmt.Errorf("%s: tensor %q is here but %s assigns it to %s", f.Path(), t.Name, indexPath, want)
			}
		}
	}
	for name, s := range idx.WeightMap {
		f := byShard[s]
		if _, ok := f.Info(name); !ok {
			c.Close()
			return nil, fmt.Errorf("%s: tensor %q, listed in %s, is missing", f.Path(), name, indexPath)
		}
		c.where[name] = f
		c.names = append(c.names, name)
	}
	sort.Strings(c.names)
	return c, nil
}

// Names returns every tensor name, sorted.
func (c *Checkpoint) Names() []string { return c.names }

// Info returns the description of tensor name and the path of its file.
func (c *Checkpoint) Info(name string) (TensorInfo, string, bool) {
	f, ok := c.where[name]
	if !ok {
		return TensorInfo{}, "", false
	}
	t, _ := f.Info(name)
	return t, f.Path(), true
}

// ReadFloat32 reads tensor name into dst; see File.ReadFloat32.
func (c *Checkpoint) ReadFloat32(name string, dst []float32) error {
	f, ok := c.where[name]
	if !ok {
		return fmt.Errorf("no tensor %q in the checkpoint", name)
	}
	return f.ReadFloat32(name, dst)
}

// Close closes every file of the checkpoint.
func (c *Checkpoint) Close() error {
	var first error
	for _, f := range c.files {
		if f == nil {
			continue
		}
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
