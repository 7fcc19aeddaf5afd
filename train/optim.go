package train

import (
	"errors"
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

	// chunks cut the arena into pieces of at most adamChunk elements, each
	// inside one parameter, so that a piece has one decay setting and the
	// pieces can be updated in parallel.
	chunks []adamChunk
}

// adamChunk is a run of arena elements sharing a weight-decay setting.
type adamChunk struct {
	off, n int
	decay  bool
}

// adamChunkElems bounds a chunk: large enough to amortise the call, small
// enough to balance two or more threads.
const adamChunkElems = 1 << 15

// NewAdamW returns an optimiser with zero moments for m's parameters.
func NewAdamW(m *model.Model, cfg AdamWConfig) (*AdamW, error) {
	return newAdamW(m, cfg, true)
}

// newAdamW is NewAdamW; without moments, the caller provides them.
func newAdamW(m *model.Model, cfg AdamWConfig, moments bool) (*AdamW, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := &AdamW{Config: cfg}
	if moments {
		o.M, o.V = make([]float32, len(m.Arena)), make([]float32, len(m.Arena))
	}
	off := 0
	for _, p := range m.Params() {
		decay := cfg.DecayVectors || len(p.Shape) > 1
		o.chunks = appendChunks(o.chunks, off, p.Size(), decay)
		off += p.Size()
	}
	if off != len(m.Arena) {
		return nil, fmt.Errorf("adamw: parameters cover %d of %d arena elements", off, len(m.Arena))
	}
	return o, nil
}

// appendChunks cuts the n elements at off into chunks of at most
// adamChunkElems.
func appendChunks(cs []adamChunk, off, n int, decay bool) []adamChunk {
	for lo := 0; lo < n; lo += adamChunkElems {
		cs = append(cs, adamChunk{off: off + lo, n: min(adamChunkElems, n-lo), decay: decay})
	}
	return cs
}

// Update applies one AdamW step with learning rate lr to params using grads
// (both of the model's arena length), then increments Step. In the order of
// torch.optim.AdamW:
//
//	p ← p − lr·λ·p                       (decoupled decay, where enabled)
//	m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//	p ← p − lr · (m/(1−β1^t)) / (sqrt(v/(1−β2^t)) + eps)
//
// The per-step constants are computed in float64, the per-element
// arithmetic in float32 by kernels.AdamW (as torch does for float32
// parameters). Every element is independent, so the result does not depend
// on GOMAXPROCS.
func (o *AdamW) Update(params, grads []float32, lr float64) error {
	return o.UpdateScaled(params, grads, lr, 1)
}

// UpdateScaled is Update with every gradient multiplied by gradScale first,
// without modifying grads: pass ClipCoef's coefficient to clip the global
// gradient norm at no extra pass over the gradients.
func (o *AdamW) UpdateScaled(params, grads []float32, lr, gradScale float64) error {
	if len(o.V) != len(o.M) {
		return fmt.Errorf("adamw: state has %d first moments and %d second moments (restored from a different model?)", len(o.M), len(o.V))
	}
	if n := chunksLen(o.chunks); n != len(o.M) {
		return fmt.Errorf("adamw: state has %d moments for an optimiser built for %d parameters (restored from a different model?)", len(o.M), n)
	}
	if len(params) != len(o.M) || len(grads) != len(o.M) {
		return fmt.Errorf("adamw: %d parameters and %d gradients for an optimiser of %d", len(params), len(grads), len(o.M))
	}
	if math.IsNaN(lr) || math.IsInf(lr, 0) || lr < 0 {
		return fmt.Errorf("adamw: learning rate %g, want a finite value >= 0", lr)
	}
	if math.IsNaN(gradScale) || math.IsInf(gradScale, 0) || gradScale < 0 {
		return fmt.Errorf("adamw: gradient scale %g, want a finite value >= 0", gradScale)
	}
	o.Step++
	c := o.Config
	t := float64(o.Step)
	bc1 := 1 - math.Pow(c.Beta1, t)
	bc2 := 1 - math.Pow(c.Beta2, t)
	base := kernels.AdamWStep{
		GradScale:  float32(gradScale),
		Decay:      1,
		Beta1:      float32(c.Beta1),
		OneMinusB1: float32(1 - c.Beta1),
		Beta2:      float32(c.Beta2),
		OneMinusB2: float32(1 - c.Beta2),
		StepSize:   float32(lr / bc1),
		InvSqrtBC2: float32(1 / math.Sqrt(bc2)),
		Eps:        float32(c.Eps),
	}
	decayed := base
	decayed.Decay = float32(1 - lr*c.WeightDecay)
	kernels.ParallelFor(len(o.chunks), func(lo, hi int) {
		for _, ch := range o.chunks[lo:hi] {
			s := base
			if ch.decay {
				s = decayed
			}
			e := ch.off + ch.n
			kernels.AdamW(params[ch.off:e], grads[ch.off:e], o.M[ch.off:e], o.V[ch.off:e], s)
		}
	})
	return nil
}

// ErrNonFinite reports a gradient whose norm is NaN or infinite:
// ClippedStep then leaves the weights and the optimiser state as they were.
var ErrNonFinite = errors.New("non-finite gradient norm, step skipped")

// ClippedStep ends an optimiser step the way every keel trainer (SFT and
// RL) does: it takes the global gradient norm (returned, before clipping),
// skips the step with ErrNonFinite when the norm is not finite, and else
// applies AdamW at lr to the gradient clipped to maxNorm (0: no clipping).
func (o *AdamW) ClippedStep(params, grads []float32, lr, maxNorm float64) (float64, error) {
	norm := GradNorm(grads)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm, ErrNonFinite
	}
	return norm, o.UpdateScaled(params, grads, lr, ClipCoef(norm, maxNorm))
}

func chunksLen(cs []adamChunk) int {
	if len(cs) == 0 {
		return 0
	}
	last := cs[len(cs)-1]
	return last.off + last.n
}

// normBlock is the fixed block size of GradNorm's two-level sum; the order of
// additions depends only on the slice length.
const normBlock = 8192

// GradNorm returns the Euclidean norm of g, accumulated in float64 in a fixed
// order: each block of normBlock elements is summed by kernels.SumSquares
// (blocks in parallel), then the block sums left to right. The value is
// therefore deterministic and independent of GOMAXPROCS.
func GradNorm(g []float32) float64 {
	nb := (len(g) + normBlock - 1) / normBlock
	partial := make([]float64, nb)
	kernels.ParallelFor(nb, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			partial[b] = kernels.SumSquares(g[b*normBlock : min((b+1)*normBlock, len(g))])
		}
	})
	var s float64
	for _, v := range partial {
		s += v
	}
	return math.Sqrt(s)
}

// ClipCoef returns the factor that brings a gradient of the given norm to
// at most maxNorm, as torch.nn.utils.clip_grad_norm_ computes it:
// maxNorm/(norm+1e-6) when that is below 1, else 1. maxNorm <= 0 disables
// clipping (1). A non-finite norm gives 1 too: the caller should skip the
// step instead.
func ClipCoef(norm, maxNorm float64) float64 {
	if maxNorm <= 0 || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return 1
	}
	return min(1, maxNorm/(norm+1e-6))
}

// ClipGradNorm scales g in place so that its norm is at most maxNorm (see
// ClipCoef) and returns the norm before clipping, which is what runs log.
// A non-finite norm leaves g untouched; the caller should skip the step.
// AdamW.UpdateScaled with ClipCoef does the same without writing g.
func ClipGradNorm(g []float32, maxNorm float64) float64 {
	norm := GradNorm(g)
	coef := ClipCoef(norm, maxNorm)
	if coef >= 1 {
		return norm
	}
	c := float32(coef)
	nb := (len(g) + normBlock - 1) / normBlock
	kernels.ParallelFor(nb, func(lo, hi int) {
		x := g[lo*normBlock : min(hi*normBlock, len(g))]
		kernels.Scale(x, x, c)
	})
	return norm
}
