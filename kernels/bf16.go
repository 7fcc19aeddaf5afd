package kernels

import "math"

// BF16 is a bfloat16 number: the top 16 bits of an IEEE float32 (1 sign bit,
// 8 exponent bits, 7 mantissa bits). The bf16 precision mode rounds GEMM
// inputs to it; it keeps float32's range, so rounding never overflows except
// for values within half a bf16 step of float32's largest finite value.
type BF16 uint16

// BF16FromFloat32 rounds f to the nearest bfloat16, ties to even, as IEEE
// 754 rounding and PyTorch's .to(torch.bfloat16) do. Subnormals are kept
// (rounded, not flushed), values that round past the largest finite bf16
// become ±Inf, and NaN stays NaN (made quiet, sign and top payload bits
// kept).
func BF16FromFloat32(f float32) BF16 {
	return bf16FromBits(math.Float32bits(f))
}

func bf16FromBits(u uint32) BF16 {
	if u&0x7fffffff > 0x7f800000 { // NaN: keep it a (quiet) NaN
		return BF16(u>>16 | 0x0040)
	}
	// Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to
	// even; a carry out of the mantissa correctly bumps the exponent (and
	// turns the largest values into Inf).
	u += 0x7fff + (u>>16)&1
	return BF16(u >> 16)
}

// Float32 returns b as a float32; every bfloat16 is exactly a float32.
func (b BF16) Float32() float32 {
	return math.Float32frombits(uint32(b) << 16)
}

// ToBF16 rounds src to bfloat16 into dst (see BF16FromFloat32). dst must be
// at least as long as src.
func ToBF16(dst []BF16, src []float32) {
	if len(dst) < len(src) {
		panic("kernels: ToBF16: dst shorter than src")
	}
	dst = dst[:len(src)]
	done := toBF16Fast(dst, src)
	for i := done; i < len(src); i++ {
		dst[i] = bf16FromBits(math.Float32bits(src[i]))
	}
}

// FromBF16 widens src into dst (exact). dst must be at least as long as src.
func FromBF16(dst []float32, src []BF16) {
	if len(dst) < len(src) {
		panic("kernels: FromBF16: dst shorter than src")
	}
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = math.Float32frombits(uint32(b) << 16)
	}
}

// RoundBF16 rounds every element of x to the nearest bfloat16 in place, so
// float32 code (the training engine's bf16 compute mode, references in
// tests) sees exactly the values the bf16 kernels use.
func RoundBF16(x []float32) {
	for i, v := range x {
		x[i] = math.Float32frombits(uint32(bf16FromBits(math.Float32bits(v))) << 16)
	}
}
