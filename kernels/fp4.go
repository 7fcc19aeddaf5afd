package kernels

import "math"

// E2M1Max is the largest float4 e2m1 magnitude.
const E2M1Max = 6

// NVFP4Block is the number of consecutive inputs that share one block
// scale in PackNVFP4, as in NVIDIA's NVFP4 format.
const NVFP4Block = 16

// RoundE2M1 rounds x to the nearest float4 e2m1 value (±{0, 0.5, 1, 1.5,
// 2, 3, 4, 6}), ties to the even code (the one whose mantissa bit is 0),
// saturating beyond ±6. NaN stays NaN; the sign of zero is kept.
func RoundE2M1(x float32) float32 {
	if x != x {
		return x
	}
	a := math.Abs(float64(x))
	var q float64
	switch {
	case a <= 0.25: // tie at 0.25 goes to 0 (code 000, even)
		q = 0
	case a < 0.75: // tie at 0.75 goes to 1 (code 010, even)
		q = 0.5
	case a <= 1.25:
		q = 1
	case a < 1.75:
		q = 1.5
	case a <= 2.5:
		q = 2
	case a < 3.5:
		q = 3
	case a <= 5:
		q = 4
	default:
		q = 6
	}
	return float32(math.Copysign(q, float64(x)))
}

// PackNVFP4 replaces p's contents with the n×k float32 matrix b (row
// stride ldb) quantised NVFP4-style, the fp4 rollout mode's weights: each
// block of NVFP4Block consecutive inputs of an output channel has an e4m3
// scale and e2m1 values, and each output channel a power-of-two scale
// (the role of NVFP4's per-tensor float32 scale, per channel here) that
// brings its block scales into e4m3's range. The stored value of w is
// RoundE2M1(w/(bs·s))·bs, which bfloat16 holds exactly (at most six
// significant bits), and the GEMM's epilogue multiplies by s, so the
// operand is exactly RoundE2M1(w/(bs·s))·bs·s. Non-finite weights give a
// non-finite channel scale, so the problem shows in the output.
func (p *PackedBF16B) PackNVFP4(b []float32, n, k, ldb int) {
	checkMatrix("PackNVFP4", "b", len(b), n, k, ldb)
	p.reset(n, k, true)
	if k == 0 {
		return
	}
	row := make([]BF16, k)
	for j := range n {
		src := b[j*ldb : j*ldb+k]
		p.scale[j] = nvfp4Row(row, src)
		p.packRow(j, row)
	}
}

// FakeQuantNVFP4Rows replaces each row of the rows×cols matrix x (row
// stride ld) by the values PackNVFP4 makes of it, in float32: exactly the
// operand values the fp4 GEMM multiplies.
func FakeQuantNVFP4Rows(x []float32, rows, cols, ld int) {
	checkMatrix("FakeQuantNVFP4Rows", "x", len(x), rows, cols, ld)
	q := make([]BF16, cols)
	for r := range rows {
		row := x[r*ld : r*ld+cols]
		s := nvfp4Row(q, row)
		for i := range row {
			row[i] = math.Float32frombits(uint32(q[i])<<16) * s
		}
	}
}

// nvfp4Row quantises row into out (bfloat16 values RoundE2M1(w/(bs·s))·bs)
// and returns the channel scale s, a power of two (1 for an all-zero row,
// NaN for a row holding a non-finite value).
func nvfp4Row(out []BF16, row []float32) float32 {
	var mx float64
	for _, v := range row {
		a := math.Abs(float64(v))
		if a != a || math.IsInf(a, 0) {
			clear(out[:len(row)])
			return float32(math.NaN())
		}
		mx = max(mx, a)
	}
	if mx == 0 {
		clear(out[:len(row)])
		return 1
	}
	// The largest block scale, mx/6, maps to at most e4m3's 448.
	s := float32(math.Exp2(math.Ceil(math.Log2(mx / (E2M1Max * E4M3Max)))))
	for lo := 0; lo < len(row); lo += NVFP4Block {
		blk := row[lo:min(lo+NVFP4Block, len(row))]
		var bm float32
		for _, v := range blk {
			bm = max(bm, float32(math.Abs(float64(v))))
		}
		bs := RoundE4M3(bm / E2M1Max / s)
		for i, v := range blk {
			q := float32(0)
			if bs != 0 {
				q = RoundE2M1(v/(bs*s)) * bs
			}
			out[lo+i] = bf16FromBits(math.Float32bits(q))
		}
	}
	return s
}
