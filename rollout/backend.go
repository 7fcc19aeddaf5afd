package rollout

import (
	"math"

	"github.com/keel-rl/keel/model"
)

// Backend is the forward pass of a rollout Engine: the model's weights, a
// KV cache of Options().Slots sequences of up to Options().MaxLen
// positions, and one decoding step at a time. The Engine is the batcher
// over it (slots, prompt sharing, sampling, seeds, routes of whole
// sequences, weight versions); it talks to its backend through these
// methods only and never looks at the backend's internals, so a CPU
// backend (New's) and a GPU one are interchangeable (NewWithBackend).
//
// A backend is driven by one goroutine at a time and need not be safe for
// concurrent use.
//
// Batch invariance is the backend's property, and the batcher's results
// rest on it: everything a step computes for a row (its keys and values,
// its log-probabilities, its routes) must depend only on the row's token
// and position, its temperature and its slot's keys and values at the
// positions below it (cached, or computed by earlier rows of the same slot
// in the same step), never on other slots' rows, the number of rows, their
// order or how the work is split. Prompt sharing (CopyPrefix) and the guarantee
// that a Scheduler's request gets exactly what Generate gives it alone
// both depend on it. In Exact precision a backend reproduces the training
// engine's forward bit for bit (log mu == log pi_old, identical routes).
type Backend interface {
	// Config returns the configuration of the model the backend serves.
	Config() model.Config
	// Options returns the backend's sizes and precision, defaults filled
	// in: the limits every StepBatch respects (at most StepRows rows and
	// Slots output rows, slots in [0, Slots), positions in [0, MaxLen)).
	// Slots >= 1, MaxLen >= 2 and StepRows >= Slots.
	Options() Options
	// Step runs the rows of b through the model, as described at
	// StepBatch: each row's keys and values go into the cache at (its
	// slot, its position), and the log-probabilities of b's output rows
	// and the routes of every row are written into b. The backend keeps
	// no reference to b after it returns. An error (a device failure)
	// leaves the cache and b's outputs unspecified; the batcher then
	// abandons the sequences in flight and may call Step again for new
	// ones: a backend that cannot recover (a sticky device error) keeps
	// returning an error, and Close must still release what it holds.
	Step(b *StepBatch) error
	// CopyPrefix copies the cached keys and values of positions [0, n) of
	// slot src to the same positions of slot dst, in every layer (prompt
	// sharing: the G samples of a prompt compute its prefill once). It is
	// called between steps; after it, the cache of dst is bit for bit what
	// computing those positions in dst would have left. A backend whose
	// copy can fail remembers the error and returns it from the next Step.
	CopyPrefix(dst, src, n int)
	// Load replaces the weights with m's, converted to the backend's
	// precision into storage of its own: m is valid during the call only
	// (a training engine's weights change at its next step), so the
	// backend copies what it needs and keeps no reference. The batcher
	// has checked that m has the backend's Config and calls Load only
	// between steps; the KV cache's contents need not survive it (the
	// sequences in flight during a weight switch, GenerateSwitching, have
	// their caches computed again from position 0). On error the batcher
	// runs no step until a Load succeeds.
	Load(m *model.Model) error
	// Close releases the weights, the cache and any workers; the backend
	// is not used afterwards. It cannot fail in a way the batcher could act
	// on, so it reports nothing: a backend logs what it must.
	Close()
}

// StepBatch is one decoding step's input and output. The Engine owns it
// (allocated once, for the backend's Options) and fills the inputs; the
// backend's Step fills the outputs in place, so a step allocates nothing.
//
// Inputs. Rows: Slot[r], Pos[r] and Tok[r] say that row r feeds token Tok
// at position Pos of the sequence in slot Slot (len(Slot) == len(Pos) ==
// len(Tok) == Rows() <= StepRows). The rows of a slot are contiguous and in
// increasing position, and every position below a row's is either cached
// for its slot (computed by an earlier step, or copied by CopyPrefix) or
// an earlier row of this step: a row attends over positions [0, Pos]
// of its slot. Output rows: OutRow[o] is the step row whose next-token
// distribution is wanted (at most one per slot, so len(OutRow) <= Slots),
// OutTemp[o] its temperature (len(OutTemp) == len(OutRow)).
//
// Outputs. LogProbs[o*V : (o+1)*V] (V = Config().VocabSize) is, for output
// row o, the log-softmax over the vocabulary of the row's logits divided
// by OutTemp[o], in float32: each logit (the LM head applied to the final
// norm of the row's hidden state) is divided by the temperature in
// float32 unless it is 1 or 0 (0 is greedy decoding, which reports the
// untempered distribution), then the log-softmax is taken. Only the first
// len(OutRow)*V entries are written. Routes[ml][r*k : (r+1)*k] (k =
// NumExpertsPerTok) are the experts row r was routed to in the ml-th MoE
// layer (counting MoE layers in model order, Config.IsMoELayer), in the
// order model.TopK gives them (most probable first, lower id first on
// ties), from the softmax of the router's logits; only the first Rows()*k
// entries of each are written. Routes is nil for dense models.
//
// Drawing on the backend (a Drawer whose Draws reports true; others never
// see Draw set): Draw[o] (len(Draw) == len(OutRow)) is -1 for an output
// row the batcher samples itself from LogProbs, as above, and otherwise
// asks the backend to draw the row's token by DrawRow's rule from the
// log-probabilities it computed (Draw[o] the uniform in [0, 1); at
// temperature 0 it is ignored and the draw is the argmax), writing the
// token to Drawn[o] and its log-probability to DrawnLP[o] instead of the
// row's LogProbs, which it need not write. So a GPU moves a token and a
// float per row to the host, not a vocabulary of floats. A drawn row whose
// policy truncates (TopK[o] > 0 or 0 < TopP[o] < 1; TopK and TopP are
// empty or one per output row) is drawn by DrawTruncated's rule instead,
// its truncated log-probability written to DrawnTLP[o] (for other drawn
// rows DrawnTLP[o] is DrawnLP[o]). A drawn row with TopN[o] > 0 (TopN
// empty or one per output row, at most MaxTopLogProbs) also gets its
// TopN[o] most probable tokens and their log-probabilities, the most
// probable first and the lower id first among equals, in
// Top[o*MaxTopLogProbs:].
type StepBatch struct {
	Slot, Pos, Tok []int32   // per row
	OutRow         []int32   // per output row: its step row
	OutTemp        []float32 // per output row: its temperature
	LogProbs       []float32 // [Slots][vocab]: the first len(OutRow) rows are the step's
	Routes         [][]int32 // per MoE layer: [StepRows][k], the first Rows() rows the step's

	Draw     []float64      // per output row: its uniform, or -1 (the batcher samples)
	TopK     []int32        // per output row drawn by the backend: its top-k (0: off)
	TopP     []float64      // per output row drawn by the backend: its top-p (0 or 1: off)
	TopN     []int32        // per output row drawn by the backend: the top log-probs to report
	Drawn    []int32        // [Slots]: per output row with Draw >= 0, the token drawn
	DrawnLP  []float32      // [Slots]: its log-probability under the row's LogProbs
	DrawnTLP []float32      // [Slots]: under the truncated distribution it was drawn from
	Top      []TokenLogProb // [Slots][MaxTopLogProbs]: a drawn row's TopN most probable tokens
}

// Truncates reports whether output row o is drawn from a truncated
// distribution (StepBatch.TopK, TopP).
func (b *StepBatch) Truncates(o int) bool {
	return (o < len(b.TopK) && b.TopK[o] > 0) || (o < len(b.TopP) && b.TopP[o] > 0 && b.TopP[o] < 1)
}

// A Drawer is a Backend that can draw output rows' tokens itself
// (StepBatch.Draw): a GPU backend, where copying every output row's
// log-probabilities to the host would cost more than the step. The draw
// follows DrawRow's rule (DrawTruncated's under top-k or top-p), so the
// same seeds give the same samples (up to a probability within rounding
// of a sampling boundary) as the batcher's own sampling, and it reports
// the top log-probabilities a policy asks for (StepBatch.TopN).
type Drawer interface {
	Backend
	// Draws reports whether Step honours StepBatch.Draw; if false the
	// batcher never sets it.
	Draws() bool
}

// DrawRow is the rule by which an untruncated policy draws a token from
// the log-probabilities z (tempered and normalised, as StepBatch.LogProbs)
// with the uniform u in [0, 1): at temperature 0 the most probable token
// (the lowest id among equals); otherwise the first token, in token order,
// at which the running float64 sum of exp(z) exceeds u times the sum over
// the whole row, tokens of probability 0 never drawn. It returns the token
// and z at it. A Drawer's draw is checked against it.
func DrawRow(z []float32, u float64, temp float32) (int32, float32) {
	if temp == 0 {
		return greedy(z)
	}
	i := drawFull(z, make([]float32, len(z)), u)
	return int32(i), z[i]
}

// NearDrawBoundary reports whether u times the total of exp(z) lies
// within rounding (1e-6 of the total) of the running sum that ends at
// token i: where two exact implementations of DrawRow's rule, adding in
// different orders, may draw neighbouring tokens. A Drawer's tests accept
// a draw other than DrawRow's only there.
func NearDrawBoundary(z []float32, u float64, i int32) bool {
	var total, cum float64
	for j, v := range z {
		p := math.Exp(float64(v))
		total += p
		if j <= int(i) {
			cum += p
		}
	}
	return math.Abs(cum-u*total) <= 1e-6*total
}

// DrawTruncated is the rule by which a policy with top-k or top-p draws a
// token from the log-probabilities z (as DrawRow's) with the uniform u in
// [0, 1) at a temperature other than 0: the candidates are z's tokens in
// descending probability (the lower id first among equals), cut to the
// first topK (off unless 0 < topK < len(z)), then to the shortest prefix
// whose running float64 sum of p = exp(z) reaches topP (off unless
// 0 < topP < 1); the draw is the first candidate, in that order, at which
// the running sum exceeds u times the kept total. It returns the token, z
// at it and its log-probability under the kept distribution (z minus the
// log of the kept total). A Drawer's truncated draws are checked against
// it.
func DrawTruncated(z []float32, u float64, topK int, topP float64) (tok int32, lp, tlp float32) {
	i, tlp := drawTruncated(z, make([]float32, len(z)), make([]int32, len(z)), u, topK, topP)
	return i, z[i], tlp
}

// NearTruncBoundary reports whether DrawTruncated's cut or draw for z, u,
// topK and topP lies within rounding (1e-6 of the total probability) of a
// boundary: a running sum of the candidates' probabilities within that of
// topP (where top-p cuts) or of u times a kept total within that of the
// cut (where the draw lands). Two exact implementations adding in
// different orders may differ there, and only there.
func NearTruncBoundary(z []float32, u float64, topK int, topP float64) bool {
	p := make([]float32, len(z))
	for i, v := range z {
		p[i] = float32(math.Exp(float64(v)))
	}
	var total float64
	for _, v := range p {
		total += float64(v)
	}
	tol := 1e-6 * total
	cand := candidates(z, p, make([]int32, len(z)), topK, 0)
	var cum float64
	sums := make([]float64, len(cand))
	for i, id := range cand {
		cum += float64(p[id])
		sums[i] = cum
	}
	kept := cum
	if topP > 0 && topP < 1 {
		for _, s := range sums {
			if math.Abs(s-topP) <= tol {
				return true
			}
			if s >= topP {
				kept = s
				break
			}
		}
	}
	target := u * kept
	for _, s := range sums {
		if math.Abs(s-target) <= tol {
			return true
		}
	}
	return false
}

// greedy returns the most probable token of z (the lowest id among
// equals) and z at it.
func greedy(z []float32) (int32, float32) {
	best := 0
	for i, v := range z {
		if v > z[best] {
			best = i
		}
	}
	return int32(best), z[best]
}

// newStepBatch allocates a batch for the limits of opt and the model c.
func newStepBatch(c *model.Config, opt Options) StepBatch {
	b := StepBatch{
		Slot: make([]int32, 0, opt.StepRows), Pos: make([]int32, 0, opt.StepRows),
		Tok:    make([]int32, 0, opt.StepRows),
		OutRow: make([]int32, 0, opt.Slots), OutTemp: make([]float32, 0, opt.Slots),
		LogProbs: make([]float32, opt.Slots*c.VocabSize),
		Draw:     make([]float64, 0, opt.Slots), TopK: make([]int32, 0, opt.Slots), TopP: make([]float64, 0, opt.Slots),
		TopN:  make([]int32, 0, opt.Slots),
		Drawn: make([]int32, opt.Slots), DrawnLP: make([]float32, opt.Slots), DrawnTLP: make([]float32, opt.Slots),
		Top: make([]TokenLogProb, opt.Slots*MaxTopLogProbs),
	}
	for i := 0; i < c.NumHiddenLayers; i++ {
		if c.IsMoELayer(i) {
			b.Routes = append(b.Routes, make([]int32, opt.StepRows*c.NumExpertsPerTok))
		}
	}
	return b
}

// Rows returns the number of rows of the step.
func (b *StepBatch) Rows() int { return len(b.Slot) }

// reset empties the rows and output rows, keeping the buffers.
func (b *StepBatch) reset() {
	b.Slot, b.Pos, b.Tok = b.Slot[:0], b.Pos[:0], b.Tok[:0]
	b.OutRow, b.OutTemp, b.Draw = b.OutRow[:0], b.OutTemp[:0], b.Draw[:0]
	b.TopK, b.TopP, b.TopN = b.TopK[:0], b.TopP[:0], b.TopN[:0]
}

// add appends a row: token tok at position pos of slot's sequence.
func (b *StepBatch) add(slot, pos int, tok int32) {
	b.Slot = append(b.Slot, int32(slot))
	b.Pos = append(b.Pos, int32(pos))
	b.Tok = append(b.Tok, tok)
}

// output makes the last row an output row at temperature temp, sampled
// by the batcher (Draw -1), returning its output index.
func (b *StepBatch) output(temp float32) int {
	b.OutRow = append(b.OutRow, int32(len(b.Slot)-1))
	b.OutTemp = append(b.OutTemp, temp)
	b.Draw = append(b.Draw, -1)
	b.TopK, b.TopP, b.TopN = append(b.TopK, 0), append(b.TopP, 0), append(b.TopN, 0)
	return len(b.OutRow) - 1
}
