package train

import (
	"math"
	"math/rand/v2"
	"testing"
)

// CombineExperts gives, bit for bit, the scalar definition: acc = g0·y0,
// acc = fma(gs, ys, acc) for the later slots in order, out = h + acc;
// with out separate from h and aliasing it, for widths around the vector
// sizes and for k = 0.
func TestCombineExpertsMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 16, 33, 128, 130} {
		for k := 0; k <= 4; k++ {
			h := make([]float32, n)
			for i := range h {
				h[i] = float32(r.NormFloat64())
			}
			gates := make([]float32, k)
			ys := make([][]float32, k)
			for s := range ys {
				gates[s] = float32(r.Float64())
				ys[s] = make([]float32, n)
				for i := range ys[s] {
					ys[s][i] = float32(r.NormFloat64() * 10)
				}
			}
			want := make([]float32, n)
			for i := range want {
				var acc float32
				for s := range ys {
					if s == 0 {
						acc = gates[0] * ys[0][i]
					} else {
						acc = float32(math.FMA(float64(gates[s]), float64(ys[s][i]), float64(acc)))
					}
				}
				want[i] = h[i] + acc
			}
			out, acc := make([]float32, n), make([]float32, n)
			CombineExperts(out, h, acc, gates, ys)
			hh := append([]float32(nil), h...)
			CombineExperts(hh, hh, acc, gates, ys) // out aliasing h
			for i := range want {
				if math.Float32bits(out[i]) != math.Float32bits(want[i]) || math.Float32bits(hh[i]) != math.Float32bits(want[i]) {
					t.Fatalf("n=%d k=%d: element %d = %v / %v (aliased), want %v", n, k, i, out[i], hh[i], want[i])
				}
			}
		}
	}
}
