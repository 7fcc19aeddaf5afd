package kernels

import (
	"fmt"
	"math"
)

// E4M3Max is the largest finite float8 e4m3 value (S.1111.110 = 1.75·2⁸).
// Quantisation scales map each row's largest magnitude onto it.
const E4M3Max = 448

// E4M3 is a float8 number in the OCP "E4M3FN" format that PyTorch calls
// float8_e4m3fn and FP8 rollouts use: 1 sign bit, 4 exponent bits with bias
// 7, 3 mantissa bits, subnormals (exponent field 0, step 2⁻⁹), no
// infinities, and NaN only as S.1111.111. Its largest finite value is 448.
type E4M3 uint8

// Float32 decodes e (exact: every e4m3 value is a float32, and a bfloat16).
func (e E4M3) Float32() float32 {
	exp := int(e>>3) & 15
	man := int(e) & 7
	var v float32
	switch {
	case exp == 15 && man == 7:
		v = float32(math.NaN())
	case exp == 0:
		v = float32(man) / 512 // man · 2⁻³ · 2⁻⁶
	default:
		v = float32(math.Ldexp(float64(8+man), exp-7-3))
	}
	if e&0x80 != 0 {
		v = -v
	}
	return v
}

// E4M3FromFloat32 encodes RoundE4M3(x): round to nearest, ties to even,
// saturating at ±448; NaN gives the NaN code with x's sign.
func E4M3FromFloat32(x float32) E4M3 {
	r := RoundE4M3(x)
	var s E4M3
	if math.Float32bits(r)>>31 != 0 {
		s = 0x80
	}
	if r != r {
		return s | 0x7f
	}
	a := math.Abs(float64(r))
	if a < 1.0/64 { // subnormal or zero: a = man · 2⁻⁹
		return s | E4M3(a*512)
	}
	frac, exp := math.Frexp(a) // a = frac · 2^exp, frac in [0.5, 1)
	man := int(frac*16) - 8    // 3 mantissa bits below the leading one
	return s | E4M3((exp-1+7)<<3|man)
}

// RoundE4M3 rounds x to the nearest float8 e4m3 value, ties to even, and
// returns it as a float32.
//
// Magnitudes beyond 448 (±Inf included) saturate to ±448 instead of
// becoming NaN: this is what scaled FP8 quantisation does in practice
// (clamp to ±448, then cast, as in Transformer Engine and vLLM), and with
// the per-row scales of QuantizeE4M3Rows a value only exceeds 448 by the
// rounding of absmax/scale. NaN stays NaN; the sign of zero is kept.
func RoundE4M3(x float32) float32 {
	u := math.Float32bits(x)
	sign, a := u&0x80000000, u&0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return x
	case a >= 0x43e00000: // |x| ≥ 448 (1.75·2⁸), Inf included: saturate
		a = 0x43e00000
	case a < 0x3c800000: // |x| < 2⁻⁶: subnormal e4m3, a multiple of 2⁻⁹
		// In [2¹⁴, 2¹⁵) float32's step is 2⁻⁹, so adding 2¹⁴ rounds to
		// nearest even at exactly the e4m3 subnormal step.
		f := float32(math.Float32frombits(a) + 0x1p14)
		a = math.Float32bits(f - 0x1p14)
	default:
		// Normal: keep 3 of float32's 23 mantissa bits, to nearest even; a
		// carry into the exponent is right, and cannot pass 448 here.
		a += 0x7ffff + (a>>20)&1
		a &^= 0xfffff
	}
	return math.Float32frombits(sign | a)
}

// QuantizeE4M3Rows quantises each row of the rows×cols matrix src (row
// stride ld) to float8 e4m3 with one float32 scale per row: scale[r] =
// max|src[r,:]| / 448 and dst[r*cols+c] = RoundE4M3(src[r,c] / scale[r]),
// stored as BF16, which holds every e4m3 value exactly. Rows are output
// channels for a weight matrix [out,in] and tokens for activations [tokens,
// features], the two granularities of the fp8 rollout mode; the bf16 GEMM
// applies the scales in its epilogue. An all-zero row gets scale 0 and zero
// values; a row containing NaN or ±Inf gets a non-finite scale, so the
// problem shows up in the output instead of being hidden. It panics if the
// slices are too short for the shape (a programming error).
func QuantizeE4M3Rows(dst []BF16, scale []float32, src []float32, rows, cols, ld int) {
	checkMatrix("QuantizeE4M3Rows", "src", len(src), rows, cols, ld)
	if len(dst) < rows*cols || len(scale) < rows {
		panic(fmt.Sprintf("kernels: QuantizeE4M3Rows: need %d dst and %d scale elements, have %d and %d", rows*cols, rows, len(dst), len(scale)))
	}
	for r := range rows {
		row := src[r*ld : r*ld+cols]
		s := e4m3RowScale(row)
		scale[r] = s
		quantizeE4M3Row(dst[r*cols:(r+1)*cols], row, s)
	}
}

// FakeQuantE4M3Rows replaces each row of the rows×cols matrix x (row stride
// ld) by its e4m3 quantisation times its scale, in float32: exactly the
// operand values the fp8 GEMM multiplies. References and the training
// engine's comparisons use it.
func FakeQuantE4M3Rows(x []float32, rows, cols, ld int) {
	checkMatrix("FakeQuantE4M3Rows", "x", len(x), rows, cols, ld)
	for r := range rows {
		row := x[r*ld : r*ld+cols]
		s := e4m3RowScale(row)
		for i, v := range row {
			q := float32(0)
			if s != 0 {
				q = RoundE4M3(v / s)
			}
			row[i] = q * s
		}
	}
}

// e4m3RowScale is max|row|/448, NaN if the row holds a NaN. The maximum
// is taken over the magnitudes' bit patterns, which order like the values
// and put NaN above everything.
func e4m3RowScale(row []float32) float32 {
	mx, done := absMaxBitsFast(row)
	for _, v := range row[done:] {
		mx = max(mx, math.Float32bits(v)&0x7fffffff)
	}
	return math.Float32frombits(mx) / E4M3Max
}

// quantizeE4M3Row writes RoundE4M3(row[i]/s) as BF16 (exact; a NaN stays
// a NaN), zeros when s is 0.
func quantizeE4M3Row(out []BF16, row []float32, s float32) {
	if s == 0 {
		clear(out[:len(row)])
		return
	}
	done := quantE4M3Fast(out, row, s)
	for i := done; i < len(row); i++ {
		out[i] = bf16FromBits(math.Float32bits(RoundE4M3(row[i] / s)))
	}
}
