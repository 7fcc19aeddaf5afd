package rollout

import (
	"fmt"

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

// Validate checks the shape, that every id is below Experts and that no
// position repeats an expert within a layer: what a decoder of stored or
// transmitted routes must check before replaying them.
func (r *Routes) Validate() error {
	n := r.Tokens * r.Layers * r.K
	if r.Tokens < 0 || r.Layers < 0 || r.K < 0 || r.Experts <= 0 {
		return fmt.Errorf("routes: bad shape [%d, %d, %d] for %d experts", r.Tokens, r.Layers, r.K, r.Experts)
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
