//go:build !amd64 || purego

package kernels

// No assembly paths on this architecture or build.
var (
	gemmAVX512 *gemmArch
	gemmAVX2   *gemmArch
)
