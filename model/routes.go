package model

import "fmt"

// Routes are the experts chosen for each token of one sequence in each MoE
// layer: IDs[(t*Layers+l)*K+s] is the s-th expert of token t in the l-th MoE
// layer (l indexes Config.MoELayers()), in descending router probability.
// They are what Routing Replay (R2, R3) records and forces.
type Routes struct {
	Tokens, Layers, K int
	IDs               []int32
}

// NewRoutes allocates routes for tokens × layers × k expert ids.
func NewRoutes(tokens, layers, k int) *Routes {
	return &Routes{Tokens: tokens, Layers: layers, K: k, IDs: make([]int32, tokens*layers*k)}
}

// At returns the k expert ids of token t in MoE layer l.
func (r *Routes) At(t, l int) []int32 {
	o := (t*r.Layers + l) * r.K
	return r.IDs[o : o+r.K]
}

// Validate checks that r has the right shape for the given number of MoE
// layers, experts and k, that every id is in range and that no token repeats
// an expert within one layer.
func (r *Routes) Validate(layers, experts, k int) error {
	if r.Layers != layers || r.K != k {
		return fmt.Errorf("routes: shape [%d tokens, %d layers, %d] does not match the model's %d MoE layers and top-%d", r.Tokens, r.Layers, r.K, layers, k)
	}
	if len(r.IDs) != r.Tokens*r.Layers*r.K {
		return fmt.Errorf("routes: %d ids for shape [%d, %d, %d]", len(r.IDs), r.Tokens, r.Layers, r.K)
	}
	for t := 0; t < r.Tokens; t++ {
		for l := 0; l < r.Layers; l++ {
			ids := r.At(t, l)
			for s, id := range ids {
				if id < 0 || int(id) >= experts {
					return fmt.Errorf("routes: token %d, MoE layer %d, slot %d: expert %d out of range [0, %d)", t, l, s, id, experts)
				}
				for _, prev := range ids[:s] {
					if prev == id {
						return fmt.Errorf("routes: token %d, MoE layer %d: expert %d chosen twice", t, l, id)
					}
				}
			}
		}
	}
	return nil
}
