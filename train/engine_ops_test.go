package train

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// Per-operation checks of the backward pieces against central finite
// differences of small float64 re-implementations (engine_ref_test.go).

func randF32(r *rand.Rand, n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(scale * r.NormFloat64())
	}
	return out
}

func toF64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

// fdCheck compares got[i] with the central difference of loss with respect
// to x[i] for every i (x is perturbed in place and restored).
func fdCheck(t *testing.T, what string, got []float32, x []float64, loss func() float64) {
	t.Helper()
	const h = 1e-5
	for i := range x {
		x0 := x[i]
		x[i] = x0 + h
		lp := loss()
		x[i] = x0 - h
		lm := loss()
		x[i] = x0
		want := (lp - lm) / (2 * h)
		if math.Abs(float64(got[i])-want) > 2e-4*max(1, math.Abs(want)) {
			t.Errorf("%s[%d]: %v, finite difference %v", what, i, got[i], want)
		}
	}
}

func TestNormBackRows(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const rows, n = 70, 8 // more than two chunks of normChunk rows
	x, w, dy := randF32(r, rows*n, 1), randF32(r, n, 1), randF32(r, rows*n, 1)
	y, inv := make([]float32, rows*n), make([]float32, rows)
	normRows(y, x, inv, w, rows, n, 1e-6)
	for _, acc := range []bool{false, true} {
		dx := randF32(r, rows*n, 1)
		dx0 := append([]float32(nil), dx...)
		dw := randF32(r, n, 1)
		dw0 := append([]float32(nil), dw...)
		var red []float32
		normBackRows(dx, dy, x, inv, w, rows, n, 1, n, dw, &red, acc)
		for i := range dx {
			if acc {
				dx[i] -= dx0[i]
			}
		}
		for i := range dw {
			dw[i] -= dw0[i]
		}
		x64, w64, dy64 := toF64(x), toF64(w), toF64(dy)
		loss := func() float64 {
			var s float64
			for rr := 0; rr < rows; rr++ {
				yr := refRMS(x64[rr*n:(rr+1)*n], w64, 1e-6)
				for j := range yr {
					s += yr[j] * dy64[rr*n+j]
				}
			}
			return s
		}
		fdCheck(t, "dx", dx, x64, loss)
		fdCheck(t, "dw", dw, w64, loss)
	}
}

func TestHeadNormRopeBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const T, nh, hd = 5, 2, 8
	pos := []int32{0, 1, 2, 7, 30}
	var rc ropeCache
	rc.ensure(hd, 1e4, 31)
	const W = nh*hd + 4 // raw rows are wider than the heads, as in the fused q/k/v buffer
	raw, w, dy := randF32(r, T*W, 1), randF32(r, hd, 1), randF32(r, T*nh*hd, 1)
	out, inv := make([]float32, T*nh*hd), make([]float32, T*nh)
	headNormRope(out, raw, inv, w, T, nh, hd, W, pos, rc.cos, rc.sin, 1e-6)
	d := make([]float32, T*W)
	for t := 0; t < T; t++ {
		copy(d[t*W:t*W+nh*hd], dy[t*nh*hd:(t+1)*nh*hd])
	}
	dw := make([]float32, hd)
	var red []float32
	ropeBack(d, T, nh, hd, W, pos, rc.cos, rc.neg)
	normBackRows(d, d, raw, inv, w, T*nh, hd, nh, W, dw, &red, false)
	raw64, w64, dy64 := toF64(raw), toF64(w), toF64(dy)
	loss := func() float64 {
		var s float64
		for t := 0; t < T; t++ {
			for h := 0; h < nh; h++ {
				o, ro := (t*nh+h)*hd, t*W+h*hd
				y := refRMS(raw64[ro:ro+hd], w64, 1e-6)
				refRope(y, int(pos[t]), 1e4)
				for j := range y {
					s += y[j] * dy64[o+j]
				}
			}
		}
		return s
	}
	fdCheck(t, "draw", d, raw64, loss)
	fdCheck(t, "dw", dw, w64, loss)
	// The forward itself against the reference.
	for t0 := 0; t0 < T; t0++ {
		for h := 0; h < nh; h++ {
			o, ro := (t0*nh+h)*hd, t0*W+h*hd
			y := refRMS(raw64[ro:ro+hd], w64, 1e-6)
			refRope(y, int(pos[t0]), 1e4)
			for j := range y {
				if math.Abs(float64(out[o+j])-y[j]) > 1e-5 {
					t.Fatalf("forward t=%d h=%d: %v vs %v", t0, h, out[o:o+hd], y)
				}
			}
		}
	}
}

// TestAttnBackward checks causal GQA attention's gradients for two packed
// sequences, one longer than an attention backward block.
func TestAttnBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	d := newAttnDims(4, 2, 4)
	starts, lens := []int{0, 70}, []int{70, 5}
	T := 75
	q, k, v := randF32(r, T*d.qd, 1), randF32(r, T*d.kvd, 1), randF32(r, T*d.kvd, 1)
	dout := randF32(r, T*d.qd, 1)
	var pool scratchPool
	att := make([]float32, T*d.qd)
	attnForward(att, q, k, v, d, starts, lens, 70, &pool)
	// Gradients go to one [T, qd+2·kvd] buffer, as the engine lays them out.
	qs := d.qd + 2*d.kvd
	dqkv := randF32(r, T*qs, 1) // overwritten
	attnBackward(dqkv, dqkv[d.qd:], dqkv[d.qd+d.kvd:], qs, dout, q, k, v, d, starts, lens, &pool)
	dq, dk, dv := make([]float32, T*d.qd), make([]float32, T*d.kvd), make([]float32, T*d.kvd)
	for t := 0; t < T; t++ {
		copy(dq[t*d.qd:(t+1)*d.qd], dqkv[t*qs:])
		copy(dk[t*d.kvd:(t+1)*d.kvd], dqkv[t*qs+d.qd:])
		copy(dv[t*d.kvd:(t+1)*d.kvd], dqkv[t*qs+d.qd+d.kvd:])
	}
	q64, k64, v64, do64 := toF64(q), toF64(k), toF64(v), toF64(dout)
	ref := func() ([]float64, float64) {
		out := make([]float64, T*d.qd)
		var loss float64
		for s := range starts {
			for i := 0; i < lens[s]; i++ {
				ti := starts[s] + i
				for h := 0; h < d.heads; h++ {
					kh := h / d.group
					sc := make([]float64, i+1)
					for j := 0; j <= i; j++ {
						tj := starts[s] + j
						for c := 0; c < d.hd; c++ {
							sc[j] += q64[ti*d.qd+h*d.hd+c] * k64[tj*d.kvd+kh*d.hd+c]
						}
						sc[j] /= math.Sqrt(float64(d.hd))
					}
					p := refSoftmax(sc)
					for j := 0; j <= i; j++ {
						tj := starts[s] + j
						for c := 0; c < d.hd; c++ {
							o := ti*d.qd + h*d.hd + c
							out[o] += p[j] * v64[tj*d.kvd+kh*d.hd+c]
						}
					}
				}
			}
		}
		for i := range out {
			loss += out[i] * do64[i]
		}
		return out, loss
	}
	out64, _ := ref()
	for i := range att {
		if math.Abs(float64(att[i])-out64[i]) > 1e-5 {
			t.Fatalf("forward [%d]: %v, reference %v", i, att[i], out64[i])
		}
	}
	loss := func() float64 { _, l := ref(); return l }
	// Check a sample of rows in both sequences and across the block edge.
	sub := func(what string, got []float32, x []float64, width int, rows []int) {
		for _, row := range rows {
			fdCheck(t, what, got[row*width:(row+1)*width], x[row*width:(row+1)*width], loss)
		}
	}
	rows := []int{0, 1, 63, 64, 69, 70, 74}
	sub("dq", dq, q64, d.qd, rows)
	sub("dk", dk, k64, d.kvd, rows)
	sub("dv", dv, v64, d.kvd, rows)
}

func TestSwigluBack(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const n = 40
	g, u, da := randF32(r, n, 2), randF32(r, n, 1), randF32(r, n, 1)
	const rows, m = 4, n / 4
	gu := make([]float32, 2*n)
	for rr := 0; rr < rows; rr++ {
		copy(gu[2*rr*m:], g[rr*m:(rr+1)*m])
		copy(gu[(2*rr+1)*m:], u[rr*m:(rr+1)*m])
	}
	dgu := make([]float32, 2*n)
	swigluBackRows(dgu, da, gu, rows, m)
	dg, du := make([]float32, n), make([]float32, n)
	for rr := 0; rr < rows; rr++ {
		copy(dg[rr*m:(rr+1)*m], dgu[2*rr*m:])
		copy(du[rr*m:(rr+1)*m], dgu[(2*rr+1)*m:])
	}
	g64, u64, da64 := toF64(g), toF64(u), toF64(da)
	loss := func() float64 {
		var s float64
		for i := range g64 {
			s += g64[i] / (1 + math.Exp(-g64[i])) * u64[i] * da64[i]
		}
		return s
	}
	fdCheck(t, "dgate", dg, g64, loss)
	fdCheck(t, "dup", du, u64, loss)
}

// TestGateWeightsBackward checks the router's softmax, renormalised top-k
// gates and their backward (as moeBackward computes it) for forced expert
// sets that include experts outside the live top-k.
func TestGateWeightsBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	const E = 6
	for _, norm := range []bool{true, false} {
		s := randF32(r, E, 2)
		ids := []int32{4, 0, 2}
		dgt := randF32(r, len(ids), 1)
		auxG := randF32(r, E, 0.3)
		p := make([]float32, E)
		copy(p, s)
		kernels.Softmax(p, p)
		g := make([]float32, len(ids))
		model.GateWeights(g, p, ids, norm)
		ds := make([]float32, E)
		RouterBackRow(ds, p, g, ids, dgt, auxG, norm)
		s64 := toF64(s)
		loss := func() float64 {
			pp := refSoftmax(s64)
			var S, l float64
			for _, id := range ids {
				S += pp[id]
			}
			for k, id := range ids {
				gk := pp[id]
				if norm {
					gk /= S
				}
				l += gk * float64(dgt[k])
			}
			for e := range pp {
				l += pp[e] * float64(auxG[e])
			}
			return l
		}
		fdCheck(t, "dscore", ds, s64, loss)
	}
}
