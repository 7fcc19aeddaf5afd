package kernels

import "math"

// AttendRow computes one query head's attention output
// out = Σ_j p_j·V_j with p = softmax_j(scale·q·K_j) over the n key rows
// j = 0..n-1. keys and values hold n rows of len(q) values with row stride
// stride; probs (length ≥ n) receives p, which the backward pass needs.
// The reduction order depends only on n and len(q), so the training engine
// (whole sequences) and the rollout engine (one token at a time with a KV
// cache) get the same bits.
//
// Precisely: the scores are DotRows(probs, q, keys, n, stride, scale), i.e.
// scale·Dot(q, K_j); p_j = exp(s_j - max s)·float32(1/Σ) with the sum taken in
// float64 (as Softmax does); out is zeroed and then AxpyRows(out, p, values),
// i.e. Axpy(p_j, V_j, out) for j in order. None of it depends on the stride
// or on where the rows live. With n = 0, out is zeroed.
func AttendRow(out, q, keys, values []float32, n, stride int, scale float32, probs []float32) {
	d := len(q)
	out = out[:d]
	clear(out)
	if n == 0 {
		return
	}
	p := probs[:n]
	DotRows(p, q, keys, n, stride, scale)
	Softmax(p, p)
	AxpyRows(out, p, values, n, stride)
}

// AttendRowBackward is the backward pass of AttendRow for one query row,
// given the forward's q, keys, values, n, stride, scale and probs, and the
// output gradient dout. It adds the gradients into dq (length len(q)) and
// into the first n rows of dkeys and dvalues (same layout as keys and
// values). scratch needs length ≥ n.
//
// dp_j = Dot(dout, V_j); ds_j = p_j·(dp_j - Σ p·dp); dq += scale·Σ ds_j·K_j;
// dK_j += scale·ds_j·q; dV_j += p_j·dout.
func AttendRowBackward(dq, dkeys, dvalues, dout, q, keys, values []float32, n, stride int, scale float32, probs, scratch []float32) {
	d := len(q)
	if n == 0 || d == 0 {
		return
	}
	dq, dout = dq[:d], dout[:d]
	span := rowsSpan(n, d, stride)
	dkeys, dvalues = dkeys[:span], dvalues[:span]
	p, ds := probs[:n], scratch[:n]
	DotRows(ds, dout, values, n, stride, 1)
	SoftmaxBackward(ds, p, ds)
	Scale(ds, ds, scale)
	AxpyRows(dq, ds, keys, n, stride)
	for j := 0; j < n; j++ {
		Axpy(ds[j], q, dkeys[j*stride:j*stride+d])
		Axpy(p[j], dout, dvalues[j*stride:j*stride+d])
	}
}

// AttendCausal runs causal self-attention for the T queries of one head:
// query i (q[i·qStride:], length d) attends to key/value rows 0..i (row
// stride kvStride) and writes out[i·outStride:] (length d). Every row is
// bit for bit AttendRow's result for that query alone, so a KV-cache decoder
// calling AttendRow reproduces it.
//
// With probStride ≥ T, row i's probabilities are left in
// probs[i·probStride:][:i+1] (the rest of each row is scratch). With
// probStride = 0, probs is only scratch and needs length ≥ 4·T.
//
// On AVX-512 it handles four queries per pass so that each key and value row
// is loaded once for four queries; elsewhere it calls AttendRow per query.
// It runs serially: callers parallelise over heads and sequences.
func AttendCausal(out, q, keys, values []float32, T, d, outStride, qStride, kvStride int, scale float32, probs []float32, probStride int) {
	if T <= 0 {
		return
	}
	if probStride != 0 && probStride < T {
		panic("kernels: AttendCausal needs probStride 0 or ≥ T")
	}
	out = out[:rowsSpan(T, d, outStride)]
	q = q[:rowsSpan(T, d, qStride)]
	span := rowsSpan(T, d, kvStride)
	keys, values = keys[:span], values[:span]
	ps := probStride
	if ps == 0 {
		ps = T
		probs = probs[:4*T]
	} else {
		probs = probs[:(T-1)*ps+T]
	}
	row := func(i int) int { // where query i's probabilities start
		if probStride == 0 {
			return (i % 4) * T
		}
		return i * ps
	}
	i := 0
	if useAVX512 && d > 0 {
		for ; i+4 <= T; i += 4 {
			base := row(i)
			// Scores of queries i..i+3 against keys 0..i+3; query i+a
			// uses the first i+a+1.
			dotRowsQ4AVX512(&probs[base], ps, &q[i*qStride], qStride, &keys[0], i+4, d, kvStride, scale)
			for a := 0; a < 4; a++ {
				p := probs[base+a*ps : base+a*ps+i+a+1]
				Softmax(p, p)
				clear(out[(i+a)*outStride : (i+a)*outStride+d])
			}
			// Keys 0..i are shared by all four queries; then the last
			// a keys of query i+a, continuing its Axpy sequence.
			axpyRowsQ4AVX512(&out[i*outStride], outStride, &probs[base], ps, &values[0], i+1, d, kvStride)
			for a := 1; a < 4; a++ {
				o := (i + a) * outStride
				AxpyRows(out[o:o+d], probs[base+a*ps+i+1:base+a*ps+i+a+1], values[(i+1)*kvStride:], a, kvStride)
			}
		}
	}
	for ; i < T; i++ {
		r := row(i)
		AttendRow(out[i*outStride:i*outStride+d], q[i*qStride:i*qStride+d], keys, values, i+1, kvStride, scale, probs[r:r+i+1])
	}
}

// AttentionScale returns 1/sqrt(headDim), the usual score scale, rounded
// once from float64 so both engines use the same float32.
func AttentionScale(headDim int) float32 {
	return float32(1 / math.Sqrt(float64(headDim)))
}
