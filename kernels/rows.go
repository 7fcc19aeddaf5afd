package kernels

import "math"

// Dot returns the inner product of a and b (len(a) elements). The summation
// order depends only on the length.
func Dot(a, b []float32) float32 {
	var s float32
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// Axpy computes y += alpha·x.
func Axpy(alpha float32, x, y []float32) {
	for i := range x {
		y[i] += alpha * x[i]
	}
}

// RMSNorm writes dst = x / sqrt(mean(x²) + eps) · weight and returns the
// inverse root-mean-square 1/sqrt(mean(x²)+eps), which the backward pass needs.
// dst may alias x.
func RMSNorm(dst, x, weight []float32, eps float32) float32 {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+eps)))
	for i, v := range x {
		dst[i] = v * inv * weight[i]
	}
	return inv
}

// LogSoftmax writes dst = x - logsumexp(x) and returns logsumexp(x).
// dst may alias x.
func LogSoftmax(dst, x []float32) float32 {
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	var s float32
	for _, v := range x {
		s += float32(math.Exp(float64(v - mx)))
	}
	lse := mx + float32(math.Log(float64(s)))
	for i, v := range x {
		dst[i] = v - lse
	}
	return lse
}

// Softmax writes dst = exp(x - max) / sum. dst may alias x.
func Softmax(dst, x []float32) {
	mx := x[0]
	for _, v := range x[1:] {
		if v > mx {
			mx = v
		}
	}
	var s float32
	for i, v := range x {
		e := float32(math.Exp(float64(v - mx)))
		dst[i] = e
		s += e
	}
	inv := 1 / s
	for i := range dst {
		dst[i] *= inv
	}
}

// SiLU returns x·sigmoid(x).
func SiLU(x float32) float32 {
	return x / (1 + float32(math.Exp(float64(-x))))
}

// SwiGLU writes dst = silu(gate)·up, the activation of Qwen3's MLP and experts.
func SwiGLU(dst, gate, up []float32) {
	for i := range dst {
		dst[i] = SiLU(gate[i]) * up[i]
	}
}

// RoPE rotates one head vector x (length 2·len(cos)) in place in the
// rotate-half layout of Hugging Face Qwen3: the first half pairs with the
// second half, x'[i] = x[i]·cos[i] - x[i+h]·sin[i] and
// x'[i+h] = x[i+h]·cos[i] + x[i]·sin[i].
func RoPE(x, cos, sin []float32) {
	h := len(cos)
	for i := 0; i < h; i++ {
		a, b := x[i], x[i+h]
		x[i] = a*cos[i] - b*sin[i]
		x[i+h] = b*cos[i] + a*sin[i]
	}
}

// AttendRow computes one query head's attention output
// out = Σ_j p_j·V_j with p = softmax_j(scale·q·K_j) over the n key rows
// j = 0..n-1. keys and values hold n rows of len(q) values with row stride
// stride; probs (length ≥ n) receives p, which the backward pass needs.
// The reduction order depends only on n and len(q), so the training engine
// (whole sequences) and the rollout engine (one token at a time with a KV
// cache) get the same bits.
func AttendRow(out, q, keys, values []float32, n, stride int, scale float32, probs []float32) {
	d := len(q)
	mx := float32(0)
	for j := 0; j < n; j++ {
		s := scale * Dot(q, keys[j*stride:j*stride+d])
		probs[j] = s
		if j == 0 || s > mx {
			mx = s
		}
	}
	var sum float32
	for j := 0; j < n; j++ {
		e := float32(math.Exp(float64(probs[j] - mx)))
		probs[j] = e
		sum += e
	}
	inv := 1 / sum
	for i := range out[:d] {
		out[i] = 0
	}
	for j := 0; j < n; j++ {
		probs[j] *= inv
		Axpy(probs[j], values[j*stride:j*stride+d], out[:d])
	}
}
