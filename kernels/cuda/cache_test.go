package cuda

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBuildKeyHashCoversEveryField(t *testing.T) {
	base := BuildKey{Name: "rows.cu", Source: "src", Options: []string{"-a", "-b"}, Target: Target{90, CodeCUBIN}, Compiler: "11.8", Driver: 12080}
	seen := map[string]string{base.Hash(): "base"}
	variants := map[string]BuildKey{}
	k := base
	k.Name = "head.cu"
	variants["name"] = k
	k = base
	k.Source = "src "
	variants["source"] = k
	k = base
	k.Options = []string{"-a -b"}
	variants["options joined differently"] = k
	k = base
	k.Target = Target{80, CodeCUBIN}
	variants["arch"] = k
	k = base
	k.Target = Target{90, CodePTX}
	variants["code"] = k
	k = base
	k.Compiler = "12.8"
	variants["compiler"] = k
	k = base
	k.Driver = 13000
	variants["driver"] = k
	for what, v := range variants {
		h := v.Hash()
		if prev, ok := seen[h]; ok {
			t.Errorf("changing the %s gives the same hash as %s", what, prev)
		}
		seen[h] = what
	}
	if base.Hash() != base.Hash() || len(base.Hash()) != 64 {
		t.Error("hash not stable or not SHA-256 hex")
	}
}

func TestCacheRoundTripAndDamage(t *testing.T) {
	c := &Cache{Dir: filepath.Join(t.TempDir(), "a", "b")} // created on Put
	k := BuildKey{Name: "x.cu", Source: "s", Target: Target{90, CodeCUBIN}}
	if _, ok := c.Get(k); ok {
		t.Fatal("hit in an empty cache")
	}
	img := []byte("\x7fELF fake cubin image")
	if err := c.Put(k, img); err != nil {
		t.Fatal(err)
	}
	got, ok := c.Get(k)
	if !ok || string(got) != string(img) {
		t.Fatalf("Get after Put = %q, %v", got, ok)
	}
	other := k
	other.Target = Target{80, CodeCUBIN}
	if _, ok := c.Get(other); ok {
		t.Error("hit for another architecture")
	}
	// A damaged entry (one flipped byte) is a miss and is removed.
	p := c.path(k)
	b, _ := os.ReadFile(p)
	b[len(b)-1] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Get(k); ok {
		t.Error("a damaged entry was returned")
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Error("the damaged entry was not removed")
	}
	// A truncated one (a crash while writing, without atomic writes).
	if err := os.WriteFile(p, []byte(cacheMagic), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Get(k); ok {
		t.Error("a truncated entry was returned")
	}
	var nilCache *Cache
	if _, ok := nilCache.Get(k); ok || nilCache.Put(k, img) != nil {
		t.Error("a nil cache must cache nothing, silently")
	}
}

// TestCacheBuild compiles through the cache: the first build compiles and
// stores (and says so on Notice), the second is a hit with the same bytes
// (and says nothing), and another compiler version misses.
func TestCacheBuild(t *testing.T) {
	n := nvrtcForTest(t)
	var notice bytes.Buffer
	c := &Cache{Dir: t.TempDir(), Notice: &notice}
	src, err := Source("optim.cu")
	if err != nil {
		t.Fatal(err)
	}
	k := BuildKey{Name: "optim.cu", Source: src, Options: KernelOptions, Target: Target{90, CodeCUBIN}}
	img1, hit, err := c.Build(n, k)
	if err != nil || hit {
		t.Fatalf("first build: hit %v, %v", hit, err)
	}
	if got := notice.String(); !strings.HasPrefix(got, "keel: compiling optim.cu for ") || strings.Count(got, "\n") != 1 {
		t.Errorf("the first build's notice: %q", got)
	}
	img2, hit, err := c.Build(n, k)
	if err != nil || !hit || string(img1) != string(img2) {
		t.Fatalf("second build: hit %v, same %v, %v", hit, string(img1) == string(img2), err)
	}
	if strings.Count(notice.String(), "\n") != 1 {
		t.Errorf("a cache hit gave a notice: %q", notice.String())
	}
	ents, _ := os.ReadDir(c.Dir)
	if len(ents) != 1 || !strings.HasSuffix(ents[0].Name(), ".cubin") {
		t.Errorf("cache holds %v", ents)
	}
	k.Source += "\n// changed\n"
	if _, hit, err := c.Build(n, k); err != nil || hit {
		t.Errorf("changed source: hit %v, %v", hit, err)
	}
}

func TestDefaultCacheDir(t *testing.T) {
	t.Setenv("KEEL_CACHE_DIR", "/some/where")
	if d, err := DefaultCacheDir(); err != nil || d != "/some/where/cuda" {
		t.Errorf("DefaultCacheDir = %q, %v", d, err)
	}
	t.Setenv("KEEL_CACHE_DIR", "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if d, err := DefaultCacheDir(); err != nil || d != "/xdg/keel/cuda" {
		t.Errorf("DefaultCacheDir = %q, %v", d, err)
	}
}
