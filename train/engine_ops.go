package train

import (
	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

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
	r.cos, r.sin = model.RopeTables(hd, theta, n)
	r.neg = make([]float32, len(r.sin))
	for i, v := range r.sin {
		r.neg[i] = -v
	}
}

// linGroup is a set of linear layers with the same input, such as q, k and
// v or an MLP's gate and up, computed as one product whose output columns
// are the layers' outputs side by side. When the weights (and gradients)
// lie next to each other in the arena, as model.New lays them out, the
// group runs as one GEMM; otherwise as one GEMM per layer over column
// blocks. Either way every output element is the same sum over the input
// in the same order, so the forward's bits do not depend on the path.
type linGroup struct {
	w, g  [][]float32 // per layer: weights and gradients [out_i, in]
	outs  []int       // per layer: output size
	fw    []float32   // fused weights [Σout, in], or nil
	fg    []float32   // fused gradients, or nil
	in    int
	total int // Σ outs
}

// arenaIndex records where each parameter of a model starts in its arena,
// so adjacent parameters can be used as one matrix.
type arenaIndex struct {
	arena []float32
	off   map[*model.Param]int
}

func newArenaIndex(m *model.Model) arenaIndex {
	ix := arenaIndex{arena: m.Arena, off: map[*model.Param]int{}}
	o := 0
	for _, p := range m.Params() {
		ix.off[p] = o
		o += p.Size()
	}
	return ix
}

// span returns the arena slice covering ps if they are consecutive in the
// arena and their Data still views it there; otherwise nil.
func (ix *arenaIndex) span(ps []*model.Param) []float32 {
	o0, ok := ix.off[ps[0]]
	if !ok {
		return nil
	}
	o := o0
	for _, p := range ps {
		po, ok := ix.off[p]
		n := p.Size()
		if !ok || po != o || len(p.Data) != n || n == 0 || o+n > len(ix.arena) || &p.Data[0] != &ix.arena[o] {
			return nil
		}
		o += n
	}
	return ix.arena[o0:o]
}

func (e *Engine) group(ps, gs []*model.Param) linGroup {
	g := linGroup{in: ps[0].Shape[1]}
	for i, p := range ps {
		g.w = append(g.w, p.Data)
		g.g = append(g.g, gs[i].Data)
		g.outs = append(g.outs, p.Shape[0])
		g.total += p.Shape[0]
	}
	if !e.noFuse {
		g.fw = e.mix.span(ps)
		g.fg = e.gix.span(gs)
	}
	return g
}

// forwardTask is forward as one product, when the group is fused.
func (g *linGroup) forwardTask(y []float32, ldy int, x []float32, ldx, rows int) (kernels.GemmTask, bool) {
	return kernels.GemmTask{TransB: true, M: rows, N: g.total, K: g.in, A: x, LDA: ldx, B: g.fw, LDB: g.in, C: y, LDC: ldy}, g.fw != nil
}

// forward computes y[:, 0:total] = x·Wᵀ for rows rows (row strides ldx, ldy).
func (g *linGroup) forward(y []float32, ldy int, x []float32, ldx, rows int) {
	if rows == 0 {
		return
	}
	if t, ok := g.forwardTask(y, ldy, x, ldx, rows); ok {
		t.Run()
		return
	}
	c := 0
	for i, w := range g.w {
		kernels.Gemm(false, true, rows, g.outs[i], g.in, x, ldx, w, g.in, y[c:], ldy, false)
		c += g.outs[i]
	}
}

// backXTask is backX as one product, when the group is fused.
func (g *linGroup) backXTask(dx []float32, ldx int, dy []float32, ldy, rows int, acc bool) (kernels.GemmTask, bool) {
	return kernels.GemmTask{M: rows, N: g.in, K: g.total, A: dy, LDA: ldy, B: g.fw, LDB: g.in, C: dx, LDC: ldx, Accumulate: acc}, g.fw != nil
}

// backX computes dx (+)= dy·W.
func (g *linGroup) backX(dx []float32, ldx int, dy []float32, ldy, rows int, acc bool) {
	if rows == 0 {
		return
	}
	if t, ok := g.backXTask(dx, ldx, dy, ldy, rows, acc); ok {
		t.Run()
		return
	}
	c := 0
	for i, w := range g.w {
		kernels.Gemm(false, false, rows, g.in, g.outs[i], dy[c:], ldy, w, g.in, dx, ldx, acc || i > 0)
		c += g.outs[i]
	}
}

// backWTask is backW as one product, when the group's gradients are fused.
func (g *linGroup) backWTask(dy []float32, ldy int, x []float32, ldx, rows int) (kernels.GemmTask, bool) {
	return kernels.GemmTask{TransA: true, M: g.total, N: g.in, K: rows, A: dy, LDA: ldy, B: x, LDB: ldx, C: g.fg, LDC: g.in, Accumulate: true}, g.fg != nil
}

// backW accumulates dW += dyᵀ·x; the sum over rows is one GEMM reduction,
// whose order depends only on rows: deterministic.
func (g *linGroup) backW(dy []float32, ldy int, x []float32, ldx, rows int) {
	if rows == 0 {
		return
	}
	if t, ok := g.backWTask(dy, ldy, x, ldx, rows); ok {
		t.Run()
		return
	}
	c := 0
	for i, gw := range g.g {
		kernels.Gemm(true, false, g.outs[i], g.in, rows, dy[c:], ldy, x, ldx, gw, g.in, true)
		c += g.outs[i]
	}
}

// linearTask is y = x·Wᵀ for rows×in x and out×in W (Hugging Face layout).
func linearTask(y, x, w []float32, rows, in, out int) kernels.GemmTask {
	return kernels.GemmTask{TransB: true, M: rows, N: out, K: in, A: x, LDA: in, B: w, LDB: in, C: y, LDC: out}
}

// linearBackXTask is dx (+)= dy·W.
func linearBackXTask(dx, dy, w []float32, rows, in, out int, acc bool) kernels.GemmTask {
	return kernels.GemmTask{M: rows, N: in, K: out, A: dy, LDA: out, B: w, LDB: in, C: dx, LDC: in, Accumulate: acc}
}

// linearBackWTask is dW += dyᵀ·x. The sum runs over rows inside one GEMM
// reduction, whose order depends only on rows: deterministic.
func linearBackWTask(dw, dy, x []float32, rows, in, out int) kernels.GemmTask {
	return kernels.GemmTask{TransA: true, M: out, N: in, K: rows, A: dy, LDA: out, B: x, LDB: in, C: dw, LDC: in, Accumulate: true}
}

// linear computes y = x·Wᵀ (see linearTask).
func linear(y, x, w []float32, rows, in, out int) {
	if rows > 0 {
		t := linearTask(y, x, w, rows, in, out)
		t.Run()
	}
}

// linearBackX computes dx (+)= dy·W.
func linearBackX(dx, dy, w []float32, rows, in, out int, acc bool) {
	if rows > 0 {
		t := linearBackXTask(dx, dy, w, rows, in, out, acc)
		t.Run()
	}
}

// linearBackW accumulates dW += dyᵀ·x.
func linearBackW(dw, dy, x []float32, rows, in, out int) {
	if rows > 0 {
		t := linearBackWTask(dw, dy, x, rows, in, out)
		t.Run()
	}
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

// normBackRows backpropagates y = x·inv·w over rows rows of length n. Row
// r lives at offset (r/per)·stride + (r%per)·n of dx, dy and x: per = 1,
// stride = n for plain rows; per = heads, stride = the token row stride
// for per-head norms inside a wider matrix. It writes (acc: adds) the input
// gradient to dx, which may alias dy when acc is false, and adds the weight
// gradient to dw. red is scratch.
//
// Per row it is kernels.RMSNormBackward: dx = r·(dy⊙w) - x·r³·mean(dy⊙w⊙x)
// and dw += dy⊙x·r with r = inv; the weight gradient is summed per chunk of
// normChunk rows, then chunk by chunk.
func normBackRows(dx, dy, x, inv, w []float32, rows, n, per, stride int, dw []float32, red *[]float32, acc bool) {
	chunks := (rows + normChunk - 1) / normChunk
	*red = grow(*red, chunks*n)
	part := *red
	kernels.ParallelFor(chunks, func(lo, hi int) {
		var tmp []float32
		if acc {
			tmp = make([]float32, n)
		}
		for c := lo; c < hi; c++ {
			p := part[c*n : (c+1)*n]
			clear(p)
			for r := c * normChunk; r < min(rows, (c+1)*normChunk); r++ {
				o := (r/per)*stride + (r%per)*n
				xr, dyr, dxr := x[o:o+n], dy[o:o+n], dx[o:o+n]
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

// swigluRows writes a = silu(g)·u for rows rows, where gu holds each row's
// gate and up projections side by side ([rows, 2n]) and a is [rows, n].
func swigluRows(a, gu []float32, rows, n int) {
	kernels.ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g := gu[r*2*n : (2*r+1)*n]
			u := gu[(2*r+1)*n : (2*r+2)*n]
			kernels.SwiGLU(a[r*n:(r+1)*n], g, u)
		}
	})
}

// swigluBackRows backpropagates swigluRows: from da [rows, n] it writes
// dgu [rows, 2n] = (da·u·silu'(g), da·silu(g)) side by side.
func swigluBackRows(dgu, da, gu []float32, rows, n int) {
	kernels.ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			o := r * 2 * n
			kernels.SwiGLUBackward(dgu[o:o+n], dgu[o+n:o+2*n], gu[o:o+n], gu[o+n:o+2*n], da[r*n:(r+1)*n])
		}
	})
}
