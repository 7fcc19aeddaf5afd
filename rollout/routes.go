package rollout

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/keel-rl/keel/model"
)

// Routes are the experts the rollout engine chose at every position of a
// sequence (prompt and response) in every MoE layer, compactly: one byte
// per expert id when the model has at most 256 experts (IDs8), else two
// (IDs16). The id of slot s at position t in MoE layer l (Config.MoELayers
// order) is at index (t·Layers + l)·K + s, slots in descending router
// probability, the layout of model.Routes, which R2 and R3 replay.
type Routes struct {
	Tokens, Layers, K int
	Experts           int
	IDs8              []uint8
	IDs16             []uint16
}

// At returns the expert in slot s at position t in MoE layer l.
func (r *Routes) At(t, l, s int) int {
	i := (t*r.Layers+l)*r.K + s
	if r.IDs8 != nil {
		return int(r.IDs8[i])
	}
	return int(r.IDs16[i])
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

// Validate checks the shape, that every id is below Experts and that no
// position repeats an expert within a layer: what a decoder of stored or
// transmitted routes must check before replaying them.
func (r *Routes) Validate() error {
	n, ok := r.size()
	if !ok || r.Experts <= 0 || r.Experts > math.MaxUint16+1 {
		return fmt.Errorf("routes: bad shape [%d, %d, %d] for %d experts", r.Tokens, r.Layers, r.K, r.Experts)
	}
	if r.K > r.Experts {
		return fmt.Errorf("routes: %d experts per token from %d", r.K, r.Experts)
	}
	switch {
	case r.IDs8 != nil && r.IDs16 != nil:
		return fmt.Errorf("routes: both 8- and 16-bit ids set")
	case r.IDs8 != nil && len(r.IDs8) != n, r.IDs16 != nil && len(r.IDs16) != n, r.IDs8 == nil && r.IDs16 == nil && n > 0:
		return fmt.Errorf("routes: %d ids for shape [%d, %d, %d]", max(len(r.IDs8), len(r.IDs16)), r.Tokens, r.Layers, r.K)
	}
	for t := 0; t < r.Tokens; t++ {
		for l := 0; l < r.Layers; l++ {
			for s := 0; s < r.K; s++ {
				id := r.At(t, l, s)
				if id >= r.Experts {
					return fmt.Errorf("routes: position %d, MoE layer %d, slot %d: expert %d out of range [0, %d)", t, l, s, id, r.Experts)
				}
				for s2 := 0; s2 < s; s2++ {
					if r.At(t, l, s2) == id {
						return fmt.Errorf("routes: position %d, MoE layer %d: expert %d chosen twice", t, l, id)
					}
				}
			}
		}
	}
	return nil
}

// Model returns the routes as model.Routes (int32 ids) for the training
// engine's replay (ForwardOptions.Replay).
func (r *Routes) Model() *model.Routes {
	m := model.NewRoutes(r.Tokens, r.Layers, r.K)
	for i := range m.IDs {
		if r.IDs8 != nil {
			m.IDs[i] = int32(r.IDs8[i])
		} else {
			m.IDs[i] = int32(r.IDs16[i])
		}
	}
	return m
}

// FromModel encodes model.Routes (as the training engine records them) of
// a model with the given number of experts compactly, after checking them.
func FromModel(m *model.Routes, experts int) (*Routes, error) {
	r := &Routes{Tokens: m.Tokens, Layers: m.Layers, K: m.K, Experts: experts}
	if n, ok := r.size(); !ok || n != len(m.IDs) {
		return nil, fmt.Errorf("routes: %d ids for shape [%d, %d, %d]", len(m.IDs), m.Tokens, m.Layers, m.K)
	}
	for _, id := range m.IDs {
		if id < 0 || int(id) >= experts {
			return nil, fmt.Errorf("routes: expert %d out of range [0, %d)", id, experts)
		}
	}
	if experts <= 256 {
		r.IDs8 = make([]uint8, len(m.IDs))
		for i, id := range m.IDs {
			r.IDs8[i] = uint8(id)
		}
	} else {
		r.IDs16 = make([]uint16, len(m.IDs))
		for i, id := range m.IDs {
			r.IDs16[i] = uint16(id)
		}
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
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
// Sequences of a few hundred tokens cost a few kilobytes.
func (r *Routes) MarshalBinary() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	width := 1
	if r.IDs16 != nil {
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

// UnmarshalBinary decodes MarshalBinary's encoding and validates the
// result (shape, ids in range, no expert twice at one position), so
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
	if err := d.Validate(); err != nil {
		return err
	}
	*r = d
	return nil
}
