package kernels

import (
	"fmt"
	"math"
)

// The row kernels below pick an assembly path once per call from the CPU
// feature flags (AVX-512, else AVX2+FMA, else portable Go). Within one path
// every result is a fixed function of the inputs and their lengths: no path
// looks at memory alignment, strides or anything else, so the training engine
// and the exact-mode rollout engine get the same bits from the same rows. The
// three paths differ from each other in the last bits (FMA, lane counts,
// exp polynomial versus math.Exp).

// Dot returns the inner product of a and b (len(a) elements). The summation
// order depends only on the length.
func Dot(a, b []float32) float32 {
	n := len(a)
	if n == 0 {
		return 0
	}
	b = b[:n]
	switch {
	case useAVX512:
		return dotAVX512(&a[0], &b[0], n)
	case useAVX2:
		return dotAVX2(&a[0], &b[0], n)
	}
	return dotGo(a, b)
}

// Axpy computes y += alpha·x.
func Axpy(alpha float32, x, y []float32) {
	n := len(x)
	if n == 0 {
		return
	}
	y = y[:n]
	switch {
	case useAVX512:
		axpyAVX512(alpha, &x[0], &y[0], n)
	case useAVX2:
		axpyAVX2(alpha, &x[0], &y[0], n)
	default:
		axpyGo(alpha, x, y)
	}
}

// rowsSpan returns how many elements n rows of width d with the given stride
// span, panicking on a negative stride (a caller bug, never user data).
func rowsSpan(n, d, stride int) int {
	if stride < 0 || n < 0 {
		panic(fmt.Sprintf("kernels: bad row layout n=%d stride=%d", n, stride))
	}
	if n == 0 {
		return 0
	}
	return (n-1)*stride + d
}

// DotRows writes dst[j] = scale·Dot(q, rows[j·stride : j·stride+len(q)]) for
// j = 0..n-1: the attention scores of one query against n keys. Each value
// has exactly the bits of the scale·Dot call it stands for.
func DotRows(dst, q, rows []float32, n, stride int, scale float32) {
	d := len(q)
	rows = rows[:rowsSpan(n, d, stride)]
	dst = dst[:n]
	if n == 0 {
		return
	}
	if d == 0 {
		clear(dst)
		return
	}
	switch {
	case useAVX512:
		dotRowsAVX512(&dst[0], &q[0], &rows[0], n, d, stride, scale)
	case useAVX2:
		dotRowsAVX2(&dst[0], &q[0], &rows[0], n, d, stride, scale)
	default:
		dotRowsGo(dst, q, rows, n, stride, scale)
	}
}

// AxpyRows computes out += Σ_j p[j]·rows[j·stride : j·stride+len(out)] for
// j = 0..n-1 in increasing j: bit for bit the same as n Axpy calls in that
// order, but with out held in registers.
func AxpyRows(out, p, rows []float32, n, stride int) {
	d := len(out)
	rows = rows[:rowsSpan(n, d, stride)]
	p = p[:n]
	if n == 0 || d == 0 {
		return
	}
	switch {
	case useAVX512:
		axpyRowsAVX512(&out[0], &p[0], &rows[0], n, d, stride)
	case useAVX2:
		axpyRowsAVX2(&out[0], &p[0], &rows[0], n, d, stride)
	default:
		axpyRowsGo(out, p, rows, n, stride)
	}
}

// Scale writes dst = c·x. dst may alias x.
func Scale(dst, x []float32, c float32) {
	n := len(x)
	if n == 0 {
		return
	}
	dst = dst[:n]
	switch {
	case useAVX512:
		scaleAVX512(&dst[0], &x[0], n, c)
	case useAVX2:
		scaleAVX2(&dst[0], &x[0], n, c)
	default:
		scaleGo(dst, x, c)
	}
}

// addConst writes dst = x + c. dst may alias x.
func addConst(dst, x []float32, c float32) {
	n := len(x)
	if n == 0 {
		return
	}
	dst = dst[:n]
	switch {
	case useAVX512:
		addAVX512(&dst[0], &x[0], n, c)
	case useAVX2:
		addAVX2(&dst[0], &x[0], n, c)
	default:
		addGo(dst, x, c)
	}
}

// Max returns the largest element of x (len(x) ≥ 1). With NaNs in x the
// result is unspecified but fixed for a given path and input.
func Max(x []float32) float32 {
	n := len(x)
	switch {
	case useAVX512:
		return maxAVX512(&x[0], n)
	case useAVX2:
		return maxAVX2(&x[0], n)
	}
	return maxGo(x)
}

// expSum writes dst[i] = exp(x[i] - shift) (dst nil: writes nothing; else
// dst may alias x) and returns Σ exp(x[i] - shift) accumulated in float64,
// so the sum over a 152k vocabulary row keeps about 1e-7 relative accuracy.
func expSum(dst, x []float32, shift float32) float64 {
	n := len(x)
	if n == 0 {
		return 0
	}
	var dp *float32
	if dst != nil {
		dst = dst[:n]
		dp = &dst[0]
	}
	switch {
	case useAVX512:
		return expSumAVX512(dp, &x[0], n, shift)
	case useAVX2:
		return expSumAVX2(dp, &x[0], n, shift)
	}
	return expSumGo(dst, x, shift)
}

// ExpSum writes dst[i] = exp(x[i] - shift) and returns the sum of those
// values accumulated in float64, in one pass (Softmax's inner loop, for
// callers that normalise later, such as an online softmax). dst may alias
// x.
func ExpSum(dst, x []float32, shift float32) float64 {
	if len(x) == 0 {
		return 0
	}
	return expSum(dst[:len(x)], x, shift)
}

// Exp writes dst[i] = exp(x[i]) for the len(x) elements of x. dst may alias
// x. The assembly paths use a float32 polynomial accurate to about 1 ulp,
// with exp(-Inf) = 0, underflow to subnormals and 0, overflow to +Inf and
// NaN kept; the portable path rounds math.Exp.
func Exp(dst, x []float32) {
	if len(x) == 0 {
		return
	}
	expSum(dst[:len(x)], x, 0)
}

// RMSNorm writes dst = x / sqrt(mean(x²) + eps) · weight and returns the
// inverse root-mean-square 1/sqrt(mean(x²)+eps), which the backward pass needs.
// dst may alias x. The sum of squares is Dot(x, x); each output is
// (x[i]·inv)·weight[i].
func RMSNorm(dst, x, weight []float32, eps float32) float32 {
	n := len(x)
	ss := Dot(x, x)
	inv := float32(1 / math.Sqrt(float64(ss/float32(n)+eps)))
	if n == 0 {
		return inv
	}
	dst = dst[:n]
	weight = weight[:n]
	switch {
	case useAVX512:
		rmsApplyAVX512(&dst[0], &x[0], &weight[0], n, inv)
	case useAVX2:
		rmsApplyAVX2(&dst[0], &x[0], &weight[0], n, inv)
	default:
		rmsApplyGo(dst, x, weight, inv)
	}
	return inv
}

// RMSNormBackward is the backward pass of RMSNorm for one row, given the
// forward's input x, weight and returned inv, and the output gradient dy:
// it writes dx = inv·(dy⊙w) - x·inv³·mean(dy⊙w⊙x) and adds dy⊙x·inv into
// dw (the weight gradient sums over rows). dx may alias dy. The sum
// Σ dy·w·x is accumulated in float64 in an order fixed by len(x) (see
// rmsBackDotGo); the element-wise part rounds every operation in float32.
func RMSNormBackward(dx, dw, dy, x, weight []float32, inv float32) {
	n := len(x)
	if n == 0 {
		return
	}
	dx, dw, dy, weight = dx[:n], dw[:n], dy[:n], weight[:n]
	var s float64
	if useAVX512 {
		s = rmsBackDotAVX512(&dy[0], &weight[0], &x[0], n)
	} else {
		s = rmsBackDotGo(dy, weight, x)
	}
	c := float32(float64(inv) * float64(inv) * float64(inv) * s / float64(n))
	if useAVX512 {
		rmsBackApplyAVX512(&dx[0], &dw[0], &dy[0], &x[0], &weight[0], n, inv, c)
		return
	}
	for i, v := range x {
		g := dy[i]
		dw[i] += float32(g * float32(v*inv))
		dx[i] = float32(inv*float32(g*weight[i])) - float32(v*c)
	}
}

// rmsBackDotGo returns Σ dy·w·x in float64 in the order of the AVX-512
// kernel: each term is the fused (dy·w)·x + acc; 16-element blocks go to
// two groups of eight lanes, a leftover 8-element chunk to the first, the
// rest to the second; then the groups are added and the lanes halved.
func rmsBackDotGo(dy, w, x []float32) float64 {
	var acc [2][8]float64
	add := func(a *[8]float64, i, cnt int) {
		for l := 0; l < cnt; l++ {
			p := float64(dy[i+l]) * float64(w[i+l])
			a[l] = math.FMA(p, float64(x[i+l]), a[l])
		}
	}
	n, i := len(x), 0
	for ; i+16 <= n; i += 16 {
		add(&acc[0], i, 8)
		add(&acc[1], i+8, 8)
	}
	if n-i >= 8 {
		add(&acc[0], i, 8)
		i += 8
	}
	add(&acc[1], i, n-i)
	var lane [8]float64
	for l := range lane {
		lane[l] = acc[0][l] + acc[1][l]
	}
	for h := 4; h >= 1; h /= 2 {
		for l := 0; l < h; l++ {
			lane[l] += lane[l+h]
		}
	}
	return lane[0]
}

// LogSoftmax writes dst = x - logsumexp(x) and returns logsumexp(x).
// dst may alias x. The row maximum is subtracted before exponentiating and
// the sum of exponentials is accumulated in float64, so rows of a 152k
// vocabulary stay accurate to about 1e-7 relative. -Inf entries give -Inf.
func LogSoftmax(dst, x []float32) float32 {
	if len(x) == 0 {
		return float32(math.Inf(-1))
	}
	mx := Max(x)
	s := expSum(nil, x, mx)
	lse := float32(float64(mx) + math.Log(s))
	addConst(dst, x, -lse)
	return lse
}

// LogSoftmaxBackward writes dx = dy - softmax·Σdy, the gradient through
// logp = LogSoftmax(x) given logp and dlogp = dy. dx may alias dy.
func LogSoftmaxBackward(dx, logp, dy []float32) {
	n := len(logp)
	if n == 0 {
		return
	}
	dx, dy = dx[:n], dy[:n]
	var s float64
	for _, g := range dy {
		s += float64(g)
	}
	sum := float32(s)
	var buf [256]float32
	for lo := 0; lo < n; lo += len(buf) {
		hi := min(lo+len(buf), n)
		e := buf[:hi-lo]
		Exp(e, logp[lo:hi])
		for i, p := range e {
			dx[lo+i] = dy[lo+i] - float32(p*sum)
		}
	}
}

// Softmax writes dst = exp(x - max) / sum. dst may alias x. The sum is
// accumulated in float64 and each output is exp(x[i]-max)·float32(1/sum).
func Softmax(dst, x []float32) {
	if len(x) == 0 {
		return
	}
	mx := Max(x)
	s := expSum(dst, x, mx)
	Scale(dst, dst, float32(1/s))
}

// SoftmaxBackward writes dx = p ⊙ (dy - Dot(p, dy)), the gradient through
// p = Softmax(x) given p and dp = dy. dx may alias dy.
func SoftmaxBackward(dx, p, dy []float32) {
	n := len(p)
	dx, dy = dx[:n], dy[:n]
	s := Dot(p, dy)
	for i, v := range p {
		dx[i] = v * (dy[i] - s)
	}
}

// SiLU returns x·sigmoid(x), computed as x / (1 + exp(-x)). SwiGLU's
// assembly paths use the float32 exp of Exp, so they may differ from
// SiLU(gate)·up in the last bit.
func SiLU(x float32) float32 {
	return x / (1 + float32(math.Exp(float64(-x))))
}

// SiLUGrad returns the derivative of SiLU at x:
// sigmoid(x)·(1 + x·(1 - sigmoid(x))).
func SiLUGrad(x float32) float32 {
	s := 1 / (1 + float32(math.Exp(float64(-x))))
	return s * (1 + float32(x*(1-s)))
}

// SwiGLU writes dst = silu(gate)·up, the activation of Qwen3's MLP and experts.
// Each output is (g / (1 + exp(-g)))·up with the float32 exp of Exp on the
// assembly paths.
func SwiGLU(dst, gate, up []float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	gate, up = gate[:n], up[:n]
	switch {
	case useAVX512:
		swigluAVX512(&dst[0], &gate[0], &up[0], n)
	case useAVX2:
		swigluAVX2(&dst[0], &gate[0], &up[0], n)
	default:
		swigluGo(dst, gate, up)
	}
}

// SwiGLUBackward writes the gradients of dst = silu(gate)·up given the
// output gradient dy: dgate = dy·up·silu'(gate) and dup = dy·silu(gate),
// as (dy·up)·(s·(1 + g·(1−s))) and dy·(g·s) with s = 1/(1+exp(-g)), every
// operation rounded in float32 and exp from Exp. dgate or dup may alias dy.
func SwiGLUBackward(dgate, dup, gate, up, dy []float32) {
	n := len(dy)
	if n == 0 {
		return
	}
	dgate, dup, gate, up = dgate[:n], dup[:n], gate[:n], up[:n]
	if useAVX512 {
		swigluBackAVX512(&dgate[0], &dup[0], &gate[0], &up[0], &dy[0], n)
		return
	}
	swigluBackGo(dgate, dup, gate, up, dy)
}

func swigluBackGo(dgate, dup, gate, up, dy []float32) {
	n := len(dy)
	var buf [256]float32
	for lo := 0; lo < n; lo += len(buf) {
		hi := min(lo+len(buf), n)
		e := buf[:hi-lo]
		for i := range e {
			e[i] = -gate[lo+i]
		}
		Exp(e, e)
		for i, ei := range e {
			k := lo + i
			g, u, d := gate[k], up[k], dy[k]
			s := 1 / (1 + ei)
			dgate[k] = float32(d*u) * float32(s*float32(1+float32(g*(1-s))))
			dup[k] = d * float32(g*s)
		}
	}
}

// RoPE rotates one head vector x (length 2·len(cos)) in place in the
// rotate-half layout of Hugging Face Qwen3: the first half pairs with the
// second half, x'[i] = x[i]·cos[i] - x[i+h]·sin[i] and
// x'[i+h] = x[i+h]·cos[i] + x[i]·sin[i], every product rounded to float32
// before the addition (no fused multiply-add).
func RoPE(x, cos, sin []float32) {
	RoPEHeads(x, 1, cos, sin)
}

// RoPEHeads applies RoPE with the same cos and sin to heads consecutive
// head vectors of 2·len(cos) floats at the start of x: the heads of one
// token. The bits are RoPE's, head by head.
func RoPEHeads(x []float32, heads int, cos, sin []float32) {
	h := len(cos)
	if h == 0 || heads <= 0 {
		return
	}
	x, sin = x[:2*h*heads], sin[:h]
	if useAVX512 {
		ropeAVX512(&x[0], &cos[0], &sin[0], h, heads)
		return
	}
	ropeGo(x, heads, cos, sin)
}

func ropeGo(x []float32, heads int, cos, sin []float32) {
	h := len(cos)
	for hd := 0; hd < heads; hd++ {
		y := x[hd*2*h : (hd+1)*2*h]
		for i := 0; i < h; i++ {
			a, b := y[i], y[i+h]
			y[i] = float32(a*cos[i]) - float32(b*sin[i])
			y[i+h] = float32(b*cos[i]) + float32(a*sin[i])
		}
	}
}

// NormRopeHeads prepares the queries or keys of one token: for each of the
// heads consecutive head vectors of raw (hd = 2·len(cos) floats each, head
// h at raw[h·hd:]), out's head h = RMSNorm(raw's head h, weight, eps), then
// RoPEHeads over out's heads. With inv non-nil, inv[h] receives head h's
// inverse root-mean-square (the backward pass needs it). The bits are
// those of the separate calls; it exists because both engines run it per
// token and head, on vectors short enough (head_dim 32 to 128) that the
// calls themselves cost as much as the arithmetic.
func NormRopeHeads(out, raw []float32, heads int, weight, cos, sin []float32, eps float32, inv []float32) {
	hd := 2 * len(cos)
	if heads <= 0 || hd == 0 {
		return
	}
	out, raw, weight = out[:heads*hd], raw[:heads*hd], weight[:hd]
	if inv != nil {
		inv = inv[:heads]
	}
	if !useAVX512 {
		for h := 0; h < heads; h++ {
			v := RMSNorm(out[h*hd:(h+1)*hd], raw[h*hd:(h+1)*hd], weight, eps)
			if inv != nil {
				inv[h] = v
			}
		}
		RoPEHeads(out, heads, cos, sin)
		return
	}
	for h := 0; h < heads; h++ {
		x := raw[h*hd : (h+1)*hd]
		ss := dotAVX512(&x[0], &x[0], hd)
		v := float32(1 / math.Sqrt(float64(ss/float32(hd)+eps)))
		rmsApplyAVX512(&out[h*hd], &x[0], &weight[0], hd, v)
		if inv != nil {
			inv[h] = v
		}
	}
	ropeAVX512(&out[0], &cos[0], &sin[:len(cos)][0], len(cos), heads)
}
