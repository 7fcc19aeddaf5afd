package train

import "github.com/keel-rl/keel/kernels"

// headChunkElems bounds the logits held at once (rows·vocab floats): with a
// real vocabulary (~150k) the full [tokens, vocab] matrix would need
// gigabytes, so the lm_head runs over chunks of token rows and Backward
// recomputes each chunk. Small vocabularies fit in one chunk, which
// Backward reuses.
var headChunkElems = 1 << 24 // a variable so tests can force several chunks

// headChunkRows returns the rows per lm_head chunk for vocabulary size v.
// It depends only on v, so the order in which the lm_head gradient sums
// token rows is fixed.
func headChunkRows(v int) int {
	return max(16, headChunkElems/v)
}

// hasNext reports whether packed row t has a next token in its sequence.
func (f *fwdState) hasNext(t int) bool {
	return t+1 < f.T && f.pos[t+1] != 0
}

// headChunk computes the log-softmax of the logits of rows c0..c0+rows-1
// into f.logp, the logits divided by the temperature first (in float32,
// element by element, as the rollout engine does) unless it is 1.
func (f *fwdState) headChunk(lm []float32, c0, rows int) {
	H, V := f.cfg.HiddenSize, f.cfg.VocabSize
	linear(f.logp, f.xf[c0*H:], lm, rows, H, V)
	temp := f.temp
	kernels.ParallelFor(rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			z := f.logp[r*V : (r+1)*V]
			if temp != 1 {
				for i := range z {
					z[i] /= temp
				}
			}
			kernels.LogSoftmax(z, z)
		}
	})
}

// headBackward writes the gradient of the loss w.r.t. the logits of rows
// c0..c0+rows-1 (whose log-softmax is in f.logp) into dz. With z the
// log-softmax and p = exp(z): d log p_y/d logit_v = δ_vy - p_v and
// dH/d logit_v = -p_v·(z_v + H), each divided by the temperature (the
// logits entered the softmax as logit/T).
func (f *fwdState) headBackward(dz []float32, c0, rows int, coefLP, coefH []float32) {
	V := f.cfg.VocabSize
	kernels.ParallelFor(rows, func(lo, hi int) {
		p := make([]float32, V)
		for r := lo; r < hi; r++ {
			t := c0 + r
			z, d := f.logp[r*V:(r+1)*V], dz[r*V:(r+1)*V]
			cl, ch := coefLP[t], coefH[t]
			if cl == 0 && ch == 0 {
				clear(d)
				continue
			}
			var ent float32
			if ch != 0 {
				ent = entropyRow(z, p)
			} else {
				kernels.Exp(p, z)
			}
			if ch == 0 {
				kernels.Scale(d, p, -cl)
			} else {
				for v, zv := range z {
					d[v] = -cl*p[v] - ch*p[v]*(zv+ent)
				}
			}
			if cl != 0 { // only rows with a next token have coefficients
				d[f.tokens[t+1]] += cl
			}
			if temp := f.temp; temp != 1 {
				for v := range d {
					d[v] /= temp
				}
			}
		}
	})
}
