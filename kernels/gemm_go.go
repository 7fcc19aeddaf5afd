package kernels

import "unsafe"

// Tile shape of the portable path.
const (
	gemmMRGo = 4
	gemmNRGo = 4
)

// gemmMicrosGo returns the portable micro-kernels, one per row count.
func gemmMicrosGo() []gemmMicro {
	ms := make([]gemmMicro, gemmMRGo+1)
	for r := 1; r <= gemmMRGo; r++ {
		ms[r] = func(k int, a, b, c *float32, ldc, flags int) {
			gemmKernGo(r, k, a, b, c, ldc, flags)
		}
	}
	return ms
}

// gemmKernGo is the portable micro-kernel for a rows×gemmNRGo tile. Each
// product is rounded before it is added (the float32 conversion forbids the
// compiler from fusing it into an FMA on some architectures and not others),
// so every element sees the same arithmetic whatever tile it is in.
func gemmKernGo(rows, k int, a, b, c *float32, ldc, flags int) {
	const nr = gemmNRGo
	as := unsafe.Slice(a, rows*k)
	bs := unsafe.Slice(b, nr*k)
	cs := unsafe.Slice(c, (rows-1)*ldc+nr)
	var acc [gemmMRGo][nr]float32
	if rows == gemmMRGo {
		gemmKernGo4x4(k, as, bs, &acc)
	} else {
		gemmKernGoRows(rows, k, as, bs, &acc)
	}
	for i := 0; i < rows; i++ {
		dst := cs[i*ldc : i*ldc+nr]
		if flags == 0 {
			copy(dst, acc[i][:])
		} else {
			for j := range dst {
				dst[j] += acc[i][j]
			}
		}
	}
}

// gemmKernGo4x4 is the full portable tile with its accumulators in locals,
// which the compiler keeps in registers where the architecture has enough.
// The arithmetic per element is exactly gemmKernGoRows's.
func gemmKernGo4x4(k int, as, bs []float32, acc *[gemmMRGo][gemmNRGo]float32) {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	as, bs = as[:4*k], bs[:4*k]
	for p := 0; p < k; p++ {
		a := (*[4]float32)(as[4*p:])
		b := (*[4]float32)(bs[4*p:])
		a0, a1, a2, a3 := a[0], a[1], a[2], a[3]
		b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
		c00, c01, c02, c03 = c00+float32(a0*b0), c01+float32(a0*b1), c02+float32(a0*b2), c03+float32(a0*b3)
		c10, c11, c12, c13 = c10+float32(a1*b0), c11+float32(a1*b1), c12+float32(a1*b2), c13+float32(a1*b3)
		c20, c21, c22, c23 = c20+float32(a2*b0), c21+float32(a2*b1), c22+float32(a2*b2), c23+float32(a2*b3)
		c30, c31, c32, c33 = c30+float32(a3*b0), c31+float32(a3*b1), c32+float32(a3*b2), c33+float32(a3*b3)
	}
	*acc = [4][4]float32{{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}}
}

// gemmKernGoRows handles tiles of fewer than gemmMRGo rows.
func gemmKernGoRows(rows, k int, as, bs []float32, acc *[gemmMRGo][gemmNRGo]float32) {
	const nr = gemmNRGo
	for p := 0; p < k; p++ {
		bp := (*[nr]float32)(bs[p*nr : p*nr+nr])
		ap := as[p*rows : p*rows+rows]
		for i, av := range ap {
			r := &acc[i]
			for j := range r {
				r[j] = r[j] + float32(av*bp[j])
			}
		}
	}
}

// gemmPackAGo writes rows [i0, i0+rows) × cols [p0, p0+kc) of op(A) to dst
// as kc groups of rows floats.
func gemmPackAGo(transA bool, a []float32, lda, i0, rows, p0, kc int, dst []float32) {
	dst = dst[:kc*rows]
	if transA {
		for p := 0; p < kc; p++ {
			copy(dst[p*rows:p*rows+rows], a[(p0+p)*lda+i0:])
		}
		return
	}
	for i := 0; i < rows; i++ {
		src := a[(i0+i)*lda+p0 : (i0+i)*lda+p0+kc]
		for p, v := range src {
			dst[p*rows+i] = v
		}
	}
}

// gemmPackBGo writes rows [p0, p0+kc) × cols [j0, j0+cols) of op(B) to dst
// as kc groups of nr floats, zero-filling columns cols .. nr-1.
func gemmPackBGo(transB bool, b []float32, ldb, j0, cols, p0, kc, nr int, dst []float32) {
	dst = dst[:kc*nr]
	if cols < nr {
		clear(dst)
	}
	if !transB {
		for p := 0; p < kc; p++ {
			copy(dst[p*nr:p*nr+cols], b[(p0+p)*ldb+j0:])
		}
		return
	}
	for j := 0; j < cols; j++ {
		src := b[(j0+j)*ldb+p0 : (j0+j)*ldb+p0+kc]
		for p, v := range src {
			dst[p*nr+j] = v
		}
	}
}
