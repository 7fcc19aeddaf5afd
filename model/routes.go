package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Routes are the experts chosen at every position of one sequence in each
// MoE layer: what the rollout engine and the training engine record and
// what Routing Replay (R2, R3) forces. The id of slot s at position t in
// the l-th MoE layer (l indexes Config.MoELayers()) is at index
// (t·Layers + l)·K + s, slots in descending router probability.
//
// The ids are stored compactly: one byte each (IDs8) when the model has at
// most 256 experts, else two (IDs16); exactly one of the two is set. Build
// routes with NewRoutes and read and write them with At, Set, Slots and
// SetSlots.
type Routes struct {
	Tokens, Layers, K int
	Experts           int
	IDs8              []uint8
	IDs16             []uint16
}

// MaxExperts is the most experts Routes can hold (16-bit ids).
const MaxExperts = math.MaxUint16 + 1

// NewRoutes allocates routes for tokens × layers × k expert ids of a model
// with the given number of experts (all ids 0): 8-bit ids when experts ≤
// 256, else 16-bit. It panics when experts exceeds MaxExperts.
func NewRoutes(tokens, layers, k, experts int) *Routes {
	if experts > MaxExperts {
		panic(fmt.Sprintf("model: NewRoutes: %d experts, at most %d", experts, MaxExperts))
	}
	r := &Routes{Tokens: tokens, Layers: layers, K: k, Experts: experts}
	if n := tokens * layers * k; experts <= 256 {
		r.IDs8 = make([]uint8, n)
	} else {
		r.IDs16 = make([]uint16, n)
	}
	return r
}

// wide reports whether the ids take two bytes (more than 256 experts).
func (r *Routes) wide() bool { return r.Experts > 256 }

// At returns the expert in slot s at position t in MoE layer l.
func (r *Routes) At(t, l, s int) int {
	i := (t*r.Layers+l)*r.K + s
	if r.IDs8 != nil {
		return int(r.IDs8[i])
	}
	return int(r.IDs16[i])
}

// Set sets the expert in slot s at position t in MoE layer l. It panics
// when id is not in [0, Experts).
func (r *Routes) Set(t, l, s, id int) {
	if uint(id) >= uint(r.Experts) {
		panic(fmt.Sprintf("model: Routes.Set: expert %d out of range [0, %d)", id, r.Experts))
	}
	i := (t*r.Layers+l)*r.K + s
	if r.IDs8 != nil {
		r.IDs8[i] = uint8(id)
	} else {
		r.IDs16[i] = uint16(id)
	}
}

// Slots copies the K expert ids of position t in MoE layer l into dst[:K]
// and returns dst[:K]; it allocates only when cap(dst) < K.
func (r *Routes) Slots(dst []int32, t, l int) []int32 {
	if cap(dst) < r.K {
		dst = make([]int32, r.K)
	}
	dst = dst[:r.K]
	o := (t*r.Layers + l) * r.K
	if r.IDs8 != nil {
		for s, id := range r.IDs8[o : o+r.K] {
			dst[s] = int32(id)
		}
	} else {
		for s, id := range r.IDs16[o : o+r.K] {
			dst[s] = int32(id)
		}
	}
	return dst
}

// SetSlots sets the K expert ids of position t in MoE layer l from
// ids[:K]. It panics when an id is not in [0, Experts).
func (r *Routes) SetSlots(t, l int, ids []int32) {
	o := (t*r.Layers + l) * r.K
	for s, id := range ids[:r.K] {
		if id < 0 || int(id) >= r.Experts {
			panic(fmt.Sprintf("model: Routes.SetSlots: expert %d out of range [0, %d)", id, r.Experts))
		}
		if r.IDs8 != nil {
			r.IDs8[o+s] = uint8(id)
		} else {
			r.IDs16[o+s] = uint16(id)
		}
	}
}

// Equal reports whether r and o have the same shape, number of experts
// and expert ids.
func (r *Routes) Equal(o *Routes) bool {
	return r.Tokens == o.Tokens && r.Layers == o.Layers && r.K == o.K && r.Experts == o.Experts &&
		slices.Equal(r.IDs8, o.IDs8) && slices.Equal(r.IDs16, o.IDs16)
}

// size returns Tokens·Layers·K, or false when a dimension is negative or
// the product overflows (a corrupt header must not pass for a small one).
func (r *Routes) size() (int, bool) {
	if r.Tokens < 0 || r.Layers < 0 || r.K < 0 {
		return 0, false
	}
	n := 1
	for _, d := range []int{r.Tokens, r.Layers, r.K} {
		if d != 0 && n > math.MaxInt32/d {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// checkStorage checks the shape, Experts, and that the id slice of the
// right width (8-bit iff Experts ≤ 256) alone is set and has
// Tokens·Layers·K ids.
func (r *Routes) checkStorage() error {
	n, ok := r.size()
	if !ok || r.Experts <= 0 || r.Experts > MaxExperts {
		return fmt.Errorf("routes: bad shape [%d, %d, %d] for %d experts", r.Tokens, r.Layers, r.K, r.Experts)
	}
	if r.K > r.Experts {
		return fmt.Errorf("routes: %d experts per token from %d", r.K, r.Experts)
	}
	switch {
	case r.IDs8 != nil && r.IDs16 != nil:
		return errors.New("routes: both 8- and 16-bit ids set")
	case r.wide() && r.IDs8 != nil:
		return fmt.Errorf("routes: 8-bit ids for %d experts", r.Experts)
	case !r.wide() && r.IDs16 != nil:
		return fmt.Errorf("routes: 16-bit ids for %d experts", r.Experts)
	case r.IDs8 != nil && len(r.IDs8) != n, r.IDs16 != nil && len(r.IDs16) != n, r.IDs8 == nil && r.IDs16 == nil && n > 0:
		return fmt.Errorf("routes: %d ids for shape [%d, %d, %d]", max(len(r.IDs8), len(r.IDs16)), r.Tokens, r.Layers, r.K)
	}
	return nil
}

// checkIDs checks that every id is below experts and that no position
// repeats an expert within a layer; what names a position in the errors.
func (r *Routes) checkIDs(experts int, what string) error {
	for t := 0; t < r.Tokens; t++ {
		for l := 0; l < r.Layers; l++ {
			for s := 0; s < r.K; s++ {
				id := r.At(t, l, s)
				if id >= experts {
					return fmt.Errorf("routes: %s %d, MoE layer %d, slot %d: expert %d out of range [0, %d)", what, t, l, s, id, experts)
				}
				for s2 := 0; s2 < s; s2++ {
					if r.At(t, l, s2) == id {
						return fmt.Errorf("routes: %s %d, MoE layer %d: expert %d chosen twice", what, t, l, id)
					}
				}
			}
		}
	}
	return nil
}

// Check checks the routes on their own: the shape, the id storage (one
// slice, of the width Experts calls for, of Tokens·Layers·K ids), that
// every id is below Experts and that no position repeats an expert within
// a layer. It is what a decoder of stored or transmitted routes must check
// before replaying them.
func (r *Routes) Check() error {
	if err := r.checkStorage(); err != nil {
		return err
	}
	return r.checkIDs(r.Experts, "position")
}

// Validate checks that r has the right shape for a model with the given
// number of MoE layers, experts and k, that every id is in range and that
// no token repeats an expert within one layer.
func (r *Routes) Validate(layers, experts, k int) error {
	if r.Layers != layers || r.K != k {
		return fmt.Errorf("routes: shape [%d tokens, %d layers, %d] does not match the model's %d MoE layers and top-%d", r.Tokens, r.Layers, r.K, layers, k)
	}
	if r.Experts != experts {
		return fmt.Errorf("routes: recorded for %d experts, the model has %d", r.Experts, experts)
	}
	if err := r.checkStorage(); err != nil {
		return err
	}
	return r.checkIDs(experts, "token")
}

// Nested returns the routes as routes[pos][layer] = the K expert ids, the
// layout keel's JSON outputs use.
func (r *Routes) Nested() [][][]int {
	out := make([][][]int, r.Tokens)
	for t := range out {
		out[t] = make([][]int, r.Layers)
		for l := range out[t] {
			ids := make([]int, r.K)
			for s := range ids {
				ids[s] = r.At(t, l, s)
			}
			out[t][l] = ids
		}
	}
	return out
}

// routesFormat is the first byte of MarshalBinary's encoding.
const routesFormat = 1

// MarshalBinary encodes the routes for storage or transfer: a format
// byte, the id width in bytes (1 or 2), then tokens, layers, k and experts
// as unsigned varints, then the ids (little endian when 2 bytes wide).
// Sequences of a few hundred tokens cost a few kilobytes. The routes must
// pass Check.
func (r *Routes) MarshalBinary() ([]byte, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	width := 1
	if r.wide() {
		width = 2
	}
	b := []byte{routesFormat, byte(width)}
	for _, v := range []int{r.Tokens, r.Layers, r.K, r.Experts} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	if width == 1 {
		return append(b, r.IDs8...), nil
	}
	for _, id := range r.IDs16 {
		b = binary.LittleEndian.AppendUint16(b, id)
	}
	return b, nil
}

// UnmarshalBinary decodes MarshalBinary's encoding and checks the result
// (Check: shape, ids in range, no expert twice at one position), so
// corrupt or hostile input gives an error, never routes that would
// misroute a replay.
func (r *Routes) UnmarshalBinary(b []byte) error {
	if len(b) < 2 || b[0] != routesFormat {
		return errors.New("routes: not a keel routes encoding (bad format byte)")
	}
	width := int(b[1])
	if width != 1 && width != 2 {
		return fmt.Errorf("routes: id width %d, want 1 or 2", width)
	}
	b = b[2:]
	var dims [4]int
	names := [4]string{"tokens", "layers", "k", "experts"}
	for i := range dims {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > math.MaxInt32 || n != len(binary.AppendUvarint(nil, v)) {
			return fmt.Errorf("routes: bad %s field", names[i])
		}
		dims[i], b = int(v), b[n:]
	}
	d := Routes{Tokens: dims[0], Layers: dims[1], K: dims[2], Experts: dims[3]}
	n, ok := d.size()
	if !ok || len(b) != n*width {
		return fmt.Errorf("routes: %d bytes of ids for shape [%d, %d, %d] at %d bytes each", len(b), d.Tokens, d.Layers, d.K, width)
	}
	if width == 1 {
		d.IDs8 = append([]uint8{}, b...)
	} else {
		d.IDs16 = make([]uint16, n)
		for i := range d.IDs16 {
			d.IDs16[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
	}
	if err := d.Check(); err != nil {
		return err
	}
	*r = d
	return nil
}
