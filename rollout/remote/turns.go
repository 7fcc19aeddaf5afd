package remote

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/keel-rl/keel/rollout"
)

// GenerateTurnsSwitching runs multi-turn episodes on the fleet, as
// rollout.Engine.GenerateTurns does locally: the first turn of each
// prompt's n samples is one request, as Generate sends it; every later
// turn of a sample is a request of its own carrying the sample's whole
// token prefix (prompt, turns and observations so far), one sample, with
// the turn's seed (rollout.TurnSeed), so that a server reuses what its
// prefix cache holds and, with kind keel, each turn is bit for bit the
// local engine's. The last request's routes cover every position. Weights
// cannot change during a remote rollout: next must be nil.
func (r *Client) GenerateTurnsSwitching(prompts [][]int32, n int, sp rollout.Sampling, turns rollout.Turns, next func() *rollout.Switch) ([]rollout.Sample, error) {
	if next != nil {
		return nil, errors.New("rollout: weights cannot change in the middle of a remote rollout (rollout.partial: switch needs the in-process engine)")
	}
	sp1 := sp
	if sp.EpisodeTokens > 0 {
		sp1.MaxNewTokens = min(sp.MaxNewTokens, sp.EpisodeTokens)
	}
	first, err := r.Generate(prompts, n, sp1)
	if err != nil {
		return nil, err
	}
	version := r.Version()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make([]error, len(first))
	var wg sync.WaitGroup
	for k := range first {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.episode(ctx, prompts[first[k].Prompt], &first[k], sp, turns, version); err != nil {
				errs[k] = err
				cancel()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs { // the first failure that is not another's cancellation
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return first, nil
}

// episode continues sample s of prompt, whose first turn is sampled,
// until turns ends it: each observation appended, each later turn one
// request.
func (r *Client) episode(ctx context.Context, prompt []int32, s *rollout.Sample, sp rollout.Sampling, turns rollout.Turns, version int64) error {
	start := 0
	for t := 0; ; t++ {
		room := 1 << 30
		if r.opt.MaxLen > 0 {
			room = r.opt.MaxLen - len(prompt) - len(s.Tokens)
		}
		if sp.EpisodeTokens > 0 {
			room = min(room, sp.EpisodeTokens-len(s.Tokens))
		}
		obs, done, err := turns.Turn(rollout.TurnEnd{Prompt: s.Prompt, Index: s.Index, Turn: t, Response: slices.Clone(s.Tokens),
			TurnStart: start, Finish: s.Finish, Room: room})
		if err != nil {
			return fmt.Errorf("rollout: prompt %d, sample %d, turn %d: %w", s.Prompt, s.Index, t, err)
		}
		if done {
			return nil
		}
		if len(obs) >= room {
			s.Finish = "length"
			return nil
		}
		for j, id := range obs {
			if id < 0 || int(id) >= r.opt.Config.VocabSize {
				return fmt.Errorf("rollout: prompt %d, sample %d, turn %d: observation token %d is id %d, outside the vocabulary [0, %d)", s.Prompt, s.Index, t, j, id, r.opt.Config.VocabSize)
			}
		}
		if at := len(s.Tokens); len(obs) > 0 {
			s.Observations = append(s.Observations, rollout.Span{Start: at, End: at + len(obs)})
		}
		s.Tokens = append(s.Tokens, obs...)
		s.LogProbs = append(s.LogProbs, make([]float32, len(obs))...)
		if s.TruncLogProbs != nil {
			s.TruncLogProbs = append(s.TruncLogProbs, make([]float32, len(obs))...)
		}
		start = len(s.Tokens)
		prefix := append(slices.Clone(prompt), s.Tokens...)
		maxNew := min(sp.MaxNewTokens, room-len(obs))
		j := job{i: s.Prompt, ids: prefix, n: 1, sp: sp, seed: rollout.TurnSeed(sp.Seed, s.Prompt, s.Index, t+1), maxNew: maxNew, version: version}
		out, err := r.runJob(ctx, j)
		if err != nil {
			return err
		}
		if len(out) != 1 {
			return fmt.Errorf("rollout: prompt %d, sample %d, turn %d: %d samples for one", s.Prompt, s.Index, t+1, len(out))
		}
		o := out[0]
		s.Tokens = append(s.Tokens, o.Tokens...)
		s.LogProbs = append(s.LogProbs, o.LogProbs...)
		if s.TruncLogProbs != nil {
			s.TruncLogProbs = append(s.TruncLogProbs, o.TruncLogProbs...)
		}
		s.Routes, s.Finish = o.Routes, o.Finish
	}
}
