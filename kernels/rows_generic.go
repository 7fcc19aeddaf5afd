package kernels

import "math"

// Portable row kernels: the paths used when the CPU has neither AVX-512 nor
// AVX2+FMA (and on other architectures). Products are wrapped in explicit
// float32 conversions so the compiler never fuses them into FMAs: a fused
// and an unfused copy of the same function inlined at two call sites could
// otherwise round differently.

func dotGo(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		s0 += float32(a[i] * b[i])
		s1 += float32(a[i+1] * b[i+1])
		s2 += float32(a[i+2] * b[i+2])
		s3 += float32(a[i+3] * b[i+3])
	}
	for ; i < n; i++ {
		s0 += float32(a[i] * b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func axpyGo(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += float32(alpha * v)
	}
}

func dotRowsGo(dst, q, k []float32, n, stride int, scale float32) {
	d := len(q)
	for j := 0; j < n; j++ {
		dst[j] = scale * dotGo(q, k[j*stride:j*stride+d])
	}
}

func axpyRowsGo(out, p, v []float32, n, stride int) {
	d := len(out)
	for j := 0; j < n; j++ {
		axpyGo(p[j], v[j*stride:j*stride+d], out)
	}
}

func maxGo(x []float32) float32 {
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	return mx
}

func expGo(x float32) float32 {
	return float32(math.Exp(float64(x)))
}

func expSumGo(dst, x []float32, shift float32) float64 {
	var s float64
	if dst == nil {
		for _, v := range x {
			s += float64(expGo(v - shift))
		}
		return s
	}
	dst = dst[:len(x)]
	for i, v := range x {
		e := expGo(v - shift)
		dst[i] = e
		s += float64(e)
	}
	return s
}

func scaleGo(dst, x []float32, c float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = v * c
	}
}

func addGo(dst, x []float32, c float32) {
	dst = dst[:len(x)]
	for i, v := range x {
		dst[i] = v + c
	}
}

func rmsApplyGo(dst, x, w []float32, inv float32) {
	dst = dst[:len(x)]
	w = w[:len(x)]
	for i, v := range x {
		dst[i] = float32(v*inv) * w[i]
	}
}

func swigluGo(dst, gate, up []float32) {
	gate = gate[:len(dst)]
	up = up[:len(dst)]
	for i, g := range gate {
		dst[i] = SiLU(g) * up[i]
	}
}
