//go:build !amd64

package kernels

import "unsafe"

// Off amd64 useAVX512 and useAVX2 are always false, so the dispatchers in
// rows.go never reach these; they exist so rows.go compiles everywhere, and
// they fall back to the portable code should anything call them.

func sl(p *float32, n int) []float32 { return unsafe.Slice(p, n) }

func dotAVX512(a, b *float32, n int) float32 { return dotGo(sl(a, n), sl(b, n)) }
func dotRowsAVX512(dst, q, k *float32, n, d, stride int, scale float32) {
	dotRowsGo(sl(dst, n), sl(q, d), sl(k, (n-1)*stride+d), n, stride, scale)
}
func axpyAVX512(alpha float32, x, y *float32, n int) { axpyGo(alpha, sl(x, n), sl(y, n)) }
func axpyRowsAVX512(out, p, v *float32, n, d, stride int) {
	axpyRowsGo(sl(out, d), sl(p, n), sl(v, (n-1)*stride+d), n, stride)
}
func maxAVX512(x *float32, n int) float32 { return maxGo(sl(x, n)) }
func expSumAVX512(dst, x *float32, n int, shift float32) float64 {
	var d []float32
	if dst != nil {
		d = sl(dst, n)
	}
	return expSumGo(d, sl(x, n), shift)
}
func scaleAVX512(dst, x *float32, n int, c float32) { scaleGo(sl(dst, n), sl(x, n), c) }
func addAVX512(dst, x *float32, n int, c float32)   { addGo(sl(dst, n), sl(x, n), c) }
func rmsApplyAVX512(dst, x, w *float32, n int, inv float32) {
	rmsApplyGo(sl(dst, n), sl(x, n), sl(w, n), inv)
}
func swigluAVX512(dst, gate, up *float32, n int) { swigluGo(sl(dst, n), sl(gate, n), sl(up, n)) }
func swigluBackAVX512(dgate, dup, gate, up, dy *float32, n int) {
	swigluBackGo(sl(dgate, n), sl(dup, n), sl(gate, n), sl(up, n), sl(dy, n))
}
func ropeAVX512(x, cos, sin *float32, h, heads int) {
	ropeGo(sl(x, 2*h*heads), heads, sl(cos, h), sl(sin, h))
}
func rmsBackDotAVX512(dy, w, x *float32, n int) float64 {
	return rmsBackDotGo(sl(dy, n), sl(w, n), sl(x, n))
}
func rmsBackApplyAVX512(dx, dw, dy, x, w *float32, n int, inv, c float32) {
	panic("kernels: AVX-512 kernel called on a non-amd64 build")
}

func dotAVX2(a, b *float32, n int) float32 { return dotAVX512(a, b, n) }
func dotRowsAVX2(dst, q, k *float32, n, d, stride int, scale float32) {
	dotRowsAVX512(dst, q, k, n, d, stride, scale)
}
func axpyAVX2(alpha float32, x, y *float32, n int)      { axpyAVX512(alpha, x, y, n) }
func axpyRowsAVX2(out, p, v *float32, n, d, stride int) { axpyRowsAVX512(out, p, v, n, d, stride) }
func maxAVX2(x *float32, n int) float32                 { return maxAVX512(x, n) }
func expSumAVX2(dst, x *float32, n int, shift float32) float64 {
	return expSumAVX512(dst, x, n, shift)
}
func scaleAVX2(dst, x *float32, n int, c float32) { scaleAVX512(dst, x, n, c) }
func addAVX2(dst, x *float32, n int, c float32)   { addAVX512(dst, x, n, c) }
func rmsApplyAVX2(dst, x, w *float32, n int, inv float32) {
	rmsApplyAVX512(dst, x, w, n, inv)
}
func swigluAVX2(dst, gate, up *float32, n int) { swigluAVX512(dst, gate, up, n) }
