package rl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
)

// Sampler is what the loop needs of a rollout engine: samples with their
// log mu_old, routes and weight version, and a way to receive new weights.
// *rollout.Engine satisfies it; a client of remote inference servers can.
type Sampler interface {
	Generate(prompts [][]int32, n int, sp rollout.Sampling) ([]rollout.Sample, error)
	UpdateWeights(ctx context.Context, m *model.Model, version int64) error
	Version() int64
}

// SamplerMetrics is implemented by a Sampler with measures of its own (a
// fleet of remote servers: servers alive, requests retried, the phases of
// a weight push); the loop records them with every step's metrics, so that
// metrics.jsonl shows a fleet losing servers.
type SamplerMetrics interface {
	Metrics() map[string]float64
}

// Sample is one scored response of a step: the rollout's output (prompt,
// response, log mu_old, routes, weight version), its reward and advantage,
// and what the training engine computed for it (log pi_old, its routes,
// entropies). It is the one batch type between the two engines.
//
// A multi-turn trajectory's Response holds the model's tokens and the
// environment's observation tokens (Obs) in order. Only the model's
// tokens are sampled: every per-token array (LogMu, Versions, LogPiOld,
// Entropy, LogRef, and the objective's) runs over them alone, in order,
// so the objective, the corrections, the sequence-level quantities and
// the metrics see the model's tokens only and the observations get no
// gradient. Routes cover every position.
type Sample struct {
	Group    int // the prompt's index within the step
	Prompt   *Prompt
	Response []int32
	// Obs are the observation spans of Response (nil for one turn).
	Obs []rollout.Span
	// LogMu[j] is log mu_old of model token j under the distribution the
	// token was drawn from: the tempered softmax, renormalised over the
	// top-k / top-p set when truncation is on.
	LogMu   []float32
	Routes  *model.Routes // the rollout's, prompt and response positions (MoE)
	Version int64         // the weights that sampled it (its first token's)
	// Versions[j] is the version that sampled model token j, set only
	// when weights changed during the sample (rollout.partial: switch).
	Versions []int64
	Finish   string
	// Episode is how the environment's episode ended (multi-turn only).
	Episode *env.Outcome

	Reward, Correct, Advantage float64

	LogPiOld  []float32     // pi_old per model token
	Entropy   []float32     // pi_old's entropy per model token
	OldRoutes *model.Routes // the routes pi_old used
	LogRef    []float32     // the reference model's (KL penalty only)
}

// tokens returns the number of the model's tokens in the response.
func (s *Sample) tokens() int {
	n := len(s.Response)
	for _, o := range s.Obs {
		n -= o.End - o.Start
	}
	return n
}

// modelSpans calls f with each run [a, b) of the model's tokens in
// Response, in order.
func (s *Sample) modelSpans(f func(a, b int)) {
	at := 0
	for _, o := range s.Obs {
		if o.Start > at {
			f(at, o.Start)
		}
		at = o.End
	}
	if at < len(s.Response) {
		f(at, len(s.Response))
	}
}

// gather returns the model tokens' entries of a per-response-token array
// (v[j] belongs to Response[j]); v itself for one turn.
func (s *Sample) gather(v []float32) []float32 {
	if s.Obs == nil {
		return v
	}
	out := make([]float32, 0, s.tokens())
	s.modelSpans(func(a, b int) { out = append(out, v[a:b]...) })
	return out
}

// fromSeq returns the model tokens' entries of a training engine's
// per-sequence array (row[p-1+j] predicts Response[j], p the prompt's
// length), as a new slice.
func (s *Sample) fromSeq(row []float32) []float32 {
	a, b := s.span()
	return slices.Clone(s.gather(row[a:b]))
}

// toSeq writes per-model-token values v into a per-sequence array dst at
// the positions that predict those tokens.
func (s *Sample) toSeq(dst, v []float32) {
	a, _ := s.span()
	k := 0
	s.modelSpans(func(lo, hi int) {
		k += copy(dst[a+lo:a+hi], v[k:k+hi-lo])
	})
}

// seq returns prompt and response as one sequence.
func (s *Sample) seq() []int32 {
	out := make([]int32, 0, len(s.Prompt.IDs)+len(s.Response))
	return append(append(out, s.Prompt.IDs...), s.Response...)
}

// span returns where the response's log-probs sit in the training
// engine's per-sequence arrays: LogProbs[p-1+j] predicts Response[j].
func (s *Sample) span() (int, int) {
	p := len(s.Prompt.IDs)
	return p - 1, p - 1 + len(s.Response)
}

// Scorer gives a response's reward and whether it is correct (for the
// accuracy metrics); the loop's default runs the task's verifier.
type Scorer func(p *Prompt, response []int32) (reward, correct float64)

// BatchScorer scores a round's responses in one call (an external reward
// program): one Scored per sample, in order. An error stops the step.
type BatchScorer interface {
	ScoreBatch(ctx context.Context, samples []*Sample) ([]Scored, error)
}

// Scored is a BatchScorer's verdict on one response.
type Scored struct {
	Reward, Correct float64
	// Metrics are averaged over the step's responses into reward/ext/NAME.
	Metrics map[string]float64
	// Failed: the response could not be scored and got reward 0
	// (reward.on_error: zero); counted in reward/external_errors.
	Failed bool
}

// Loop is the synchronous RL loop of docs/method.md §5 over the policy's
// training engine and a rollout Sampler.
type Loop struct {
	R *Recipe
	// Trainer is the policy's training engine, its optimiser inside: the
	// loop reaches the policy only through it.
	Trainer train.Trainer
	Sampler Sampler
	Loader  *Loader
	Score   Scorer
	// Batch, when set, scores each round's responses in one call in
	// place of Score.
	Batch BatchScorer
	// Stop ends responses (<|im_end|>).
	Stop []int32
	// Reference scores the frozen starting model for the KL penalty (nil
	// without one); the loop only runs its Forward.
	Reference train.Trainer
	// Env, when set, makes every rollout multi-turn episodes of an
	// environment, which gives their rewards (Score and Batch are not
	// used); Budgets bound them and Tok decodes turns and encodes
	// observations. The Sampler must run episodes (the in-process engine
	// and the remote client do).
	Env     env.Environment
	Budgets env.Budgets
	Tok     *tokenizer.Tokenizer

	// Step is the number of completed global steps; the policy's weights
	// are version Step.
	Step int
	// NonFinite counts consecutive skipped optimiser steps.
	NonFinite int

	obj  Objective
	corr Correction
	moe  bool
	nMoE int
	// separatePiOld recomputes pi_old for the first mini-batch in its own
	// forward instead of reusing its first training forward (tests check
	// both give the same bits).
	separatePiOld bool
	// pipe is the rollout running ahead (rollout.staleness > 0), started
	// by the first step; restored holds the batches a checkpoint saved
	// until then.
	pipe     *pipeline
	restored []*batch
	closed   bool // by Close
	// engineTime accumulates the time spent inside the training engine
	// (forward, backward, gradient norm, AdamW) during a step, and
	// oldTokens the tokens of its pi_old-only forwards.
	engineTime time.Duration
	oldTokens  int
}

// ErrTooManyNonFinite stops a run whose optimiser steps keep diverging.
var ErrTooManyNonFinite = errors.New("rl: too many consecutive non-finite steps")

// Init checks the loop's parts against each other and prepares engines.
func (l *Loop) Init() error {
	if l.Trainer == nil || l.R == nil {
		return errors.New("rl: a Loop needs a recipe and a Trainer")
	}
	c := l.Trainer.Config()
	l.nMoE = len(c.MoELayers())
	l.moe = l.nMoE > 0
	if !l.moe && l.R.Algorithm.Replay != ReplayNone {
		return fmt.Errorf("algorithm.replay: %s needs an MoE model; %s is dense", l.R.Algorithm.Replay, c.Architecture)
	}
	if _, ok := l.Sampler.(turnSampler); l.Env != nil && (!ok || l.Tok == nil) {
		return fmt.Errorf("rl: an environment needs a rollout that runs multi-turn episodes (%T does not) and a tokenizer", l.Sampler)
	}
	if _, ok := l.Sampler.(switchingSampler); l.R.Rollout.Partial == PartialSwitch && !ok {
		return fmt.Errorf("rollout.partial: switch needs a rollout that takes new weights mid-sequence (the in-process engine, or keel servers); %T does not", l.Sampler)
	}
	if l.obj = l.R.Algorithm.objective(l.R.responseBudget()); l.obj == nil {
		return fmt.Errorf("algorithm.objective: %q with no clip range, or unknown (want %s): build recipes with ParseRecipe", l.R.Algorithm.Objective, objectiveNames())
	}
	l.corr = l.R.Algorithm.correction()
	return nil
}

// StepResult is what one global step measured.
type StepResult struct {
	Metrics map[string]float64
	Samples []*Sample
	Skipped int // optimiser steps skipped as non-finite
	// Unpushed: the context was cancelled during the weight push, so the
	// rollout does not hold the step's weights.
	Unpushed bool
}

// phase timers of a step.
type phases struct {
	rollout, score, old, update, push time.Duration
	// wait is the trainer's wait for the step's batch when the rollout
	// runs ahead (rollout and score then overlap the training).
	wait time.Duration
}

// RunStep runs one global step: rollout, scoring, advantages, pi_old, N
// mini-batch updates and the weight push. ctx aborts a weight push that
// hangs (remote servers): the step is then complete but its weights not
// pushed (StepResult.Unpushed), and the caller should stop with a
// checkpoint, from which a resumed run pushes them first.
func (l *Loop) RunStep(ctx context.Context) (*StepResult, error) {
	start := time.Now()
	var ph phases
	l.engineTime, l.oldTokens = 0, 0
	step := l.Step + 1
	m := map[string]float64{}

	b, err := l.batch(step, &ph)
	if err != nil {
		return nil, err
	}
	groups, genTokens := b.groups, b.genTokens
	for k, v := range b.metrics {
		m[k] = v
	}
	var samples []*Sample
	for _, g := range groups {
		samples = append(samples, g...)
	}
	res := &StepResult{Metrics: m, Samples: samples}
	mbs := splitMiniBatches(groups, l.R.Train.MiniBatches)

	t := time.Now()
	if err := l.oldLogProbs(mbs, samples); err != nil {
		return nil, err
	}
	ph.old = time.Since(t)

	t = time.Now()
	var tot stepTotals
	for i, mb := range mbs {
		if len(mb) == 0 {
			continue // fewer groups than mini-batches (dynamic sampling): no empty steps
		}
		tot.updates++
		mr, err := l.update(i, mb)
		if errors.Is(err, errNonFinite) {
			res.Skipped++
			l.NonFinite++
			if l.NonFinite >= l.R.Guards.MaxNonFinite {
				return nil, fmt.Errorf("%w: %d in a row (guards.max_nonfinite = %d); the last checkpoint is intact", ErrTooManyNonFinite, l.NonFinite, l.R.Guards.MaxNonFinite)
			}
			tot.stale = append(tot.stale, math.NaN())
			continue
		}
		if err != nil {
			return nil, err
		}
		l.NonFinite = 0
		tot.add(mr)
	}
	ph.update = time.Since(t)

	if !l.async() {
		t = time.Now()
		if err := l.push(ctx, step); err != nil {
			if ctx.Err() == nil {
				return nil, err
			}
			res.Unpushed = true
		}
		ph.push = time.Since(t)
	}
	l.Step = step

	// Metrics (docs/method.md §6).
	m["train/skipped_steps"] = float64(res.Skipped)
	m["lr"] = l.R.schedule().LR(int(l.Trainer.Steps()))
	tot.metrics(m, res.Skipped, l.Reference != nil)
	l.discrepancyMetrics(samples, m)
	if l.async() {
		lagMetrics(samples, step, l.ahead(), m)
	}
	if sm, ok := l.Sampler.(SamplerMetrics); ok && !l.async() {
		for k, v := range sm.Metrics() {
			m[k] = v
		}
	}
	l.timeMetrics(m, &ph, time.Since(start), genTokens, tot.trainTokens)
	return res, nil
}

// batch returns step's rollout: collected now from the weights the step
// starts from, or (running ahead) the batch the worker sampled from the
// weights of k versions before, queuing the next one. ph gets the
// rollout's and scoring's times, and the trainer's wait.
func (l *Loop) batch(step int, ph *phases) (*batch, error) {
	if !l.async() {
		b := l.collect(step, int64(l.Step))
		ph.rollout, ph.score = b.rollout, b.score
		return b, b.err
	}
	if l.closed {
		return nil, errClosed
	}
	if l.pipe == nil {
		l.startPipeline()
	}
	d, err := l.advance(step)
	if err != nil {
		return nil, err
	}
	ph.push = d
	b, wait := l.take(step)
	if b.err != nil {
		return nil, b.err
	}
	ph.rollout, ph.score, ph.wait = b.rollout, b.score, wait
	b.metrics["time/rollout_idle"] = b.idle.Seconds()
	return b, nil
}

// lagMetrics records how many versions the step's samples are behind the
// weights it starts from (pi_old is version step-1), per sample (its first
// token's weights: mean and max) and the share of response tokens at each
// lag 0..k, and the fraction of samples whose weights changed during them
// (rollout.partial: switch). The synchronous loop's lags are 0, not logged.
func lagMetrics(samples []*Sample, step, k int, m map[string]float64) {
	if len(samples) == 0 {
		return
	}
	var sum, most, switched float64
	tokens := make([]float64, k+1)
	var total float64 // tokens within [0, k] (a resumed run's k may differ)
	for _, s := range samples {
		lag := float64(int64(step-1) - s.Version)
		sum += lag
		most = max(most, lag)
		if s.Versions != nil {
			switched++
		}
		for j := range s.tokens() {
			v := s.Version
			if s.Versions != nil {
				v = s.Versions[j]
			}
			if d := int64(step-1) - v; d >= 0 && d <= int64(k) {
				tokens[d]++
				total++
			}
		}
	}
	m["rollout/lag_mean"] = sum / float64(len(samples))
	m["rollout/lag_max"] = most
	m["rollout/switched_frac"] = switched / float64(len(samples))
	for d, n := range tokens {
		m["rollout/tokens_lag"+itoa(d)] = n / max(total, 1)
	}
}

// splitMiniBatches cuts a step's groups into n mini-batches of whole
// groups, in order.
func splitMiniBatches(groups [][]*Sample, n int) [][]*Sample {
	mbs := make([][]*Sample, n)
	for i := range n {
		lo, hi := i*len(groups)/n, (i+1)*len(groups)/n
		for _, g := range groups[lo:hi] {
			mbs[i] = append(mbs[i], g...)
		}
	}
	return mbs
}

// oldLogProbs computes pi_old for the mini-batches that are not the first,
// and the reference model's log-probs under a KL penalty. The first
// mini-batch's pi_old is its own first training forward (same weights,
// tokens and routes; the kernels are batch invariant, so the same bits)
// for the samples it trains on, and a forward here for those it does not
// (see trains).
func (l *Loop) oldLogProbs(mbs [][]*Sample, samples []*Sample) error {
	for i, todo := range mbs {
		if i == 0 && !l.separatePiOld {
			todo = nil
			for _, s := range mbs[0] {
				if !l.trains(s) {
					todo = append(todo, s)
				}
			}
		}
		if err := l.piOld(todo); err != nil {
			return err
		}
	}
	if l.Reference != nil {
		return l.refLogProbs(samples)
	}
	return nil
}

// push sends the trainer's new weights to the rollout as version step:
// device to device when the sampler can take them from the trainer (both
// engines on one GPU), else through the host.
func (l *Loop) push(ctx context.Context, step int) error {
	if d, ok := l.Sampler.(interface {
		UpdateWeightsFrom(ctx context.Context, src any, version int64) (bool, error)
	}); ok {
		done, err := d.UpdateWeightsFrom(ctx, l.Trainer, int64(step))
		if err != nil {
			return fmt.Errorf("weight push: %w", err)
		}
		if done {
			return nil
		}
	}
	w, err := l.Trainer.Weights()
	if err == nil {
		err = l.Sampler.UpdateWeights(ctx, w, int64(step))
	}
	if err != nil {
		return fmt.Errorf("weight push: %w", err)
	}
	return nil
}

// stepTotals accumulates a step's mini-batch updates for its metrics.
type stepTotals struct {
	all                      Stats
	updates                  int // mini-batches run (skipped ones included)
	gradSum, gradMax, klSum  float64
	surrSum                  float64
	surrN                    int
	stale                    []float64 // per mini-batch (NaN: skipped)
	staleRoute               []float64 // per MoE layer: summed pi_old vs pi_theta disagreement
	staleRouteN, trainTokens int
}

// add takes one completed mini-batch update.
func (a *stepTotals) add(mr *mbResult) {
	a.all.Add(mr.stats)
	a.gradSum += mr.gradNorm
	a.gradMax = max(a.gradMax, mr.gradNorm)
	a.klSum += mr.klSum
	a.surrSum += mr.surrogate * float64(mr.trained)
	a.surrN += mr.trained
	a.stale = append(a.stale, mr.stats.Staleness())
	if mr.disagree != nil {
		if a.staleRoute == nil {
			a.staleRoute = make([]float64, len(mr.disagree))
		}
		for k, v := range mr.disagree {
			a.staleRoute[k] += v
		}
		a.staleRouteN++
	}
	a.trainTokens += mr.tokens
}

// metrics records the updates' measures: gradient norms, IS weights,
// clipping, staleness, surrogate gap, routing drift and the KL to the
// reference (withRef).
func (a *stepTotals) metrics(m map[string]float64, skipped int, withRef bool) {
	if done := float64(a.updates - skipped); done > 0 {
		m["grad_norm"] = a.gradSum / done
		m["grad_norm/max"] = a.gradMax
	}
	all := &a.all
	if all.HasWeights() {
		m["is/mean"], m["is/min"], m["is/max"] = all.ISMean(), all.ISMin, all.ISMax
		m["is/truncated_frac"], m["is/masked_frac"], m["is/ess"] = all.TruncatedFrac(), all.MaskedFrac(), all.ESS()
	}
	m["clip/pos_frac"], m["clip/neg_frac"] = all.ClipPosFrac(), all.ClipNegFrac()
	for i, s := range a.stale {
		m["staleness/mb"+itoa(i)] = s
	}
	if a.surrN > 0 {
		m["surrogate/gap"] = a.surrSum / float64(a.surrN)
	}
	if a.staleRoute != nil {
		var mean float64
		for k, v := range a.staleRoute {
			m["routing/old_vs_theta/l"+itoa(k)] = v / float64(a.staleRouteN)
			mean += v / float64(a.staleRouteN)
		}
		m["routing/old_vs_theta"] = mean / float64(len(a.staleRoute))
	}
	if withRef && all.Tokens > 0 {
		m["kl_ref/k3"] = a.klSum / float64(all.Tokens)
	}
}

// timeMetrics records where the step's time went and its throughput.
func (l *Loop) timeMetrics(m map[string]float64, ph *phases, total time.Duration, genTokens, trainTokens int) {
	m["time/rollout"] = ph.rollout.Seconds()
	m["time/score"] = ph.score.Seconds()
	m["time/old_logprobs"] = ph.old.Seconds()
	m["time/update"] = ph.update.Seconds()
	m["time/weight_push"] = ph.push.Seconds()
	m["time/step"] = total.Seconds()
	// The rollout's share of the step: its whole time, or (running
	// ahead) the trainer's wait for it.
	rollout, score := ph.rollout, ph.score
	if l.async() {
		m["time/trainer_idle"] = ph.wait.Seconds()
		rollout, score = ph.wait, 0
	}
	m["time/other"] = (total - rollout - score - ph.old - ph.update - ph.push).Seconds()
	// What the loop itself costs: everything but the two engines and the
	// weight push (scoring, coefficients, metrics, bookkeeping).
	m["time/train_engine"] = l.engineTime.Seconds()
	m["time/loop_overhead"] = (total - rollout - l.engineTime - ph.push).Seconds()
	m["tokens_per_s/rollout"] = float64(genTokens) / ph.rollout.Seconds()
	if d := (ph.old + ph.update).Seconds(); d > 0 {
		m["tokens_per_s/train"] = float64(trainTokens+l.oldTokens) / d
	}
}

// batch is one step's rollout: its scored groups, what collecting them
// measured, and where the loader stood after them.
type batch struct {
	step              int
	groups            [][]*Sample
	rounds, genTokens int
	// metrics holds the rollout's measures (rewards, accuracy, lengths,
	// groups, rounds), the start of the step's metrics.
	metrics        map[string]float64
	rollout, score time.Duration
	idle           time.Duration // the rollout worker's wait for this job (running ahead)
	loader         LoaderState
	err            error
	// ext gathers a BatchScorer's per-response metrics (sums and counts)
	// and failures over the step's rounds.
	extSum    map[string]float64
	extN      map[string]int
	extFailed int
}

// collect samples B prompts' groups from weights of version want (more
// rounds under dynamic sampling), scores them and computes advantages.
func (l *Loop) collect(step int, want int64) *batch {
	r := l.R
	B, G := r.Train.PromptsPerStep, r.Train.GroupSize
	b := &batch{step: step, metrics: map[string]float64{}}
	var scored []*Sample // every sample scored, for the reward metrics
	zeroVar := 0
	for round := 0; ; round++ {
		b.rounds++
		groups, err := l.round(step, round, want, b)
		if err != nil {
			b.err = err
			return b
		}
		t := time.Now()
		for _, g := range groups {
			scored = append(scored, g...)
			if equalRewards(g) {
				zeroVar++
				if r.Algorithm.DynamicSampling {
					continue
				}
			}
			b.groups = append(b.groups, g)
		}
		b.score += time.Since(t)
		if !r.Algorithm.DynamicSampling || len(b.groups) >= B || round+1 >= r.Algorithm.MaxRounds {
			break
		}
	}
	if len(b.groups) > B {
		b.groups = b.groups[:B]
	}
	if len(b.groups) == 0 {
		// Every group was dropped: keep the first B scored ones so the step runs
		// (a zero-gradient step, logged), never an empty update.
		for i := 0; i < len(scored); i += G {
			b.groups = append(b.groups, scored[i:i+G])
			if len(b.groups) == B {
				break
			}
		}
	}
	for i, g := range b.groups {
		for _, s := range g {
			s.Group = i
		}
	}
	m := b.metrics
	rewardMetrics(scored, m)
	if l.Env != nil {
		episodeMetrics(scored, m)
	}
	if l.Batch != nil {
		m["reward/external_errors"] = float64(b.extFailed)
		for k, v := range b.extSum {
			m["reward/ext/"+k] = v / float64(b.extN[k])
		}
	}
	m["groups/zero_variance_frac"] = float64(zeroVar) / float64(max(len(scored)/G, 1))
	m["groups/trained"] = float64(len(b.groups))
	m["rollout/rounds"] = float64(b.rounds)
	b.loader = l.Loader.State()
	return b
}

// round samples G responses to each of the next B prompts from weights of
// version want, scores them and computes each group's advantages (rollout
// and scoring time into b).
func (l *Loop) round(step, round int, want int64, b *batch) ([][]*Sample, error) {
	r := l.R
	B, G := r.Train.PromptsPerStep, r.Train.GroupSize
	prompts := l.Loader.Next(B)
	ids := make([][]int32, len(prompts))
	for i, p := range prompts {
		ids[i] = p.IDs
	}
	sp := rollout.Sampling{
		Temperature: r.Rollout.Temperature, TopK: r.Rollout.TopK, TopP: r.Rollout.TopP,
		MaxNewTokens: r.Rollout.MaxNewTokens, Stop: l.Stop,
		Seed: mix(r.Seed, uint64(step), uint64(round)),
	}
	var sess *env.Session
	if l.Env != nil {
		rows := make([]*data.Example, len(prompts))
		for i, p := range prompts {
			rows[i] = &p.Example
		}
		var err error
		if sess, err = env.NewSession(context.Background(), l.Env, l.Tok, rows, G, l.Budgets); err != nil {
			return nil, err
		}
	}
	t := time.Now()
	if sess != nil {
		sp.EpisodeTokens = l.Budgets.MaxTokens
	}
	out, err := l.generate(ids, G, sp, sess)
	if sess != nil {
		// A failed close (an environment server's) loses no result: it is
		// counted, not fatal.
		failed, _ := sess.Close()
		b.metrics["env/close_errors"] += float64(failed)
	}
	b.rollout += time.Since(t)
	if err != nil {
		return nil, fmt.Errorf("rollout: %w", err)
	}
	t = time.Now()
	defer func() { b.score += time.Since(t) }()
	if err := checkCounts(out, len(prompts), G); err != nil {
		return nil, err
	}
	groups := make([][]*Sample, len(prompts))
	all := make([]*Sample, 0, len(out))
	for _, o := range out {
		// The loop trains only on samples of the weights it asked for (or,
		// with max_staleness, newer).
		if o.Version < want || (o.Version != want && !l.freshest()) {
			return nil, fmt.Errorf("rollout: a sample of prompt %d carries weight version %d, the step's samples must be of version %d", o.Prompt, o.Version, want)
		}
		s, err := l.newSample(prompts[o.Prompt], o)
		if err != nil {
			return nil, err
		}
		if sess != nil {
			oc := sess.Outcome(o.Prompt, o.Index)
			s.Episode = &oc
			s.Reward, s.Correct = oc.Reward, oc.Correct
		}
		b.genTokens += s.tokens()
		groups[o.Prompt] = append(groups[o.Prompt], s)
		all = append(all, s)
	}
	if err := l.score(all, b); err != nil {
		return nil, err
	}
	for _, g := range groups {
		rewards := make([]float64, len(g))
		for j, s := range g {
			rewards[j] = s.Reward
		}
		adv, err := Advantages(rewards, len(g), r.Algorithm.Advantage)
		if err != nil {
			return nil, err
		}
		for j, s := range g {
			s.Advantage = adv[j]
		}
	}
	return groups, nil
}

// checkCounts checks that out holds G samples of each of n prompts.
func checkCounts(out []rollout.Sample, n, G int) error {
	if len(out) != n*G {
		return fmt.Errorf("rollout: %d samples for %d prompts x %d", len(out), n, G)
	}
	count := make([]int, n)
	for _, o := range out {
		if o.Prompt < 0 || o.Prompt >= n {
			return fmt.Errorf("rollout: sample for prompt %d of %d", o.Prompt, n)
		}
		count[o.Prompt]++
	}
	for p, c := range count {
		if c != G {
			return fmt.Errorf("rollout: %d samples for prompt %d, want %d", c, p, G)
		}
	}
	return nil
}

// equalRewards reports whether every response of a group has the same
// reward (its advantages are all 0).
func equalRewards(g []*Sample) bool {
	for _, s := range g {
		if s.Reward != g[0].Reward {
			return false
		}
	}
	return true
}

// mix derives a sampling seed from the run seed, the step and the round.
func mix(seed, step, round uint64) uint64 {
	x := seed*0x9e3779b97f4a7c15 ^ step*0xbf58476d1ce4e5b9 ^ round*0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// newSample turns a rollout sample into a Sample, checked; score gives it
// its reward.
func (l *Loop) newSample(p *Prompt, o rollout.Sample) (*Sample, error) {
	s := &Sample{Prompt: p, Response: o.Tokens, Obs: o.Observations, LogMu: o.LogProbs, Version: o.Version, Finish: o.Finish}
	if o.TruncLogProbs != nil {
		s.LogMu = o.TruncLogProbs
	}
	if err := checkSpans(s.Obs, len(s.Response)); err != nil {
		return nil, fmt.Errorf("rollout: a sample of prompt row %d: %w", p.Row, err)
	}
	if len(s.Response) == 0 || len(s.LogMu) != len(s.Response) || s.tokens() == 0 {
		return nil, fmt.Errorf("rollout: a sample of prompt row %d has %d tokens (%d of the model) and %d log-probs", p.Row, len(s.Response), s.tokens(), len(s.LogMu))
	}
	s.LogMu = s.gather(s.LogMu)
	if o.TokenVersions != nil {
		if len(o.TokenVersions) != len(s.Response) {
			return nil, fmt.Errorf("rollout: a sample of prompt row %d has %d tokens and %d token versions", p.Row, len(s.Response), len(o.TokenVersions))
		}
		s.Versions = o.TokenVersions
		if s.Obs != nil {
			s.Versions = nil
			s.modelSpans(func(a, b int) { s.Versions = append(s.Versions, o.TokenVersions[a:b]...) })
		}
	}
	if err := checkVersions(s.Version, s.Versions, s.tokens()); err != nil {
		return nil, fmt.Errorf("rollout: a sample of prompt row %d: %w", p.Row, err)
	}
	if l.moe {
		if o.Routes == nil {
			return nil, fmt.Errorf("rollout: a sample of prompt row %d has no routes (MoE model)", p.Row)
		}
		rt := o.Routes
		if err := rt.Check(); err != nil {
			return nil, fmt.Errorf("rollout: a sample of prompt row %d: %w", p.Row, err)
		}
		c := l.Trainer.Config()
		if err := rt.Validate(l.nMoE, c.NumExperts, c.NumExpertsPerTok); err != nil {
			return nil, fmt.Errorf("rollout: a sample of prompt row %d: %w", p.Row, err)
		}
		if rt.Tokens != len(p.IDs)+len(s.Response) {
			return nil, fmt.Errorf("rollout: a sample of prompt row %d has routes for %d positions, prompt and response have %d", p.Row, rt.Tokens, len(p.IDs)+len(s.Response))
		}
		s.Routes = rt
	}
	return s, nil
}

// score gives a round's samples their rewards and correctness: the
// BatchScorer's, in one call, or Score's per sample; then DAPO's overlong
// penalty. A BatchScorer's metrics and failures go into b.
func (l *Loop) score(samples []*Sample, b *batch) error {
	switch {
	case l.Env != nil: // the episodes gave the rewards
	case l.Batch != nil:
		res, err := l.Batch.ScoreBatch(context.Background(), samples)
		if err != nil {
			return err
		}
		if len(res) != len(samples) {
			return fmt.Errorf("reward: %d results for %d responses", len(res), len(samples))
		}
		if b.extSum == nil {
			b.extSum, b.extN = map[string]float64{}, map[string]int{}
		}
		for i, s := range samples {
			r := res[i]
			s.Reward, s.Correct = r.Reward, r.Correct
			if r.Failed {
				b.extFailed++
			}
			for k, v := range r.Metrics {
				b.extSum[k] += v
				b.extN[k]++
			}
		}
	default:
		for _, s := range samples {
			s.Reward, s.Correct = l.Score(s.Prompt, s.Response)
		}
	}
	if buf := l.R.Algorithm.OverlongBuffer; buf > 0 {
		for _, s := range samples {
			n := s.tokens()
			if l.Env != nil {
				n = len(s.Response) // env.max_tokens counts the observations too
			}
			s.Reward += OverlongPenalty(n, l.R.responseBudget(), buf, l.R.Algorithm.OverlongPenalty)
		}
	}
	return nil
}

// OverlongPenalty is DAPO's soft overlong punishment of a response of n
// tokens under a budget of max: 0 up to max-buffer tokens, then falling
// linearly to -penalty at max.
func OverlongPenalty(n, max, buffer int, penalty float64) float64 {
	if buffer <= 0 || n <= max-buffer {
		return 0
	}
	return -penalty * math.Min(1, float64(n-(max-buffer))/float64(buffer))
}

// microBatches cuts samples into consecutive runs of at most budget
// tokens (at least one sample each).
func microBatches(samples []*Sample, budget int) [][]*Sample {
	var out [][]*Sample
	lo, tokens := 0, 0
	for i, s := range samples {
		n := len(s.Prompt.IDs) + len(s.Response)
		if i > lo && tokens+n > budget {
			out = append(out, samples[lo:i])
			lo, tokens = i, 0
		}
		tokens += n
	}
	if lo < len(samples) {
		out = append(out, samples[lo:])
	}
	return out
}

// forwardOpts returns the training engine's options for a micro-batch:
// the routes to replay under R3 (the rollout's) or, for pi_theta under R2,
// pi_old's.
func (l *Loop) forwardOpts(mb []*Sample, theta bool) train.ForwardOptions {
	opt := train.ForwardOptions{Record: l.moe, Temperature: l.R.Rollout.Temperature}
	switch l.R.Algorithm.Replay {
	case ReplayR3:
		opt.Replay = make([]*model.Routes, len(mb))
		for i, s := range mb {
			opt.Replay[i] = s.Routes
		}
	case ReplayR2:
		if theta && mb[0].OldRoutes != nil {
			opt.Replay = make([]*model.Routes, len(mb))
			for i, s := range mb {
				opt.Replay[i] = s.OldRoutes
			}
		}
	}
	return opt
}

func seqs(mb []*Sample) [][]int32 {
	out := make([][]int32, len(mb))
	for i, s := range mb {
		out[i] = s.seq()
	}
	return out
}

// setPiOld stores a forward's log-probs, entropies and routes as pi_old.
func setPiOld(mb []*Sample, res *train.Result) {
	for i, s := range mb {
		s.LogPiOld = s.fromSeq(res.LogProbs[i])
		if res.Entropy != nil {
			s.Entropy = s.fromSeq(res.Entropy[i])
		}
		if res.Routes != nil {
			s.OldRoutes = res.Routes[i]
		}
	}
}

// piOld recomputes log pi_old of samples with the training engine.
func (l *Loop) piOld(samples []*Sample) error {
	for _, mb := range microBatches(samples, l.R.Train.MicroBatchTokens) {
		t := time.Now()
		sq := seqs(mb)
		res, err := l.Trainer.Forward(sq, l.forwardOpts(mb, false))
		l.engineTime += time.Since(t)
		if err != nil {
			return fmt.Errorf("pi_old: %w", err)
		}
		for _, q := range sq {
			l.oldTokens += len(q)
		}
		setPiOld(mb, res)
	}
	return nil
}

// refLogProbs computes the reference model's log-probs (KL penalty).
func (l *Loop) refLogProbs(samples []*Sample) error {
	for _, mb := range microBatches(samples, l.R.Train.MicroBatchTokens) {
		t := time.Now()
		res, err := l.Reference.Forward(seqs(mb), train.ForwardOptions{NoEntropy: true, Temperature: l.R.Rollout.Temperature})
		l.engineTime += time.Since(t)
		if err != nil {
			return fmt.Errorf("reference: %w", err)
		}
		for i, s := range mb {
			s.LogRef = s.fromSeq(res.LogProbs[i])
		}
	}
	return nil
}

var errNonFinite = errors.New("non-finite loss or gradient")

// trains reports whether s can contribute to the gradient: a non-zero
// advantage, or a term that does not depend on it (KL, entropy, the MoE
// auxiliary loss). The others' coefficients are all zero, so the update
// skips their forward and backward (their pi_old, for the metrics, is a
// forward only); the objective still normalises by the whole mini-batch.
func (l *Loop) trains(s *Sample) bool {
	a := &l.R.Algorithm
	return s.Advantage != 0 || a.KLCoef > 0 || a.EntropyCoef > 0 || l.R.Train.AuxLoss > 0
}

// update runs mini-batch i: forward, coefficients and backward over the
// micro-batches of its samples that train (see trains), then one AdamW
// step; the statistics are over those samples.
func (l *Loop) update(i int, mb []*Sample) (*mbResult, error) {
	r := l.R
	tot := Totals{Responses: len(mb)}
	var active []*Sample
	activeTokens := 0
	for _, s := range mb {
		tot.Tokens += s.tokens()
		if l.trains(s) {
			active = append(active, s)
			activeTokens += len(s.Prompt.IDs) + len(s.Response)
		}
	}
	l.Trainer.ZeroGrad()
	var acc mbAccum
	for _, micro := range microBatches(active, r.Train.MicroBatchTokens) {
		err := l.microStep(i, micro, tot, activeTokens, &acc)
		if errors.Is(err, errNonFinite) {
			return nil, l.abandon(i, active)
		}
		if err != nil {
			return nil, err
		}
	}
	lr := r.schedule().LR(int(l.Trainer.Steps()) + 1)
	t := time.Now()
	gn, err := l.Trainer.Step(lr, r.Train.ClipNorm)
	l.engineTime += time.Since(t)
	if errors.Is(err, train.ErrNonFinite) {
		return nil, errNonFinite
	}
	if err != nil {
		return nil, err
	}
	surr := MeasureDiscrepancy(acc.logMu, acc.logPi).SurrogateGap
	var dis []float64
	if len(acc.thetaR) > 0 {
		dis = RoutingDisagreement(acc.oldR, acc.thetaR, nil)
	}
	return &mbResult{stats: acc.st, gradNorm: gn, klSum: acc.klSum, surrogate: surr, trained: len(acc.logMu), disagree: dis, tokens: acc.tokens}, nil
}

// abandon gives up mini-batch i's update as non-finite; the first
// mini-batch's samples not yet run still need their pi_old (a forward
// only) for the metrics.
func (l *Loop) abandon(i int, active []*Sample) error {
	if i == 0 && !l.separatePiOld {
		var rest []*Sample
		for _, s := range active {
			if s.LogPiOld == nil {
				rest = append(rest, s)
			}
		}
		if err := l.piOld(rest); err != nil {
			return err
		}
	}
	return errNonFinite
}

// mbAccum gathers a mini-batch update's measures over its micro-batches.
type mbAccum struct {
	st           Stats
	klSum        float64
	logMu, logPi [][]float32     // per response trained on
	oldR, thetaR []*model.Routes // pi_old's and pi_theta's routes (live routing, later mini-batches)
	tokens       int
}

// microStep runs one micro-batch of mini-batch i: the forward (pi_old
// too, for the first mini-batch), the objective's coefficients with the
// correction and the KL term, and the backward of their loss. It returns
// errNonFinite for a NaN or Inf coefficient or auxiliary loss.
func (l *Loop) microStep(i int, micro []*Sample, tot Totals, activeTokens int, acc *mbAccum) error {
	r := l.R
	fresh := i == 0 && !l.separatePiOld
	opt := l.forwardOpts(micro, !fresh)
	opt.Backward = true
	opt.NoEntropy = !fresh && r.Algorithm.EntropyCoef == 0
	t := time.Now()
	res, err := l.Trainer.Forward(seqs(micro), opt)
	l.engineTime += time.Since(t)
	if err != nil {
		return fmt.Errorf("mini-batch %d: %w", i, err)
	}
	if fresh {
		setPiOld(micro, res)
	}
	batch := make([]Response, len(micro))
	for k, s := range micro {
		a, b := s.span()
		batch[k] = Response{Advantage: s.Advantage, LogMu: s.LogMu, LogPiOld: s.LogPiOld, LogPi: s.gather(res.LogProbs[k][a:b])}
		acc.tokens += len(s.Prompt.IDs) + len(s.Response)
		acc.logMu = append(acc.logMu, s.LogMu)
		acc.logPi = append(acc.logPi, batch[k].LogPi)
		if l.moe && r.Algorithm.Replay == ReplayNone && i > 0 && res.Routes != nil {
			acc.oldR = append(acc.oldR, s.OldRoutes)
			acc.thetaR = append(acc.thetaR, res.Routes[k])
		}
	}
	coef, norm, err := l.coefficients(micro, batch, tot, acc)
	if err != nil {
		return err
	}
	loss, err := l.loss(micro, coef, norm, activeTokens)
	if err != nil {
		return err
	}
	if math.IsNaN(res.AuxLoss) || math.IsInf(res.AuxLoss, 0) {
		return errNonFinite
	}
	t = time.Now()
	err = l.Trainer.Backward(loss)
	l.engineTime += time.Since(t)
	if err != nil {
		return fmt.Errorf("mini-batch %d: %w", i, err)
	}
	return nil
}

// coefficients returns the per-token coefficients of a micro-batch (the
// objective's, corrected, with the KL penalty's) and each response's
// aggregation multiplier, adding their statistics to acc.
func (l *Loop) coefficients(micro []*Sample, batch []Response, tot Totals, acc *mbAccum) ([][]float32, []float64, error) {
	a := &l.R.Algorithm
	coef, mst, err := l.obj.Coefficients(batch, tot)
	if err != nil {
		return nil, nil, err
	}
	if err := l.corr.Apply(batch, coef, &mst); err != nil {
		return nil, nil, err
	}
	norm, err := Norms(batch, a.aggregation(), l.R.responseBudget(), tot)
	if err != nil {
		return nil, nil, err
	}
	if l.Reference != nil && a.KLCoef > 0 {
		ref := make([][]float32, len(micro))
		for k, s := range micro {
			ref[k] = s.LogRef
		}
		kl, err := KLPenalty(batch, ref, norm, a.KLCoef, coef)
		if err != nil {
			return nil, nil, err
		}
		acc.klSum += kl
	}
	acc.st.Add(mst)
	return coef, norm, nil
}

// loss lays a micro-batch's coefficients out as the training engine's loss
// over whole sequences (prompt positions 0), with the entropy bonus and
// the auxiliary loss; errNonFinite for a NaN or Inf coefficient.
func (l *Loop) loss(micro []*Sample, coef [][]float32, norm []float64, activeTokens int) (train.Loss, error) {
	r := l.R
	// The auxiliary loss of a forward is a mean over its tokens: weigh
	// each micro-batch's by its share of the mini-batch's tokens, so the
	// cut into micro-batches does not scale it.
	microTokens := 0
	for _, s := range micro {
		microTokens += len(s.Prompt.IDs) + len(s.Response)
	}
	loss := train.Loss{LogProb: make([][]float32, len(micro)), Aux: r.Train.AuxLoss * float64(microTokens) / float64(activeTokens)}
	if r.Algorithm.EntropyCoef > 0 {
		loss.Entropy = make([][]float32, len(micro))
	}
	for k, s := range micro {
		n := len(s.Prompt.IDs) + len(s.Response) - 1
		for _, c := range coef[k] {
			if math.IsNaN(float64(c)) || math.IsInf(float64(c), 0) {
				return train.Loss{}, errNonFinite
			}
		}
		loss.LogProb[k] = make([]float32, n)
		s.toSeq(loss.LogProb[k], coef[k])
		if loss.Entropy != nil {
			ent := make([]float32, s.tokens())
			for j := range ent {
				ent[j] = float32(-r.Algorithm.EntropyCoef * norm[k])
			}
			loss.Entropy[k] = make([]float32, n)
			s.toSeq(loss.Entropy[k], ent)
		}
	}
	return loss, nil
}

// mbResult is what one mini-batch update measured.
type mbResult struct {
	stats     Stats
	gradNorm  float64   // before clipping
	klSum     float64   // Σ k3 to the reference
	surrogate float64   // mean surrogate gap of pi_theta against mu_old
	trained   int       // responses trained on
	disagree  []float64 // pi_old vs pi_theta routing disagreement per MoE layer (live routing)
	tokens    int       // tokens through the training engine
}

// rewardMetrics records reward, accuracy (overall and per task) and length
// statistics over every scored sample of the step.
func rewardMetrics(samples []*Sample, m map[string]float64) {
	if len(samples) == 0 {
		return
	}
	var sum, sq, acc, lenSum, lenMax, truncated float64
	perTask := map[string][2]float64{}
	for _, s := range samples {
		sum += s.Reward
		sq += s.Reward * s.Reward
		acc += s.Correct
		n := float64(s.tokens())
		lenSum += n
		lenMax = max(lenMax, n)
		if s.Finish == "length" {
			truncated++
		}
		t := perTask[s.Prompt.Example.Task]
		perTask[s.Prompt.Example.Task] = [2]float64{t[0] + s.Correct, t[1] + 1}
	}
	n := float64(len(samples))
	mean := sum / n
	m["reward/mean"] = mean
	m["reward/std"] = math.Sqrt(math.Max(0, sq/n-mean*mean))
	m["accuracy"] = acc / n
	tasks := make([]string, 0, len(perTask))
	for t := range perTask {
		tasks = append(tasks, t)
	}
	sort.Strings(tasks)
	for _, t := range tasks {
		v := perTask[t]
		m["accuracy/"+t] = v[0] / v[1]
	}
	m["response_length/mean"] = lenSum / n
	m["response_length/max"] = lenMax
	m["response/truncated_frac"] = truncated / n
}

// episodeMetrics records how a step's episodes went, averaged over them:
// model turns, observation tokens, the share that the environment ended
// (done) and that a budget cut (each budget's share), the environment's
// own metrics (env/NAME: tool calls, tool errors, ...), and the seconds
// spent in the environment per episode (time/env_episode; episodes run
// concurrently with decoding).
func episodeMetrics(samples []*Sample, m map[string]float64) {
	sums := map[string]float64{}
	n := 0
	for _, s := range samples {
		oc := s.Episode
		if oc == nil {
			continue
		}
		n++
		sums["env/turns"] += float64(oc.Turns)
		sums["env/obs_tokens"] += float64(oc.ObsTokens)
		sums["time/env_episode"] += oc.Time.Seconds()
		sums["env/done_frac"] += indicator(oc.Done)
		for _, cut := range []string{env.CutTurns, env.CutTokens, env.CutContext} {
			sums["env/cut_"+cut+"_frac"] += indicator(oc.Cut == cut)
		}
		for k, v := range oc.Metrics {
			sums["env/"+k] += v
		}
	}
	for k, v := range sums {
		m[k] = v / float64(max(n, 1))
	}
}

// indicator is 1 for true, 0 for false.
func indicator(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// discrepancyMetrics records pi_old against mu_old (train-infer KL, |Δ log
// p|, perplexity gap, surrogate gap), the entropy and the rollout-vs-pi_old
// routing disagreement per MoE layer.
func (l *Loop) discrepancyMetrics(samples []*Sample, m map[string]float64) {
	logMu := make([][]float32, len(samples))
	logOld := make([][]float32, len(samples))
	var ent float64
	var entN int
	for i, s := range samples {
		logMu[i], logOld[i] = s.LogMu, s.LogPiOld
		for _, e := range s.Entropy {
			ent += float64(e)
			entN++
		}
	}
	d := MeasureDiscrepancy(logMu, logOld)
	m["train_infer/k1"], m["train_infer/k3"] = d.K1, d.K3
	m["train_infer/abs_diff_mean"], m["train_infer/abs_diff_max"] = d.MeanAbs, d.MaxAbs
	m["train_infer/ppl_gap"], m["train_infer/surrogate_gap"] = d.PPLGap, d.SurrogateGap
	m["train_infer/frac_above_0.1"], m["train_infer/frac_above_1"] = d.Above01, d.Above1
	if entN > 0 {
		m["entropy"] = ent / float64(entN)
	}
	if l.moe && l.R.Algorithm.Replay != ReplayR3 {
		a := make([]*model.Routes, len(samples))
		b := make([]*model.Routes, len(samples))
		for i, s := range samples {
			a[i], b[i] = s.Routes, s.OldRoutes
		}
		dis := RoutingDisagreement(a, b, nil)
		var mean float64
		for k, v := range dis {
			m["routing/infer_vs_old/l"+itoa(k)] = v
			mean += v
		}
		if len(dis) > 0 {
			m["routing/infer_vs_old"] = mean / float64(len(dis))
		}
	}
}
