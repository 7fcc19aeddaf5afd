//go:build !amd64

package kernels

// Off amd64 AttendCausal never takes the four-query path (useAVX512 is
// false); these stubs only let attn.go compile.

func dotRowsQ4AVX512(dst *float32, dstStride int, q *float32, qStride int, k *float32, n, d, kStride int, scale float32) {
	panic("kernels: dotRowsQ4AVX512 without AVX-512")
}

func axpyRowsQ4AVX512(out *float32, outStride int, p *float32, pStride int, v *float32, n, d, vStride int) {
	panic("kernels: axpyRowsQ4AVX512 without AVX-512")
}
