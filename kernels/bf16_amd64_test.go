package kernels

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// bf16DotPairsRef is VDPBF16PS's per-lane definition as bf16MAC implements it:
// acc + a[2j+1]·b[2j+1], rounded and flushed, then + a[2j]·b[2j].
func bf16DotPairsRef(acc, a, b uint32) uint32 {
	r := math.Float32frombits(acc)
	if acc&0x7f800000 == 0 { // DAZ on the accumulator input
		r = math.Float32frombits(acc & 0x80000000)
	}
	r = bf16MAC(r, BF16(a>>16), BF16(b>>16))
	r = bf16MAC(r, BF16(a), BF16(b))
	return math.Float32bits(r)
}

func bf16RandomPair(rng *rand.Rand) uint32 {
	h := func() uint32 {
		switch rng.IntN(10) {
		case 0:
			return uint32(rng.IntN(2))<<15 | uint32(rng.IntN(128)) // subnormal or zero
		default: // exponents near 1 so that sums cancel and round
			return uint32(rng.IntN(2))<<15 | uint32(120+rng.IntN(16))<<7 | uint32(rng.IntN(128))
		}
	}
	return h() | h()<<16
}

// TestVDPBF16PSEncoding checks the hand-assembled VDPBF16PS (register and
// broadcast-memory forms, every register extension bit and every row
// addressing of the micro-kernel) against the scalar definition.
func TestVDPBF16PSEncoding(t *testing.T) {
	if !useAVX512BF16 {
		t.Skip("CPU lacks AVX512_BF16")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		var acc, a, b, want [16]uint32
		for i := range 16 {
			acc[i] = math.Float32bits(float32(rng.NormFloat64()))
			a[i], b[i] = bf16RandomPair(rng), bf16RandomPair(rng)
			want[i] = bf16DotPairsRef(bf16DotPairsRef(acc[i], a[i], b[i]), a[i], b[i])
		}
		vdpbf16psTest(&acc, &a, &b)
		if acc != want {
			t.Fatalf("register form: got %x, want %x", acc, want)
		}
		var accs [14][16]uint32
		var bs [14]uint32
		var wants [14][16]uint32
		for r := range 14 {
			bs[r] = bf16RandomPair(rng)
			for i := range 16 {
				accs[r][i] = math.Float32bits(float32(rng.NormFloat64()))
				wants[r][i] = bf16DotPairsRef(accs[r][i], a[i], bs[r])
			}
		}
		vdpbf16psBcastTest(&accs, &a, &bs)
		for r := range 14 {
			if accs[r] != wants[r] {
				t.Fatalf("broadcast form, row addressing %d: got %x, want %x", r, accs[r], wants[r])
			}
		}
	}
}

// TestVDPBF16PSSemantics documents what the hardware does, measured rather
// than assumed: the odd pair element is added first, each addition rounds
// to nearest even (not one rounding of the three-term sum), bf16 subnormal
// inputs and a subnormal accumulator read as zero, and subnormal results
// flush to zero. Intel's pseudo-code says the same; this test fails on a
// CPU that differs, and then bf16MAC (and so the portable and FMA paths)
// must follow it.
func TestVDPBF16PSSemantics(t *testing.T) {
	if !useAVX512BF16 {
		t.Skip("CPU lacks AVX512_BF16")
	}
	one := func(acc float32, a, b uint32) float32 {
		var va, vb, vacc [16]uint32
		vacc[0], va[0], vb[0] = math.Float32bits(acc), a, b
		// The broadcast-form test applies the instruction once.
		var accs [14][16]uint32
		var bs [14]uint32
		accs[0] = vacc
		bs[0] = vb[0]
		vdpbf16psBcastTest(&accs, &va, &bs)
		return math.Float32frombits(accs[0][0])
	}
	pair := func(even, odd BF16) uint32 { return uint32(even) | uint32(odd)<<16 }
	const b1 = BF16(0x3f80)   // 1.0
	const tiny = BF16(0x3380) // 2^-24: half an ulp of 1.0
	const sub = BF16(0x0040)  // 2^-127, a bf16 subnormal
	const big1 = BF16(0x7180) // 2^100
	const m70 = BF16(0x1c80)  // 2^-70
	cases := []struct {
		name      string
		acc       float32
		a, b      uint32
		want      float32
		rationale string
	}{
		{"two half-ulps", 1, pair(tiny, tiny), pair(b1, b1), 1,
			"1 + 2^-24 + 2^-24: one rounding of the exact sum would give 1+2^-23; two ties to even give 1"},
		{"odd first", 1 + 0x1p-23, pair(BF16(0xb400), tiny), pair(b1, b1), 1 + 0x1p-23,
			"(1+2^-23) + 2^-24 ties to even 1+2^-22, then -2^-23 gives 1+2^-23; even first (or one rounding) gives 1"},
		{"daz a", 0, pair(sub, 0), pair(big1, 0), 0, "subnormal bf16 times 2^100 counts as zero"},
		{"daz b odd", 0, pair(0, big1), pair(0, sub), 0, "also in the odd element and the other operand"},
		{"ftz", 0, pair(m70, 0), pair(m70, 0), 0, "2^-140 is subnormal in float32 and flushes"},
		{"daz acc", math.Float32frombits(0x40), pair(0, 0), pair(0, 0), 0, "a subnormal accumulator reads as zero"},
		{"normal", 2, pair(b1, BF16(0x4000)), pair(BF16(0x4040), BF16(0x4080)), 2 + 3 + 8, "2 + 1·3 + 2·4"},
	}
	for _, c := range cases {
		got := one(c.acc, c.a, c.b)
		if math.Float32bits(got) != math.Float32bits(c.want) {
			t.Errorf("%s: got %g, want %g (%s)", c.name, got, c.want, c.rationale)
		}
		if ref := math.Float32frombits(bf16DotPairsRef(math.Float32bits(c.acc), c.a, c.b)); math.Float32bits(ref) != math.Float32bits(c.want) {
			t.Errorf("%s: bf16MAC emulation gives %g, want %g", c.name, ref, c.want)
		}
	}
	// Random cancelling sums: hardware and emulation agree bit for bit, and
	// (as a check that the test has teeth) one rounding of the exact sum
	// would often disagree.
	rng := rand.New(rand.NewPCG(9, 10))
	differ := 0
	for range 20000 {
		acc := float32(rng.NormFloat64())
		a, b := bf16RandomPair(rng), bf16RandomPair(rng)
		got := one(acc, a, b)
		if w := math.Float32frombits(bf16DotPairsRef(math.Float32bits(acc), a, b)); math.Float32bits(got) != math.Float32bits(w) {
			t.Fatalf("acc=%g a=%#08x b=%#08x: hardware %g, emulation %g", acc, a, b, got, w)
		}
		x := new(big.Float).SetPrec(1000).SetFloat64(float64(acc))
		x.Add(x, new(big.Float).SetFloat64(float64(BF16(a).Float32())*float64(BF16(b).Float32())))
		x.Add(x, new(big.Float).SetFloat64(float64(BF16(a>>16).Float32())*float64(BF16(b>>16).Float32())))
		if f, _ := x.Float32(); f != got {
			differ++
		}
	}
	if differ == 0 {
		t.Errorf("no case distinguished two roundings from one: the random inputs are too easy")
	}
}

// BenchmarkBF16Kernel measures the micro-kernel alone on cache-resident
// operands (one 14×32 tile, k = 256): the single-core ceiling.
func BenchmarkBF16Kernel(b *testing.B) {
	const kp = 128
	a := make([]BF16, bf16MR*2*kp)
	p := make([]uint32, kp*bf16NR)
	c := make([]float32, bf16MR*bf16NR)
	for i := range a {
		a[i] = BF16FromFloat32(float32(i%7) - 3)
	}
	for i := range p {
		p[i] = 0x3f803f80
	}
	for _, path := range []string{"avx512bf16", "avx512fma"} {
		if path == "avx512bf16" && !useAVX512BF16 || !useAVX512 {
			continue
		}
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				if path == "avx512bf16" {
					bf16Kern14x32(kp, &a[0], 2*kp, &p[0], &c[0], bf16NR, bf16MR, 0xffffffff, false, &bf16Ones[0], &bf16Ones[0])
				} else {
					bf16Kern7x32FMA(kp, &a[0], 2*kp, &p[0], &c[0], bf16NR, 7, 0xffffffff, false, &bf16Ones[0], &bf16Ones[0])
					bf16Kern7x32FMA(kp, &a[7*2*kp], 2*kp, &p[0], &c[7*bf16NR], bf16NR, 7, 0xffffffff, false, &bf16Ones[7], &bf16Ones[0])
				}
			}
			b.ReportMetric(2*bf16MR*bf16NR*2*kp*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
