package rollout

import (
	"github.com/keel-rl/keel/kernels"
)

// The bf16 and fp8 modes keep the KV cache in bfloat16, as inference
// engines serving a bf16 model do: keys and values are rounded once when
// written, halving the bytes every decode step streams (attention over
// the cache is bound by memory bandwidth, not arithmetic). Attention is
// then the engine's own kernel, float32 arithmetic on the widened values:
//
//	s_j = scale · Σ_i q_i·K_j,i   (sixteen lanes i mod 16, each an FMA
//	                                chain, then added pairwise)
//	p   = kernels.Softmax(s)
//	o_i = Σ_j p_j·V_j,i            (four interleaved chains, j mod 4, added
//	                                 pairwise at the end)
//
// Keys and values are stored position-major ([slot][pos][kv heads·d]), so
// writing a position touches a few cache lines. The order of every sum
// depends only on d and n, never on the slot, the step or the thread, so
// the engine's reproducibility holds.

// bf16Cache is one layer's bfloat16 KV cache.
type bf16Cache struct {
	k, v []kernels.BF16 // [slot][pos][kv heads·d]
}

// dotRowsBF16 writes s[j] = scale·(q · k[j·ld : j·ld+len(q)]) for j < n.
func dotRowsBF16(s, q []float32, k []kernels.BF16, n, ld int, scale float32) {
	d := len(q)
	if n <= 0 {
		return
	}
	s = s[:n]
	_ = k[(n-1)*ld+d-1]
	if useBF16Asm && d%16 == 0 && d > 0 {
		dotRowsBF16AVX512(&s[0], &q[0], &k[0], n, d, ld, scale)
		return
	}
	dotRowsBF16Go(s, q, k, n, ld, scale)
}

func dotRowsBF16Go(s, q []float32, k []kernels.BF16, n, ld int, scale float32) {
	d := len(q)
	for j := range s[:n] {
		row := k[j*ld : j*ld+d]
		var lane [16]float32
		for i, qi := range q {
			lane[i%16] += qi * row[i].Float32()
		}
		for w := 8; w >= 1; w /= 2 {
			for l := 0; l < w; l++ {
				lane[l] += lane[l+w]
			}
		}
		s[j] = lane[0] * scale
	}
}

// axpyRowsBF16 adds Σ_j p[j]·v[j·ld : j·ld+len(out)] to out, j < n.
func axpyRowsBF16(out, p []float32, v []kernels.BF16, n, ld int) {
	d := len(out)
	if n <= 0 || d == 0 {
		return
	}
	p = p[:n]
	_ = v[(n-1)*ld+d-1]
	if useBF16Asm && d%16 == 0 {
		axpyRowsBF16AVX512(&out[0], &p[0], &v[0], n, d, ld)
		return
	}
	axpyRowsBF16Go(out, p, v, n, ld)
}

func axpyRowsBF16Go(out, p []float32, v []kernels.BF16, n, ld int) {
	for i := range out {
		var acc [4]float32
		for j := 0; j < n; j++ {
			acc[j%4] += p[j] * v[j*ld+i].Float32()
		}
		out[i] += (acc[0] + acc[1]) + (acc[2] + acc[3])
	}
}
