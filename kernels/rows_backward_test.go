package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

func dot64(a []float32, b []float64) float64 {
	var s float64
	for i := range b {
		s += float64(a[i]) * b[i]
	}
	return s
}

func TestRMSNormBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	forEachPath(t, func(t *testing.T) {
		for _, n := range []int{1, 2, 5, 17, 64} {
			x, w, dy := randSlice(r, n, 1), randSlice(r, n, 1), randSlice(r, n, 1)
			const eps = 1e-5
			y := make([]float32, n)
			inv := RMSNorm(y, x, w, eps)
			dx := make([]float32, n)
			dw := make([]float32, n)
			dw[0] = 0.5 // accumulates
			RMSNormBackward(dx, dw, dy, x, w, inv)
			f := func(x, w []float64) float64 {
				var ss float64
				for _, v := range x {
					ss += v * v
				}
				iv := 1 / math.Sqrt(ss/float64(len(x))+eps)
				var l float64
				for i := range x {
					l += float64(dy[i]) * x[i] * iv * w[i]
				}
				return l
			}
			x64, w64 := to64(x), to64(w)
			checkGrad(t, "dx", dx, numGrad(func(v []float64) float64 { return f(v, w64) }, x64), 1e-5)
			gw := numGrad(func(v []float64) float64 { return f(x64, v) }, w64)
			gw[0] += 0.5
			checkGrad(t, "dw", dw, gw, 1e-5)
		}
	})
}

func TestSoftmaxBackwards(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	forEachPath(t, func(t *testing.T) {
		for _, n := range []int{1, 2, 7, 40, 300} {
			x, dy := randSlice(r, n, 2), randSlice(r, n, 1)
			lse := func(x []float64) float64 {
				mx := math.Inf(-1)
				for _, v := range x {
					mx = math.Max(mx, v)
				}
				var s float64
				for _, v := range x {
					s += math.Exp(v - mx)
				}
				return mx + math.Log(s)
			}
			x64 := to64(x)

			p := make([]float32, n)
			Softmax(p, x)
			dx := make([]float32, n)
			SoftmaxBackward(dx, p, dy)
			g := numGrad(func(v []float64) float64 {
				l := lse(v)
				s := make([]float64, len(v))
				for i := range v {
					s[i] = math.Exp(v[i] - l)
				}
				return dot64(dy, s)
			}, x64)
			checkGrad(t, "softmax dx", dx, g, 1e-5)

			lp := make([]float32, n)
			LogSoftmax(lp, x)
			LogSoftmaxBackward(dx, lp, dy)
			g = numGrad(func(v []float64) float64 {
				l := lse(v)
				s := make([]float64, len(v))
				for i := range v {
					s[i] = v[i] - l
				}
				return dot64(dy, s)
			}, x64)
			checkGrad(t, "logsoftmax dx", dx, g, 1e-5)
		}
	})
}

func TestSwiGLUBackward(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	forEachPath(t, func(t *testing.T) {
		for _, n := range []int{1, 3, 16, 300, 700} {
			g, u, dy := randSlice(r, n, 3), randSlice(r, n, 1), randSlice(r, n, 1)
			dg, du := make([]float32, n), make([]float32, n)
			SwiGLUBackward(dg, du, g, u, dy)
			for i := range g {
				x := float64(g[i])
				s := 1 / (1 + math.Exp(-x))
				wantU := float64(dy[i]) * x * s
				wantG := float64(dy[i]) * float64(u[i]) * s * (1 + x*(1-s))
				if math.Abs(float64(du[i])-wantU) > 1e-6*(1+math.Abs(wantU)) ||
					math.Abs(float64(dg[i])-wantG) > 1e-6*(1+math.Abs(wantG)) {
					t.Fatalf("n=%d i=%d: got (%v, %v) want (%v, %v)", n, i, dg[i], du[i], wantG, wantU)
				}
				if sg := SiLUGrad(g[i]); math.Abs(float64(sg)-s*(1+x*(1-s))) > 1e-6 {
					t.Fatalf("SiLUGrad(%v) = %v", g[i], sg)
				}
			}
		}
	})
}

// TestElementwiseBatchInvariance: the elementwise kernels give each element
// the same bits whether it is processed in one long call or row by row.
func TestElementwiseBatchInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 38))
	forEachPath(t, func(t *testing.T) {
		const rows, n = 5, 37
		g, u := randSlice(r, rows*n, 3), randSlice(r, rows*n, 1)
		all, one := make([]float32, rows*n), make([]float32, rows*n)
		SwiGLU(all, g, u)
		ex, ex1 := make([]float32, rows*n), make([]float32, rows*n)
		Exp(ex, g)
		for i := 0; i < rows; i++ {
			SwiGLU(one[i*n:(i+1)*n], g[i*n:(i+1)*n], u[i*n:(i+1)*n])
			Exp(ex1[i*n:(i+1)*n], g[i*n:(i+1)*n])
		}
		for i := range all {
			if math.Float32bits(all[i]) != math.Float32bits(one[i]) || math.Float32bits(ex[i]) != math.Float32bits(ex1[i]) {
				t.Fatalf("element %d differs between one call and per-row calls", i)
			}
		}
	})
}

// TestBackwardKernelsAsmMatchesGo: the AVX-512 SwiGLU and RMSNorm backward
// kernels give the bits of the portable code (which follows the same order
// of operations) at every length, tails included.
func TestBackwardKernelsAsmMatchesGo(t *testing.T) {
	if !useAVX512 {
		t.Skip("no AVX-512")
	}
	r := rand.New(rand.NewPCG(41, 42))
	for n := 1; n <= 80; n++ {
		g, u, dy := randSlice(r, n, 4), randSlice(r, n, 1), randSlice(r, n, 1)
		dg1, du1 := make([]float32, n), make([]float32, n)
		dg2, du2 := make([]float32, n), make([]float32, n)
		SwiGLUBackward(dg1, du1, g, u, dy)
		swigluBackGo(dg2, du2, g, u, dy)
		for i := range dg1 {
			if math.Float32bits(dg1[i]) != math.Float32bits(dg2[i]) || math.Float32bits(du1[i]) != math.Float32bits(du2[i]) {
				t.Fatalf("SwiGLUBackward n=%d i=%d: asm (%v, %v), Go (%v, %v)", n, i, dg1[i], du1[i], dg2[i], du2[i])
			}
		}
		x, w := randSlice(r, n, 1), randSlice(r, n, 1)
		if a, b := rmsBackDotAVX512(&dy[0], &w[0], &x[0], n), rmsBackDotGo(dy, w, x); a != b {
			t.Fatalf("rms dot n=%d: asm %v, Go %v", n, a, b)
		}
		inv := RMSNorm(make([]float32, n), x, w, 1e-6)
		dx1, dw1 := make([]float32, n), randSlice(r, n, 1)
		dw2 := append([]float32(nil), dw1...)
		RMSNormBackward(dx1, dw1, dy, x, w, inv)
		useAVX512 = false
		dx2 := make([]float32, n)
		RMSNormBackward(dx2, dw2, dy, x, w, inv)
		useAVX512 = true
		for i := range dx1 {
			if math.Float32bits(dx1[i]) != math.Float32bits(dx2[i]) || math.Float32bits(dw1[i]) != math.Float32bits(dw2[i]) {
				t.Fatalf("RMSNormBackward n=%d i=%d: asm (%v, %v), Go (%v, %v)", n, i, dx1[i], dw1[i], dx2[i], dw2[i])
			}
		}
	}
}

// TestRoPEHeadsAsmMatchesGo: the AVX-512 rotation gives the portable bits
// for every half length (tails included) and several heads at once, and
// RoPEHeads equals RoPE head by head.
func TestRoPEHeadsAsmMatchesGo(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for h := 1; h <= 40; h++ {
		for _, heads := range []int{1, 3} {
			x, c, s := randSlice(r, 2*h*heads+5, 2), randSlice(r, h, 1), randSlice(r, h, 1)
			want := append([]float32(nil), x...)
			ropeGo(want[:2*h*heads], heads, c, s)
			got := append([]float32(nil), x...)
			RoPEHeads(got, heads, c, s)
			one := append([]float32(nil), x...)
			for k := 0; k < heads; k++ {
				RoPE(one[k*2*h:], c, s)
			}
			for i := range x {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) || math.Float32bits(one[i]) != math.Float32bits(want[i]) {
					t.Fatalf("h=%d heads=%d i=%d: RoPEHeads %v, RoPE %v, portable %v", h, heads, i, got[i], one[i], want[i])
				}
			}
		}
	}
}
