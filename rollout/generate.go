package rollout

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
)

// Sampling holds the settings of Generate (for all its sequences) and of
// a Scheduler's Request (for its own).
type Sampling struct {
	// Temperature divides the logits before the softmax; 0 is greedy
	// decoding (the most probable token, lowest id on ties).
	Temperature float64
	// TopK keeps only the K most probable tokens (0: off).
	TopK int
	// TopP keeps the smallest set of most probable tokens whose
	// probability reaches TopP (0 or 1: off).
	TopP float64
	// MaxNewTokens bounds each response.
	MaxNewTokens int
	// Stop tokens end a response; the stop token is part of it.
	Stop []int32
	// TopLogProbs > 0 also reports, at every position, the TopLogProbs most
	// probable tokens with their log-probabilities under the full softmax
	// at the sampling temperature (Sample.TopLogProbs): what OpenAI's
	// logprobs / top_logprobs answer. At most MaxTopLogProbs.
	TopLogProbs int
	// Seed fixes the samples: sequence (prompt i, sample j) draws from its
	// own random stream derived from (Seed, i, j), so results do not depend
	// on the slot count or on which sequences share a batch.
	Seed uint64
}

// Truncated reports whether top-k or top-p truncation is on: whether the
// samples come from a truncated distribution, so that log mu is the
// truncated one (Sample.TruncLogProbs). Greedy decoding never truncates.
// It is exported so that a client of remote servers asks for and reads the
// same log-probs as the engine computes.
func (s *Sampling) Truncated() bool {
	return s.Temperature != 0 && (s.TopK > 0 || (s.TopP > 0 && s.TopP < 1))
}

// Sample is one generated response.
type Sample struct {
	Prompt int     // index of the prompt in Generate's input (0 for a Request)
	Index  int     // sample number within the prompt, 0..n-1
	Tokens []int32 // the response (a stop token included)
	// LogProbs[t] is log mu(Tokens[t]): the log-probability under the full
	// softmax at the sampling temperature (logits divided by T in float32
	// before the log-softmax). The training engine tempers its logits the
	// same way (train.ForwardOptions.Temperature), so this is the
	// counterpart of its log pi_old: bit-identical in exact precision at
	// any temperature. Greedy decoding (T = 0) reports the untempered
	// distribution.
	LogProbs []float32
	// TruncLogProbs[t] is the log-probability under the distribution the
	// token was actually drawn from, renormalised over the top-k / top-p
	// set; nil when truncation is off. It is log mu_old for the RL loop's
	// IS weights when truncation is on (the behaviour policy is the
	// truncated one); the gap to LogProbs measures what truncation does.
	TruncLogProbs []float32
	// TopLogProbs[t] are the Sampling.TopLogProbs most probable tokens at
	// response position t, most probable first (ties: lower id first);
	// nil unless asked for.
	TopLogProbs [][]TokenLogProb
	// Routes are the experts chosen at every position of prompt and
	// response (MoE models only; nil for dense ones), compactly (8-bit ids
	// for models of at most 256 experts, else 16-bit).
	Routes *model.Routes
	// Finish is "stop" (a stop token) or "length" (MaxNewTokens or the
	// engine's MaxLen reached).
	Finish string
	// Version is the weight version that generated the sample.
	Version int64
}

// MaxTopLogProbs bounds Sampling.TopLogProbs (OpenAI's limit).
const MaxTopLogProbs = 20

// MinTemperature is the smallest positive Sampling.Temperature. The
// logits are divided by the temperature in float32: below this the
// quotients overflow to infinities (NaN log-probabilities), and below
// float32's range the temperature itself rounds to 0. Greedy decoding is
// Temperature 0.
const MinTemperature = 1e-5

// TokenLogProb is a token and its log-probability.
type TokenLogProb struct {
	Token   int32
	LogProb float32
}

// Token is one sampled token as a Request's OnToken hears of it: the
// token, its LogProbs and TruncLogProbs entries (0 when truncation is
// off) and, when asked for, its position's most probable tokens (valid
// during the call only: copy them to keep them).
type Token struct {
	ID           int32
	LogProb      float32
	TruncLogProb float32
	Top          []TokenLogProb
}

// slotState is one slot's sequence; its buffers are allocated once, with
// the engine, and reused by every Generate (and every Request).
type slotState struct {
	active       bool
	tail         bool   // finished; its last token's routes are computed next step
	waiting      bool   // for another slot to finish computing the shared prompt
	grp          *group // the prompt (and settings) the sequence samples
	idx          int    // its sample number within grp
	promptLen    int
	cached       int     // positions already in the KV cache
	seq          []int32 // prompt, then response
	lp, tlp      []float32
	routes       []uint8 // [pos][moe layers][k], experts ≤ 256
	routes16     []uint16
	rng          rand.PCG
	finish       string
	outIdx       int // this step's output row, or -1
	sampled      int32
	sampLP, sTLP float32
	top          []TokenLogProb // TopLogProbs per response position, flat
	stepTop      [MaxTopLogProbs]TokenLogProb
}

// genState is what Generate (or a Scheduler) works in, allocated with
// the engine: the slots' sequences, log-probabilities and routes (MaxLen
// positions each) and the samplers' scratch. With a real model's routes
// (hundreds of bytes per position) this is large: allocating it per call
// would churn the garbage collector every RL step.
type genState struct {
	slots []slotState
	idBuf [][]int32   // per worker: candidate token ids for truncation
	pBuf  [][]float32 // per worker: probabilities of one row
}

func (e *Engine) allocGen() {
	L := e.opt.MaxLen
	perPos := len(e.moeLayers) * e.cfg.NumExpertsPerTok
	gs := &e.gs
	gs.slots = make([]slotState, e.opt.Slots)
	for i := range gs.slots {
		s := &gs.slots[i]
		s.seq = make([]int32, 0, L)
		s.lp, s.tlp = make([]float32, 0, L), make([]float32, 0, L)
		if perPos > 0 {
			if e.cfg.NumExperts <= 256 {
				s.routes = make([]uint8, L*perPos)
			} else {
				s.routes16 = make([]uint16, L*perPos)
			}
		}
	}
	gs.idBuf = make([][]int32, e.pool.Workers())
	gs.pBuf = make([][]float32, e.pool.Workers())
	for i := range gs.pBuf {
		gs.idBuf[i] = make([]int32, e.vocab)
		gs.pBuf[i] = make([]float32, e.vocab)
	}
}

// gen drives the engine's slots: it admits the samples of queued groups as
// slots free up, runs forward steps over every running sequence whatever
// its group, and retires finished sequences into their groups. Generate
// runs one over a fixed queue; a Scheduler keeps one for its lifetime and
// queues requests as they arrive.
type gen struct {
	e *Engine
	// queue holds the groups with samples not yet admitted, in order: only
	// the head can have some of its samples admitted already.
	queue      []*group
	hold       bool // admit no sample of a group not yet started (a weight update waits)
	slots      []slotState
	out        []Sample    // Generate's samples, prompt-major (its groups' out point into it)
	promptRows int         // prompt rows computed (the rest were shared)
	sampled    int         // tokens sampled
	idBuf      [][]int32   // per worker: candidate token ids for truncation
	pBuf       [][]float32 // per worker: probabilities of one row
	fnSamp     func(w, lo, hi int)
}

// group is the n samples of one prompt with one policy: a prompt of a
// Generate call or a Scheduler's Request. The samples of a group share its
// prompt's prefill; two groups never do, even on equal prompts.
type group struct {
	prompt  []int32
	index   int // Sample.Prompt, and the prompt index of the random streams
	n       int
	pol     *policy
	onToken func(index int, t Token)
	next    int      // samples admitted so far
	left    int      // samples not finished
	out     []Sample // by sample index
}

// policy is a group's sampling settings, with the stop set laid out for
// the per-token check. Groups of one Generate call share one.
type policy struct {
	sp      Sampling
	stop    [256]bool // stop tokens below 256, for a fast check
	stopAll []int32
}

func newPolicy(sp Sampling) *policy {
	pl := &policy{sp: sp}
	for _, t := range sp.Stop {
		if t < 256 {
			pl.stop[t] = true
		} else {
			pl.stopAll = append(pl.stopAll, t)
		}
	}
	return pl
}

// Generate samples n responses for each prompt (token ids) with continuous
// batching over the engine's slots, returning them ordered by prompt, then
// sample index. Prompts must be non-empty and fit the engine's MaxLen with
// at least one new token.
func (e *Engine) Generate(prompts [][]int32, n int, sp Sampling) ([]Sample, error) {
	g, err := e.newGen(prompts, n, sp)
	if err != nil {
		return nil, err
	}
	for g.admit() {
		g.step()
	}
	return g.out, nil
}

func (e *Engine) newGen(prompts [][]int32, n int, sp Sampling) (*gen, error) {
	if err := e.checkSampling(n, sp); err != nil {
		return nil, err
	}
	for i, p := range prompts {
		if err := e.checkPrompt(i, p); err != nil {
			return nil, err
		}
	}
	g := e.slotsGen()
	pol := newPolicy(sp)
	g.out = make([]Sample, len(prompts)*n)
	groups := make([]group, len(prompts))
	g.queue = make([]*group, len(prompts))
	for i, p := range prompts {
		groups[i] = group{prompt: p, index: i, n: n, pol: pol, left: n, out: g.out[i*n : (i+1)*n : (i+1)*n]}
		g.queue[i] = &groups[i]
	}
	return g, nil
}

// checkSampling validates n samples per prompt with settings sp, for
// Generate and for a Scheduler's Request.
func (e *Engine) checkSampling(n int, sp Sampling) error {
	if n < 1 {
		return fmt.Errorf("rollout: n = %d samples per prompt, want >= 1", n)
	}
	if sp.MaxNewTokens < 1 {
		return fmt.Errorf("rollout: max new tokens = %d, want >= 1", sp.MaxNewTokens)
	}
	if !(sp.Temperature >= 0) || math.IsInf(sp.Temperature, 0) {
		return fmt.Errorf("rollout: temperature %g, want a finite value >= 0", sp.Temperature)
	}
	if sp.Temperature > 0 && sp.Temperature < MinTemperature {
		return fmt.Errorf("rollout: temperature %g is too small to sample with (at least %g; use 0 for greedy decoding)", sp.Temperature, MinTemperature)
	}
	if sp.TopK < 0 || !(sp.TopP >= 0 && sp.TopP <= 1) {
		return fmt.Errorf("rollout: top-k %d / top-p %g out of range (top-k >= 0, 0 <= top-p <= 1)", sp.TopK, sp.TopP)
	}
	if sp.TopLogProbs < 0 || sp.TopLogProbs > MaxTopLogProbs || sp.TopLogProbs > e.vocab {
		return fmt.Errorf("rollout: top log-probs %d, want 0 to %d", sp.TopLogProbs, min(MaxTopLogProbs, e.vocab))
	}
	for _, t := range sp.Stop {
		if t < 0 || int(t) >= e.vocab {
			return fmt.Errorf("rollout: stop token %d outside the vocabulary [0, %d)", t, e.vocab)
		}
	}
	return nil
}

// checkPrompt validates prompt i: non-empty, ids in the vocabulary, room
// for at least one new token. It reads only what New set, so any
// goroutine may call it.
func (e *Engine) checkPrompt(i int, p []int32) error {
	if len(p) == 0 {
		return fmt.Errorf("rollout: prompt %d is empty", i)
	}
	if len(p) >= e.opt.MaxLen {
		return fmt.Errorf("rollout: prompt %d has %d tokens; the engine holds sequences of at most %d (prompt and at least one new token)", i, len(p), e.opt.MaxLen)
	}
	for j, t := range p {
		if t < 0 || int(t) >= e.vocab {
			return fmt.Errorf("rollout: prompt %d, token %d: id %d outside the vocabulary [0, %d)", i, j, t, e.vocab)
		}
	}
	return nil
}

// slotsGen returns a gen over the engine's slots, all free, with an empty
// queue.
func (e *Engine) slotsGen() *gen {
	g := &gen{e: e, slots: e.gs.slots, idBuf: e.gs.idBuf, pBuf: e.gs.pBuf}
	for i := range g.slots {
		s := &g.slots[i]
		s.active, s.tail, s.waiting, s.grp = false, false, false, nil
	}
	g.fnSamp = g.sampleRows
	return g
}

// admit fills free slots from the queue and reports whether any slot is
// active. Sample j of a group draws from the random stream of (its
// policy's seed, the group's prompt index, j), whatever slot it gets.
func (g *gen) admit() bool {
	any := false
	for i := range g.slots {
		s := &g.slots[i]
		if !s.active && g.admissible() {
			q := g.queue[0]
			j := q.next
			q.next++
			if q.next == q.n {
				g.queue[0] = nil
				g.queue = g.queue[1:]
			}
			*s = slotState{active: true, grp: q, idx: j, promptLen: len(q.prompt),
				seq: append(s.seq[:0], q.prompt...), lp: s.lp[:0], tlp: s.tlp[:0], top: s.top[:0],
				routes: s.routes, routes16: s.routes16}
			s.rng.Seed(Splitmix64(q.pol.sp.Seed^Splitmix64(uint64(q.index))), SampleStream(j))
			g.takePrompt(i)
		}
		any = any || s.active
	}
	return any
}

// admissible reports whether the queue has a sample that admit may start.
func (g *gen) admissible() bool {
	return len(g.queue) > 0 && !(g.hold && g.queue[0].next == 0)
}

// busy reports whether a step has work: a running sequence, or one admit
// may start.
func (g *gen) busy() bool {
	return g.admissible() || g.running() > 0
}

// running returns the number of active slots.
func (g *gen) running() int {
	n := 0
	for i := range g.slots {
		if g.slots[i].active {
			n++
		}
	}
	return n
}

// drained reports whether no sequence is running and no group has started
// (the queue's head has no sample admitted): no sample is in flight.
func (g *gen) drained() bool {
	return g.running() == 0 && (len(g.queue) == 0 || g.queue[0].next == 0)
}

// drop ends group q where it stands: its running sequences are freed
// (their slots are admitted into at the next step) and its samples not yet
// admitted never will be. Only q's slots are touched: no other group
// shares its prompt.
func (g *gen) drop(q *group) {
	for i := range g.slots {
		if s := &g.slots[i]; s.active && s.grp == q {
			s.active, s.tail, s.waiting, s.grp = false, false, false, nil
		}
	}
	if i := slices.Index(g.queue, q); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
	}
}

// Prompt sharing. The n samples of a prompt start from the same keys and
// values: a sequence admitted while another slot holds (or is computing)
// its prompt copies the prompt's first len-1 positions of keys, values
// and routes from that slot and computes only the last prompt row, whose
// output is its own first token's distribution. Every row's arithmetic
// depends only on its own tokens and positions (the kernels are batch
// invariant), so the copy is bit for bit what the sequence would have
// computed itself, in every precision; it saves the prefill of n-1 of
// every n samples (RL samples G = 16 per prompt).

// takePrompt sets up the prompt of the sequence just admitted to slot i:
// shared from a slot that has it, waiting for one that is computing it,
// or (no such slot) computed by slot i.
func (g *gen) takePrompt(i int) {
	s := &g.slots[i]
	if s.promptLen < 2 {
		return
	}
	switch d, pending := g.donor(i); {
	case d >= 0:
		g.share(i, d)
	case pending:
		s.waiting = true
	}
}

// donor returns an active slot other than i whose cache holds the first
// len-1 positions of slot i's prompt, or -1, with pending reporting
// whether some slot is still computing them.
func (g *gen) donor(i int) (d int, pending bool) {
	s := &g.slots[i]
	for j := range g.slots {
		t := &g.slots[j]
		if j == i || !t.active || t.waiting || t.grp != s.grp {
			continue
		}
		if t.cached >= s.promptLen-1 {
			return j, false
		}
		pending = true
	}
	return -1, pending
}

// share copies the first promptLen-1 positions of keys, values and routes
// from slot d into slot i, which then has only its last prompt row to
// compute.
func (g *gen) share(i, d int) {
	e := g.e
	s, t := &g.slots[i], &g.slots[d]
	m := s.promptLen - 1
	dst, src := e.cacheRow(int32(i), 0), e.cacheRow(int32(d), 0)
	for l := range e.kc {
		copy(e.kc[l][dst:dst+m*e.kvd], e.kc[l][src:src+m*e.kvd])
		copy(e.vc[l][dst:dst+m*e.kvd], e.vc[l][src:src+m*e.kvd])
	}
	for l := range e.kv16 {
		kv := &e.kv16[l]
		copy(kv.k[dst:dst+m*e.kvd], kv.k[src:src+m*e.kvd])
		copy(kv.v[dst:dst+m*e.kvd], kv.v[src:src+m*e.kvd])
	}
	per := len(e.moeLayers) * e.cfg.NumExpertsPerTok
	if s.routes != nil {
		copy(s.routes[:m*per], t.routes)
	} else if s.routes16 != nil {
		copy(s.routes16[:m*per], t.routes16)
	}
	s.cached, s.waiting = m, false
}

// step runs one forward step over every active slot (one decode row each,
// then prompt rows to prefill within the step's row budget), samples the
// next token of every slot whose distribution it produced, each with its
// group's settings, and retires finished sequences.
func (g *gen) step() {
	e := g.e
	e.rows = 0
	e.outRow, e.outTemp = e.outRow[:0], e.outTemp[:0]
	add := func(slot, pos int, tok int32) {
		e.slot[e.rows], e.pos[e.rows], e.tok[e.rows] = int32(slot), int32(pos), tok
		e.rows++
	}
	for i := range g.slots {
		s := &g.slots[i]
		s.outIdx = -1
		if s.active && s.cached >= s.promptLen { // decoding, or the tail row
			add(i, s.cached, s.seq[s.cached])
			if !s.tail {
				g.output(s)
			}
		}
	}
	for i := range g.slots {
		s := &g.slots[i]
		if !s.active || s.waiting || s.cached >= s.promptLen {
			continue
		}
		chunk := min(s.promptLen-s.cached, e.opt.StepRows-e.rows)
		g.promptRows += chunk
		for p := s.cached; p < s.cached+chunk; p++ {
			add(i, p, s.seq[p])
		}
		if s.cached+chunk == s.promptLen {
			g.output(s)
		}
	}
	e.forward()
	g.recordRoutes()
	e.pool.Run(len(e.outRow), g.fnSamp)
	for i := range g.slots {
		s := &g.slots[i]
		if !s.active {
			continue
		}
		if s.tail {
			g.retire(s)
			continue
		}
	}
	// Advance the cache positions, then take the sampled tokens.
	for r := 0; r < e.rows; r++ {
		g.slots[e.slot[r]].cached = int(e.pos[r]) + 1
	}
	for i := range g.slots {
		if s := &g.slots[i]; s.active && s.waiting {
			g.takePrompt(i) // the prompt's owner may have just computed it
		}
	}
	for i := range g.slots {
		s := &g.slots[i]
		if !s.active || s.outIdx < 0 {
			continue
		}
		pol := s.grp.pol
		s.seq = append(s.seq, s.sampled)
		s.lp = append(s.lp, s.sampLP)
		var tlp float32
		if pol.sp.Truncated() {
			s.tlp = append(s.tlp, s.sTLP)
			tlp = s.sTLP
		}
		var top []TokenLogProb
		if n := pol.sp.TopLogProbs; n > 0 {
			s.top = append(s.top, s.stepTop[:n]...)
			top = s.top[len(s.top)-n:]
		}
		g.sampled++
		if f := s.grp.onToken; f != nil {
			f(s.idx, Token{ID: s.sampled, LogProb: s.sampLP, TruncLogProb: tlp, Top: top})
		}
		switch {
		case pol.isStop(s.sampled):
			s.finish = "stop"
		case len(s.seq)-s.promptLen >= pol.sp.MaxNewTokens || len(s.seq) >= e.opt.MaxLen:
			s.finish = "length"
		default:
			continue
		}
		if len(e.moeLayers) > 0 {
			s.tail = true // one more row records the last token's routes
		} else {
			g.retire(s)
		}
	}
}

// output makes the step's last row slot s's output row, to be tempered
// at its group's temperature.
func (g *gen) output(s *slotState) {
	e := g.e
	s.outIdx = len(e.outRow)
	e.outRow = append(e.outRow, int32(e.rows-1))
	e.outTemp = append(e.outTemp, float32(s.grp.pol.sp.Temperature))
}

func (pl *policy) isStop(t int32) bool {
	if t < 256 {
		return pl.stop[t]
	}
	return slices.Contains(pl.stopAll, t)
}

// recordRoutes copies the step's routes into the slots' route buffers.
func (g *gen) recordRoutes() {
	e := g.e
	nl := len(e.moeLayers)
	if nl == 0 {
		return
	}
	k := e.cfg.NumExpertsPerTok
	for r := 0; r < e.rows; r++ {
		s := &g.slots[e.slot[r]]
		base := int(e.pos[r]) * nl * k
		for ml := 0; ml < nl; ml++ {
			ids := e.routes[ml][r*k : (r+1)*k]
			for j, id := range ids {
				if s.routes != nil {
					s.routes[base+ml*k+j] = uint8(id)
				} else {
					s.routes16[base+ml*k+j] = uint16(id)
				}
			}
		}
	}
}

// retire turns a finished slot into its group's Sample and frees the
// slot.
func (g *gen) retire(s *slotState) {
	e := g.e
	q := s.grp
	smp := Sample{
		Prompt: q.index, Index: s.idx, Finish: s.finish, Version: e.version,
		Tokens:   slices.Clone(s.seq[s.promptLen:]),
		LogProbs: slices.Clone(s.lp),
	}
	if q.pol.sp.Truncated() {
		smp.TruncLogProbs = slices.Clone(s.tlp)
	}
	if n := q.pol.sp.TopLogProbs; n > 0 {
		flat := slices.Clone(s.top)
		smp.TopLogProbs = make([][]TokenLogProb, len(flat)/n)
		for t := range smp.TopLogProbs {
			smp.TopLogProbs[t] = flat[t*n : (t+1)*n : (t+1)*n]
		}
	}
	if nl := len(e.moeLayers); nl > 0 {
		k := e.cfg.NumExpertsPerTok
		r := &model.Routes{Tokens: len(s.seq), Layers: nl, K: k, Experts: e.cfg.NumExperts}
		if s.routes != nil {
			r.IDs8 = slices.Clone(s.routes[:len(s.seq)*nl*k])
		} else {
			r.IDs16 = slices.Clone(s.routes16[:len(s.seq)*nl*k])
		}
		smp.Routes = r
	}
	q.out[s.idx] = smp
	q.left--
	s.active, s.tail, s.grp = false, false, nil
}

// sampleRows draws the next token of output rows lo..hi-1.
func (g *gen) sampleRows(w, lo, hi int) {
	e := g.e
	for o := lo; o < hi; o++ {
		s := &g.slots[e.slot[e.outRow[o]]]
		z := e.lp[o*e.vocab : (o+1)*e.vocab]
		s.sampled, s.sampLP, s.sTLP = s.grp.pol.sampleOne(z, &s.rng, g.idBuf[w], g.pBuf[w])
		if n := s.grp.pol.sp.TopLogProbs; n > 0 {
			topTokens(s.stepTop[:n], z)
		}
	}
}

// topTokens fills top with the len(top) largest entries of z, largest
// first, the lower id first among equal values: one pass with an
// insertion into a short sorted list.
func topTokens(top []TokenLogProb, z []float32) {
	n := 0
	for i, v := range z {
		if n == len(top) && !(v > top[n-1].LogProb) {
			continue
		}
		j := min(n, len(top)-1)
		for j > 0 && v > top[j-1].LogProb {
			top[j] = top[j-1]
			j--
		}
		top[j] = TokenLogProb{Token: int32(i), LogProb: v}
		if n < len(top) {
			n++
		}
	}
}

// sampleOne draws a token from the log-probabilities z (already at the
// sampling temperature) with rng, returning it with its log-probability
// under z and under the truncated distribution. ids and p are scratch of
// len(z) (ids only needed with truncation).
//
// The draw is inverse-CDF: one uniform u in [0, 1) against the running
// float64 sum of p = exp(z) in token order (drawFull; in descending
// probability over the kept set under truncation), scaled by the total, so
// that the few ulps by which Σ exp(z) misses 1 never bias the last token.
func (pl *policy) sampleOne(z []float32, rng *rand.PCG, ids []int32, p []float32) (int32, float32, float32) {
	if pl.sp.Temperature == 0 {
		best := 0
		for i, v := range z {
			if v > z[best] {
				best = i
			}
		}
		return int32(best), z[best], 0
	}
	u := float64(rng.Uint64()>>11) * 0x1p-53
	p = p[:len(z)]
	if !pl.sp.Truncated() {
		i := drawFull(z, p, u)
		return int32(i), z[i], z[i]
	}
	kernels.Exp(p, z)
	cand := pl.candidates(z, p, ids)
	var kept float64
	for _, id := range cand {
		kept += float64(p[id])
	}
	target := u * kept
	var cum float64
	pick := cand[len(cand)-1]
	for _, id := range cand {
		cum += float64(p[id])
		if cum > target {
			pick = id
			break
		}
	}
	return pick, z[pick], float32(float64(z[pick]) - math.Log(kept))
}

// drawBlock is the number of tokens whose probabilities drawFull sums in
// one vectorised pass.
const drawBlock = 512

// drawFull returns the token at which the running sum of p = exp(z)
// first exceeds u times the total (inverse CDF over the full distribution,
// token order), writing p. Sums are float64: each block of drawBlock
// tokens is exponentiated and summed in one vectorised pass (the float64
// sum's lane order fixed by the block's length), the blocks are added in
// order, and only the block where the draw lands is scanned token by
// token, so a 151,936-token row costs one vector pass, not two scalar
// ones. The result depends only on z and u. Tokens of probability 0 are
// never drawn; if rounding leaves the target unreached, the last token of
// non-zero probability is.
func drawFull(z, p []float32, u float64) int {
	nb := (len(z) + drawBlock - 1) / drawBlock
	var sumsArr [512]float64
	sums := sumsArr[:0]
	if nb > len(sumsArr) {
		sums = make([]float64, 0, nb)
	}
	var total float64
	for b := 0; b < nb; b++ {
		lo, hi := b*drawBlock, min((b+1)*drawBlock, len(z))
		s := kernels.ExpSum(p[lo:hi], z[lo:hi], 0)
		sums = append(sums, s)
		total += s
	}
	target := u * total
	var cum float64
	b := 0
	for ; b < nb && cum+sums[b] <= target; b++ {
		cum += sums[b]
	}
	// Token by token from the block where the draw lands (on past it in
	// the rare case that the block's tokens summed one by one fall short
	// of its vectorised sum).
	for i := b * drawBlock; i < len(p); i++ {
		if p[i] == 0 {
			continue
		}
		cum += float64(p[i])
		if cum > target {
			return i
		}
	}
	for i := len(p) - 1; i > 0; i-- {
		if p[i] != 0 {
			return i
		}
	}
	return 0
}

// candidates returns the truncated set in descending probability (ties:
// lower id first): the top-k, then cut to the smallest prefix whose
// probability (p = exp(z)) reaches top-p.
func (pl *policy) candidates(z, p []float32, buf []int32) []int32 {
	var cand []int32
	if k := pl.sp.TopK; k > 0 && k < len(z) {
		// Insertion into a sorted prefix of k: cheap for the small k used.
		cand = buf[:0]
		for i := range z {
			id := int32(i)
			if len(cand) == k && !before(z, id, cand[k-1]) {
				continue
			}
			if len(cand) < k {
				cand = append(cand, id)
			} else {
				cand[k-1] = id
			}
			for j := len(cand) - 1; j > 0 && before(z, cand[j], cand[j-1]); j-- {
				cand[j], cand[j-1] = cand[j-1], cand[j]
			}
		}
	} else {
		cand = buf[:len(z)]
		for i := range cand {
			cand[i] = int32(i)
		}
		sortByProb(cand, z)
	}
	if tp := pl.sp.TopP; tp > 0 && tp < 1 {
		var cum float64
		for i, id := range cand {
			cum += float64(p[id])
			if cum >= tp {
				return cand[:i+1]
			}
		}
	}
	return cand
}

// before reports whether token a ranks before token b: more probable, or
// as probable with a lower id.
func before(z []float32, a, b int32) bool {
	if z[a] != z[b] {
		return z[a] > z[b]
	}
	return a < b
}

// sortByProb sorts ids by before (a heap sort: in place, no allocation,
// no closure, O(n log n) in the worst case).
func sortByProb(ids []int32, z []float32) {
	n := len(ids)
	// Build a heap whose root ranks last, then move roots to the end.
	for i := n/2 - 1; i >= 0; i-- {
		siftDown(ids, z, i, n)
	}
	for end := n - 1; end > 0; end-- {
		ids[0], ids[end] = ids[end], ids[0]
		siftDown(ids, z, 0, end)
	}
}

func siftDown(ids []int32, z []float32, i, n int) {
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && before(z, ids[c], ids[c+1]) {
			c++ // the child that ranks later
		}
		if !before(z, ids[i], ids[c]) {
			return
		}
		ids[i], ids[c] = ids[c], ids[i]
		i = c
	}
}
