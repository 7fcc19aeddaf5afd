package kernels

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
)

// e4m3Table decodes the 256 codes independently of E4M3.Float32, from the
// format's definition: (-1)^s · 2^(e-7) · (1 + m/8), or 2^-6 · m/8 when e = 0.
func e4m3Table() (vals [256]float64, finite [256]bool) {
	for c := range 256 {
		s, e, m := c>>7, (c>>3)&15, c&7
		if e == 15 && m == 7 {
			vals[c] = math.NaN()
			continue
		}
		var v float64
		if e == 0 {
			v = math.Ldexp(float64(m)/8, -6)
		} else {
			v = math.Ldexp(1+float64(m)/8, e-7)
		}
		if s == 1 {
			v = -v
		}
		vals[c], finite[c] = v, true
	}
	return
}

func TestE4M3AllCodes(t *testing.T) {
	vals, finite := e4m3Table()
	for c := range 256 {
		e := E4M3(c)
		v := e.Float32()
		if !finite[c] {
			if v == v {
				t.Errorf("code %#02x decodes to %g, want NaN", c, v)
			}
			if r := RoundE4M3(v); r == r {
				t.Errorf("RoundE4M3(NaN) = %g", r)
			}
			continue
		}
		if float64(v) != vals[c] || math.Signbit(float64(v)) != (c >= 128) {
			t.Errorf("code %#02x decodes to %g, want %g", c, v, vals[c])
		}
		if r := RoundE4M3(v); math.Float32bits(r) != math.Float32bits(v) {
			t.Errorf("RoundE4M3(%g) = %g, want itself (code %#02x)", v, r, c)
		}
		if got := E4M3FromFloat32(v); got != e {
			t.Errorf("E4M3FromFloat32(%g) = %#02x, want %#02x", v, got, c)
		}
		// Every e4m3 value is exact in bfloat16.
		if BF16FromFloat32(v).Float32() != v {
			t.Errorf("e4m3 value %g is not exact in bfloat16", v)
		}
	}
	for _, c := range []struct {
		code E4M3
		v    float32
	}{{0x7e, 448}, {0xfe, -448}, {0x01, 0x1p-9}, {0x07, 7 * 0x1p-9}, {0x08, 0x1p-6}, {0x38, 1}, {0x78, 256}, {0x3c, 1.5}} {
		if got := c.code.Float32(); got != c.v {
			t.Errorf("code %#02x = %g, want %g", c.code, got, c.v)
		}
	}
}

func TestE4M3TiesAndSaturation(t *testing.T) {
	vals, finite := e4m3Table()
	// Positive finite values in increasing order are codes 0x00..0x7e.
	for c := 0; c < 0x7e; c++ {
		lo, hi := vals[c], vals[c+1]
		mid := float32((lo + hi) / 2) // exact: a few mantissa bits
		if float64(mid) != (lo+hi)/2 {
			t.Fatalf("midpoint of %g and %g not exact", lo, hi)
		}
		want := lo
		if c%2 == 1 { // the even code is c+1
			want = hi
		}
		if got := RoundE4M3(mid); float64(got) != want {
			t.Errorf("tie RoundE4M3(%g) = %g, want %g (even code)", mid, got, want)
		}
		if got := RoundE4M3(-mid); float64(got) != -want {
			t.Errorf("tie RoundE4M3(%g) = %g, want %g", -mid, got, -want)
		}
		above := math.Nextafter32(mid, float32(math.Inf(1)))
		below := math.Nextafter32(mid, 0)
		if got := RoundE4M3(above); float64(got) != hi {
			t.Errorf("RoundE4M3(%g) = %g, want %g", above, got, hi)
		}
		if got := RoundE4M3(below); float64(got) != lo {
			t.Errorf("RoundE4M3(%g) = %g, want %g", below, got, lo)
		}
	}
	_ = finite
	for _, c := range []struct{ in, want float32 }{
		{448, 448}, {449, 448}, {463.9, 448}, {464, 448}, {480, 448}, {1e30, 448},
		{float32(math.Inf(1)), 448}, {float32(math.Inf(-1)), -448}, {-500, -448},
		{0x1p-10, 0}, {-0x1p-10, float32(math.Copysign(0, -1))}, {0x1.0001p-10, 0x1p-9},
		{3 * 0x1p-10, 2 * 0x1p-9}, {1e-30, 0}, {0.1, 0.1015625}, {-0.3, -0.3125},
	} {
		got := RoundE4M3(c.in)
		if math.Float32bits(got) != math.Float32bits(c.want) {
			t.Errorf("RoundE4M3(%g) = %g, want %g", c.in, got, c.want)
		}
	}
	if got := E4M3FromFloat32(float32(math.NaN())); got != 0x7f {
		t.Errorf("E4M3FromFloat32(NaN) = %#02x, want 0x7f", got)
	}
}

// e4m3RoundRef is RoundE4M3 written with float64 arithmetic instead of bit
// manipulation, as an independent reference.
func e4m3RoundRef(x float32) float32 {
	if x != x {
		return x
	}
	a := math.Abs(float64(x))
	var r float64
	switch {
	case a >= E4M3Max:
		r = E4M3Max
	case a < 1.0/64:
		r = math.RoundToEven(a*512) / 512
	default:
		frac, exp := math.Frexp(a)
		r = math.Ldexp(math.RoundToEven(frac*16), exp-4)
	}
	if math.Signbit(float64(x)) {
		r = -r
	}
	return float32(r)
}

func TestE4M3AgainstFloat64Rounding(t *testing.T) {
	check := func(u uint32) {
		x := math.Float32frombits(u)
		got, want := RoundE4M3(x), e4m3RoundRef(x)
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("RoundE4M3(%#08x = %g) = %g, want %g", u, x, got, want)
		}
	}
	step := uint64(251) // a sample of all float32 bit patterns
	if os.Getenv("KEEL_LONG") != "" {
		step = 1
	}
	for u := uint64(0); u < 1<<32; u += step {
		check(uint32(u))
	}
}

// TestE4M3AgainstNearest compares RoundE4M3 with a brute-force search of the
// code table for random inputs.
func TestE4M3AgainstNearest(t *testing.T) {
	vals, finite := e4m3Table()
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200000 {
		x := float32(math.Ldexp(rng.Float64()*2-1, rng.IntN(22)-12))
		best, bestD := -1, math.Inf(1)
		for c := range 256 {
			if !finite[c] {
				continue
			}
			d := math.Abs(float64(x) - vals[c])
			if d < bestD || (d == bestD && c&1 == 0 && vals[c] != 0) {
				best, bestD = c, d
			}
		}
		want := vals[best]
		if math.Abs(float64(x)) >= 448 {
			want = math.Copysign(448, float64(x))
		}
		if got := RoundE4M3(x); float64(got) != want && !(got == 0 && want == 0) {
			t.Fatalf("RoundE4M3(%g) = %g, want %g", x, got, want)
		}
	}
}

func TestQuantizeE4M3Rows(t *testing.T) {
	// Row 0: absmax 1, scale 1/448: 0.5 -> 224, -1 -> -448, 0.25 -> 112.
	// Row 1: all zero. Row 2: absmax 2; 0.01·224 = 2.24 -> 2.25.
	src := []float32{
		0.5, -1, 0.25, 0, 99,
		0, 0, 0, 0, 99,
		2, 0.01, -2, 1, 99,
	}
	dst := make([]BF16, 12)
	scale := make([]float32, 3)
	QuantizeE4M3Rows(dst, scale, src, 3, 4, 5)
	want := []float32{224, -448, 112, 0, 0, 0, 0, 0, 448, 2.25, -448, 224}
	wantScale := []float32{1.0 / 448, 0, 2.0 / 448}
	for i, w := range want {
		if dst[i].Float32() != w {
			t.Errorf("q[%d] = %g, want %g", i, dst[i].Float32(), w)
		}
	}
	for i, w := range wantScale {
		if scale[i] != w {
			t.Errorf("scale[%d] = %g, want %g", i, scale[i], w)
		}
	}
	fq := append([]float32(nil), src...)
	FakeQuantE4M3Rows(fq, 3, 4, 5)
	for r := range 3 {
		for c := range 4 {
			if w := dst[r*4+c].Float32() * scale[r]; fq[r*5+c] != w {
				t.Errorf("fake quant [%d,%d] = %g, want %g", r, c, fq[r*5+c], w)
			}
		}
		if fq[r*5+4] != 99 {
			t.Errorf("FakeQuantE4M3Rows wrote past the row into the stride gap")
		}
	}
	// A NaN poisons its row's scale instead of disappearing.
	nan := []float32{1, float32(math.NaN())}
	QuantizeE4M3Rows(dst, scale, nan, 1, 2, 2)
	if scale[0] == scale[0] {
		t.Errorf("row with NaN got scale %g, want NaN", scale[0])
	}
}

func TestQuantizeE4M3RowsBadShape(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("short src did not panic")
		}
	}()
	QuantizeE4M3Rows(make([]BF16, 4), make([]float32, 2), make([]float32, 3), 2, 2, 2)
}

// TestQuantizeE4M3Paths: the AVX-512 quantiser and abs-max give the same
// bits as the scalar code on rows full of ties, subnormals, saturating
// values, infinities and NaNs.
func TestQuantizeE4M3Paths(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	vals, finite := e4m3Table()
	special := func() float32 {
		switch rng.IntN(6) {
		case 0: // an exact tie between two e4m3 codes (before scaling by 1)
			c := rng.IntN(0x7e)
			if !finite[c] {
				return 0
			}
			return float32((vals[c] + vals[c+1]) / 2)
		case 1:
			return bf16RandomF32(rng)
		case 2:
			return float32(rng.NormFloat64() * 0x1p-8)
		default:
			return float32(rng.NormFloat64() * 300)
		}
	}
	saved := useAVX512
	defer func() { useAVX512 = saved }()
	for it := range 300 {
		n := 1 + rng.IntN(70)
		row := make([]float32, n)
		for i := range row {
			row[i] = special()
		}
		s := []float32{1, 0.5, 3, 1e-3, float32(rng.Float64())}[it%5]
		var outs [2][]BF16
		var scales [2]float32
		for p, fast := range []bool{false, true} {
			useAVX512 = fast && saved
			outs[p] = make([]BF16, n)
			quantizeE4M3Row(outs[p], row, s)
			scales[p] = e4m3RowScale(row)
		}
		for i := range row {
			if outs[0][i] != outs[1][i] {
				t.Fatalf("x/s = %g/%g: scalar %#04x, AVX-512 %#04x", row[i], s, outs[0][i], outs[1][i])
			}
			want := bf16FromBits(math.Float32bits(e4m3RoundRef(row[i] / s)))
			if outs[0][i] != want {
				t.Fatalf("x/s = %g/%g: got %#04x, want %#04x", row[i], s, outs[0][i], want)
			}
		}
		if math.Float32bits(scales[0]) != math.Float32bits(scales[1]) {
			t.Fatalf("row scale: scalar %g, AVX-512 %g", scales[0], scales[1])
		}
	}
}
