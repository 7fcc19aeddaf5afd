package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
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

// TestDeviceFusedBF16: the bf16 rollout's fused kernels give, bit for
// bit, what the plain kernel followed by the rounding to bf16 gives (an
// RMSNorm, a SwiGLU, the decoding attention, whose padding rows give
// zeros), and a product with an addend gives the product plus the addend
// within a rounding of the sum.
func TestDeviceFusedBF16(t *testing.T) {
	g := newGPU(t)
	ops := NewOps(g.d)
	r := rand.New(rand.NewPCG(3, 30))
	u16 := func(b Buffer, n int) []uint16 {
		out := make([]uint16, n)
		if err := Download(g.d, out, b); err != nil {
			t.Fatal(err)
		}
		return out
	}
	sameU16 := func(what string, a, b []uint16) {
		t.Helper()
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%s: element %d: %#04x fused, %#04x plain", what, i, a[i], b[i])
			}
		}
	}
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if err := g.d.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	const rows, n = 5, 200
	x, w := bufOf(g, randF32(r, rows*n, 2)), bufOf(g, randF32(r, n, 1))
	y, y16, f16 := g.poisoned(rows*n), g.poisoned(rows*n), g.poisoned(rows*n)
	inv, finv := g.poisoned(rows), g.poisoned(rows)
	check(ops.RMSNorm(y, inv, x, w, rows, n, 1e-6))
	check(ops.ToBF16Rows(y16, y, rows, n, n))
	check(ops.RMSNormBF16(f16, finv, x, w, rows, n, 1e-6))
	sameU16("RMSNormBF16", u16(f16, rows*n), u16(y16, rows*n))
	for i, v := range g.f32(finv, rows) {
		if want := g.f32(inv, rows)[i]; math.Float32bits(v) != math.Float32bits(want) {
			t.Fatalf("RMSNormBF16: row %d's inverse RMS %v, RMSNorm's %v", i, v, want)
		}
	}

	gu := bufOf(g, randF32(r, rows*2*n, 3))
	check(ops.SwiGLU(y, gu, rows, n))
	check(ops.ToBF16Rows(y16, y, rows, n, n))
	check(ops.SwiGLUBF16(f16, gu, rows, n))
	sameU16("SwiGLUBF16", u16(f16, rows*n), u16(y16, rows*n))

	// SwiGLU's backward into bf16: [rows, 2n] outputs.
	da := bufOf(g, randF32(r, rows*n, 1))
	dgu, dgu16, fdgu := g.poisoned(rows*2*n), g.poisoned(rows*2*n), g.poisoned(rows*2*n)
	check(ops.Launch("rows.cu", "swiglu_bwd", Dim3{X: 3}, Dim3{X: 256}, dgu, da, gu, int64(rows), n))
	check(ops.ToBF16Rows(dgu16, dgu, rows, 2*n, 2*n))
	check(ops.SwiGLUBackBF16(fdgu, da, gu, rows, n))
	sameU16("SwiGLUBackBF16", u16(fdgu, rows*2*n), u16(dgu16, rows*2*n))

	// Decoding attention over a bf16 cache: 3 slots of 9 positions, 4
	// heads sharing 2 KV heads of 32; the last row is padding.
	const slots, maxLen, heads, kv, hd = 3, 9, 4, 2, 32
	cache := func() Buffer {
		b := make([]kernels.BF16, slots*maxLen*kv*hd)
		kernels.ToBF16(b, randF32(r, len(b), 1))
		v := make([]uint16, len(b))
		for i := range b {
			v[i] = uint16(b[i])
		}
		return bufOf(g, v)
	}
	kcache, vcache := cache(), cache()
	q := bufOf(g, randF32(r, 4*heads*hd, 1))
	slot, pos := bufOf(g, []int32{2, 0, 1, -1}), bufOf(g, []int32{8, 3, 0, 0})
	att, att16, fatt := g.poisoned(4*heads*hd), g.poisoned(4*heads*hd), g.poisoned(4*heads*hd)
	check(ops.AttnDecodeBF16(att, q, kcache, vcache, slot, pos, 4, maxLen, heads, kv, hd, 0.17))
	check(ops.ToBF16Rows(att16, att, 4, heads*hd, heads*hd))
	check(ops.AttnDecodeBF16To16(fatt, q, kcache, vcache, slot, pos, 4, maxLen, heads, kv, hd, 0.17))
	got := u16(fatt, 4*heads*hd)
	sameU16("AttnDecodeBF16To16", got, u16(att16, 4*heads*hd))
	for i, v := range got[3*heads*hd:] {
		if v != 0 {
			t.Fatalf("padding row's attention element %d = %#04x, want 0", i, v)
		}
	}

	// The fused q/k step: q as NormRope gives it, the caches as NormRope
	// then KVStoreBF16 fill them; the padding row writes no cache. The
	// fused step reads q, k and v as column spans of one matrix (their one
	// product's output), the unfused ones as matrices of their own. At
	// head sizes 64 and 128 NormRope takes a warp's heads two at a time
	// (rows.cu's norm_rope_pairs) and the fused step four
	// (norm_rope_kv_heads), two implementations of one loop: the same
	// bits.
	for _, c := range []struct{ heads, hd int }{{heads, hd}, {30, 64}, {12, 128}, {40, 128}} {
		heads, hd := c.heads, c.hd // with kv: 32, 14 and 42 heads a token: a warp's four whole, part, and a second group
		rows, qd, kvd := 4, heads*hd, kv*hd
		ld := qd + 2*kvd
		qh, kh, vh := randF32(r, rows*qd, 1), randF32(r, rows*kvd, 1), randF32(r, rows*kvd, 1)
		qkvh := make([]float32, 0, rows*ld)
		for t := range rows {
			qkvh = append(qkvh, qh[t*qd:(t+1)*qd]...)
			qkvh = append(qkvh, kh[t*kvd:(t+1)*kvd]...)
			qkvh = append(qkvh, vh[t*kvd:(t+1)*kvd]...)
		}
		qraw, kraw, vv, qkv := bufOf(g, qh), bufOf(g, kh), bufOf(g, vh), bufOf(g, qkvh)
		qw, kw := bufOf(g, randF32(r, hd, 1)), bufOf(g, randF32(r, hd, 1))
		cosT, sinT := model.RopeTables(hd, 1e6, maxLen)
		bcos, bsin := bufOf(g, cosT), bufOf(g, sinT)
		zero := make([]uint16, slots*maxLen*kv*hd)
		kc1, vc1, kc2, vc2, kc3, vc3 := bufOf(g, zero), bufOf(g, zero), bufOf(g, zero), bufOf(g, zero), bufOf(g, zero), bufOf(g, zero)
		q1, q2, k1 := g.poisoned(rows*qd), g.poisoned(rows*qd), g.poisoned(rows*kvd)
		check(ops.NormRope(q1, Buffer{}, qraw, qw, bcos, bsin, pos, rows, heads, hd, qd, 1e-6))
		check(ops.NormRope(k1, Buffer{}, kraw, kw, bcos, bsin, pos, rows, kv, hd, kvd, 1e-6))
		check(ops.KVStoreBF16(kc1, vc1, k1, vv, slot, pos, rows, maxLen, kvd, kvd))
		check(ops.NormRopeKVBF16(q2, kc2, vc2, qkv, qkv.Floats(qd, rows*ld-qd), qkv.Floats(qd+kvd, rows*ld-qd-kvd), qw, kw, bcos, bsin,
			slot, pos, rows, ld, heads, kv, hd, maxLen, 1e-6))
		// KVStoreBF16 with v a column span of the same matrix.
		check(ops.KVStoreBF16(kc3, vc3, k1, qkv.Floats(qd+kvd, rows*ld-qd-kvd), slot, pos, rows, maxLen, kvd, ld))
		sameU16("KVStoreBF16 values from a column span", u16(vc3, len(zero)), u16(vc1, len(zero)))
		sameBits(t, "NormRopeKVBF16 q", g.f32(q2, rows*qd), g.f32(q1, rows*qd))
		sameU16("NormRopeKVBF16 keys", u16(kc2, len(zero)), u16(kc1, len(zero)))
		sameU16("NormRopeKVBF16 values", u16(vc2, len(zero)), u16(vc1, len(zero)))
		written := 0
		for _, v := range u16(kc2, len(zero)) {
			if v != 0 {
				written++
			}
		}
		if written != 3*kv*hd { // three rows with a slot, the fourth padding
			t.Errorf("head size %d: NormRopeKVBF16 wrote %d key elements, want %d", hd, written, 3*kv*hd)
		}
	}

	// A product with an addend: y = x·Wᵀ + add.
	const in, out = 64, 48
	arena := bufOf(g, randF32(r, out*in, 1))
	bl, err := NewBF16Linear(ops, arena, out*in)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Free()
	xin := bufOf(g, randF32(r, rows*in, 1))
	x16 := g.poisoned(rows * in)
	check(ops.ToBF16Rows(x16, xin, rows, in, in))
	add := randF32(r, rows*out, 4)
	plain, fused, many := g.poisoned(rows*out), g.poisoned(rows*out), g.poisoned(rows*out)
	check(bl.Linear(plain, xin, arena, rows, in, out, out, in))
	check(bl.LinearManyBF16(x16, rows, in, Product{Y: many, W: arena, Out: out, LdY: out}))
	sameBits(t, "LinearManyBF16 against Linear", g.f32(many, rows*out), g.f32(plain, rows*out))
	check(bl.LinearManyBF16(x16, rows, in, Product{Y: fused, W: arena, Out: out, LdY: out, Add: bufOf(g, add)}))
	p, f := g.f32(plain, rows*out), g.f32(fused, rows*out)
	for i := range p {
		want := float64(p[i]) + float64(add[i])
		if d := math.Abs(float64(f[i]) - want); d > 1e-6*math.Abs(want)+1e-6 {
			t.Fatalf("product with an addend, element %d: %v, want %v", i, f[i], want)
		}
	}
	if err := ops.LinearMany(xin, rows, in, in, Product{Y: fused, W: arena, Out: out, LdY: out, Add: bufOf(g, add)}); err == nil {
		t.Error("the float32 products took an addend they do not add")
	}
}

// TestDeviceCaptureBesideSync: one goroutine records a graph while others
// synchronise the GPU and free a buffer (an async rollout beside the
// trainer, on one GPU: each opens a Device of its own on the primary
// context). The driver refuses a context synchronisation during any
// stream's recording and loses the recording (so does the emulator), so
// Sync and Free must wait until the recording ends: then the recording
// succeeds, and its replay computes y = 0 + x + z.
func TestDeviceCaptureBesideSync(t *testing.T) {
	g := newGPU(t)
	ops := NewOps(g.d)
	if !ops.GraphsAvailable() {
		t.Skip("graphs unavailable (a profiled run or an old driver)")
	}
	defer ops.CloseGraphs()
	const n = 300
	r := rand.New(rand.NewPCG(8, 1))
	xs, zs := randF32(r, n, 1), randF32(r, n, 1)
	x, z := bufOf(g, xs), bufOf(g, zs)
	y := g.poisoned(n)
	spare, err := g.d.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	trainer, err := Open(g.d.Ordinal) // the other engine's Device
	if err != nil {
		t.Fatal(err)
	}
	defer trainer.Close()
	if err := ops.Add(y, z, n); err != nil { // the module loaded before the recording
		t.Fatal(err)
	}
	recording, release := make(chan struct{}), make(chan struct{})
	type result struct {
		gr  *Graph
		err error
	}
	captured := make(chan result, 1)
	go func() {
		gr, err := ops.Capture(func() error {
			close(recording)
			if err := ops.Add(y, x, n); err != nil {
				return err
			}
			err := ops.Add(y, z, n)
			<-release // the other goroutines' calls come now
			return err
		})
		captured <- result{gr, err}
	}()
	<-recording
	var ended atomic.Bool // set once the recording has ended
	synced, freed := make(chan error, 1), make(chan error, 1)
	go func() {
		err := trainer.Sync()
		if !ended.Load() {
			err = fmt.Errorf("Sync returned during the recording (%v)", err)
		}
		synced <- err
	}()
	go func() {
		err := g.d.Free(spare)
		if !ended.Load() {
			err = fmt.Errorf("Free returned during the recording (%v)", err)
		}
		freed <- err
	}()
	time.Sleep(50 * time.Millisecond) // time for a Sync or Free that does not wait to come through
	ended.Store(true)
	close(release)
	res := <-captured
	if res.err != nil {
		t.Fatalf("recording beside a Sync and a Free: %v", res.err)
	}
	defer res.gr.Close()
	for what, c := range map[string]chan error{"Sync": synced, "Free": freed} {
		if err := <-c; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if err := Upload(g.d, y, make([]float32, n)); err != nil {
		t.Fatal(err)
	}
	if err := res.gr.Launch(); err != nil {
		t.Fatal(err)
	}
	for i, v := range g.f32(y, n) {
		if want := xs[i] + zs[i]; v != want {
			t.Fatalf("replay: y[%d] = %g, want %g", i, v, want)
		}
	}
}
