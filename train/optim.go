package train

import (
	"fmt"
	"math"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// AdamWConfig holds AdamW's hyper-parameters. The learning rate is not here:
// it comes from a Schedule at every step.
type AdamWConfig struct {
	Beta1       float64 // first-moment decay (torch default 0.9)
	Beta2       float64 // second-moment decay (torch default 0.999)
	Eps         float64 // added to sqrt(v̂) (torch default 1e-8)
	WeightDecay float64 // decoupled decay λ: p -= lr·λ·p (torch default 0.01)
	// DecayVectors also decays 1-D parameters (RMSNorm weights). Off by
	// default: decaying a norm's gain towards 0 shrinks the whole activation,
	// which is rarely what anyone wants.
	DecayVectors bool
}

// DefaultAdamWConfig returns torch.optim.AdamW's defaults.
func DefaultAdamWConfig() AdamWConfig {
	return AdamWConfig{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01}
}

// Validate reports a hyper-parameter outside its meaningful range.
func (c AdamWConfig) Validate() error {
	switch {
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return fmt.Errorf("adamw: beta1 = %g, want 0 <= beta1 < 1", c.Beta1)
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return fmt.Errorf("adamw: beta2 = %g, want 0 <= beta2 < 1", c.Beta2)
	case !(c.Eps > 0):
		return fmt.Errorf("adamw: eps = %g, want > 0", c.Eps)
	case !(c.WeightDecay >= 0) || math.IsInf(c.WeightDecay, 0):
		return fmt.Errorf("adamw: weight_decay = %g, want a finite value >= 0", c.WeightDecay)
	}
	return nil
}

// AdamW is torch.optim.AdamW (decoupled weight decay, bias-corrected moments)
// over a model's whole arena. Its state is exported so that checkpoints can
// save and restore it exactly: M and V are laid out like model.Model.Arena,
// Step counts the updates taken. To restore, build one with NewAdamW for the
// same model and configuration, then copy M, V and Step into it.
type AdamW struct {
	Config AdamWConfig
	M, V   []float32 // first and second moments, one entry per arena element
	Step   int64     // number of updates applied so far

	decay []bool // per arena element: apply weight decay
}

// NewAdamW returns an optimiser with zero moments for m's parameters.
func NewAdamW(m *model.Model, cfg AdamWConfig) (*AdamW, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := &AdamW{Config: cfg, M: make([]float32, len(m.Arena)), V: make([]float32, len(m.Arena))}
	o.decay = make([]bool, len(m.Arena))
	off := 0
	for _, p := range m.Params() {
		n := p.Size()
		d := cfg.DecayVectors || len(p.Shape) > 1
		for i := off; i < off+n; i++ {
			o.decay[i] = d
		}
		off += n
	}
	if off != len(m.Arena) {
		return nil, fmt.Errorf("adamw: parameters cover %d of %d arena elements", off, len(m.Arena))
	}
	return o, nil
}

// Update applies one AdamW step with learning rate lr to params using grads
// (both of the model's arena length), then increments Step. In the order of
// torch.optim.AdamW:
//
//	p ← p − lr·λ·p                       (decoupled decay, where enabled)
//	m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//	p ← p − lr · (m/(1−β1^t)) / (sqrt(v/(1−β2^t)) + eps)
//
// Arithmetic is done in float64 per element and stored as float32; every
// element is independent, so the result does not depend on GOMAXPROCS.
func (o *AdamW) Update(params, grads []float32, lr float64) error {
	if len(o.V) != len(o.M) || len(o.decay) != len(o.M) {
		return fmt.Errorf("adamw: state has %d first moments, %d second moments for %d parameters (restored from a different model?)", len(o.M), len(o.V), len(o.decay))
	}
	if len(params) != len(o.M) || len(grads) != len(o.M) {
		return fmt.Errorf("adamw: %d parameters and %d gradients for an optimiser of %d", len(params), len(grads), len(o.M))
	}
	if math.IsNaN(lr) || math.IsInf(lr, 0) || lr < 0 {
		return fmt.Errorf("adamw: learning rate %g, want a finite value >= 0", lr)
	}
	o.Step++
	c := o.Config
	t := float64(o.Step)
	bc1 := 1 - math.Pow(c.Beta1, t)
	bc2 := 1 - math.Pow(c.Beta2, t)
	decay := 1 - lr*c.WeightDecay
	const chunk = 4096
	kernels.ParallelFor((len(params)+chunk-1)/chunk, func(lo, hi int) {
		end := min(hi*chunk, len(params))
		for i := lo * chunk; i < end; i++ {
			p := float64(params[i])
			if o.decay[i] {
				p *= decay
			}
			g := float64(grads[i])
			m := c.Beta1*float64(o.M[i]) + (1-c.Beta1)*g
			v := c.Beta2*float64(o.V[i]) + (1-c.Beta2)*g*g
			o.M[i], o.V[i] = float32(m), float32(v)
			p -= lr * (m / bc1) / (math.Sqrt(v/bc2) + c.Eps)
			params[i] = float32(p)
		}
	})
	return nil
}

// normBlock is the fixed block size of GradNorm's two-level sum; the order of
// additions depends only on the slice length.
const normBlock = 8192

// GradNorm returns the Euclidean norm of g, accumulated in float64 in a fixed
// order: each block of normBlock elements is summed left to right (blocks in
// parallel), then the block sums left to right. The value is therefore
// deterministic and independent of GOMAXPROCS.
func GradNorm(g []float32) float64 {
	nb := (len(g) + normBlock - 1) / normBlock
	partial := make([]float64, nb)
	kernels.ParallelFor(nb, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			var s float64
			for _, v := range g[b*normBlock : min((b+1)*normBlock, len(g))] {
				s += float64(v) * float64(v)
			}
			partial[b] = s
		}
	})
	var s float64
	for _, v := range partial {
		s += v
	}
	return math.Sqrt(s)
}

// ClipGradNorm scales g in place so that its norm is at most maxNorm, like
// torch.nn.utils.clip_grad_norm_: coefficient maxNorm/(norm+1e-6), applied
// only when it is below 1. It returns the norm before clipping, which is what
// runs log. maxNorm <= 0 disables clipping. A non-finite norm leaves g
// untouched; the caller should skip the step.
func ClipGradNorm(g []float32, maxNorm float64) float64 {
	norm := GradNorm(g)
	if maxNorm <= 0 || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm
	}
	coef := maxNorm / (norm + 1e-6)
	if coef >= 1 {
		return norm
	}
	c := float32(coef)
	for i := range g {
		g[i] *= c
	}
	return norm
}
