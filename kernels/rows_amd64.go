package kernels

// Assembly row kernels (rows_avx512_amd64.s, rows_avx2_amd64.s). They take
// raw pointers and a length; the exported wrappers in rows.go check the
// slice lengths before calling them. Each walks its data in a pattern fixed
// by the length alone, so results never depend on alignment.

//go:noescape
func dotAVX512(a, b *float32, n int) float32

//go:noescape
func dotRowsAVX512(dst, q, k *float32, n, d, stride int, scale float32)

//go:noescape
func axpyAVX512(alpha float32, x, y *float32, n int)

//go:noescape
func axpyRowsAVX512(out, p, v *float32, n, d, stride int)

//go:noescape
func maxAVX512(x *float32, n int) float32

//go:noescape
func expSumAVX512(dst, x *float32, n int, shift float32) float64

//go:noescape
func scaleAVX512(dst, x *float32, n int, c float32)

//go:noescape
func addAVX512(dst, x *float32, n int, c float32)

//go:noescape
func rmsApplyAVX512(dst, x, w *float32, n int, inv float32)

//go:noescape
func swigluAVX512(dst, gate, up *float32, n int)

//go:noescape
func dotAVX2(a, b *float32, n int) float32

//go:noescape
func dotRowsAVX2(dst, q, k *float32, n, d, stride int, scale float32)

//go:noescape
func axpyAVX2(alpha float32, x, y *float32, n int)

//go:noescape
func axpyRowsAVX2(out, p, v *float32, n, d, stride int)

//go:noescape
func maxAVX2(x *float32, n int) float32

//go:noescape
func expSumAVX2(dst, x *float32, n int, shift float32) float64

//go:noescape
func scaleAVX2(dst, x *float32, n int, c float32)

//go:noescape
func addAVX2(dst, x *float32, n int, c float32)

//go:noescape
func rmsApplyAVX2(dst, x, w *float32, n int, inv float32)

//go:noescape
func swigluAVX2(dst, gate, up *float32, n int)

//go:noescape
func swigluBackAVX512(dgate, dup, gate, up, dy *float32, n int)

//go:noescape
func rmsBackDotAVX512(dy, w, x *float32, n int) float64

//go:noescape
func rmsBackApplyAVX512(dx, dw, dy, x, w *float32, n int, inv, c float32)

//go:noescape
func ropeAVX512(x, cos, sin *float32, h, heads int)
