package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

var e2m1Values = []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// RoundE2M1 is the nearest e2m1 value, ties to the even code, saturating:
// checked against a search over the eight magnitudes on a fine grid that
// holds every tie.
func TestRoundE2M1(t *testing.T) {
	for i := -3000; i <= 3000; i++ {
		x := float64(i) / 400 // steps of 1/400 include every midpoint
		a := math.Abs(x)
		best, code := 0.0, 0
		for c, v := range e2m1Values {
			d, bd := math.Abs(a-v), math.Abs(a-best)
			if d < bd || d == bd && c%2 == 0 && code%2 == 1 {
				best, code = v, c
			}
		}
		want := math.Copysign(best, x)
		if got := RoundE2M1(float32(x)); float64(got) != want {
			t.Fatalf("RoundE2M1(%v) = %v, want %v", x, got, want)
		}
	}
	if got := RoundE2M1(float32(math.Inf(-1))); got != -6 {
		t.Errorf("RoundE2M1(-Inf) = %v", got)
	}
	if got := RoundE2M1(float32(math.NaN())); got == got {
		t.Errorf("RoundE2M1(NaN) = %v", got)
	}
}

// PackNVFP4's operands: every block's values are e2m1 multiples of one
// e4m3 scale times the channel's power-of-two scale; the largest magnitude
// of a block is represented within half an e2m1 step of the block scale;
// the packed GEMM (with fp8 activations, the fp4 mode's) equals a float64
// product of the fake-quantised operands.
func TestPackNVFP4(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	n, k := 7, 45 // a partial last block
	b := make([]float32, n*k)
	for i := range b {
		b[i] = float32(r.NormFloat64() * 0.05 * float64(1+i%k/16))
	}
	for i := range k {
		b[2*k+i] = 0 // an all-zero channel
	}
	q := append([]float32(nil), b...)
	FakeQuantNVFP4Rows(q, n, k, k)
	for j := range n {
		row, qrow := b[j*k:(j+1)*k], q[j*k:(j+1)*k]
		for lo := 0; lo < k; lo += NVFP4Block {
			hi := min(lo+NVFP4Block, k)
			var bm, qm float64
			for i := lo; i < hi; i++ {
				bm = max(bm, math.Abs(float64(row[i])))
				qm = max(qm, math.Abs(float64(qrow[i])))
			}
			if bm == 0 {
				if qm != 0 {
					t.Fatalf("row %d block %d: zeros quantised to %v", j, lo, qm)
				}
				continue
			}
			// The block's unit: qm/6 up to e4m3 rounding of the scale.
			if math.Abs(qm-bm) > 0.1*bm {
				t.Errorf("row %d block %d: max %v quantised to %v", j, lo, bm, qm)
			}
			unit := qm / 6 // the block scale times the channel scale
			for i := lo; i < hi; i++ {
				c := math.Abs(float64(qrow[i])) / unit
				if !isE2M1Value(c, 1e-6) {
					t.Fatalf("row %d col %d: %v is %v block units, not an e2m1 value", j, i, qrow[i], c)
				}
				if d := math.Abs(float64(row[i]) - float64(qrow[i])); d > 1.01*unit {
					t.Fatalf("row %d col %d: %v quantised to %v (unit %v)", j, i, row[i], qrow[i], unit)
				}
			}
		}
	}
	var p PackedBF16B
	p.PackNVFP4(b, n, k, k)
	m := 3
	a := make([]float32, m*k)
	for i := range a {
		a[i] = float32(r.NormFloat64())
	}
	c := make([]float32, m*n)
	GemmE4M3F32A(m, a, k, &p, c, n, false)
	FakeQuantE4M3Rows(a, m, k, k) // the operands the GEMM multiplies
	for i := range m {
		for j := range n {
			var want float64
			for l := range k {
				want += float64(a[i*k+l]) * float64(q[j*k+l])
			}
			if d := math.Abs(float64(c[i*n+j]) - want); d > 1e-4*(1+math.Abs(want)) {
				t.Errorf("C[%d,%d] = %v, want %v", i, j, c[i*n+j], want)
			}
		}
	}
}

func isE2M1Value(c, tol float64) bool {
	for _, v := range e2m1Values {
		if math.Abs(c-v) <= tol*max(1, v) {
			return true
		}
	}
	return false
}
