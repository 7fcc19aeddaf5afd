// Package testmodel builds models for tests: weights drawn so that
// activations have unit scale, so attention, routing and sampling are far
// from uniform and numerical comparisons are not trivially satisfied.
package testmodel

import (
	"math"
	"math/rand/v2"

	"github.com/keel-rl/keel/model"
)

// Random returns a model of configuration c with norm weights 1 ± 0.2 and
// matrices of standard deviation 1/sqrt(fan-in), drawn from seed.
func Random(c model.Config, seed uint64) *model.Model {
	m := model.New(c)
	r := rand.New(rand.NewPCG(seed, 7))
	for _, p := range m.Params() {
		if len(p.Shape) == 1 {
			for i := range p.Data {
				p.Data[i] = float32(1 + 0.2*r.NormFloat64())
			}
			continue
		}
		sc := 1 / math.Sqrt(float64(p.Shape[1]))
		for i := range p.Data {
			p.Data[i] = float32(sc * r.NormFloat64())
		}
	}
	return m
}
