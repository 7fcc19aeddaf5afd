package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestDeviceGraph records a step of launches (a kernel, and the products
// of each precision: keel's float32 GEMM, cuBLASLt's bf16, the fp8 path's
// quantisation, product and scaling) into a graph and checks that
// recording runs nothing, that a replay reads its buffers as they are when
// it runs (new inputs uploaded after the recording), and that it gives the
// bits the same launches give when issued one by one.
func TestDeviceGraph(t *testing.T) {
	g := newGPU(t)
	ops := NewOps(g.d)
	if !ops.GraphsAvailable() {
		t.Skip("graphs unavailable (a profiled run or an old driver)")
	}
	defer ops.CloseGraphs()
	r := rand.New(rand.NewPCG(21, 5))
	const rows, in, out = 13, 48, 40
	mats := []Matrix{{Off: 8, Rows: out, Cols: in}}
	arena := bufOf(g, randF32(r, 8+out*in, 1))
	w := arena.Floats(8, out*in)
	bl, err := NewBF16Linear(ops, arena, 8+out*in)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Free()
	f8, err := NewQuantLinear(ops, arena, 8+out*in, mats, FormatFP8)
	if err != nil {
		t.Fatal(err)
	}
	defer f8.Free()
	x, z := bufOf(g, randF32(r, rows*in, 1)), bufOf(g, randF32(r, rows*out, 1))
	for _, c := range []struct {
		name string
		p    interface {
			Linear(y, x, w Buffer, rows, in, out, ldy, ldx int) error
		}
	}{{"fp32", ops}, {"bf16", bl}, {"fp8", f8}} {
		y := g.poisoned(rows * out)
		step := func() error {
			if err := c.p.Linear(y, x, w, rows, in, out, out, in); err != nil {
				return err
			}
			return ops.Add(y, z, rows*out) // y += z
		}
		run := func(what string, f func() error) []float32 {
			t.Helper()
			if err := Upload(g.d, y, nanSlice(rows*out)); err != nil {
				t.Fatal(err)
			}
			if err := f(); err != nil {
				t.Fatalf("%s %s: %v", c.name, what, err)
			}
			if err := g.d.Sync(); err != nil {
				t.Fatal(err)
			}
			return g.f32(y, rows*out)
		}
		run("direct", step) // the weights' copies made, the scratch grown
		if err := Upload(g.d, y, nanSlice(rows*out)); err != nil {
			t.Fatal(err)
		}
		gr, err := ops.Capture(step)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
		for i, v := range g.f32(y, rows*out) {
			if v == v {
				t.Fatalf("%s: recording the graph wrote y[%d] = %g: it ran the launches", c.name, i, v)
			}
		}
		for round := 0; round < 2; round++ {
			if err := Upload(g.d, x, randF32(r, rows*in, 1)); err != nil {
				t.Fatal(err)
			}
			want := run("direct", step)
			got := run("replay", gr.Launch)
			sameBits(t, fmt.Sprintf("%s round %d: graph against direct launches", c.name, round), got, want)
		}
		gr.Close()
	}
	// A recording whose function fails reports it, and the next records.
	boom := errors.New("boom")
	if _, err := ops.Capture(func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("a failing recording returned %v", err)
	}
	gr, err := ops.Capture(func() error { return ops.Add(z, z, rows*out) })
	if err != nil {
		t.Fatalf("recording after a failed one: %v", err)
	}
	gr.Close()
}

func nanSlice(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.NaN())
	}
	return x
}
