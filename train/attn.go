package train

import "github.com/keel-rl/keel/kernels"

// attnDims are the attention shapes of one model.
type attnDims struct {
	heads, kv, hd int
	qd, kvd       int
	group         int     // query heads per kv head
	scale         float32 // head_dim^-0.5
}

func newAttnDims(heads, kv, hd int) attnDims {
	return attnDims{
		heads: heads, kv: kv, hd: hd,
		qd: heads * hd, kvd: kv * hd,
		group: heads / kv,
		scale: kernels.AttentionScale(hd),
	}
}

// headNormRope applies the per-head RMSNorm (q_norm or k_norm) and RoPE to
// T rows of nh heads: out = RoPE(RMSNorm(raw_head)), saving the inverse RMS
// of every head row in inv. Token t's heads start at raw[t·rawStride]; out
// is [T, nh·hd].
func headNormRope(out, raw, inv, w []float32, T, nh, hd, rawStride int, pos []int32, cos, sin []float32, eps float32) {
	half := hd / 2
	kernels.ParallelFor(T, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			p := int(pos[t])
			c, s := cos[p*half:(p+1)*half], sin[p*half:(p+1)*half]
			kernels.NormRopeHeads(out[t*nh*hd:], raw[t*rawStride:], nh, w, c, s, eps, inv[t*nh:])
		}
	})
}

// ropeBack rotates gradient rows back in place (the transpose of RoPE is
// RoPE with negated sines). Token t's heads start at d[t·stride].
func ropeBack(d []float32, T, nh, hd, stride int, pos []int32, cos, negSin []float32) {
	half := hd / 2
	kernels.ParallelFor(T, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			p := int(pos[t])
			c, s := cos[p*half:(p+1)*half], negSin[p*half:(p+1)*half]
			kernels.RoPEHeads(d[t*stride:], nh, c, s)
		}
	})
}

// attnForward computes causal grouped-query attention for every sequence
// and head with kernels.AttendCausal, whose every output row is bit for bit
// kernels.AttendRow over that row's prefix, so each row depends only on its
// own sequence's prefix (the rollout engine's decode step computes the same
// AttendRow call with its KV cache).
func attnForward(att, q, k, v []float32, d attnDims, starts, lens []int, maxLen int, pool *scratchPool) {
	items := len(starts) * d.heads
	kernels.ParallelFor(items, func(lo, hi int) {
		probs := pool.get(4 * maxLen)
		defer pool.put(probs)
		for it := lo; it < hi; it++ {
			s, h := it/d.heads, it%d.heads
			st, n := starts[s], lens[s]
			kvo := st*d.kvd + (h/d.group)*d.hd
			o := st*d.qd + h*d.hd
			kernels.AttendCausal(att[o:], q[o:], k[kvo:], v[kvo:], n, d.hd, d.qd, d.qd, d.kvd, d.scale, probs, 0)
		}
	})
}

// attnBlock is the number of query rows the attention backward handles with
// one set of GEMMs.
const attnBlock = 64

// attnBackward computes the gradients dq, dk, dv (all written, not added,
// each with token row stride ds) of causal GQA attention from datt, the
// gradient of its output. Per block
// of query rows of one head it recomputes the probabilities with a GEMM
// (they may differ from the forward's in the last bit, which only perturbs
// the gradient by rounding) and then computes
//
//	P = softmax(scale·Q·Kᵀ), dP = dO·Vᵀ, D_i = Σ_j P_ij·dP_ij, dS = P∘(dP - D)·scale,
//	dQ = dS·K, dK += dSᵀ·Q, dV += Pᵀ·dO.
//
// Work is split by (sequence, kv head); within one item the query heads
// and blocks run in a fixed order, so dk and dv are deterministic.
func attnBackward(dq, dk, dv []float32, ds int, datt, q, k, v []float32, d attnDims, starts, lens []int, pool *scratchPool) {
	items := len(starts) * d.kv
	kernels.ParallelFor(items, func(lo, hi int) {
		for it := lo; it < hi; it++ {
			s, kh := it/d.kv, it%d.kv
			st, n := starts[s], lens[s]
			kvo := st*d.kvd + kh*d.hd
			dko := st*ds + kh*d.hd
			for i := 0; i < n; i++ {
				clear(dk[dko+i*ds : dko+i*ds+d.hd])
				clear(dv[dko+i*ds : dko+i*ds+d.hd])
			}
			bq := min(attnBlock, n)
			p := pool.get(bq * n)
			dp := pool.get(bq * n)
			for h := kh * d.group; h < (kh+1)*d.group; h++ {
				for i0 := 0; i0 < n; i0 += attnBlock {
					i1 := min(n, i0+attnBlock)
					rows, nk := i1-i0, i1
					qo := (st+i0)*d.qd + h*d.hd
					// Scores of the block's rows against keys 0..nk-1, then
					// the causal softmax of each row.
					kernels.Gemm(false, true, rows, nk, d.hd, q[qo:], d.qd, k[kvo:], d.kvd, p, nk, false)
					for r := 0; r < rows; r++ {
						n1 := i0 + r + 1
						pr := p[r*nk : r*nk+n1]
						kernels.Scale(pr, pr, d.scale)
						kernels.Softmax(pr, pr)
						clear(p[r*nk+n1 : (r+1)*nk])
					}
					// dP = dO·Vᵀ over the block's keys 0..nk-1.
					kernels.Gemm(false, true, rows, nk, d.hd, datt[qo:], d.qd, v[kvo:], d.kvd, dp, nk, false)
					for r := 0; r < rows; r++ {
						n1 := i0 + r + 1
						pr, dpr := p[r*nk:r*nk+n1], dp[r*nk:r*nk+n1]
						kernels.SoftmaxBackward(dpr, pr, dpr)
						kernels.Scale(dpr, dpr, d.scale)
						clear(dp[r*nk+n1 : (r+1)*nk])
					}
					dqo := (st+i0)*ds + h*d.hd
					kernels.Gemm(false, false, rows, d.hd, nk, dp, nk, k[kvo:], d.kvd, dq[dqo:], ds, false)
					kernels.Gemm(true, false, nk, d.hd, rows, dp, nk, q[qo:], d.qd, dk[dko:], ds, true)
					kernels.Gemm(true, false, nk, d.hd, rows, p, nk, datt[qo:], d.qd, dv[dko:], ds, true)
				}
			}
			pool.put(p)
			pool.put(dp)
		}
	})
}
