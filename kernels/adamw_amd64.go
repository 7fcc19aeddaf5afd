package kernels

//go:noescape
func adamwAVX512(p, grad, m, v *float32, n int, c *[9]float32)

//go:noescape
func sumSquaresAVX512(x *float32, n int) float64
