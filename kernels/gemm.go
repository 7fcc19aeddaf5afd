package kernels

// Gemm computes C = op(A)·op(B), or C += op(A)·op(B) when accumulate is set.
//
// All matrices are row-major. op(A) is m×k: A is stored m×k with row stride
// lda, or k×m (row stride lda) when transA is set. op(B) is k×n: B is stored
// k×n with row stride ldb, or n×k when transB is set. C is m×n with row
// stride ldc.
//
// The result is batch invariant and deterministic: each C element is the sum
// over k in a fixed order that depends only on k, whatever m, n and
// GOMAXPROCS are.
func Gemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	gemmRef(transA, transB, m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

// gemmRef is the plain triple loop: the reference the fast paths are tested
// against.
func gemmRef(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, accumulate bool) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				var av, bv float32
				if transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += av * bv
			}
			if accumulate {
				c[i*ldc+j] += s
			} else {
				c[i*ldc+j] = s
			}
		}
	}
}
