// Package train is keel's training engine: a teacher-forced forward pass over
// whole packed sequences of a Qwen3 / Qwen3-MoE model that returns per-token
// log-probabilities, entropies and MoE routes, and a backward pass that
// accumulates the gradient of Σ_t c_t·log π(y_t) (plus optional entropy and
// load-balancing terms) into a gradient model of the same layout.
//
// # Forward arithmetic (what the rollout engine's exact mode replicates)
//
// Every step below is computed per token row with the kernels package, so a
// token's values depend only on its own sequence prefix, never on the other
// sequences of the batch (batch invariance). For a token at position pos
// (positions restart at 0 in every sequence), x starts as a copy of its
// embedding row, then each decoder layer computes:
//
//   - xn = kernels.RMSNorm(x, input_layernorm, float32(eps));
//   - q = xn·Wqᵀ, k = xn·Wkᵀ, v = xn·Wvᵀ with kernels.Gemm (row invariant;
//     q/k/v may run as one GEMM over adjacent weights, which gives the same
//     bits, as every output element is the same sum in the same order);
//   - per q head and k head: kernels.RMSNorm over head_dim with q_norm or
//     k_norm, then kernels.RoPE with the tables of model.RopeTables;
//   - per query head h: kernels.AttendRow(out, q_h, K, V, pos+1,
//     kv_heads·head_dim, kernels.AttentionScale(head_dim), probs) over the
//     keys and values of kv head h/(heads/kv_heads) at positions 0..pos;
//   - h = x + out·Woᵀ (float32 add, element by element);
//   - xn2 = kernels.RMSNorm(h, post_attention_layernorm, float32(eps));
//   - dense MLP: x = h + kernels.SwiGLU(xn2·Wgateᵀ, xn2·Wupᵀ)·Wdownᵀ;
//   - MoE: p = kernels.Softmax(xn2·Wrouterᵀ); the experts are model.TopK(p) or the
//     replayed ones, in slot order; the gates are model.GateWeights(p); each
//     expert's output is SwiGLU(xn2·Gateᵀ, xn2·Upᵀ)·Downᵀ; model.CombineExperts
//     gives x = h + ((g_0·y_0) + g_1·y_1) + ... in slot order.
//
// Finally xf = kernels.RMSNorm(x, norm, float32(eps)), z = xf·LMHeadᵀ,
// kernels.LogSoftmax(z) and log π(y) = z[y]; the entropy is -Σ_v p_v·z_v
// with p = kernels.Exp(z), accumulated in float64 in vocabulary order.
package train

import (
	"errors"
	"fmt"
	"math"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// Engine holds a model, gradient buffers of the same shapes, and the
// activations saved by the last Forward for Backward. Its buffers are
// allocated once and reused by later calls of the same or smaller size,
// because the engine runs every RL step. An Engine is not safe for
// concurrent use.
type Engine struct {
	Model *model.Model
	// Grad holds the gradients in the model's layout (one arena:
	// Grad.Arena is the flat gradient, in the order of Model.Params).
	Grad *model.Model

	fw    *fwdState // the last forward's saved activations; nil before the first
	valid bool      // whether fw holds a completed forward
	rope  ropeCache
	pool  scratchPool
	mix   arenaIndex // where each parameter sits in Model.Arena
	gix   arenaIndex // the same for Grad.Arena
	// noFuse forces the per-layer products (tests compare both paths).
	noFuse bool

	// The optimiser (see NewTrainer): its configuration (nil: none, an
	// engine that only scores), and its state, created at first use.
	optCfg *AdamWConfig
	optim  *AdamW
}

// New returns an engine for m with a zero gradient model.
func New(m *model.Model) *Engine {
	e := &Engine{Model: m, Grad: m.ZeroLike()}
	e.mix = newArenaIndex(e.Model)
	e.gix = newArenaIndex(e.Grad)
	return e
}

// ZeroGrad sets every gradient to zero, since Backward accumulates.
func (e *Engine) ZeroGrad() {
	clear(e.Grad.Arena)
}

// ForwardOptions select routing replay, route recording and entropies.
type ForwardOptions struct {
	// Replay holds, per sequence, the expert sets to force (R2 / R3). A nil
	// slice or a nil entry routes live. An entry covers all len(tokens)
	// positions of its sequence, MoE layers in Config.MoELayers() order.
	Replay []*model.Routes
	// Record asks for the routes used: the live top-k in descending
	// probability, or the replayed ones.
	Record bool
	// NoEntropy skips the entropies, which cost a pass over the vocabulary.
	NoEntropy bool
	// Temperature divides the logits before the softmax (in float32, as the
	// rollout engine divides them when it samples at that temperature), so
	// that log pi_old and log pi_theta are the policy the rollout engine
	// sampled from. 0 means 1 (no tempering); entropies are those of the
	// tempered distribution, and Backward differentiates through 1/T.
	Temperature float64
	// Backward says a Backward of this Forward's loss follows: an engine
	// may keep what it would otherwise recompute there (the GPU engine's
	// bf16 mode keeps its logits where they fit). Forward-only calls (log
	// pi_old, a reference's log-probs, scoring) leave it false.
	Backward bool
}

// Result is what one Forward computed.
type Result struct {
	// LogProbs[s][t] = log π(tokens[t+1] | tokens[0..t]) of sequence s:
	// len(tokens)-1 entries.
	LogProbs [][]float32
	// Entropy[s][t] is the full-vocabulary entropy of the same
	// distribution (nil with NoEntropy).
	Entropy [][]float32
	// Routes are the experts used per sequence (nil unless Record on an MoE
	// model).
	Routes []*model.Routes
	// AuxLoss is the MoE load-balancing loss of this forward, as Hugging
	// Face's load_balancing_loss_func computes it over the router outputs
	// of all MoE layers concatenated: with N = tokens·MoE layers rows,
	// p_n the full router softmax of row n and c_e the number of (row,
	// slot) pairs routed to expert e,
	//
	//	AuxLoss = E · Σ_e (c_e / N) · (Σ_n p_n,e / N).
	//
	// The counts are not differentiable; the gradient flows through p.
	// Under replay the counts are those of the replayed experts (the ones
	// actually used). 0 for a dense model.
	AuxLoss float64
}

// Loss is the scalar that Backward differentiates:
//
//	Σ_s Σ_t LogProb[s][t]·log π_s,t + Σ_s Σ_t Entropy[s][t]·H_s,t + Aux·AuxLoss.
type Loss struct {
	LogProb [][]float32 // c[s][t], the shape of Result.LogProbs
	Entropy [][]float32 // optional e[s][t] (nil: no entropy term)
	Aux     float64     // weight of Result.AuxLoss
}

// Forward runs the model over seqs (each a full token sequence: prompt and
// response), saves what Backward needs and returns the log-probabilities of
// every next token.
func (e *Engine) Forward(seqs [][]int32, opt ForwardOptions) (*Result, error) {
	e.valid = false
	if err := validateConfig(&e.Model.Config); err != nil {
		return nil, err
	}
	if err := e.checkModels(); err != nil {
		return nil, err
	}
	if err := validateInput(&e.Model.Config, seqs, opt); err != nil {
		return nil, err
	}
	if e.fw == nil {
		e.fw = &fwdState{}
	}
	f := e.fw
	f.setup(e.Model, seqs, opt)
	e.forward(f, opt)
	e.valid = true
	return e.result(f, opt), nil
}

// Backward accumulates into e.Grad the gradient of l with respect to every
// parameter, using the activations saved by the last Forward. It may be
// called more than once after one Forward. The weights must not change
// between the Forward and its Backward (step the optimiser afterwards).
func (e *Engine) Backward(l Loss) error {
	if !e.valid || e.fw == nil {
		return errors.New("train: Backward called without a successful Forward")
	}
	f := e.fw
	if err := CheckLoss(l, f.lens); err != nil {
		return err
	}
	e.backward(f, l)
	return nil
}

// CheckForward reports what a Trainer's Forward must refuse: a
// configuration the engines cannot run, or input that does not fit it
// (empty or too long sequences, tokens outside the vocabulary, a bad
// temperature or replay). Every engine calls it, so that they refuse the
// same input with the same words.
func CheckForward(c *model.Config, seqs [][]int32, opt ForwardOptions) error {
	if err := validateConfig(c); err != nil {
		return err
	}
	return validateInput(c, seqs, opt)
}

// CheckLoss reports a Loss that does not match the last Forward's
// sequences of lengths lens, or holds a non-finite coefficient.
func CheckLoss(l Loss, lens []int) error {
	if err := checkShape("LogProb", l.LogProb, lens, false); err != nil {
		return err
	}
	if err := checkShape("Entropy", l.Entropy, lens, true); err != nil {
		return err
	}
	if math.IsNaN(l.Aux) || math.IsInf(l.Aux, 0) {
		return fmt.Errorf("train: Loss.Aux = %v is not finite", l.Aux)
	}
	return nil
}

// checkModels verifies that every parameter of Model and Grad holds the
// data its shape needs and that Grad has Model's layout, and refreshes the
// arena indexes when either model was replaced.
func (e *Engine) checkModels() error {
	if e.Model == nil || e.Grad == nil {
		return errors.New("train: Engine has no Model or Grad (use train.New)")
	}
	mp, gp := e.Model.Params(), e.Grad.Params()
	if len(mp) != len(gp) {
		return fmt.Errorf("train: Grad has %d parameters, Model %d", len(gp), len(mp))
	}
	for i, p := range mp {
		if len(p.Data) != p.Size() {
			return fmt.Errorf("train: parameter %s has %d values for shape %v", p.Name, len(p.Data), p.Shape)
		}
		g := gp[i]
		if len(g.Data) != g.Size() || !equalShape(p.Shape, g.Shape) {
			return fmt.Errorf("train: gradient %s has shape %v and %d values, parameter has shape %v", g.Name, g.Shape, len(g.Data), p.Shape)
		}
	}
	if !sameArena(e.mix.arena, e.Model.Arena) {
		e.mix = newArenaIndex(e.Model)
	}
	if !sameArena(e.gix.arena, e.Grad.Arena) {
		e.gix = newArenaIndex(e.Grad)
	}
	return nil
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func sameArena(a, b []float32) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func checkShape(field string, c [][]float32, lens []int, optional bool) error {
	if c == nil && optional {
		return nil
	}
	if len(c) != len(lens) {
		return fmt.Errorf("train: Loss.%s has %d sequences, the last Forward had %d", field, len(c), len(lens))
	}
	for s, row := range c {
		if len(row) != lens[s]-1 {
			return fmt.Errorf("train: Loss.%s[%d] has %d entries, want %d (sequence length - 1)", field, s, len(row), lens[s]-1)
		}
		for t, v := range row {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("train: Loss.%s[%d][%d] = %v is not finite", field, s, t, v)
			}
		}
	}
	return nil
}

// validateConfig checks what the engine relies on, so a bad configuration is
// an error rather than an index panic.
func validateConfig(c *model.Config) error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("train: config %s = %v: %s", field, v, want)
	}
	switch {
	case c.VocabSize <= 0:
		return bad("vocab_size", c.VocabSize, "must be positive")
	case c.HiddenSize <= 0:
		return bad("hidden_size", c.HiddenSize, "must be positive")
	case c.NumHiddenLayers < 0:
		return bad("num_hidden_layers", c.NumHiddenLayers, "must not be negative")
	case c.NumAttentionHeads <= 0:
		return bad("num_attention_heads", c.NumAttentionHeads, "must be positive")
	case c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0:
		return bad("num_key_value_heads", c.NumKeyValueHeads, "must be positive and divide num_attention_heads")
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return bad("head_dim", c.HeadDim, "must be positive and even")
	case !(c.RMSNormEps > 0):
		return bad("rms_norm_eps", c.RMSNormEps, "must be positive")
	case !(c.RopeTheta > 0):
		return bad("rope_theta", c.RopeTheta, "must be positive")
	}
	if c.NumExperts > 0 {
		if c.NumExpertsPerTok <= 0 || c.NumExpertsPerTok > c.NumExperts {
			return bad("num_experts_per_tok", c.NumExpertsPerTok, fmt.Sprintf("must be in [1, num_experts=%d]", c.NumExperts))
		}
		if len(c.MoELayers()) > 0 && c.MoeIntermediateSize <= 0 {
			return bad("moe_intermediate_size", c.MoeIntermediateSize, "must be positive")
		}
	}
	if len(c.MoELayers()) < c.NumHiddenLayers && c.IntermediateSize <= 0 {
		return bad("intermediate_size", c.IntermediateSize, "must be positive")
	}
	return nil
}

func validateInput(c *model.Config, seqs [][]int32, opt ForwardOptions) error {
	if len(seqs) == 0 {
		return errors.New("train: Forward: no sequences")
	}
	for s, seq := range seqs {
		if len(seq) == 0 {
			return fmt.Errorf("train: Forward: sequence %d is empty", s)
		}
		if c.MaxPositionEmbeddings > 0 && len(seq) > c.MaxPositionEmbeddings {
			return fmt.Errorf("train: Forward: sequence %d has %d tokens, more than max_position_embeddings = %d", s, len(seq), c.MaxPositionEmbeddings)
		}
		for t, tok := range seq {
			if tok < 0 || int(tok) >= c.VocabSize {
				return fmt.Errorf("train: Forward: sequence %d, position %d: token %d out of vocabulary [0, %d)", s, t, tok, c.VocabSize)
			}
		}
	}
	if t := opt.Temperature; t < 0 || math.IsNaN(t) || math.IsInf(t, 0) {
		return fmt.Errorf("train: Forward: temperature %g, want a finite value > 0 (0: none)", t)
	}
	if opt.Replay != nil && len(opt.Replay) != len(seqs) {
		return fmt.Errorf("train: Forward: ForwardOptions.Replay has %d entries for %d sequences", len(opt.Replay), len(seqs))
	}
	nMoE := len(c.MoELayers())
	for s, r := range opt.Replay {
		if r == nil {
			continue
		}
		if nMoE == 0 {
			return fmt.Errorf("train: Forward: ForwardOptions.Replay[%d] given for a model without MoE layers", s)
		}
		if r.Tokens != len(seqs[s]) {
			return fmt.Errorf("train: Forward: ForwardOptions.Replay[%d] covers %d tokens, sequence has %d", s, r.Tokens, len(seqs[s]))
		}
		if err := r.Validate(nMoE, c.NumExperts, c.NumExpertsPerTok); err != nil {
			return fmt.Errorf("train: Forward: ForwardOptions.Replay[%d]: %w", s, err)
		}
	}
	return nil
}

// result copies the per-sequence outputs out of the saved activations.
func (e *Engine) result(f *fwdState, opt ForwardOptions) *Result {
	r := &Result{LogProbs: make([][]float32, len(f.lens)), AuxLoss: f.aux}
	if !opt.NoEntropy {
		r.Entropy = make([][]float32, len(f.lens))
	}
	for s, n := range f.lens {
		st := f.starts[s]
		r.LogProbs[s] = append([]float32(nil), f.tlp[st:st+n-1]...)
		if r.Entropy != nil {
			r.Entropy[s] = append([]float32(nil), f.ent[st:st+n-1]...)
		}
	}
	if opt.Record && len(f.moeIdx) > 0 {
		nl, k := len(f.moeIdx), f.cfg.NumExpertsPerTok
		r.Routes = make([]*model.Routes, len(f.lens))
		for s, n := range f.lens {
			rt := model.NewRoutes(n, nl, k, f.cfg.NumExperts)
			for i := 0; i < n; i++ {
				t := f.starts[s] + i
				for l, li := range f.moeIdx {
					rt.SetSlots(i, l, f.layers[li].moe.ids[t*k:(t+1)*k])
				}
			}
			r.Routes[s] = rt
		}
	}
	return r
}

// entropyRow returns -Σ p_v·z_v of one log-softmax row z with
// p = kernels.Exp(z) (written to scratch p), accumulated in float64 in
// vocabulary order.
func entropyRow(z, p []float32) float32 {
	kernels.Exp(p, z)
	var h float64
	for v, zv := range z {
		h -= float64(p[v]) * float64(zv)
	}
	return float32(h)
}
