package model

import (
	"fmt"
	"math"

	"github.com/keel-rl/keel/kernels"
)

// The Qwen3 maths below is shared by the training engine (package train)
// and the rollout engine (package rollout), which do not import each
// other. Both call these functions, so the rollout engine's exact mode
// reproduces the training engine's forward pass bit for bit.

// RopeTables returns the rotary-embedding tables of Hugging Face Qwen3 for
// positions 0..n-1: cos[p·hd/2+i] = cos(p·θ^(-2i/hd)) and likewise sin,
// computed in float64 and rounded to float32. Shared by the training and
// rollout engines, so both rotate with the same bits.
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

// TopK writes into ids the len(ids) largest entries of the router
// probabilities p in descending order; ties go to the lower index (as a
// stable descending sort would). NaNs rank below every number, so a
// diverged router still yields k distinct experts. Shared by the training
// and rollout engines, so both route to exactly the same experts.
func TopK(ids []int32, p []float32) {
	for s := range ids {
		best := -1
		for e, v := range p {
			taken := false
			for _, id := range ids[:s] {
				if int(id) == e {
					taken = true
					break
				}
			}
			// A NaN loses to any number (so a real probability is
			// preferred) and ties go to the lower index.
			if !taken && (best < 0 || v > p[best] || (p[best] != p[best] && v == v)) {
				best = e
			}
		}
		ids[s] = int32(best)
	}
}

// GateWeights writes the gate weights of the experts ids from the full
// router softmax p: g_i = p_i / S with S summed in slot order when norm
// (norm_topk_prob), else g_i = p_i. The training engine gives replayed
// experts the same formula from the live probabilities, so the router
// receives their gradients. Shared by the training and rollout engines,
// so both gate bit for bit alike.
func GateWeights(g []float32, p []float32, ids []int32, norm bool) {
	if !norm {
		for s, id := range ids {
			g[s] = p[id]
		}
		return
	}
	var sum float32
	for _, id := range ids {
		sum += p[id]
	}
	for s, id := range ids {
		g[s] = p[id] / sum
	}
}

// CombineExperts writes out = h + Σ_s gates[s]·ys[s] for one token, with
// the sum accumulated in slot order in acc (scratch of len(h)): acc =
// gates[0]·ys[0] (kernels.Scale), then acc += gates[s]·ys[s] with
// kernels.Axpy, then out = h + acc element by element (kernels.Axpy with
// alpha 1, whose fused multiply-add of an exact product rounds once, as
// the addition does). out may alias h. Shared by the training and rollout
// engines, so both combine expert outputs bit for bit alike.
func CombineExperts(out, h, acc, gates []float32, ys [][]float32) {
	acc = acc[:len(h)]
	if len(ys) == 0 {
		clear(acc)
	}
	for s, y := range ys {
		if s == 0 {
			kernels.Scale(acc, y[:len(h)], gates[0])
		} else {
			kernels.Axpy(gates[s], y[:len(h)], acc)
		}
	}
	out = out[:len(h)]
	if len(h) > 0 && &out[0] != &h[0] {
		copy(out, h)
	}
	kernels.Axpy(1, acc, out)
}

// EachExpert calls f for each expert x with rows in GroupByExpert's
// grouping (off), in expert order: its first row r0 and its n > 0 rows.
// It stops at f's first error.
func EachExpert(off []int, f func(x, r0, n int) error) error {
	for x := 0; x+1 < len(off); x++ {
		if n := off[x+1] - off[x]; n > 0 {
			if err := f(x, off[x], n); err != nil {
				return err
			}
		}
	}
	return nil
}

// ExpertLayout finds layer l's experts in an arena (offs: each
// parameter's offset in floats) as the GPU engines' grouped products read
// them: expert e's gate projection at gate0 + e·stride, its up projection
// right after its gate (the two one [2·inter, hidden] matrix), its down
// projection at down0 + e·stride. New lays the experts out so; any other
// layout is an error, not a wrong product later.
func ExpertLayout(offs map[*Param]int, l *Layer, hidden, inter int) (gate0, down0, stride int, err error) {
	if len(l.Experts) == 0 {
		return 0, 0, 0, fmt.Errorf("model: ExpertLayout of a layer without experts")
	}
	gate0, down0 = offs[l.Experts[0].Gate], offs[l.Experts[0].Down]
	stride = 3 * inter * hidden
	if len(l.Experts) > 1 {
		stride = offs[l.Experts[1].Gate] - gate0
	}
	for e, ex := range l.Experts {
		g := offs[ex.Gate]
		if g != gate0+e*stride || offs[ex.Up] != g+inter*hidden || offs[ex.Down] != down0+e*stride || stride < 2*inter*hidden {
			return 0, 0, 0, fmt.Errorf("model: the experts' weights are not laid out as the grouped products read them")
		}
	}
	return gate0, down0, stride, nil
}

// GroupByExpert groups the (token, slot) pairs of ids ([tokens][k] expert
// ids, k per token) by expert, tokens in order within an expert: expert
// e's pairs are rows off[e]..off[e+1] of the grouped order, pair j (token
// j/k, slot j%k) is grouped row row[j], and grouped row r holds token
// tok[r]. The GPU engines run each expert over its rows as one product.
func GroupByExpert(ids []int32, experts, k int) (off []int, row, tok []int32) {
	off = make([]int, experts+1)
	for _, id := range ids {
		off[id+1]++
	}
	for e := 0; e < experts; e++ {
		off[e+1] += off[e]
	}
	row, tok = make([]int32, len(ids)), make([]int32, len(ids))
	fill := make([]int, experts)
	for j, id := range ids {
		r := off[id] + fill[id]
		fill[id]++
		row[j] = int32(r)
		tok[r] = int32(j / k)
	}
	return off, row, tok
}
