package kernels

// Assembly in bf16_amd64.s.

//go:noescape
func vdpbf16psTest(acc, a, b *[16]uint32)

//go:noescape
func vdpbf16psBcastTest(acc *[14][16]uint32, a *[16]uint32, b *[14]uint32)

//go:noescape
func bf16Kern14x32(kp int, a *BF16, lda int, b *uint32, c *float32, ldc int, mr int, mask uint32, accumulate bool, sa, sb *float32)

//go:noescape
func bf16Kern7x32FMA(kp int, a *BF16, lda int, b *uint32, c *float32, ldc int, mr int, mask uint32, accumulate bool, sa, sb *float32)

//go:noescape
func toBF16AVX512(dst *BF16, src *float32, n int)

// toBF16Fast converts the longest prefix it can with AVX-512 and returns
// its length; the caller finishes the rest.
func toBF16Fast(dst []BF16, src []float32) int {
	n := len(src) &^ 15
	if !useAVX512 || n == 0 {
		return 0
	}
	toBF16AVX512(&dst[0], &src[0], n)
	return n
}

// bf16Tile computes one 14×32 tile with the best kernel for this CPU. a
// holds 14 rows of 2·kp values with row stride lda, b one packed panel;
// rows mr.. and the columns outside mask are not written.
func bf16Tile(kp int, a []BF16, lda int, b []uint32, c []float32, ldc, mr int, mask uint32, accumulate bool, sa, sb []float32) {
	switch {
	case useAVX512BF16:
		_ = a[(bf16MR-1)*lda+2*kp-1]
		_ = b[kp*bf16NR-1]
		bf16Kern14x32(kp, &a[0], lda, &b[0], &c[0], ldc, mr, mask, accumulate, &sa[0], &sb[0])
	case useAVX512:
		_ = a[(bf16MR-1)*lda+2*kp-1]
		_ = b[kp*bf16NR-1]
		bf16Kern7x32FMA(kp, &a[0], lda, &b[0], &c[0], ldc, min(mr, 7), mask, accumulate, &sa[0], &sb[0])
		if mr > 7 {
			bf16Kern7x32FMA(kp, &a[7*lda], lda, &b[0], &c[7*ldc], ldc, mr-7, mask, accumulate, &sa[7], &sb[0])
		}
	default:
		bf16TileGo(kp, a, lda, b, c, ldc, mr, mask, accumulate, sa, sb)
	}
}
