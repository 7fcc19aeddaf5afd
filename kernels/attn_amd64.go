package kernels

// Four-query attention kernels (attn_avx512_amd64.s) used by AttendCausal.

//go:noescape
func dotRowsQ4AVX512(dst *float32, dstStride int, q *float32, qStride int, k *float32, n, d, kStride int, scale float32)

//go:noescape
func axpyRowsQ4AVX512(out *float32, outStride int, p *float32, pStride int, v *float32, n, d, vStride int)
