//go:build !amd64

package kernels

func adamwAVX512(p, grad, m, v *float32, n int, c *[9]float32) {
	panic("kernels: AVX-512 kernel called on a non-amd64 build")
}

func sumSquaresAVX512(x *float32, n int) float64 {
	panic("kernels: AVX-512 kernel called on a non-amd64 build")
}
