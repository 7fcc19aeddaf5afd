package rollout

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// bigFloats returns n zeroed float32s for the KV cache. On Linux, large
// buffers are mapped directly and marked for transparent huge pages: the
// cache of a few hundred sequences spans hundreds of megabytes read in
// scattered slices every step, where 4 KB pages cost a TLB miss per slice.
// Mappings are recorded in *maps for freeBig (Engine.Close); the
// fallback is an ordinary slice.
func bigFloats(n int, maps *[][]byte) []float32 {
	const huge = 2 << 20
	size := n * 4
	if size < huge {
		return make([]float32, n)
	}
	size = (size + huge - 1) / huge * huge
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]float32, n)
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	*maps = append(*maps, b)
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// freeBig unmaps what bigFloats mapped.
func freeBig(maps [][]byte) {
	for _, b := range maps {
		_ = unix.Munmap(b)
	}
}
