package rollout

import (
	"fmt"
	"slices"
)

// Turns drives multi-turn generation (GenerateTurns): at the end of each of
// the model's turns (a stop token, or a budget: the turn's, the episode's,
// the engine's MaxLen) it decides
// whether the sample goes on, and with which tokens the environment
// answers. An implementation keeps each trajectory's state by (prompt,
// index).
type Turns interface {
	// Turn is called when a sample ends one of the model's turns. It
	// returns the observation tokens to append before the model's next
	// turn, or done to end the sample there. Calls for different samples
	// run concurrently on goroutines of their own; the sample waits for
	// its answer while the others decode.
	Turn(t TurnEnd) (obs []int32, done bool, err error)
}

// TurnEnd is what Turns hears at the end of a turn.
type TurnEnd struct {
	Prompt, Index int // the sample: its prompt's index in the call, its number within the prompt
	Turn          int // the turn's number, from 0
	// Response holds every token after the prompt so far (model and
	// observation tokens), the turn's own from TurnStart on. It is the
	// callee's (a copy).
	Response  []int32
	TurnStart int
	Finish    string // "stop" (a stop token) or "length" (the turn's budget or the engine's MaxLen)
	// Room is how many more tokens the sequence can hold (the engine's
	// MaxLen, Sampling.EpisodeTokens): an observation must leave at least
	// one for the next turn.
	Room int
}

// Span is the half-open range [Start, End) of a sample's tokens.
type Span struct {
	Start int `json:"start"`
	End   int `json:"end"`
}

// TurnSeed returns the seed with which a one-prompt, one-sample Generate
// call on the sample's whole sequence so far (prompt, earlier turns and
// observations) draws exactly turn t >= 1 of sample j of prompt i in a
// GenerateTurns call with seed seed: every turn after the first draws
// from its own stream, keyed by (seed, i, j, t), so a remote server that
// is sent each turn with its whole token prefix (one request per turn)
// samples what the local engine samples.
func TurnSeed(seed uint64, i, j, t int) uint64 {
	return Splitmix64(seed ^ Splitmix64(uint64(i)) ^ Splitmix64(SampleStream(j)+uint64(t)*turnSalt))
}

// turnSalt keeps the turns' keys apart.
const turnSalt = 0x8cb92ba72f3d8dd7

// GenerateTurns is Generate for multi-turn episodes: Sampling.MaxNewTokens
// bounds each turn and Sampling.EpisodeTokens the whole trajectory, and at
// the end of each turn turns decides whether the sample goes on. The
// observation tokens it answers with are appended to the sequence and
// computed into the KV cache (their positions' routes recorded) before
// the model's next turn; nothing already computed is recomputed. A
// Sample's Tokens then hold the whole trajectory after the prompt, its
// Observations where the observation tokens are (their LogProbs and
// TruncLogProbs entries are 0, their TopLogProbs entries zero values, not
// probabilities; an empty observation has no span), and Finish is that of
// its last turn, or "length" when an observation did not fit (the
// engine's MaxLen, the episode's budget: the observation is then
// dropped). The first turn draws from the stream Generate would use,
// later ones from TurnSeed's, so results do not depend on how long turns
// takes to answer.
func (e *Engine) GenerateTurns(prompts [][]int32, n int, sp Sampling, turns Turns) ([]Sample, error) {
	return e.GenerateTurnsSwitching(prompts, n, sp, turns, nil)
}

// GenerateTurnsSwitching is GenerateTurns with weight updates in flight
// (as GenerateSwitching); next may be nil.
func (e *Engine) GenerateTurnsSwitching(prompts [][]int32, n int, sp Sampling, turns Turns, next func() *Switch) ([]Sample, error) {
	if turns == nil {
		return nil, fmt.Errorf("rollout: GenerateTurns without Turns")
	}
	g, err := e.newGen(prompts, n, sp)
	if err != nil {
		return nil, err
	}
	g.turns = turns
	g.turnDone = make(chan turnAnswer, len(g.slots))
	if err := g.run(next); err != nil {
		return nil, err
	}
	return g.out, nil
}

// turnAnswer is what Turns answered for the sample in slot.
type turnAnswer struct {
	slot int
	obs  []int32
	done bool
	err  error
}

// endTurn hands slot s's finished turn to Turns on a goroutine of its
// own; the slot decodes nothing until the answer is applied.
func (g *gen) endTurn(s *slotState, finish string) {
	s.awaiting, s.finish = true, finish
	g.awaiting++
	slot := 0
	for &g.slots[slot] != s {
		slot++
	}
	t := TurnEnd{Prompt: s.grp.index, Index: s.idx, Turn: s.turn, Response: slices.Clone(s.seq[s.promptLen:]),
		TurnStart: s.turnStart - s.promptLen, Finish: finish, Room: g.room(s)}
	go func() {
		obs, done, err := g.turns.Turn(t)
		g.turnDone <- turnAnswer{slot: slot, obs: obs, done: done, err: err}
	}()
}

// awaitTurns applies the answers Turns has given, waiting for one when no
// slot has anything else to do.
func (g *gen) awaitTurns() error {
	for g.awaiting > 0 {
		var a turnAnswer
		if g.idle() {
			a = <-g.turnDone
		} else {
			select {
			case a = <-g.turnDone:
			default:
				return nil
			}
		}
		if err := g.applyTurn(a); err != nil {
			return err
		}
	}
	return nil
}

// room returns how many more tokens slot s's sequence can hold: the
// engine's MaxLen and the episode's budget.
func (g *gen) room(s *slotState) int {
	r := g.e.opt.MaxLen - len(s.seq)
	if b := s.grp.pol.sp.EpisodeTokens; b > 0 {
		r = min(r, b-(len(s.seq)-s.promptLen))
	}
	return r
}

// idle reports whether every active slot awaits Turns and none is free
// for a sample to be admitted into.
func (g *gen) idle() bool {
	n := g.running()
	return n == g.awaiting && (!g.admissible() || n == len(g.slots))
}

// applyTurn ends a sample or appends the observation Turns answered with
// and starts its next turn, from its own random stream.
func (g *gen) applyTurn(a turnAnswer) error {
	e := g.e
	s := &g.slots[a.slot]
	s.awaiting = false
	g.awaiting--
	if a.err != nil {
		return fmt.Errorf("rollout: prompt %d, sample %d, turn %d: %w", s.grp.index, s.idx, s.turn, a.err)
	}
	if !a.done && len(a.obs) >= g.room(s) {
		a.done, s.finish = true, "length"
	}
	if a.done {
		if e.nMoE > 0 {
			s.tail = true // one more row records the last token's routes
		} else {
			g.retire(s)
		}
		return nil
	}
	for j, t := range a.obs {
		if t < 0 || int(t) >= e.vocab {
			return fmt.Errorf("rollout: prompt %d, sample %d, turn %d: observation token %d is id %d, outside the vocabulary [0, %d)", s.grp.index, s.idx, s.turn, j, t, e.vocab)
		}
	}
	if resp := len(s.seq) - s.promptLen; len(a.obs) > 0 {
		s.obs = append(s.obs, Span{Start: resp, End: resp + len(a.obs)})
	}
	s.seq = append(s.seq, a.obs...)
	for range a.obs {
		s.lp = append(s.lp, 0)
		s.vers = append(s.vers, e.version)
		if s.grp.pol.sp.Truncated() {
			s.tlp = append(s.tlp, 0)
		}
		if n := s.grp.pol.sp.TopLogProbs; n > 0 {
			s.top = append(s.top, make([]TokenLogProb, n)...)
		}
	}
	if s.stale {
		s.cached, s.stale = 0, false // weights changed while it waited
	}
	s.prefill = len(s.seq)
	s.turn++
	s.turnStart = len(s.seq)
	s.rng.Seed(Splitmix64(TurnSeed(s.grp.pol.sp.Seed, s.grp.index, s.idx, s.turn)^Splitmix64(0)), SampleStream(0))
	return nil
}
