package kernels

import "unsafe"

// Tile shape of the portable path.
const (
	gemmMRGo = 4
	gemmNRGo = 8
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
