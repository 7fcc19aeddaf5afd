package kernels

import "math"

// AdamWStep holds the constants of one AdamW update, in float32 as the
// kernel uses them. The caller (train.AdamW) derives them from the learning
// rate, the step count and the clipping coefficient.
type AdamWStep struct {
	GradScale  float32 // multiplies every gradient first: the clipping coefficient, 1 for none
	Decay      float32 // multiplies every parameter first: 1 − lr·λ, or 1 where decay is off
	Beta1      float32 // β1
	OneMinusB1 float32 // 1 − β1, rounded once from float64 (not 1 − float32(β1))
	Beta2      float32 // β2
	OneMinusB2 float32 // 1 − β2, rounded once from float64
	StepSize   float32 // lr / (1 − β1^t)
	InvSqrtBC2 float32 // 1 / sqrt(1 − β2^t)
	Eps        float32 // ε, added to the bias-corrected sqrt(v)
}

// AdamW applies one AdamW update in place to the parameters p with
// gradients g and moments m and v (all of one length), element by element
// in float32, in the order of torch.optim.AdamW:
//
//	g' = g·GradScale;  p' = p·Decay
//	m  = β1·m + (1−β1)·g'          (one fused multiply-add)
//	v  = β2·v + (1−β2)·g'²         (one fused multiply-add)
//
// with 1−β1 and 1−β2 taken from OneMinusB1 and OneMinusB2,
//
//	p  = p' − StepSize · m / (sqrt(v)·InvSqrtBC2 + Eps)
//
// g is not modified. Every element is independent, so the result does not
// depend on how the caller splits the slices. On CPUs without AVX-512 the
// portable path computes the fused operations through float64, which can
// differ from a single float32 rounding in the last bit on rare inputs.
func AdamW(p, g, m, v []float32, s AdamWStep) {
	n := len(p)
	if len(g) != n || len(m) != n || len(v) != n {
		panic("kernels: AdamW slices differ in length")
	}
	if n == 0 {
		return
	}
	if useAVX512 {
		c := [9]float32{s.GradScale, s.Decay, s.Beta1, s.OneMinusB1, s.Beta2, s.OneMinusB2, s.StepSize, s.InvSqrtBC2, s.Eps}
		adamwAVX512(&p[0], &g[0], &m[0], &v[0], n, &c)
		return
	}
	adamwGo(p, g, m, v, s)
}

// fma32 is a float32 fused multiply-add computed through float64.
func fma32(a, b, c float32) float32 {
	return float32(math.FMA(float64(a), float64(b), float64(c)))
}

func adamwGo(p, g, m, v []float32, s AdamWStep) {
	c1, c2 := s.OneMinusB1, s.OneMinusB2
	for i := range p {
		gi := g[i] * s.GradScale
		pi := p[i] * s.Decay
		mi := fma32(gi, c1, m[i]*s.Beta1)
		gg := gi * gi
		vi := fma32(gg, c2, v[i]*s.Beta2)
		d := fma32(float32(math.Sqrt(float64(vi))), s.InvSqrtBC2, s.Eps)
		q := mi / d
		p[i] = fma32(-q, s.StepSize, pi)
		m[i], v[i] = mi, vi
	}
}

// SumSquares returns Σ x[i]² accumulated in float64 in an order fixed by
// len(x) alone (eight float64 lanes in four accumulators on AVX-512, then a
// fixed tree), so the value never depends on alignment or threading. It is
// the inner sum of the global gradient norm.
func SumSquares(x []float32) float64 {
	if len(x) == 0 {
		return 0
	}
	if useAVX512 {
		return sumSquaresAVX512(&x[0], len(x))
	}
	return sumSquaresGo(x)
}

// sumSquaresGo follows the AVX-512 order: 32-element blocks into four
// groups of eight lanes, leftover 8-element chunks (and the zero-padded
// last one) into the first group, then lanes summed as the assembly does.
func sumSquaresGo(x []float32) float64 {
	var acc [4][8]float64
	i := 0
	for ; i+32 <= len(x); i += 32 {
		for a := 0; a < 4; a++ {
			for l := 0; l < 8; l++ {
				v := float64(x[i+8*a+l])
				acc[a][l] = math.FMA(v, v, acc[a][l])
			}
		}
	}
	for ; i < len(x); i += 8 {
		for l := 0; l < 8 && i+l < len(x); l++ {
			v := float64(x[i+l])
			acc[0][l] = math.FMA(v, v, acc[0][l])
		}
	}
	var lane [8]float64
	for l := 0; l < 8; l++ {
		lane[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l])
	}
	for w := 4; w >= 1; w /= 2 {
		for l := 0; l < w; l++ {
			lane[l] += lane[l+w]
		}
	}
	return lane[0]
}
