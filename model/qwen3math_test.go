package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// CombineExperts gives, bit for bit, the scalar definition: acc = g0·y0,
// acc = fma(gs, ys, acc) for the later slots in order, out = h + acc;
// with out separate from h and aliasing it, for widths around the vector
// sizes and for k = 0.
func TestCombineExpertsMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 16, 33, 128, 130} {
		for k := 0; k <= 4; k++ {
			h := make([]float32, n)
			for i := range h {
				h[i] = float32(r.NormFloat64())
			}
			gates := make([]float32, k)
			ys := make([][]float32, k)
			for s := range ys {
				gates[s] = float32(r.Float64())
				ys[s] = make([]float32, n)
				for i := range ys[s] {
					ys[s][i] = float32(r.NormFloat64() * 10)
				}
			}
			want := make([]float32, n)
			for i := range want {
				var acc float32
				for s := range ys {
					if s == 0 {
						acc = gates[0] * ys[0][i]
					} else {
						acc = float32(math.FMA(float64(gates[s]), float64(ys[s][i]), float64(acc)))
					}
				}
				want[i] = h[i] + acc
			}
			out, acc := make([]float32, n), make([]float32, n)
			CombineExperts(out, h, acc, gates, ys)
			hh := append([]float32(nil), h...)
			CombineExperts(hh, hh, acc, gates, ys) // out aliasing h
			for i := range want {
				if math.Float32bits(out[i]) != math.Float32bits(want[i]) || math.Float32bits(hh[i]) != math.Float32bits(want[i]) {
					t.Fatalf("n=%d k=%d: element %d = %v / %v (aliased), want %v", n, k, i, out[i], hh[i], want[i])
				}
			}
		}
	}
}

// TopK ranks in descending order, sends ties to the lower index and ranks
// NaNs below every number.
func TestTopK(t *testing.T) {
	for _, c := range []struct {
		p    []float32
		want []int32
	}{
		{[]float32{0.1, 0.5, 0.2, 0.2}, []int32{1, 2, 3}},
		{[]float32{0.1, 0.3, 0.3, 0.3}, []int32{1, 2}},
		{[]float32{float32(math.NaN()), 0.5, float32(math.NaN())}, []int32{1, 0}},
		{[]float32{float32(math.NaN()), float32(math.NaN())}, []int32{0, 1}},
	} {
		ids := make([]int32, len(c.want))
		TopK(ids, c.p)
		for s := range ids {
			if ids[s] != c.want[s] {
				t.Fatalf("TopK(%v) = %v, want %v", c.p, ids, c.want)
			}
		}
	}
}

// GateWeights gives p_i, or p_i over the slot-order sum of the chosen
// probabilities with norm.
func TestGateWeights(t *testing.T) {
	p := []float32{0.1, 0.4, 0.2, 0.3}
	ids := []int32{1, 3, 0}
	g := make([]float32, len(ids))
	GateWeights(g, p, ids, false)
	for s, id := range ids {
		if g[s] != p[id] {
			t.Fatalf("unnormalised gates %v, want p at %v", g, ids)
		}
	}
	GateWeights(g, p, ids, true)
	sum := p[1] + p[3] + p[0]
	for s, id := range ids {
		if math.Float32bits(g[s]) != math.Float32bits(p[id]/sum) {
			t.Fatalf("normalised gate %d = %v, want %v", s, g[s], p[id]/sum)
		}
	}
}

// RopeTables holds cos and sin of p·θ^(-2i/hd), rounded from float64.
func TestRopeTables(t *testing.T) {
	const hd, n, theta = 8, 5, 10000.0
	cos, sin := RopeTables(hd, theta, n)
	if len(cos) != n*hd/2 || len(sin) != n*hd/2 {
		t.Fatalf("lengths %d, %d, want %d", len(cos), len(sin), n*hd/2)
	}
	for p := 0; p < n; p++ {
		for i := 0; i < hd/2; i++ {
			a := float64(p) * math.Pow(theta, -float64(2*i)/hd)
			if cos[p*hd/2+i] != float32(math.Cos(a)) || sin[p*hd/2+i] != float32(math.Sin(a)) {
				t.Fatalf("p=%d i=%d: %v, %v, want %v, %v", p, i, cos[p*hd/2+i], sin[p*hd/2+i], math.Cos(a), math.Sin(a))
			}
		}
	}
}

func TestGroupByExpert(t *testing.T) {
	// Three tokens, k = 2, experts 0..3: token 0 → (2, 0), token 1 → (0, 3),
	// token 2 → (2, 1). By expert: 0: pairs 1 (token 0), 2 (token 1);
	// 1: pair 5 (token 2); 2: pairs 0 (token 0), 4 (token 2); 3: pair 3.
	off, row, tok := GroupByExpert([]int32{2, 0, 0, 3, 2, 1}, 4, 2)
	wantOff := []int{0, 2, 3, 5, 6}
	wantRow := []int32{3, 0, 1, 5, 4, 2}
	wantTok := []int32{0, 1, 2, 0, 2, 1}
	for i := range wantOff {
		if off[i] != wantOff[i] {
			t.Fatalf("off = %v, want %v", off, wantOff)
		}
	}
	for i := range wantRow {
		if row[i] != wantRow[i] || tok[i] != wantTok[i] {
			t.Fatalf("row = %v, tok = %v; want %v, %v", row, tok, wantRow, wantTok)
		}
	}
}

// TestEachExpert: the experts with rows, in order, with their first row
// and count; an error stops the walk.
func TestEachExpert(t *testing.T) {
	off := []int{0, 2, 2, 5, 5, 6}
	var got [][3]int
	if err := EachExpert(off, func(x, r0, n int) error {
		got = append(got, [3]int{x, r0, n})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := [][3]int{{0, 0, 2}, {2, 2, 3}, {4, 5, 1}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("visited %v, want %v", got, want)
	}
	calls := 0
	stop := errors.New("stop")
	if err := EachExpert(off, func(x, r0, n int) error { calls++; return stop }); err != stop || calls != 1 {
		t.Errorf("after an error: %v, %d calls", err, calls)
	}
}

// TestExpertLayout: New's arena puts expert e's gate projection 3·I·H
// floats after expert e-1's, its up projection right after its gate, its
// down projection likewise strided; offsets that break the layout are an
// error.
func TestExpertLayout(t *testing.T) {
	cfg, err := Preset("tiny-moe", 64)
	if err != nil {
		t.Fatal(err)
	}
	m := New(cfg)
	offs, off := map[*Param]int{}, 0
	for _, p := range m.Params() {
		offs[p] = off
		off += p.Size()
	}
	H, I := cfg.HiddenSize, cfg.MoeIntermediateSize
	l := &m.Layers[cfg.MoELayers()[0]]
	gate0, down0, stride, err := ExpertLayout(offs, l, H, I)
	if err != nil {
		t.Fatal(err)
	}
	if gate0 != offs[l.Experts[0].Gate] || down0 != gate0+2*I*H || stride != 3*I*H {
		t.Errorf("gate0 %d, down0 %d, stride %d; want %d, %d, %d", gate0, down0, stride, offs[l.Experts[0].Gate], gate0+2*I*H, 3*I*H)
	}
	offs[l.Experts[1].Up]++ // an up projection not right after its gate
	if _, _, _, err := ExpertLayout(offs, l, H, I); err == nil {
		t.Error("an up projection apart from its gate: no error")
	}
	if _, _, _, err := ExpertLayout(offs, &m.Layers[0], H, I); err == nil && len(m.Layers[0].Experts) == 0 {
		t.Error("a layer without experts: no error")
	}
}
