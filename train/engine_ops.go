package train

import (
	"math"

	"github.com/keel-rl/keel/kernels"
)

// RopeTables returns the rotary-embedding tables of Hugging Face Qwen3 for
// positions 0..n-1: cos[p·hd/2+i] = cos(p·θ^(-2i/hd)) and likewise sin,
// computed in float64 and rounded to float32. The rollout engine must use
// the same tables to reproduce the training engine's bits.
func RopeTables(headDim int, theta float64, n int) (cos, sin []float32) {
	half := headDim / 2
	cos = make([]float32, n*half)
	sin = make([]float32, n*half)
	for i := 0; i < half; i++ {
		invFreq := math.Pow(theta, -float64(2*i)/float64(headDim))
		for p := 0; p < n; p++ {
			a := float64(p) * invFreq
			cos[p*half+i] = float32(math.Cos(a))
			sin[p*half+i] = float32(math.Sin(a))
		}
	}
	return cos, sin
}

// ropeCache keeps the RoPE tables for the longest sequence seen so far, and
// the negated sines the backward pass rotates with.
type ropeCache struct {
	hd            int
	theta         float64
	n             int
	cos, sin, neg []float32
}

func (r *ropeCache) ensure(hd int, theta float64, n int) {
	if r.hd == hd && r.theta == theta && r.n >= n {
		return
	}
	if r.hd == hd && r.theta == theta {
		n = max(n, 2*r.n) // grow geometrically
	}
	n = max(n, 64)
	r.hd, r.theta, r.n = hd, theta, n
	r.cos, r.sin = RopeTables(hd, theta, n)
	r.neg = make([]float32, len(r.sin))
	for i, v := range r.sin {
		r.neg[i] = -v
	}
}

// linear computes y = x·Wᵀ for rows×in x and out×in W (Hugging Face layout).
func linear(y, x, w []float32, rows, in, out int) {
	if rows == 0 {
		return
	}
	kernels.Gemm(false, true, rows, out, in, x, in, w, in, y, out, false)
}

// linearBackX computes dx (+)= dy·W.
func linearBackX(dx, dy, w []float32, rows, in, out int, acc bool) {
	if rows == 0 {
		return
	}
	kernels.Gemm(false, false, rows, in, out, dy, out, w, in, dx, in, acc)
}

// linearBackW accumulates dW += dyᵀ·x. The sum runs over rows inside one
// GEMM reduction, whose order depends only on rows: deterministic.
func linearBackW(dw, dy, x []float32, rows, in, out int) {
	if rows == 0 {
		return
	}
	kernels.Gemm(true, false, out, in, rows, dy, out, x, in, dw, in, true)
}

// normRows applies kernels.RMSNorm to each of rows rows of length n,
// saving the inverse RMS of each.
func normRows(dst, x, inv, w []float32, rows, n int, eps float32) {
	kernels.ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			inv[r] = kernels.RMSNorm(dst[r*n:(r+1)*n], x[r*n:(r+1)*n], w, eps)
		}
	})
}

// normChunk is the number of rows whose norm-weight gradients are summed
// together before the chunk sums are added in order: a fixed size, so the
// result does not depend on GOMAXPROCS.
const normChunk = 32

// normBackRows backpropagates y = x·inv·w over rows rows of length n. It
// writes (acc: adds) the input gradient to dx, which may alias dy when acc
// is false, and adds the weight gradient to dw. red is scratch.
//
// Per row it is kernels.RMSNormBackward: dx = r·(dy⊙w) - x·r³·mean(dy⊙w⊙x)
// and dw += dy⊙x·r with r = inv; the weight gradient is summed per chunk of
// normChunk rows, then chunk by chunk.
func normBackRows(dx, dy, x, inv, w []float32, rows, n int, dw []float32, red *[]float32, acc bool) {
	chunks := (rows + normChunk - 1) / normChunk
	*red = grow(*red, chunks*n)
	part := *red
	kernels.ParallelFor(chunks, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			p := part[c*n : (c+1)*n]
			clear(p)
			var tmp []float32
			if acc {
				tmp = make([]float32, n)
			}
			for r := c * normChunk; r < min(rows, (c+1)*normChunk); r++ {
				xr, dyr, dxr := x[r*n:(r+1)*n], dy[r*n:(r+1)*n], dx[r*n:(r+1)*n]
				if acc {
					kernels.RMSNormBackward(tmp, p, dyr, xr, w, inv[r])
					kernels.Axpy(1, tmp, dxr)
				} else {
					kernels.RMSNormBackward(dxr, p, dyr, xr, w, inv[r])
				}
			}
		}
	})
	for c := 0; c < chunks; c++ {
		kernels.Axpy(1, part[c*n:(c+1)*n], dw)
	}
}

// swigluRows applies kernels.SwiGLU to rows rows of length n in parallel.
func swigluRows(dst, g, u []float32, rows, n int) {
	kernels.ParallelFor(rows, func(lo, hi int) {
		kernels.SwiGLU(dst[lo*n:hi*n], g[lo*n:hi*n], u[lo*n:hi*n])
	})
}

// swigluBackRows backpropagates a = silu(g)·u over rows rows of length n:
// dg = da·u·silu'(g), du = da·silu(g). dg may alias da.
func swigluBackRows(dg, du, da, g, u []float32, rows, n int) {
	kernels.ParallelFor(rows, func(lo, hi int) {
		kernels.SwiGLUBackward(dg[lo*n:hi*n], du[lo*n:hi*n], g[lo*n:hi*n], u[lo*n:hi*n], da[lo*n:hi*n])
	})
}
