package model

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// randomRoutes draws valid routes: k distinct experts at every position
// and layer.
func randomRoutes(rng *rand.Rand, tokens, layers, k, experts int) *Routes {
	r := NewRoutes(tokens, layers, k, experts)
	for t := 0; t < tokens; t++ {
		for l := 0; l < layers; l++ {
			for s, id := range rng.Perm(experts)[:k] {
				r.Set(t, l, s, id)
			}
		}
	}
	return r
}

func sameRoutes(t *testing.T, a, b *Routes) {
	t.Helper()
	if !a.Equal(b) {
		t.Fatalf("routes differ:\n%+v\n%+v", a, b)
	}
}

// The accessors agree with the layout (t·Layers + l)·K + s in both id
// widths, and Slots does not allocate when dst has room.
func TestRoutesAccessors(t *testing.T) {
	for _, experts := range []int{6, 256, 257, 300} {
		r := NewRoutes(3, 2, 4, experts)
		if wide := experts > 256; (r.IDs16 != nil) != wide || (r.IDs8 != nil) == wide {
			t.Fatalf("%d experts: IDs8 %v, IDs16 %v", experts, r.IDs8 != nil, r.IDs16 != nil)
		}
		want := make([]int32, 3*2*4)
		rng := rand.New(rand.NewPCG(1, uint64(experts)))
		for t := 0; t < 3; t++ {
			for l := 0; l < 2; l++ {
				ids := make([]int32, 4)
				for s, id := range rng.Perm(experts)[:4] {
					ids[s] = int32(id)
				}
				copy(want[(t*2+l)*4:], ids)
				if l == 0 {
					r.SetSlots(t, l, ids)
				} else {
					for s, id := range ids {
						r.Set(t, l, s, int(id))
					}
				}
			}
		}
		if err := r.Check(); err != nil {
			t.Fatal(err)
		}
		if err := r.Validate(2, experts, 4); err != nil {
			t.Fatal(err)
		}
		nested := r.Nested()
		buf := make([]int32, 0, 8)
		for tk := 0; tk < 3; tk++ {
			for l := 0; l < 2; l++ {
				got := r.Slots(buf, tk, l)
				if !slices.Equal(got, want[(tk*2+l)*4:(tk*2+l+1)*4]) || &got[0] != &buf[:1][0] {
					t.Fatalf("%d experts: Slots(%d, %d) = %v, want %v in dst", experts, tk, l, got, want[(tk*2+l)*4:(tk*2+l+1)*4])
				}
				for s := 0; s < 4; s++ {
					id := want[(tk*2+l)*4+s]
					if r.At(tk, l, s) != int(id) || nested[tk][l][s] != int(id) {
						t.Fatalf("%d experts: At(%d, %d, %d) = %d, Nested %d, want %d", experts, tk, l, s, r.At(tk, l, s), nested[tk][l][s], id)
					}
				}
			}
		}
		if got := r.Slots(nil, 2, 1); len(got) != 4 || !slices.Equal(got, want[20:]) {
			t.Fatalf("Slots(nil) = %v", got)
		}
		if n := testing.AllocsPerRun(10, func() { r.Slots(buf, 1, 1) }); n != 0 {
			t.Fatalf("Slots allocates %v times", n)
		}
	}
	for _, bad := range []int{-1, 6} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Set(%d) of 6 experts did not panic", bad)
				}
			}()
			NewRoutes(1, 1, 2, 6).Set(0, 0, 0, bad)
		}()
	}
}

// Validate checks routes against a model's shape, naming token, layer and
// slot; Check checks them on their own.
func TestRoutesValidate(t *testing.T) {
	good := randomRoutes(rand.New(rand.NewPCG(3, 4)), 4, 2, 2, 6)
	edit := func(f func(r *Routes)) *Routes {
		r := *good
		r.IDs8 = slices.Clone(good.IDs8)
		f(&r)
		return &r
	}
	cases := []struct {
		name      string
		r         *Routes
		layers, k int
		experts   int
		want      string
		checkWant string // "" when Check passes
	}{
		{"good", good, 2, 2, 6, "", ""},
		{"layers", good, 3, 2, 6, "does not match", ""},
		{"k", good, 2, 3, 6, "does not match", ""},
		{"experts", good, 2, 2, 7, "recorded for 6 experts", ""},
		{"out of range", edit(func(r *Routes) { r.IDs8[(2*2+1)*2+1] = 6 }), 2, 2, 6,
			"token 2, MoE layer 1, slot 1: expert 6 out of range [0, 6)", "position 2, MoE layer 1, slot 1: expert 6 out of range"},
		{"repeat", edit(func(r *Routes) { r.IDs8[3] = r.IDs8[2] }), 2, 2, 6, "token 0, MoE layer 1: expert", "chosen twice"},
		{"short", edit(func(r *Routes) { r.IDs8 = r.IDs8[1:] }), 2, 2, 6, "15 ids for shape [4, 2, 2]", "15 ids"},
		{"no ids", edit(func(r *Routes) { r.IDs8 = nil }), 2, 2, 6, "0 ids", "0 ids"},
		{"both widths", edit(func(r *Routes) { r.IDs16 = make([]uint16, 16) }), 2, 2, 6, "both", "both"},
		{"wide for few", edit(func(r *Routes) { r.IDs8, r.IDs16 = nil, make([]uint16, 16) }), 2, 2, 6, "16-bit ids for 6", "16-bit ids for 6"},
		{"narrow for many", edit(func(r *Routes) { r.Experts = 300 }), 2, 2, 300, "8-bit ids for 300", "8-bit ids for 300"},
		{"negative tokens", edit(func(r *Routes) { r.Tokens = -1 }), 2, 2, 6, "bad shape", "bad shape"},
		{"no experts", edit(func(r *Routes) { r.Experts = 0 }), 2, 2, 0, "bad shape", "bad shape"},
	}
	for _, c := range cases {
		err := c.r.Validate(c.layers, c.experts, c.k)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: Validate: %v, want %q", c.name, err, c.want)
		}
		err = c.r.Check()
		if c.checkWant == "" && err != nil || c.checkWant != "" && (err == nil || !strings.Contains(err.Error(), c.checkWant)) {
			t.Errorf("%s: Check: %v, want %q", c.name, err, c.checkWant)
		}
	}
	if err := NewRoutes(0, 2, 2, 6).Check(); err != nil {
		t.Errorf("no positions: %v", err)
	}
	if err := (&Routes{Layers: 2, K: 2, Experts: 300}).Check(); err != nil {
		t.Errorf("no positions, no ids: %v", err)
	}
}

// Routes survive the binary encoding unchanged, in both id widths.
func TestRoutesRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	r := randomRoutes(rng, 10, 2, 2, 6)
	b, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	// Format, width, four one-byte varints, one byte per id.
	if want := 2 + 4 + r.Tokens*r.Layers*r.K; len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	var back Routes
	if err := back.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	sameRoutes(t, r, &back)

	// 300 experts: two bytes per id.
	wide := randomRoutes(rng, 3, 2, 4, 300)
	if wide.IDs16 == nil {
		t.Fatalf("wide routes %+v", wide)
	}
	b, err = wide.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	// Format, width, varints (300 takes two bytes), two bytes per id.
	if want := 2 + 5 + 2*3*2*4; len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	if err := back.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	sameRoutes(t, wide, &back)

	// No positions.
	empty := NewRoutes(0, 2, 2, 6)
	b, err = empty.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := back.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	sameRoutes(t, empty, &back)

	// Invalid routes do not encode.
	bad := NewRoutes(1, 1, 2, 4)
	bad.IDs8[0], bad.IDs8[1] = 1, 1
	if _, err := bad.MarshalBinary(); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("MarshalBinary with a repeated expert: %v", err)
	}
}

// Decoding rejects every kind of corruption with an error naming it.
func TestRoutesDecodeErrors(t *testing.T) {
	r := randomRoutes(rand.New(rand.NewPCG(5, 6)), 10, 2, 2, 6)
	good, _ := r.MarshalBinary()
	ids := len(good) - r.Tokens*r.Layers*r.K // offset of the first id
	edit := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "format"},
		{"format", edit(func(b []byte) []byte { b[0] = 9; return b }), "format"},
		{"width", edit(func(b []byte) []byte { b[1] = 3; return b }), "width 3"},
		{"truncated", good[:len(good)-1], "bytes of ids"},
		{"trailing", append(slices.Clone(good), 0), "bytes of ids"},
		{"header cut", good[:3], "field"},
		{"out of range", edit(func(b []byte) []byte { b[ids] = 6; return b }), "out of range"},
		{"repeat", edit(func(b []byte) []byte { b[ids+1] = b[ids]; return b }), "chosen twice"},
		{"huge tokens", append([]byte{1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f, 2, 2, 6}, good[ids:]...), "tokens"},
		{"k above experts", append([]byte{1, 1, 1, 1, 3, 2}, 0, 1, 0), "experts per token"},
		{"wide for few", []byte{1, 2, 1, 1, 1, 4, 3, 0}, "16-bit ids for 4"},
		{"narrow for many", []byte{1, 1, 1, 1, 1, 300&0x7f | 0x80, 300 >> 7, 3}, "8-bit ids for 300"},
	}
	for _, c := range cases {
		var d Routes
		err := d.UnmarshalBinary(c.b)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", c.name, err, c.want)
		}
	}
}

// Whatever the bytes, decoding never panics, and what it accepts encodes
// back to the same bytes.
func FuzzRoutesUnmarshal(f *testing.F) {
	f.Add([]byte{1, 1, 1, 1, 2, 4, 0, 3})
	f.Add([]byte{1, 2, 1, 1, 1, 300&0x7f | 0x80, 300 >> 7, 0x2b, 0x01})
	f.Add([]byte{1, 1, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Routes
		if r.UnmarshalBinary(b) != nil {
			return
		}
		if err := r.Check(); err != nil {
			t.Fatalf("accepted routes fail Check: %v", err)
		}
		again, err := r.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted routes do not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding %x gave %x", b, again)
		}
	})
}
