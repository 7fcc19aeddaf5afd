package cuda

import (
	"fmt"
	"os"
	"sync"
)

// CublasLt is NVIDIA's matrix-product library, loaded from a shared
// library: keel's GEMMs (bf16 inputs, fp32 accumulation; fp8 on Hopper)
// go through it, everything else through keel's own kernels.
type CublasLt struct {
	// Path is the file (or soname) that was loaded.
	Path string
	// Version is cublasLtGetVersion's: major*10000 + minor*100 + patch.
	Version int

	getVersion func() uintptr
}

var (
	cublasOnce sync.Once
	cublasLib  *CublasLt
	cublasErr  error
)

// LoadCublasLt loads cuBLASLt once per process (searched for as NVRTC
// is). It needs no GPU to load.
func LoadCublasLt() (*CublasLt, error) {
	cublasOnce.Do(func() { cublasLib, cublasErr = loadCublasLt(searchDirs(os.Getenv)) })
	return cublasLib, cublasErr
}

func loadCublasLt(dirs []string) (*CublasLt, error) {
	h, path, err := load(libCublasLt, dirs)
	if err != nil {
		return nil, err
	}
	c := &CublasLt{Path: path}
	if err := register(&c.getVersion, h, "cublasLtGetVersion"); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", path, err)
	}
	c.Version = int(c.getVersion())
	return c, nil
}

// VersionString is the version as "major.minor.patch".
func (c *CublasLt) VersionString() string {
	return fmt.Sprintf("%d.%d.%d", c.Version/10000, c.Version/100%100, c.Version%100)
}
