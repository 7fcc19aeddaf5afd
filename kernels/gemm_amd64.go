//go:build !purego

package kernels

//go:noescape
func gemmPackC512(rows, cols int, src *float32, lds int, dst *float32, ldd int)

// gemmAVX512 is the AVX-512 path: 14×32 tiles, assembly packing.
var gemmAVX512 = &gemmArch{
	name:    "avx512",
	mr:      gemmMR512,
	nr:      gemmNR512,
	micro:   gemmKerns512[:],
	wide:    gemmWide512[:],
	strided: gemmKern512x14s,
	packA: func(transA bool, a []float32, lda, i0, rows, p0, kc int, dst []float32) {
		_ = dst[kc*rows-1]
		if transA {
			gemmPackC512(kc, rows, &a[p0*lda+i0], lda, &dst[0], rows)
			return
		}
		gemmPackT512(rows, kc, &a[i0*lda+p0], lda, &dst[0], rows, 1<<rows-1)
	},
	packB: func(transB bool, b []float32, ldb, j0, cols, p0, kc int, dst []float32) {
		const nr = gemmNR512
		_ = dst[kc*nr-1]
		if !transB {
			gemmPackC512(kc, cols, &b[p0*ldb+j0], ldb, &dst[0], nr)
			return
		}
		src := &b[j0*ldb+p0]
		gemmPackT512(min(cols, 16), kc, src, ldb, &dst[0], nr, 0xffff)
		if cols > 16 {
			src = &b[(j0+16)*ldb+p0]
		}
		gemmPackT512(max(cols-16, 0), kc, src, ldb, &dst[16], nr, 0xffff)
	},
}

// gemmAVX2 is the AVX2+FMA path: 6×16 tiles, Go packing.
var gemmAVX2 = &gemmArch{
	name:    "avx2",
	mr:      gemmMR256,
	nr:      gemmNR256,
	micro:   gemmKerns256[:],
	wide:    gemmWide256[:],
	strided: gemmKern256x6s,
	packA:   gemmPackAGo,
	packB: func(transB bool, b []float32, ldb, j0, cols, p0, kc int, dst []float32) {
		gemmPackBGo(transB, b, ldb, j0, cols, p0, kc, gemmNR256, dst)
	},
}
