package rollout

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

// sampleRoutes returns the routes of one generated MoE sample.
func sampleRoutes(t *testing.T) *Routes {
	t.Helper()
	m := randomModel(moeConfig(), 12)
	e, err := New(m, Options{Slots: 2, MaxLen: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := e.Generate([][]int32{{1, 2, 3, 4}}, 1, Sampling{Temperature: 1, MaxNewTokens: 6, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	r := s[0].Routes
	if r == nil || r.IDs8 == nil || r.Tokens != 4+len(s[0].Tokens) || r.Layers != 2 || r.K != 2 {
		t.Fatalf("routes %+v", r)
	}
	return r
}

func sameRoutes(t *testing.T, a, b *Routes) {
	t.Helper()
	if a.Tokens != b.Tokens || a.Layers != b.Layers || a.K != b.K || a.Experts != b.Experts ||
		!slices.Equal(a.IDs8, b.IDs8) || !slices.Equal(a.IDs16, b.IDs16) {
		t.Fatalf("routes differ:\n%+v\n%+v", a, b)
	}
}

// Routes survive the binary encoding and the conversion to and from the
// training engine's model.Routes unchanged, in both id widths.
func TestRoutesRoundTrip(t *testing.T) {
	r := sampleRoutes(t)
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
	fm, err := FromModel(r.Model(), r.Experts)
	if err != nil {
		t.Fatal(err)
	}
	sameRoutes(t, r, fm)

	// 300 experts: two bytes per id.
	mr := model.NewRoutes(3, 2, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(mr.IDs); i += 4 {
		for s, id := range rng.Perm(300)[:4] {
			mr.IDs[i+s] = int32(id)
		}
	}
	wide, err := FromModel(mr, 300)
	if err != nil {
		t.Fatal(err)
	}
	if wide.IDs16 == nil || wide.At(2, 1, 3) != int(mr.At(2, 1)[3]) {
		t.Fatalf("wide routes %+v", wide)
	}
	b, _ = wide.MarshalBinary()
	if err := back.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	sameRoutes(t, wide, &back)
	if !slices.Equal(back.Model().IDs, mr.IDs) {
		t.Fatal("wide routes changed in the round trip")
	}
}

// Decoding rejects every kind of corruption with an error naming it.
func TestRoutesDecodeErrors(t *testing.T) {
	r := sampleRoutes(t)
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
	}
	for _, c := range cases {
		var d Routes
		err := d.UnmarshalBinary(c.b)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want one mentioning %q", c.name, err, c.want)
		}
	}
	bad := model.NewRoutes(1, 1, 2)
	bad.IDs[0], bad.IDs[1] = 1, 1
	if _, err := FromModel(bad, 4); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("FromModel with a repeated expert: %v", err)
	}
	bad.IDs[1] = 4
	if _, err := FromModel(bad, 4); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("FromModel with expert 4 of 4: %v", err)
	}
}

// Whatever the bytes, decoding never panics, and what it accepts encodes
// back to the same bytes.
func FuzzRoutesUnmarshal(f *testing.F) {
	f.Add([]byte{1, 1, 1, 1, 2, 4, 0, 3})
	f.Add([]byte{1, 2, 1, 1, 1, 300 & 0x7f, 0x02, 0x2b, 0x01})
	f.Add([]byte{1, 1, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Routes
		if r.UnmarshalBinary(b) != nil {
			return
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
