package model

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
)

// initBlock is how many elements one random stream fills. Each block of
// each parameter has its own stream, keyed by the seed, the parameter's name
// and the block index, so blocks can be filled in parallel in any order and
// a parameter's values do not depend on the other parameters (changing the
// vocabulary does not change the layers).
const initBlock = 1 << 16

// Init fills m with fresh weights, deterministically from seed:
//
//   - RMSNorm weights (input, post-attention, q/k and final norms) are 1.
//   - Every other weight (embedding, attention and MLP projections, routers,
//     experts, an untied LM head) is drawn from normal(0, 0.02), the
//     initializer_range of transformers' Qwen3 models.
//   - The projections that write into the residual stream (o_proj, and
//     down_proj of dense MLPs and of every expert) are further scaled by
//     1/sqrt(2·num_hidden_layers), as GPT-2 does, so that the residual
//     stream's variance does not grow with depth at initialisation.
//
// The same seed gives a bitwise identical model on any machine and any
// number of cores: the random streams are math/rand/v2's PCG, and normal
// samples come from the polar method with a logarithm computed here from
// correctly rounded IEEE operations only (no math.Log, whose assembly
// differs between architectures, and no fusable multiply-adds).
func Init(m *Model, seed uint64) {
	type job struct {
		p     *Param
		std   float64 // 0 means "fill with ones"
		block int
	}
	std := InitializerRange
	outStd := InitializerRange / math.Sqrt(float64(2*max(1, m.Config.NumHiddenLayers)))
	kind := map[*Param]float64{}
	for _, l := range m.Layers {
		for _, p := range []*Param{l.InputNorm, l.PostAttnNorm, l.QNorm, l.KNorm} {
			kind[p] = 0
		}
		kind[l.O] = outStd
		if l.Down != nil {
			kind[l.Down] = outStd
		}
		for _, e := range l.Experts {
			kind[e.Down] = outStd
		}
	}
	kind[m.Norm] = 0
	var jobs []job
	for _, p := range m.Params() {
		s, ok := kind[p]
		if !ok {
			s = std
		}
		for b := 0; b*initBlock < len(p.Data); b++ {
			jobs = append(jobs, job{p, s, b})
		}
	}
	seedHi := splitmix64(seed)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(jobs) {
					return
				}
				j := jobs[i]
				lo := j.block * initBlock
				dst := j.p.Data[lo:min(lo+initBlock, len(j.p.Data))]
				if j.std == 0 {
					for k := range dst {
						dst[k] = 1
					}
					continue
				}
				key := splitmix64(fnv1a(j.p.Name) + uint64(j.block))
				fillNormal(dst, j.std, rand.New(rand.NewPCG(seedHi, key)))
			}
		}()
	}
	wg.Wait()
}

// fillNormal fills dst with normal(0, std) samples (Marsaglia's polar
// method, both values of each pair used).
func fillNormal(dst []float32, std float64, r *rand.Rand) {
	for i := 0; i < len(dst); i += 2 {
		var u, v, s float64
		for {
			u = uniform(r)
			v = uniform(r)
			s = float64(u*u) + float64(v*v)
			if s > 0 && s < 1 {
				break
			}
		}
		f := math.Sqrt(-2 * detLog(s) / s) // Sqrt is correctly rounded everywhere
		dst[i] = float32(float64(u*f) * std)
		if i+1 < len(dst) {
			dst[i+1] = float32(float64(v*f) * std)
		}
	}
}

// uniform returns a uniform float64 in [-1, 1) from 53 random bits; every
// step is exact.
func uniform(r *rand.Rand) float64 {
	return float64(r.Uint64()>>11)/(1<<52) - 1
}

// detLog is the natural logarithm of x > 0 (finite, normal or subnormal),
// accurate to a few ulps, computed with +, -, *, / only, each explicitly
// rounded, so the result is the same bits on every IEEE 754 machine.
//
// x = f·2^e with f in [√½, √2); log f = 2·atanh(t), t = (f-1)/(f+1),
// |t| < 0.172, summed as the odd series t + t³/3 + ... to t²³/23, whose
// truncation error is below 1e-19 relative.
func detLog(x float64) float64 {
	f, e := math.Frexp(x) // exact
	if f < math.Sqrt2/2 {
		f *= 2 // exact
		e--
	}
	t := (f - 1) / (f + 1)
	u := float64(t * t)
	p := 1.0 / 23
	for k := 10; k >= 0; k-- {
		p = float64(p*u) + 1/float64(2*k+1)
	}
	return float64(float64(e)*math.Ln2) + float64(2*t*p)
}

// splitmix64 scrambles x (Steele, Lea and Flood's SplitMix64 finaliser) so
// that nearby keys give unrelated PCG states.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// fnv1a is the 64-bit FNV-1a hash of s.
func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
