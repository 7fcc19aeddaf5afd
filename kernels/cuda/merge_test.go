package cuda

import "testing"

// TestMergeProducts: which neighbouring products mergeProducts joins, on
// made-up addresses (no device needed).
func TestMergeProducts(t *testing.T) {
	const in, base, out = 16, 1 << 20, 1 << 24
	// w is the span of a matrix of rows outputs at element offset off of
	// the arena; y a span of the output starting at column col.
	w := func(off, rows int) Buffer { return Buffer{Ptr: base + uint64(off)*4, Size: int64(rows*in) * 4} }
	y := func(col, elt int) Buffer { return Buffer{Ptr: out + uint64(col*elt), Size: 64} }
	q, k, v := w(0, 8), w(8*in, 4), w(12*in, 4)
	qkv := []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 16}, {Y: y(8, 4), W: k, Out: 4, LdY: 16}, {Y: y(12, 4), W: v, Out: 4, LdY: 16}}
	got := mergeProducts(qkv, in, nil)
	if len(got) != 1 || got[0].Out != 16 || got[0].W != (Buffer{Ptr: base, Size: 16 * in * 4}) || got[0].Y.Ptr != out || got[0].LdY != 16 {
		t.Fatalf("q, k, v back to back: %+v, want one product of 16 outputs", got)
	}
	if qkv[0].Out != 8 {
		t.Fatal("mergeProducts changed its argument")
	}
	// gate and up into bf16 [rows, 2·8]: columns two bytes wide.
	gu := []Product{{Y: y(0, 2), W: w(0, 8), Out: 8, LdY: 16, Y16: true}, {Y: y(8, 2), W: w(8*in, 8), Out: 8, LdY: 16, Y16: true}}
	if got := mergeProducts(gu, in, nil); len(got) != 1 || got[0].Out != 16 || !got[0].Y16 {
		t.Fatalf("gate and up in bf16: %+v, want one product", got)
	}
	for _, c := range []struct {
		name string
		ps   []Product
	}{
		{"a gap between the weights", []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 16}, {Y: y(8, 4), W: w(8*in+1, 4), Out: 4, LdY: 16}}},
		{"the weights out of order", []Product{{Y: y(0, 4), W: k, Out: 4, LdY: 16}, {Y: y(4, 4), W: q, Out: 8, LdY: 16}}},
		{"outputs of their own", []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 8}, {Y: y(100, 4), W: k, Out: 4, LdY: 4}}},
		{"a column apart", []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 16}, {Y: y(9, 4), W: k, Out: 4, LdY: 16}}},
		{"bf16 columns read as float32", []Product{{Y: y(0, 2), W: q, Out: 8, LdY: 16, Y16: true}, {Y: y(16, 2), W: k, Out: 4, LdY: 16, Y16: true}}},
		{"one bf16, one float32", []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 16}, {Y: y(8, 4), W: k, Out: 4, LdY: 16, Y16: true}}},
		{"row strides that differ", []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 16}, {Y: y(8, 4), W: k, Out: 4, LdY: 20}}},
		{"past the row", []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 10}, {Y: y(8, 4), W: k, Out: 4, LdY: 10}}},
		{"a weight span shorter than its matrix", []Product{{Y: y(0, 4), W: Buffer{Ptr: base, Size: 4 * in * 4}, Out: 8, LdY: 16}, {Y: y(8, 4), W: w(4*in, 4), Out: 4, LdY: 16}}},
		{"an addend", []Product{{Y: y(0, 4), W: q, Out: 8, LdY: 16}, {Y: y(8, 4), W: k, Out: 4, LdY: 16, Add: y(500, 4)}}},
	} {
		if got := mergeProducts(c.ps, in, nil); len(got) != 2 {
			t.Errorf("%s: %d products, want the 2 given", c.name, len(got))
		}
	}
	// The caller's condition: q and k join, v does not.
	noV := func(a, b Product) bool { return b.W != v }
	if got := mergeProducts(qkv, in, noV); len(got) != 2 || got[0].Out != 12 || got[1].W != v {
		t.Errorf("with v held apart: %+v, want q|k and v", got)
	}
}
