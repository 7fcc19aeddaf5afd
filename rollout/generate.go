package rollout

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

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
	// MaxNewTokens bounds each response (with GenerateTurns, each turn).
	MaxNewTokens int
	// EpisodeTokens, with GenerateTurns, bounds a whole trajectory: the
	// tokens after the prompt, the model's and the observations' (0: only
	// the engine's MaxLen bounds it).
	EpisodeTokens int
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
	// Version is the weight version that generated the sample (the
	// version of its first token when weights changed during it).
	Version int64
	// TokenVersions[t] is the weight version that sampled Tokens[t], set
	// only when it changed during the sample (GenerateSwitching); nil
	// means every token is of Version. LogProbs[t] is always under the
	// weights that sampled Tokens[t].
	TokenVersions []int64
	// Observations are where GenerateTurns appended an environment's
	// tokens to Tokens, in order; nil for one turn.
	Observations []Span
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
	// Version is the weight version that sampled the token.
	Version int64
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
	prefill      int     // positions to compute before decoding: the prompt, or (after a weight switch) the whole sequence
	cached       int     // positions already in the KV cache
	seq          []int32 // prompt, then response
	lp, tlp      []float32
	vers         []int64 // per response token: the version that sampled it
	routes       []uint8 // [pos][moe layers][k], experts ≤ 256
	routes16     []uint16
	rng          rand.PCG
	finish       string
	outIdx       int // this step's output row, or -1
	sampled      int32
	sampLP, sTLP float32
	top          []TokenLogProb // TopLogProbs per response position, flat
	stepTop      [MaxTopLogProbs]TokenLogProb
	// Multi-turn (GenerateTurns): the turn number, where its tokens start
	// in seq, the observations appended so far (response positions), and
	// whether the sample waits for Turns' answer (awaiting) and saw the
	// weights change while it did (stale: its cache is recomputed).
	turn, turnStart int
	obs             []Span
	awaiting, stale bool
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
	perPos := e.nMoE * e.cfg.NumExpertsPerTok
	gs := &e.gs
	gs.slots = make([]slotState, e.opt.Slots)
	for i := range gs.slots {
		s := &gs.slots[i]
		s.seq = make([]int32, 0, L)
		s.lp, s.tlp = make([]float32, 0, L), make([]float32, 0, L)
		s.vers = make([]int64, 0, L)
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
	// turns, when set, is asked at the end of every turn (GenerateTurns);
	// turnDone carries its answers and awaiting counts the slots waiting
	// for one.
	turns    Turns
	turnDone chan turnAnswer
	awaiting int
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

// Generate samples n responses for each prompt (token ids) with continuous
// batching over the engine's slots, returning them ordered by prompt, then
// sample index. Prompts must be non-empty and fit the engine's MaxLen with
// at least one new token.
func (e *Engine) Generate(prompts [][]int32, n int, sp Sampling) ([]Sample, error) {
	g, err := e.newGen(prompts, n, sp)
	if err != nil {
		return nil, err
	}
	if err := g.run(nil); err != nil {
		return nil, err
	}
	return g.out, nil
}

// run steps until every sample is done, taking the weight updates next
// offers (nil: none) and the answers of Turns.
func (g *gen) run(next func() *Switch) error {
	for g.admit() {
		if err := g.awaitTurns(); err != nil {
			return err
		}
		if g.running() == g.awaiting {
			continue // the answers ended samples: admit into their slots
		}
		if next != nil {
			if sw := next(); sw != nil {
				if err := g.switchWeights(sw); err != nil {
					return err
				}
			}
		}
		if err := g.step(); err != nil {
			return err
		}
	}
	return nil
}

// Switch is a weight update that GenerateSwitching takes in the middle of
// a generation: the weights of Version, valid until Release is called,
// which the engine does once it is done with them, saying whether they
// were loaded.
type Switch struct {
	Model   *model.Model
	Version int64
	Release func(loaded bool)
}

// GenerateSwitching is Generate with weight updates in flight (partial
// rollouts): before every forward step it asks next for newer weights,
// and when there are some it loads them and recomputes the KV cache of
// every sequence in flight (prompt and response so far) under them, so
// that each later token is drawn from, and its log-probability is that of,
// the new policy given the whole sequence, exactly as if the sequence had
// been fed to the new weights; the tokens already sampled keep their
// log-probabilities under the weights that sampled them. Sample.Version is
// then the first token's version and Sample.TokenVersions each token's.
// Routes are those of the last computation of each position. next
// returning nil means no update.
func (e *Engine) GenerateSwitching(prompts [][]int32, n int, sp Sampling, next func() *Switch) ([]Sample, error) {
	g, err := e.newGen(prompts, n, sp)
	if err != nil {
		return nil, err
	}
	if err := g.run(next); err != nil {
		return nil, err
	}
	return g.out, nil
}

// switchWeights loads sw's weights between two steps and sends every
// sequence in flight back to recompute its cache from position 0.
// Finished MoE sequences waiting for their last row keep their state: that
// row records only the last position's routes, which train nothing.
func (g *gen) switchWeights(sw *Switch) error {
	e := g.e
	err := e.UpdateWeights(context.Background(), sw.Model, sw.Version)
	if sw.Release != nil {
		sw.Release(err == nil)
	}
	if err != nil {
		return err
	}
	for i := range g.slots {
		s := &g.slots[i]
		if !s.active {
			continue
		}
		if s.tail || s.awaiting {
			s.stale = true // a tail row needs no cache; an awaiting one is recomputed when its observation comes
			continue
		}
		s.cached, s.prefill = 0, len(s.seq)
	}
	return nil
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
			*s = slotState{active: true, grp: q, idx: j, promptLen: len(q.prompt), prefill: len(q.prompt),
				seq: append(s.seq[:0], q.prompt...), lp: s.lp[:0], tlp: s.tlp[:0], vers: s.vers[:0], top: s.top[:0],
				routes: s.routes, routes16: s.routes16, turnStart: len(q.prompt)}
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
		if j == i || !t.active || t.waiting || t.stale || t.grp != s.grp {
			continue // stale: its cache is of weights the engine no longer holds
		}
		if t.cached >= s.promptLen-1 {
			return j, false
		}
		pending = true
	}
	return -1, pending
}

// share copies the first promptLen-1 positions of keys and values (in the
// backend's cache) and of routes from slot d into slot i, which then has
// only its last prompt row to compute.
func (g *gen) share(i, d int) {
	e := g.e
	s, t := &g.slots[i], &g.slots[d]
	m := s.promptLen - 1
	e.b.CopyPrefix(i, d, m)
	per := e.nMoE * e.cfg.NumExpertsPerTok
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
// group's settings, and retires finished sequences. After an error (the
// backend's) the sequences in flight are lost: Generate returns it, a
// Scheduler fails their requests.
func (g *gen) step() error {
	e := g.e
	if e.loadErr != nil {
		return e.loadErr
	}
	var start time.Time
	if e.opt.OnStep != nil {
		start = time.Now()
	}
	prompted := g.promptRows
	g.fill()
	if err := e.b.Step(&e.batch); err != nil {
		return fmt.Errorf("rollout: forward step: %w", err)
	}
	for o, d := range e.batch.Draw {
		if t := e.batch.Drawn[o]; d >= 0 && (t < 0 || int(t) >= e.vocab) {
			return fmt.Errorf("rollout: forward step: the backend drew token %d for output row %d, vocabulary %d", t, o, e.vocab)
		}
	}
	g.recordRoutes()
	e.pool.Run(len(e.batch.OutRow), g.fnSamp)
	for i := range g.slots {
		if s := &g.slots[i]; s.active && s.tail {
			g.retire(s)
		}
	}
	// Advance the cache positions, then take the sampled tokens.
	b := &e.batch
	for r, slot := range b.Slot {
		g.slots[slot].cached = int(b.Pos[r]) + 1
	}
	for i := range g.slots {
		if s := &g.slots[i]; s.active && s.waiting {
			g.takePrompt(i) // the prompt's owner may have just computed it
		}
	}
	for i := range g.slots {
		if s := &g.slots[i]; s.active && s.outIdx >= 0 {
			g.take(s)
		}
	}
	if e.opt.OnStep != nil {
		info := StepInfo{Rows: b.Rows(), PromptRows: g.promptRows - prompted, Time: time.Since(start)}
		for _, p := range b.Pos {
			info.Context += int64(p) + 1
		}
		e.opt.OnStep(info)
	}
	return nil
}

// fill sets up the step's batch: a row for every active slot past its
// prompt (its next token, or the tail row of a finished MoE sequence),
// then prompt rows to prefill within the step's row budget, and the
// output rows.
func (g *gen) fill() {
	e := g.e
	b := &e.batch
	b.reset()
	for i := range g.slots {
		s := &g.slots[i]
		s.outIdx = -1
		if s.active && !s.awaiting && s.cached >= s.prefill { // decoding, or the tail row
			b.add(i, s.cached, s.seq[s.cached])
			if !s.tail {
				g.output(s)
			}
		}
	}
	for i := range g.slots {
		s := &g.slots[i]
		if !s.active || s.waiting || s.awaiting || s.cached >= s.prefill {
			continue
		}
		chunk := min(s.prefill-s.cached, e.opt.StepRows-b.Rows())
		g.promptRows += chunk
		for p := s.cached; p < s.cached+chunk; p++ {
			b.add(i, p, s.seq[p])
		}
		if s.cached+chunk == s.prefill {
			g.output(s)
		}
	}
}

// take appends the token sampled for slot s, with its log-probabilities,
// to its sequence, tells its group's OnToken, and ends the sequence on a
// stop token or at its length limit (MoE sequences after one more row,
// which records the last token's routes).
func (g *gen) take(s *slotState) {
	e := g.e
	pol := s.grp.pol
	s.seq = append(s.seq, s.sampled)
	s.lp = append(s.lp, s.sampLP)
	s.vers = append(s.vers, e.version)
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
		f(s.idx, Token{ID: s.sampled, LogProb: s.sampLP, TruncLogProb: tlp, Top: top, Version: e.version})
	}
	stop := pol.isStop(s.sampled)
	if g.turns != nil { // the turn ends as a one-turn sample would; Turns decides what follows
		if stop {
			g.endTurn(s, "stop")
		} else if len(s.seq)-s.turnStart >= pol.sp.MaxNewTokens || g.room(s) <= 0 {
			g.endTurn(s, "length")
		}
		return
	}
	switch {
	case stop:
		s.finish = "stop"
	case len(s.seq)-s.promptLen >= pol.sp.MaxNewTokens || len(s.seq) >= e.opt.MaxLen:
		s.finish = "length"
	default:
		return
	}
	if e.nMoE > 0 {
		s.tail = true // one more row records the last token's routes
	} else {
		g.retire(s)
	}
}

// output makes the step's last row slot s's output row, to be tempered
// at its group's temperature.
//
// Where the backend draws (Drawer), the row's uniform is taken from the
// sequence's stream here, as sampleOne would take it after the step (the
// same seeds give the same draws either way), and the row carries its
// policy's top-k, top-p and top log-probabilities.
func (g *gen) output(s *slotState) {
	e, pol := g.e, s.grp.pol
	s.outIdx = e.batch.output(float32(pol.sp.Temperature))
	if e.draws {
		u := 0.0
		if pol.sp.Temperature != 0 {
			u = uniform(&s.rng)
		}
		e.batch.Draw[s.outIdx] = u
		if pol.sp.Truncated() {
			e.batch.TopK[s.outIdx], e.batch.TopP[s.outIdx] = int32(min(pol.sp.TopK, e.vocab)), pol.sp.TopP
		}
		e.batch.TopN[s.outIdx] = int32(pol.sp.TopLogProbs)
	}
}

// recordRoutes copies the step's routes into the slots' route buffers.
func (g *gen) recordRoutes() {
	e := g.e
	nl := e.nMoE
	if nl == 0 {
		return
	}
	k := e.cfg.NumExpertsPerTok
	b := &e.batch
	for r, slot := range b.Slot {
		s := &g.slots[slot]
		base := int(b.Pos[r]) * nl * k
		for ml := 0; ml < nl; ml++ {
			ids := b.Routes[ml][r*k : (r+1)*k]
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
	if len(s.vers) > 0 {
		smp.Version = s.vers[0]
		if s.vers[len(s.vers)-1] != s.vers[0] {
			smp.TokenVersions = slices.Clone(s.vers)
		}
	}
	if q.pol.sp.Truncated() {
		smp.TruncLogProbs = slices.Clone(s.tlp)
	}
	if len(s.obs) > 0 {
		smp.Observations = slices.Clone(s.obs)
	}
	if n := q.pol.sp.TopLogProbs; n > 0 {
		flat := slices.Clone(s.top)
		smp.TopLogProbs = make([][]TokenLogProb, len(flat)/n)
		for t := range smp.TopLogProbs {
			smp.TopLogProbs[t] = flat[t*n : (t+1)*n : (t+1)*n]
		}
	}
	if nl := e.nMoE; nl > 0 {
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
	b := &e.batch
	for o := lo; o < hi; o++ {
		s := &g.slots[b.Slot[b.OutRow[o]]]
		if b.Draw[o] >= 0 { // drawn by the backend
			s.sampled, s.sampLP, s.sTLP = b.Drawn[o], b.DrawnLP[o], b.DrawnTLP[o]
			if n := s.grp.pol.sp.TopLogProbs; n > 0 {
				copy(s.stepTop[:n], b.Top[o*MaxTopLogProbs:])
			}
			continue
		}
		z := b.LogProbs[o*e.vocab : (o+1)*e.vocab]
		s.sampled, s.sampLP, s.sTLP = s.grp.pol.sampleOne(z, &s.rng, g.idBuf[w], g.pBuf[w])
		if n := s.grp.pol.sp.TopLogProbs; n > 0 {
			topTokens(s.stepTop[:n], z)
		}
	}
}
