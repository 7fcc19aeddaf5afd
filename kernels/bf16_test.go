package kernels

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
)

// bf16Ref rounds x to bfloat16 without bit tricks: it takes the two
// bfloat16 neighbours of x and compares distances in float64, ties to the
// even code. The code past the largest finite value (Inf) counts as 2¹²⁸,
// as IEEE overflow rounding says.
func bf16Ref(x float32) BF16 {
	u := math.Float32bits(x)
	if x != x {
		return BF16(u>>16 | 0x40)
	}
	lo := BF16(u >> 16) // truncation: toward zero
	if u&0xffff == 0 {
		return lo
	}
	hi := lo + 1 // next away from zero (same sign)
	val := func(b BF16) float64 {
		if b&0x7fff == 0x7f80 {
			return math.Copysign(0x1p128, float64(b.Float32()))
		}
		return float64(b.Float32())
	}
	dl := math.Abs(float64(x) - val(lo))
	dh := math.Abs(val(hi) - float64(x))
	switch {
	case dl < dh:
		return lo
	case dh < dl:
		return hi
	case lo&1 == 0:
		return lo
	default:
		return hi
	}
}

func TestBF16HandCases(t *testing.T) {
	cases := []struct {
		in   uint32
		want BF16
		why  string
	}{
		{0x3f800000, 0x3f80, "1.0 exact"},
		{0x80000000, 0x8000, "-0 keeps its sign"},
		{0x3f808000, 0x3f80, "tie between 0x3f80 and 0x3f81 goes to even 0x3f80"},
		{0x3f818000, 0x3f82, "tie between 0x3f81 and 0x3f82 goes to even 0x3f82"},
		{0xbf818000, 0xbf82, "negative tie goes to even"},
		{0x3f808001, 0x3f81, "just above a tie rounds up"},
		{0x3f807fff, 0x3f80, "just below a tie rounds down"},
		{0x3fffffff, 0x4000, "rounds up into the next exponent (1.99.. -> 2)"},
		{0x3f7fc000, 0x3f80, "0.99.. rounds up to 1.0"},
		{0x00008000, 0x0000, "subnormal tie to even zero"},
		{0x00018000, 0x0002, "subnormal tie to even 0x0002"},
		{0x00010001, 0x0001, "subnormal rounds down"},
		{0x00000001, 0x0000, "smallest float32 subnormal rounds to zero"},
		{0x007fffff, 0x0080, "largest subnormal rounds up to the smallest normal"},
		{0x00400000, 0x0040, "bf16 subnormal kept, not flushed"},
		{0x7f800000, 0x7f80, "+Inf"},
		{0xff800000, 0xff80, "-Inf"},
		{0x7f7f7fff, 0x7f7f, "rounds down to the largest finite bf16"},
		{0x7f7f8000, 0x7f80, "tie at the top goes to even, which is Inf"},
		{0x7f7fffff, 0x7f80, "largest float32 overflows to Inf"},
		{0xff7fffff, 0xff80, "most negative float32 overflows to -Inf"},
		{0x7fc00000, 0x7fc0, "quiet NaN"},
		{0x7f800001, 0x7fc0, "signalling NaN with payload only in the low bits stays NaN"},
		{0xff800001, 0xffc0, "negative NaN keeps its sign"},
		{0x7fffffff, 0x7fff, "NaN with all bits set does not carry into the sign"},
	}
	for _, c := range cases {
		got := BF16FromFloat32(math.Float32frombits(c.in))
		if got != c.want {
			t.Errorf("BF16FromFloat32(%#08x): got %#04x, want %#04x (%s)", c.in, got, c.want, c.why)
		}
		if ref := bf16Ref(math.Float32frombits(c.in)); ref != c.want {
			t.Errorf("reference(%#08x) = %#04x, want %#04x: the test's reference is wrong", c.in, ref, c.want)
		}
	}
	if v := BF16(0x7f7f).Float32(); v != 0x1.fep127 {
		t.Errorf("largest finite bf16 = %g, want %g", v, 0x1.fep127)
	}
	if v := BF16(0x0001).Float32(); v != 0x1p-133 {
		t.Errorf("smallest bf16 subnormal = %g, want 2^-133", v)
	}
}

// bf16RandomF32 draws float32 values from every class: normal, subnormal,
// ties, huge, Inf, NaN.
func bf16RandomF32(rng *rand.Rand) float32 {
	switch rng.IntN(8) {
	case 0:
		return math.Float32frombits(rng.Uint32() & 0x807fffff) // subnormal
	case 1:
		return math.Float32frombits(rng.Uint32()&0xffff0000 | 0x8000) // exact tie
	case 2:
		return math.Float32frombits(rng.Uint32() | 0x7f800000) // Inf or NaN
	case 3:
		return math.Float32frombits(rng.Uint32()&0x80ffffff | 0x7f000000) // huge
	default:
		return math.Float32frombits(rng.Uint32())
	}
}

func TestBF16AgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		x := bf16RandomF32(rng)
		if got, want := BF16FromFloat32(x), bf16Ref(x); got != want {
			t.Fatalf("BF16FromFloat32(%#08x) = %#04x, want %#04x", math.Float32bits(x), got, want)
		}
	}
}

// TestBF16Exhaustive checks all 2³² float32 values (KEEL_LONG=1).
func TestBF16Exhaustive(t *testing.T) {
	if os.Getenv("KEEL_LONG") == "" {
		t.Skip("set KEEL_LONG=1 to check all 2^32 inputs")
	}
	for u := uint64(0); u < 1<<32; u++ {
		x := math.Float32frombits(uint32(u))
		if got, want := BF16FromFloat32(x), bf16Ref(x); got != want {
			t.Fatalf("BF16FromFloat32(%#08x) = %#04x, want %#04x", u, got, want)
		}
	}
}

// bf16Paths runs fn once per conversion/kernel path this CPU has, with the
// feature flags switched accordingly.
func bf16Paths(t *testing.T, fn func(t *testing.T)) {
	t.Helper()
	saved512, savedBF16 := useAVX512, useAVX512BF16
	defer func() { useAVX512, useAVX512BF16 = saved512, savedBF16 }()
	type path struct {
		name            string
		avx512, avx512b bool
	}
	paths := []path{{"portable", false, false}}
	if saved512 {
		paths = append(paths, path{"avx512", true, false})
	}
	if savedBF16 {
		paths = append(paths, path{"avx512bf16", true, true})
	}
	for _, p := range paths {
		useAVX512, useAVX512BF16 = p.avx512, p.avx512b
		t.Run(p.name, fn)
	}
}

func TestToBF16Slices(t *testing.T) {
	bf16Paths(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 100, 1000} {
			src := make([]float32, n)
			for i := range src {
				src[i] = bf16RandomF32(rng)
			}
			dst := make([]BF16, n+1)
			dst[n] = 0x1234
			ToBF16(dst, src)
			if dst[n] != 0x1234 {
				t.Fatalf("n=%d: ToBF16 wrote past len(src)", n)
			}
			back := make([]float32, n)
			FromBF16(back, dst[:n])
			rounded := append([]float32(nil), src...)
			RoundBF16(rounded)
			for i, x := range src {
				want := bf16Ref(x)
				if dst[i] != want {
					t.Fatalf("n=%d i=%d: ToBF16(%#08x) = %#04x, want %#04x", n, i, math.Float32bits(x), dst[i], want)
				}
				if math.Float32bits(back[i]) != uint32(want)<<16 {
					t.Fatalf("FromBF16(%#04x) = %#08x", want, math.Float32bits(back[i]))
				}
				if math.Float32bits(rounded[i]) != uint32(want)<<16 {
					t.Fatalf("RoundBF16(%#08x) = %#08x, want %#08x", math.Float32bits(x), math.Float32bits(rounded[i]), uint32(want)<<16)
				}
			}
		}
	})
}
