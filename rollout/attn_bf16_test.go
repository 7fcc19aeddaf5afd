package rollout

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/keel-rl/keel/kernels"
)

// Small integers are exact in bfloat16 and their products and sums exact
// in float32, so the kernels must give these hand-computed values exactly,
// on every path.
func TestBF16AttentionKernelsByHand(t *testing.T) {
	for _, asm := range []bool{false, true} {
		if asm && !useBF16Asm {
			continue
		}
		saved := useBF16Asm
		useBF16Asm = asm
		// Keys: 3 positions of 16 (row stride 20): key j has component i
		// equal to (i+1)·(j+1) for i < 2 and 0 elsewhere.
		d, n, ld := 16, 3, 20
		k := make([]kernels.BF16, n*ld)
		for i := 0; i < 2; i++ {
			for j := 0; j < n; j++ {
				k[j*ld+i] = kernels.BF16FromFloat32(float32((i + 1) * (j + 1)))
			}
		}
		q := make([]float32, d)
		q[0], q[1] = 2, 3
		s := make([]float32, n)
		dotRowsBF16(s, q, k, n, ld, 0.5) // s_j = 0.5·(2(j+1) + 6(j+1)) = 4(j+1)
		for j, v := range s {
			if v != float32(4*(j+1)) {
				t.Fatalf("asm %v: scores %v, want 4, 8, 12", asm, s)
			}
		}
		// Values: 5 positions of 16 (row stride 20), v_j,i = j - i.
		v := make([]kernels.BF16, 5*20)
		for j := 0; j < 5; j++ {
			for i := 0; i < 16; i++ {
				v[j*20+i] = kernels.BF16FromFloat32(float32(j - i))
			}
		}
		p := []float32{1, 2, 0.5, -1, 4}
		out := make([]float32, 16)
		for i := range out {
			out[i] = 100
		}
		axpyRowsBF16(out, p, v, 5, 20)
		for i, o := range out {
			var want float32 = 100
			for j, pj := range p {
				want += pj * float32(j-i)
			}
			if o != want {
				t.Fatalf("asm %v: out[%d] = %v, want %v", asm, i, o, want)
			}
		}
		useBF16Asm = saved
	}
}

// The assembly agrees with the Go loops to rounding on random data, for
// every key count and head size (it may differ in the last bits: fused
// multiply-adds).
func TestBF16AttentionKernelsAgree(t *testing.T) {
	if !useBF16Asm {
		t.Skip("no AVX-512")
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, d := range []int{16, 32, 48, 128} {
		for n := 1; n <= 150; n += 1 + n/8 {
			ld := d + 16*r.IntN(2)
			// The keys end exactly at the last element used, so a read
			// past it would be caught by the bounds of the slice.
			k := make([]kernels.BF16, (n-1)*ld+d)
			for i := range k {
				k[i] = kernels.BF16FromFloat32(float32(r.NormFloat64()))
			}
			q := make([]float32, d)
			for i := range q {
				q[i] = float32(r.NormFloat64())
			}
			sA, sG := make([]float32, n), make([]float32, n)
			useBF16Asm = true
			dotRowsBF16(sA, q, k, n, ld, 0.25)
			useBF16Asm = false
			dotRowsBF16(sG, q, k, n, ld, 0.25)
			useBF16Asm = true
			for j := range sA {
				if !close32(sA[j], sG[j], 1e-5*float64(d)) {
					t.Fatalf("d %d n %d: score %d: asm %v, Go %v", d, n, j, sA[j], sG[j])
				}
			}
			vld := d + 16*r.IntN(2)
			v := make([]kernels.BF16, (n-1)*vld+d)
			for i := range v {
				v[i] = kernels.BF16FromFloat32(float32(r.NormFloat64()))
			}
			p := make([]float32, n)
			for i := range p {
				p[i] = r.Float32()
			}
			oA, oG := make([]float32, d), make([]float32, d)
			for i := range oA {
				oA[i] = float32(i)
				oG[i] = float32(i)
			}
			axpyRowsBF16(oA, p, v, n, vld)
			useBF16Asm = false
			axpyRowsBF16(oG, p, v, n, vld)
			useBF16Asm = true
			for i := range oA {
				if !close32(oA[i], oG[i], 1e-5*float64(n+i)) {
					t.Fatalf("d %d n %d: out %d: asm %v, Go %v", d, n, i, oA[i], oG[i])
				}
			}
		}
	}
}

func close32(a, b float32, tol float64) bool {
	return math.Abs(float64(a)-float64(b)) <= tol
}

// Whole generations agree between the assembly and the Go loops to
// rounding: the engine wires the bf16 cache the same way for both.
func TestBF16CacheAsmMatchesGo(t *testing.T) {
	if !useBF16Asm {
		t.Skip("no AVX-512")
	}
	m := randomModel(denseConfig(), 21) // head_dim 16: the assembly runs
	prompts := testPrompts(rand.New(rand.NewPCG(6, 6)), 37, 5, 9, 2)
	var runs [2][]Sample
	for i, asm := range []bool{true, false} {
		useBF16Asm = asm
		e, err := New(m, Options{Precision: BF16, Slots: 3, MaxLen: 24})
		if err != nil {
			t.Fatal(err)
		}
		runs[i], err = e.Generate(prompts, 2, Sampling{MaxNewTokens: 8})
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	useBF16Asm = true
	for i, a := range runs[0] {
		b := runs[1][i]
		for j := range a.Tokens {
			if a.Tokens[j] != b.Tokens[j] || !close32(a.LogProbs[j], b.LogProbs[j], 1e-4) {
				t.Fatalf("sample %d token %d: %d (%v) with assembly, %d (%v) without", i, j, a.Tokens[j], a.LogProbs[j], b.Tokens[j], b.LogProbs[j])
			}
		}
	}
}

// Four keys at a time and one at a time add in the same order: a key's
// score does not depend on how many keys share the call.
func TestBF16DotRowsKeyCountInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	d, ld, n := 32, 48, 11
	k := make([]kernels.BF16, (n-1)*ld+d)
	for i := range k {
		k[i] = kernels.BF16FromFloat32(float32(r.NormFloat64()))
	}
	q := make([]float32, d)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	all := make([]float32, n)
	dotRowsBF16(all, q, k, n, ld, 0.3)
	for m := 1; m <= n; m++ {
		part := make([]float32, m)
		dotRowsBF16(part, q, k, m, ld, 0.3)
		for j := range part {
			if math.Float32bits(part[j]) != math.Float32bits(all[j]) {
				t.Fatalf("key %d: %v with %d keys, %v with %d", j, part[j], m, all[j], n)
			}
		}
	}
}

// attendOnline (the fp32 mode's attention) agrees with AttendRow to float32
// rounding for prefixes within one block and across several (where the
// running maximum grows and the partial sums are rescaled).
// (TestPrecisionDiscrepancyOrder checks that fp32 differs from exact.)
func TestAttendOnline(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	const d, stride = 24, 40
	for _, n := range []int{1, 5, attendOnlineBlock, attendOnlineBlock + 1, 3*attendOnlineBlock + 17} {
		keys, values := make([]float32, n*stride), make([]float32, n*stride)
		for i := range keys {
			// Scores that grow along the prefix make later blocks raise
			// the running maximum.
			keys[i] = float32(r.NormFloat64()) + float32(i/stride)*0.01
			values[i] = float32(r.NormFloat64())
		}
		q := make([]float32, d)
		for i := range q {
			q[i] = float32(r.NormFloat64())
		}
		want, got := make([]float32, d), make([]float32, d)
		s, acc := make([]float32, max(n, attendOnlineBlock)), make([]float32, d)
		kernels.AttendRow(want, q, keys, values, n, stride, 0.3, make([]float32, n))
		attendOnline(got, q, keys, values, n, stride, 0.3, s, acc)
		for i := range want {
			if diff := math.Abs(float64(got[i] - want[i])); diff > 1e-5*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("n=%d: element %d = %v, AttendRow %v", n, i, got[i], want[i])
			}
		}
	}
}
