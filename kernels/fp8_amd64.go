package kernels

// Assembly in fp8_amd64.s.

//go:noescape
func absMaxBitsAVX512(x *float32, n int) uint32

//go:noescape
func quantE4M3AVX512(dst *BF16, src *float32, n int, s float32)

// absMaxBitsFast returns the abs-max bits of the longest prefix of x it
// handles with AVX-512, and that prefix's length.
func absMaxBitsFast(x []float32) (uint32, int) {
	n := len(x) &^ 15
	if !useAVX512 || n == 0 {
		return 0, 0
	}
	return absMaxBitsAVX512(&x[0], n), n
}

// quantE4M3Fast quantises the longest prefix it can with AVX-512 and
// returns its length.
func quantE4M3Fast(dst []BF16, src []float32, s float32) int {
	n := len(src) &^ 15
	if !useAVX512 || n == 0 {
		return 0
	}
	_ = dst[n-1]
	quantE4M3AVX512(&dst[0], &src[0], n, s)
	return n
}
