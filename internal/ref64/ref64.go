// Package ref64 is a deliberately plain float64 implementation of the Qwen3 /
// Qwen3-MoE forward pass, written with explicit loops and sharing no code with
// the kernels or train packages. It exists so that the training engine's
// log-probabilities, entropies, auxiliary loss and (through finite
// differences) gradients can be checked against an independent computation
// whose rounding error is far below float32's.
//
// Semantics follow Hugging Face transformers' modeling_qwen3.py and
// modeling_qwen3_moe.py: RMSNorm x·rsqrt(mean(x²)+eps)·w; q_norm and k_norm per
// head over head_dim before rotate-half RoPE with inv_freq_i =
// theta^(-2i/head_dim) and positions restarting at 0 for every sequence;
// grouped-query attention (query head h reads key/value head h/(heads/kv));
// scale head_dim^-0.5; causal softmax; router p = softmax(x·W_rᵀ), top-k with
// ties broken towards the lower expert index, gates renormalised over the
// top-k when norm_topk_prob; SwiGLU experts down(silu(gate x)·up x); pre-norm
// residual layout; final norm; tied or untied head.
//
// Routing Replay (docs/method.md §2): a forced expert set I keeps its gates computed
// from the live router scores restricted to I, g_i = exp(s_i)/Σ_{j∈I} exp(s_j)
// when norm_topk_prob, else the full-softmax probability p_i.
//
// Speed is not a goal; clarity is.
package ref64

import (
	"fmt"
	"math"
	"sort"

	"github.com/keel-rl/keel/model"
)

// Model is a float64 copy of a model.Model's parameters. Arena holds every
// parameter in the same order and at the same offsets as the source model's
// arena, so a test can perturb Arena[i] and compare with gradient entry i.
type Model struct {
	Config model.Config
	Arena  []float64

	embed, norm, head []float64
	layers            []layer
}

type expert struct{ gate, up, down []float64 }

type layer struct {
	inNorm, q, k, v, o, qNorm, kNorm, postNorm []float64
	gate, up, down                             []float64 // dense MLP
	router                                     []float64 // MoE
	experts                                    []expert
}

// FromModel returns a float64 copy of m's parameters.
func FromModel(m *model.Model) *Model {
	r := &Model{Config: m.Config, Arena: make([]float64, len(m.Arena))}
	for i, v := range m.Arena {
		r.Arena[i] = float64(v)
	}
	off := map[*model.Param]int{}
	o := 0
	for _, p := range m.Params() {
		off[p] = o
		o += p.Size()
	}
	view := func(p *model.Param) []float64 {
		if p == nil {
			return nil
		}
		b := off[p]
		return r.Arena[b : b+p.Size() : b+p.Size()]
	}
	r.embed = view(m.Embed)
	r.norm = view(m.Norm)
	r.head = view(m.LMHead) // the embedding's view when tied
	r.layers = make([]layer, len(m.Layers))
	for i := range m.Layers {
		ml := &m.Layers[i]
		l := &r.layers[i]
		l.inNorm, l.q, l.k, l.v, l.o = view(ml.InputNorm), view(ml.Q), view(ml.K), view(ml.V), view(ml.O)
		l.qNorm, l.kNorm, l.postNorm = view(ml.QNorm), view(ml.KNorm), view(ml.PostAttnNorm)
		l.gate, l.up, l.down = view(ml.Gate), view(ml.Up), view(ml.Down)
		l.router = view(ml.Router)
		for _, e := range ml.Experts {
			l.experts = append(l.experts, expert{view(e.Gate), view(e.Up), view(e.Down)})
		}
	}
	return r
}

// Options select routing for Forward.
type Options struct {
	// Replay forces the expert sets, one entry per sequence covering every
	// position; a nil slice or nil entry means live routing.
	Replay []*model.Routes
	// AuxMask, when set (one entry per sequence, nil entry = live), replaces
	// the live top-k in the auxiliary loss's expert mask (tokens_per_expert).
	// Hugging Face recomputes that mask from the router logits; freezing it
	// lets finite differences step over points where the live top-k would
	// flip. The mask carries no gradient either way.
	AuxMask []*model.Routes
	// Temperature divides the logits before the softmax (0 means 1).
	Temperature float64
}

// Result is the output of Forward.
type Result struct {
	// LogProbs[s][t] = log p(tokens[t+1] | tokens[0..t]) for t < len(seq)-1.
	LogProbs [][]float64
	// Entropy[s][t] is the full-vocabulary entropy at the same positions.
	Entropy [][]float64
	// Routes are the experts used at every position (nil for dense models):
	// the live top-k in descending router probability, or the forced sets.
	Routes []*model.Routes
	// AuxLoss is Hugging Face's load_balancing_loss_func over all MoE layers
	// (see auxLoss); 0 for dense models.
	AuxLoss float64
}

// Forward runs every sequence through the model independently.
func (m *Model) Forward(seqs [][]int32, opt Options) (*Result, error) {
	c := &m.Config
	moeLayers := c.MoELayers()
	nl, ne, k := len(moeLayers), c.NumExperts, c.NumExpertsPerTok
	if opt.Replay != nil && len(opt.Replay) != len(seqs) {
		return nil, fmt.Errorf("ref64: %d replay routes for %d sequences", len(opt.Replay), len(seqs))
	}
	if opt.AuxMask != nil && len(opt.AuxMask) != len(seqs) {
		return nil, fmt.Errorf("ref64: %d aux masks for %d sequences", len(opt.AuxMask), len(seqs))
	}
	checkRoutes := func(what string, s int, r *model.Routes) error {
		if r == nil {
			return nil
		}
		if nl == 0 {
			return fmt.Errorf("ref64: sequence %d: %s routes given for a dense model", s, what)
		}
		if r.Tokens != len(seqs[s]) {
			return fmt.Errorf("ref64: sequence %d: %s routes cover %d tokens, sequence has %d", s, what, r.Tokens, len(seqs[s]))
		}
		if err := r.Validate(nl, ne, k); err != nil {
			return fmt.Errorf("ref64: sequence %d: %s %w", s, what, err)
		}
		return nil
	}
	res := &Result{}
	var aux auxAcc
	if nl > 0 {
		aux.count = make([]float64, ne)
		aux.prob = make([]float64, ne)
	}
	for s, toks := range seqs {
		for t, id := range toks {
			if id < 0 || int(id) >= c.VocabSize {
				return nil, fmt.Errorf("ref64: sequence %d, position %d: token %d out of range [0, %d)", s, t, id, c.VocabSize)
			}
		}
		var replay, mask *model.Routes
		if opt.Replay != nil {
			replay = opt.Replay[s]
		}
		if opt.AuxMask != nil {
			mask = opt.AuxMask[s]
		}
		if err := checkRoutes("replay", s, replay); err != nil {
			return nil, err
		}
		if err := checkRoutes("aux-mask", s, mask); err != nil {
			return nil, err
		}
		temp := opt.Temperature
		if temp == 0 {
			temp = 1
		}
		lp, ent, routes := m.sequence(toks, replay, mask, &aux, temp)
		res.LogProbs = append(res.LogProbs, lp)
		res.Entropy = append(res.Entropy, ent)
		res.Routes = append(res.Routes, routes)
	}
	if nl > 0 {
		res.AuxLoss = aux.loss(ne)
	} else {
		res.Routes = nil
	}
	return res, nil
}

// auxAcc accumulates Hugging Face's load_balancing_loss_func. HF concatenates
// the router logits of all MoE layers into N = layers·tokens rows, takes
// routing_weights = softmax(logits), expert_mask = one_hot(topk(weights, k)),
// tokens_per_expert = mean over rows of the mask ([k, E]),
// router_prob_per_expert = mean over rows of the weights ([E]), and returns
// E · Σ_{k,e} tokens_per_expert[k,e] · router_prob_per_expert[e]. Summing the
// mask over its k slots first gives E · Σ_e (count_e/N) · (Σ_rows p_e / N),
// where count_e is the number of rows whose top-k contains e. Note that the
// product mixes layers: counts and probabilities are pooled over all MoE
// layers before multiplying, exactly as HF does.
type auxAcc struct {
	count, prob []float64
	rows        int
}

func (a *auxAcc) loss(ne int) float64 {
	if a.rows == 0 {
		return 0
	}
	n := float64(a.rows)
	var s float64
	for e := 0; e < ne; e++ {
		s += (a.count[e] / n) * (a.prob[e] / n)
	}
	return float64(ne) * s
}

func rmsnorm(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * inv * w[i]
	}
	return out
}

// matvec returns W·x for W stored [rows, len(x)] row-major.
func matvec(w, x []float64) []float64 {
	n := len(x)
	out := make([]float64, len(w)/n)
	for r := range out {
		var s float64
		for i := 0; i < n; i++ {
			s += w[r*n+i] * x[i]
		}
		out[r] = s
	}
	return out
}

// rope rotates one head vector in place at position pos (rotate-half form).
func rope(x []float64, pos int, theta float64) {
	d := len(x)
	half := d / 2
	for i := 0; i < half; i++ {
		freq := math.Pow(theta, -float64(2*i)/float64(d))
		a := float64(pos) * freq
		cs, sn := math.Cos(a), math.Sin(a)
		x1, x2 := x[i], x[i+half]
		x[i] = x1*cs - x2*sn
		x[i+half] = x2*cs + x1*sn
	}
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

// swiglu returns down(silu(gate x) · up x).
func swiglu(gate, up, down, x []float64) []float64 {
	g := matvec(gate, x)
	u := matvec(up, x)
	for i := range g {
		g[i] = silu(g[i]) * u[i]
	}
	return matvec(down, g)
}

func softmax(x []float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, v)
	}
	out := make([]float64, len(x))
	var s float64
	for i, v := range x {
		out[i] = math.Exp(v - mx)
		s += out[i]
	}
	for i := range out {
		out[i] /= s
	}
	return out
}

// topK returns the indices of the k largest scores, largest first, ties
// broken towards the lower index.
func topK(scores []float64, k int) []int {
	idx := make([]int, len(scores))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return scores[idx[a]] > scores[idx[b]] })
	return idx[:k]
}

// sequence runs one sequence through the model: the embedding, every layer's
// attention block then MLP or MoE block (each a pre-norm residual update of
// x), and the head's log-probabilities and entropies.
func (m *Model) sequence(toks []int32, replay, mask *model.Routes, aux *auxAcc, temp float64) (lp, ent []float64, routes *model.Routes) {
	c := &m.Config
	h := c.HiddenSize
	T := len(toks)
	moeLayers := c.MoELayers()
	if len(moeLayers) > 0 {
		routes = model.NewRoutes(T, len(moeLayers), c.NumExpertsPerTok, c.NumExperts)
	}

	x := make([][]float64, T)
	for t, id := range toks {
		x[t] = append([]float64(nil), m.embed[int(id)*h:int(id+1)*h]...)
	}
	moeIdx := 0
	for li := range m.layers {
		l := &m.layers[li]
		m.attention(l, x)
		if l.router == nil {
			m.mlp(l, x)
			continue
		}
		m.moe(l, x, moeIdx, replay, mask, aux, routes)
		moeIdx++
	}
	lp, ent = m.logProbs(x, toks, temp)
	return lp, ent, routes
}

// qkv returns every position's queries, keys and values for layer l: the
// projections of the input-normed x, with q_norm/k_norm and RoPE applied per
// head to the queries and keys.
func (m *Model) qkv(l *layer, x [][]float64) (qs, ks, vs [][]float64) {
	c := &m.Config
	hd, nh, nkv, eps := c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads, c.RMSNormEps
	T := len(x)
	qs = make([][]float64, T)
	ks = make([][]float64, T)
	vs = make([][]float64, T)
	for t := 0; t < T; t++ {
		hn := rmsnorm(x[t], l.inNorm, eps)
		q, kk := matvec(l.q, hn), matvec(l.k, hn)
		for hh := 0; hh < nh; hh++ {
			v := rmsnorm(q[hh*hd:(hh+1)*hd], l.qNorm, eps)
			rope(v, t, c.RopeTheta)
			copy(q[hh*hd:], v)
		}
		for hh := 0; hh < nkv; hh++ {
			v := rmsnorm(kk[hh*hd:(hh+1)*hd], l.kNorm, eps)
			rope(v, t, c.RopeTheta)
			copy(kk[hh*hd:], v)
		}
		qs[t], ks[t], vs[t] = q, kk, matvec(l.v, hn)
	}
	return qs, ks, vs
}

// attention adds layer l's causal grouped-query attention block to x.
func (m *Model) attention(l *layer, x [][]float64) {
	c := &m.Config
	hd, nh := c.HeadDim, c.NumAttentionHeads
	group := nh / c.NumKeyValueHeads
	T := len(x)
	qs, ks, vs := m.qkv(l, x)
	scale := 1 / math.Sqrt(float64(hd))
	for t := 0; t < T; t++ {
		att := make([]float64, nh*hd)
		for hh := 0; hh < nh; hh++ {
			kv := hh / group
			sc := make([]float64, t+1)
			for s := 0; s <= t; s++ {
				var d float64
				for i := 0; i < hd; i++ {
					d += qs[t][hh*hd+i] * ks[s][kv*hd+i]
				}
				sc[s] = d * scale
			}
			p := softmax(sc)
			for s := 0; s <= t; s++ {
				for i := 0; i < hd; i++ {
					att[hh*hd+i] += p[s] * vs[s][kv*hd+i]
				}
			}
		}
		o := matvec(l.o, att)
		// x[t] is not read again by this layer's attention (q, k, v are
		// computed), so updating it in place is safe.
		for i := range o {
			x[t][i] += o[i]
		}
	}
}

// mlp adds dense layer l's SwiGLU MLP block to x.
func (m *Model) mlp(l *layer, x [][]float64) {
	for t := range x {
		y := swiglu(l.gate, l.up, l.down, rmsnorm(x[t], l.postNorm, m.Config.RMSNormEps))
		for i := range y {
			x[t][i] += y[i]
		}
	}
}

// moe adds MoE layer l (the moeIdx-th) to x: it routes every position
// (live, or the replay's forced sets), accumulates the auxiliary-loss
// statistics into aux (the mask's sets instead of the live top-k when mask is
// set), records the experts used in routes and adds the gated experts.
func (m *Model) moe(l *layer, x [][]float64, moeIdx int, replay, mask *model.Routes, aux *auxAcc, routes *model.Routes) {
	k := m.Config.NumExpertsPerTok
	for t := range x {
		hn := rmsnorm(x[t], l.postNorm, m.Config.RMSNormEps)
		s := matvec(l.router, hn)
		p := softmax(s)
		live := topK(s, k)
		// Auxiliary-loss statistics from the live logits.
		aux.rows++
		for e := range p {
			aux.prob[e] += p[e]
		}
		if mask != nil {
			for j := 0; j < k; j++ {
				aux.count[mask.At(t, moeIdx, j)]++
			}
		} else {
			for _, e := range live {
				aux.count[e]++
			}
		}
		chosen := make([]int, k)
		if replay != nil {
			for j := range chosen {
				chosen[j] = replay.At(t, moeIdx, j)
			}
		} else {
			copy(chosen, live)
		}
		gates := m.gates(s, p, chosen)
		for j, e := range chosen {
			routes.Set(t, moeIdx, j, e)
			ex := &l.experts[e]
			y := swiglu(ex.gate, ex.up, ex.down, hn)
			for i := range y {
				x[t][i] += gates[j] * y[i]
			}
		}
	}
}

// gates returns the weights of the chosen experts from the live router
// scores s and probabilities p = softmax(s): renormalised over the chosen set
// when norm_topk_prob, else the full-softmax probabilities.
func (m *Model) gates(s, p []float64, chosen []int) []float64 {
	gates := make([]float64, len(chosen))
	if m.Config.NormTopKProb {
		// exp(s_i)/Σ_{j∈I} exp(s_j), from the live scores.
		mx := math.Inf(-1)
		for _, e := range chosen {
			mx = math.Max(mx, s[e])
		}
		var z float64
		for j, e := range chosen {
			gates[j] = math.Exp(s[e] - mx)
			z += gates[j]
		}
		for j := range gates {
			gates[j] /= z
		}
	} else {
		for j, e := range chosen {
			gates[j] = p[e]
		}
	}
	return gates
}

// logProbs returns, for every position but the last, the log-probability of the
// next token and the full-vocabulary entropy, from the final-normed x's
// logits divided by temp.
func (m *Model) logProbs(x [][]float64, toks []int32, temp float64) (lp, ent []float64) {
	T := len(toks)
	for t := 0; t+1 < T; t++ {
		hn := rmsnorm(x[t], m.norm, m.Config.RMSNormEps)
		logits := matvec(m.head, hn)
		for i := range logits {
			logits[i] /= temp
		}
		mx := math.Inf(-1)
		for _, v := range logits {
			mx = math.Max(mx, v)
		}
		var z float64
		for _, v := range logits {
			z += math.Exp(v - mx)
		}
		lse := mx + math.Log(z)
		var H float64
		for _, v := range logits {
			l := v - lse
			H -= math.Exp(l) * l
		}
		lp = append(lp, logits[toks[t+1]]-lse)
		ent = append(ent, H)
	}
	return lp, ent
}
