//go:build !amd64

package kernels

// Without amd64 assembly the four-query kernels are plain loops over the
// portable DotRows and AxpyRows code. They are reached only where the CPU
// flags report AVX-512 on a non-amd64 build (GOARCH=386 on an x86 CPU).

func dotRowsQ4AVX512(dst *float32, dstStride int, q *float32, qStride int, k *float32, n, d, kStride int, scale float32) {
	ds, qs, ks := sl(dst, 3*dstStride+n), sl(q, 3*qStride+d), sl(k, (n-1)*kStride+d)
	for a := 0; a < 4; a++ {
		dotRowsGo(ds[a*dstStride:a*dstStride+n], qs[a*qStride:a*qStride+d], ks, n, kStride, scale)
	}
}

func axpyRowsQ4AVX512(out *float32, outStride int, p *float32, pStride int, v *float32, n, d, vStride int) {
	ov, ps, vs := sl(out, 3*outStride+d), sl(p, 3*pStride+n), sl(v, (n-1)*vStride+d)
	for a := 0; a < 4; a++ {
		axpyRowsGo(ov[a*outStride:a*outStride+d], ps[a*pStride:a*pStride+n], vs, n, vStride)
	}
}
