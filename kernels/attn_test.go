package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// attend64 is the float64 reference of AttendRow.
func attend64(q, keys, values []float32, n, stride int, scale float64) (out, p []float64) {
	d := len(q)
	s := make([]float64, n)
	mx := math.Inf(-1)
	for j := range s {
		for i := 0; i < d; i++ {
			s[j] += float64(q[i]) * float64(keys[j*stride+i])
		}
		s[j] *= scale
		mx = math.Max(mx, s[j])
	}
	var sum float64
	for j := range s {
		s[j] = math.Exp(s[j] - mx)
		sum += s[j]
	}
	out = make([]float64, d)
	for j := range s {
		s[j] /= sum
		for i := 0; i < d; i++ {
			out[i] += s[j] * float64(values[j*stride+i])
		}
	}
	return out, s
}

func TestAttendRowAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	forEachPath(t, func(t *testing.T) {
		for _, d := range []int{1, 7, 16, 32, 64, 80, 100, 128, 200} {
			for _, n := range []int{1, 2, 17, 100, 300} {
				stride := d + r.IntN(5)
				q := randSlice(r, d, 1)
				keys := randSlice(r, (n-1)*stride+d, 1)
				values := randSlice(r, (n-1)*stride+d, 1)
				scale := AttentionScale(d)
				out := make([]float32, d)
				probs := make([]float32, n)
				AttendRow(out, q, keys, values, n, stride, scale, probs)
				ro, rp := attend64(q, keys, values, n, stride, float64(scale))
				// Scores carry the float32 dot's rounding (~1e-7 absolute),
				// which exp turns into relative error of p.
				for j := range rp {
					if math.Abs(float64(probs[j])-rp[j]) > 4e-6*rp[j]+1e-7 {
						t.Fatalf("d=%d n=%d: p[%d] = %v want %v", d, n, j, probs[j], rp[j])
					}
				}
				for i := range ro {
					if math.Abs(float64(out[i])-ro[i]) > 1e-5 {
						t.Fatalf("d=%d n=%d: out[%d] = %v want %v", d, n, i, out[i], ro[i])
					}
				}
			}
		}
	})
}

// TestAttendRowCacheInvariance checks the exact-mode contract: the query at
// position i gets the same bits from a whole-sequence pass (AttendCausal, K/V
// rows interleaved with other heads) as from AttendRow alone against a KV
// cache with another stride and alignment, and the result is the documented
// composition of DotRows, Softmax and AxpyRows.
func TestAttendRowCacheInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	forEachPath(t, func(t *testing.T) {
		for _, d := range []int{16, 32, 64, 100, 128} {
			const T, heads = 37, 3
			kvd := heads * d // whole-sequence layout: all heads in one row
			h := 1
			q := randSlice(r, T*kvd, 1)
			k := randSlice(r, T*kvd, 1)
			v := randSlice(r, T*kvd, 1)
			scale := AttentionScale(d)
			out := make([]float32, T*kvd)
			probs := make([]float32, T*T)
			AttendCausal(out[h*d:], q[h*d:], k[h*d:], v[h*d:], T, d, kvd, kvd, kvd, scale, probs, T)

			// A KV cache for head h alone: stride d+3, starting at an odd offset.
			cs := d + 3
			ck := make([]float32, 1+T*cs)[1:]
			cv := make([]float32, 5+T*cs)[5:]
			o := make([]float32, d)
			p := make([]float32, T+1)
			for i := 0; i < T; i++ {
				copy(ck[i*cs:], k[i*kvd+h*d:i*kvd+h*d+d])
				copy(cv[i*cs:], v[i*kvd+h*d:i*kvd+h*d+d])
				AttendRow(o, q[i*kvd+h*d:i*kvd+h*d+d], ck, cv, i+1, cs, scale, p)
				for c := 0; c < d; c++ {
					if math.Float32bits(o[c]) != math.Float32bits(out[i*kvd+h*d+c]) {
						t.Fatalf("d=%d i=%d c=%d: cache %v, whole sequence %v", d, i, c, o[c], out[i*kvd+h*d+c])
					}
				}
				for j := 0; j <= i; j++ {
					if math.Float32bits(p[j]) != math.Float32bits(probs[i*T+j]) {
						t.Fatalf("d=%d i=%d: probs differ at %d", d, i, j)
					}
				}
				// The documented composition.
				s := make([]float32, i+1)
				for j := range s {
					s[j] = scale * Dot(q[i*kvd+h*d:i*kvd+h*d+d], ck[j*cs:j*cs+d])
				}
				Softmax(s, s)
				w := make([]float32, d)
				for j := range s {
					Axpy(s[j], cv[j*cs:j*cs+d], w)
				}
				for c := range w {
					if math.Float32bits(w[c]) != math.Float32bits(o[c]) {
						t.Fatalf("d=%d i=%d: AttendRow is not Dot+Softmax+Axpy at %d", d, i, c)
					}
				}
			}
		}
	})
}

func TestAttendRowEmpty(t *testing.T) {
	out := []float32{1, 2}
	AttendRow(out, []float32{1, 1}, nil, nil, 0, 2, 1, nil)
	if out[0] != 0 || out[1] != 0 {
		t.Fatalf("AttendRow with n=0 = %v, want zeros", out)
	}
}

// numGrad returns the central-difference gradient of f at x in float64.
func numGrad(f func(x []float64) float64, x []float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		old := x[i]
		h := 1e-6 * math.Max(1, math.Abs(old))
		x[i] = old + h
		fp := f(x)
		x[i] = old - h
		fm := f(x)
		x[i] = old
		g[i] = (fp - fm) / (2 * h)
	}
	return g
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func checkGrad(t *testing.T, name string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, numerical %v", name, i, got[i], want[i])
		}
	}
}

func TestAttendRowBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	forEachPath(t, func(t *testing.T) {
		for _, c := range []struct{ d, n int }{{4, 1}, {5, 3}, {16, 7}, {33, 20}} {
			d, n := c.d, c.n
			stride := d + 2
			q := randSlice(r, d, 1)
			keys := randSlice(r, (n-1)*stride+d, 1)
			values := randSlice(r, (n-1)*stride+d, 1)
			dout := randSlice(r, d, 1)
			scale := AttentionScale(d)
			out := make([]float32, d)
			probs := make([]float32, n)
			AttendRow(out, q, keys, values, n, stride, scale, probs)
			dq := make([]float32, d)
			dk := make([]float32, len(keys))
			dv := make([]float32, len(values))
			AttendRowBackward(dq, dk, dv, dout, q, keys, values, n, stride, scale, probs, make([]float32, n))

			loss := func(q, k, v []float64) float64 {
				s := make([]float64, n)
				mx := math.Inf(-1)
				for j := range s {
					for i := 0; i < d; i++ {
						s[j] += q[i] * k[j*stride+i]
					}
					s[j] *= float64(scale)
					mx = math.Max(mx, s[j])
				}
				var sum float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				var l float64
				for i := 0; i < d; i++ {
					var o float64
					for j := range s {
						o += s[j] / sum * v[j*stride+i]
					}
					l += o * float64(dout[i])
				}
				return l
			}
			q64, k64, v64 := to64(q), to64(keys), to64(values)
			checkGrad(t, "dq", dq, numGrad(func(x []float64) float64 { return loss(x, k64, v64) }, q64), 1e-5)
			gk := numGrad(func(x []float64) float64 { return loss(q64, x, v64) }, k64)
			gv := numGrad(func(x []float64) float64 { return loss(q64, k64, x) }, v64)
			for j := 0; j < n; j++ {
				for i := d; i < stride && j*stride+i < len(keys); i++ {
					gk[j*stride+i], gv[j*stride+i] = 0, 0 // padding between rows
				}
			}
			checkGrad(t, "dkeys", dk, gk, 1e-5)
			checkGrad(t, "dvalues", dv, gv, 1e-5)
		}
	})
}

func TestAttendCausalMatchesAttendRow(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	forEachPath(t, func(t *testing.T) {
		for _, d := range []int{1, 7, 16, 48, 128, 200} {
			for _, T := range []int{1, 3, 4, 5, 8, 9, 21} {
				for _, pst := range []int{0, T, T + 3} {
					qs, kvs, os := d+1, d+5, d+2
					q := randSlice(r, T*qs, 1)
					k := randSlice(r, T*kvs, 1)
					v := randSlice(r, T*kvs, 1)
					out := make([]float32, T*os)
					np := 4 * T
					if pst > 0 {
						np = T * pst
					}
					probs := make([]float32, np)
					scale := AttentionScale(d)
					AttendCausal(out, q, k, v, T, d, os, qs, kvs, scale, probs, pst)
					o := make([]float32, d)
					p := make([]float32, T)
					for i := 0; i < T; i++ {
						AttendRow(o, q[i*qs:i*qs+d], k, v, i+1, kvs, scale, p)
						for c := range o {
							if math.Float32bits(o[c]) != math.Float32bits(out[i*os+c]) {
								t.Fatalf("d=%d T=%d probStride=%d: row %d col %d: causal %v, AttendRow %v", d, T, pst, i, c, out[i*os+c], o[c])
							}
						}
						if pst > 0 {
							for j := 0; j <= i; j++ {
								if math.Float32bits(probs[i*pst+j]) != math.Float32bits(p[j]) {
									t.Fatalf("d=%d T=%d: probs of row %d differ at %d", d, T, i, j)
								}
							}
						}
					}
				}
			}
		}
	})
}
