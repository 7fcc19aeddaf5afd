package safetensors

import "math"

// BF16FromFloat32 rounds f to the nearest bfloat16, ties to even, as PyTorch
// does when it casts float32 to bfloat16. NaN stays NaN (quiet, sign kept);
// values beyond the bfloat16 range round to ±Inf as IEEE rounding requires.
func BF16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: truncating could turn it into Inf
		return uint16(b>>16) | 0x0040
	}
	// Add 0x7fff plus the lowest kept bit: rounds half to even, and a carry
	// out of the mantissa correctly bumps the exponent (up to Inf).
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// Float32FromBF16 widens a bfloat16 to float32; it is exact.
func Float32FromBF16(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Float32FromF16 widens an IEEE 754 half-precision value to float32; it is
// exact for every input, subnormals, infinities and NaN included.
func Float32FromF16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf or NaN: keep the payload
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0: // normal: rebias 15 -> 127
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0: // ±0
		return math.Float32frombits(sign)
	}
	// Subnormal half: man·2^-24. Normalise it into a float32 normal.
	e := uint32(113) // biased float32 exponent of 2^-14
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}
