package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/keel-rl/keel/internal/atomicfile"
)

// Cache keeps compiled kernels on disk, so that a GPU compiles keel's
// kernels once and a new GPU or driver needs no rebuild of keel: an
// entry's key is a hash of everything the image depends on (source,
// options, target, compiler and driver versions). Entries are written
// atomically and carry a checksum, so a crash or a damaged file costs a
// recompile, never a wrong kernel. A nil *Cache caches nothing.
type Cache struct {
	Dir string
	// Notice, where not nil, gets a line before each compile (a miss).
	Notice io.Writer
}

// CompileNotice is the Notice of the caches Open gives devices: the keel
// command sets it to its standard error. A source's first use on a
// machine compiles it, and with NVRTC 13 on an H200 that took tens of
// seconds for the sources the training engine uses (its test against the
// CPU engine: 39.8 s with an empty cache; 3.5 s in an earlier session's
// run, whose cache the kernel tests had filled): a wait a user should not
// take for a hang.
var CompileNotice io.Writer

// DefaultCacheDir is KEEL_CACHE_DIR/cuda when that is set, else the
// user's cache folder (XDG_CACHE_HOME or ~/.cache) under keel/cuda.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("KEEL_CACHE_DIR"); d != "" {
		return filepath.Join(d, "cuda"), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cuda: kernel cache: %w (set KEEL_CACHE_DIR)", err)
	}
	return filepath.Join(d, "keel", "cuda"), nil
}

// BuildKey identifies one compiled image: what went into it.
type BuildKey struct {
	Name, Source string
	Options      []string
	Target       Target
	Compiler     string // NVRTC's version
	Driver       int    // the driver's CUDA version (12080 for 12.8), 0 when none is loaded
}

// Hash is the key's cache name: hex SHA-256 over its fields, each length
// prefixed so that no two keys share a byte stream.
func (k BuildKey) Hash() string {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field("keel-cuda-1")
	field(k.Name)
	field(k.Source)
	field(strings.Join(k.Options, "\x00"))
	field(k.Target.String())
	field(k.Compiler)
	field(fmt.Sprint(k.Driver))
	return hex.EncodeToString(h.Sum(nil))
}

const cacheMagic = "keel-cuda-cache 1 "

func (c *Cache) path(k BuildKey) string {
	return filepath.Join(c.Dir, k.Hash()+"."+k.Target.Code.String())
}

// Get returns the cached image for k, or false when there is none or the
// entry is damaged (a damaged entry is removed).
func (c *Cache) Get(k BuildKey) ([]byte, bool) {
	if c == nil {
		return nil, false
	}
	p := c.path(k)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, false
	}
	img, err := parseEntry(b)
	if err != nil {
		os.Remove(p)
		return nil, false
	}
	return img, true
}

func parseEntry(b []byte) ([]byte, error) {
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 || !bytes.HasPrefix(b, []byte(cacheMagic)) {
		return nil, errors.New("not a cache entry")
	}
	want := string(b[len(cacheMagic):nl])
	img := b[nl+1:]
	sum := sha256.Sum256(img)
	if hex.EncodeToString(sum[:]) != want || len(img) == 0 {
		return nil, errors.New("checksum mismatch")
	}
	return img, nil
}

// Put stores img under k, atomically.
func (c *Cache) Put(k BuildKey, img []byte) error {
	if c == nil {
		return nil
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return fmt.Errorf("cuda: kernel cache: %w", err)
	}
	sum := sha256.Sum256(img)
	return atomicfile.Write(c.path(k), func(w io.Writer) error {
		if _, err := fmt.Fprintf(w, "%s%s\n", cacheMagic, hex.EncodeToString(sum[:])); err != nil {
			return err
		}
		_, err := w.Write(img)
		return err
	})
}

// Build returns the image of k, from the cache when it holds one, else
// compiled by n and stored; hit says which. k.Compiler is set to n's
// version, marked when n is the CUDA emulator's so that its images and a
// GPU's never share an entry (nor the emulator's two builds: with
// KEEL_CUDA_EMU_MMA=1 its kernels take their tensor-core paths). A cache
// that cannot be written (a read-only home) is not an error: the image is
// still returned.
func (c *Cache) Build(n *NVRTC, k BuildKey) (img []byte, hit bool, err error) {
	k.Compiler = n.Version()
	if n.Emulated { // its images are shared objects for the CPU: never a GPU's
		k.Compiler += " (keel CUDA emulator)"
		if os.Getenv("KEEL_CUDA_EMU_MMA") == "1" {
			k.Compiler += " mma"
		}
	}
	if img, ok := c.Get(k); ok {
		return img, true, nil
	}
	if c != nil && c.Notice != nil {
		fmt.Fprintf(c.Notice, "keel: compiling %s for %s with NVRTC %s (its first use with this compiler and driver; kept in %s)\n", k.Name, k.Target, n.Version(), c.Dir)
	}
	img, _, err = n.Compile(k.Source, k.Name, k.Target, k.Options...)
	if err != nil {
		return nil, false, err
	}
	_ = c.Put(k, img)
	return img, false, nil
}
