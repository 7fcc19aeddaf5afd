package rl

import (
	"math"
	"testing"

	"github.com/keel-rl/keel/model"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*(1+math.Abs(b)) }

// Two sequences with hand-computed values: l = log pi - log mu per token.
func TestMeasureDiscrepancyHand(t *testing.T) {
	mu := [][]float32{{-1, -2}, {-0.5}}
	pi := [][]float32{{-1.5, -2}, {-0.25}}
	// l = (-0.5, 0, 0.25)
	d := MeasureDiscrepancy(mu, pi)
	l := []float64{-0.5, 0, 0.25}
	var k1, k3 float64
	for _, v := range l {
		k1 += -v
		k3 += math.Exp(v) - v - 1
	}
	if d.Tokens != 3 || d.Sequences != 2 || !near(d.K1, k1/3) || !near(d.K3, k3/3) {
		t.Fatalf("%+v", d)
	}
	if !near(d.MeanAbs, 0.75/3) || d.MaxAbs != 0.5 || !near(d.Above01, 2.0/3) || d.Above1 != 0 {
		t.Fatalf("abs stats %+v", d)
	}
	ppl := math.Exp(3.5/3) - math.Exp(3.75/3)
	if !near(d.PPLGap, ppl) {
		t.Fatalf("PPLGap %v, want %v", d.PPLGap, ppl)
	}
	// Sequence 1: prod(1+d) - 1 = e^-0.5 - 1; sum d = (e^-0.5 - 1) + 0: gap 0.
	// Sequence 2: one token, gap 0. Both exact: the product of one term.
	if !near(d.SurrogateGap, 0) {
		t.Fatalf("SurrogateGap %v, want 0", d.SurrogateGap)
	}
	// Two non-zero deltas: gap = |(1+a)(1+b) - 1 - a - b| = |a·b|.
	d = MeasureDiscrepancy([][]float32{{0, 0}}, [][]float32{{float32(math.Log(1.5)), float32(math.Log(0.8))}})
	if math.Abs(d.SurrogateGap-0.1) > 1e-6 { // float32 logs: about 1e-7 off
		t.Fatalf("SurrogateGap %v, want 0.1", d.SurrogateGap)
	}
	if z := MeasureDiscrepancy(pi, pi); z.K1 != 0 || z.K3 != 0 || z.MaxAbs != 0 || z.SurrogateGap != 0 || z.PPLGap != 0 {
		t.Fatalf("identical inputs: %+v", z)
	}
}

func TestRoutingDisagreement(t *testing.T) {
	a := &model.Routes{Tokens: 2, Layers: 2, K: 2, Experts: 10, IDs8: []uint8{0, 1, 2, 3, 4, 5, 6, 7}}
	b := &model.Routes{Tokens: 2, Layers: 2, K: 2, Experts: 10, IDs8: []uint8{1, 0, 2, 9, 4, 5, 7, 8}}
	// Layer 0: position 0 same set {0,1}; position 1 {4,5} same: 0 of 4.
	// Layer 1: position 0 {2,3} vs {2,9}: 1; position 1 {6,7} vs {7,8}: 1. 2 of 4.
	got := RoutingDisagreement([]*model.Routes{a}, []*model.Routes{b}, nil)
	if len(got) != 2 || got[0] != 0 || got[1] != 0.5 {
		t.Fatalf("%v, want [0 0.5]", got)
	}
	got = RoutingDisagreement([]*model.Routes{a}, []*model.Routes{b}, []int{1})
	if got[1] != 0.5 || got[0] != 0 {
		t.Fatalf("first position only: %v, want [0 0.5]", got)
	}
}

// SetsDiffer counts positions whose expert sets differ, order ignored:
// hand-made routes of 3 positions in 2 layers, top-2.
func TestSetsDiffer(t *testing.T) {
	// IDs8 are position-major: (t·Layers + l)·K + slot.
	a := &model.Routes{Tokens: 3, Layers: 2, K: 2, Experts: 8, IDs8: []uint8{
		0, 1 /* t0 l0 */, 2, 3 /* t0 l1 */, 1, 0 /* t1 l0 */, 2, 3 /* t1 l1 */, 4, 5 /* t2 l0 */, 6, 7 /* t2 l1 */}}
	b := &model.Routes{Tokens: 3, Layers: 2, K: 2, Experts: 8, IDs8: []uint8{
		1, 0 /* same set */, 2, 4 /* differs */, 1, 0 /* same */, 3, 5 /* differs */, 4, 5 /* same */, 7, 6 /* same set */}}
	got := SetsDiffer([]*model.Routes{a}, []*model.Routes{b})
	if len(got) != 2 || got[0] != 0 || got[1] != 2.0/3 {
		t.Fatalf("sets differ %v, want [0 0.667]", got)
	}
}
