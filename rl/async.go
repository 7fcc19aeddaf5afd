package rl

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// The asynchronous loop (rollout.staleness or max_staleness: k > 0). With
// staleness, step s trains on
// samples drawn from the weights of version max(0, s-1-k), exactly: with
// k = 1 (verl's one-step-off) the rollout of step s+1 runs from the
// weights step s starts from while step s trains. The rollout runs on one
// worker goroutine that takes jobs in order (weight pushes and the
// collection of a step's batch), so the sampler never sees new weights in
// the middle of a batch, every batch depends only on its step, its seed
// and its weights, and a run is deterministic and resumes bit for bit: a
// checkpoint holds the k batches already sampled for the steps after it.
// With max_staleness, the trainer publishes its weights after every step
// and each batch samples the newest published when it starts (at least
// those of k steps before its own): fresher when the rollout is the slower
// side, but which weights a batch gets depends on timing.

// pipeline is the rollout running ahead of the trainer.
type pipeline struct {
	jobs chan func()
	done chan struct{}
	// ctx ends with Close: queued jobs then fail at once, and a weight
	// push in progress is aborted.
	ctx     context.Context
	cancel  context.CancelFunc
	pending map[int]*future // collected or being collected, by step
	pushed  int64           // the newest version sent to the sampler
	free    []*model.Model  // weight snapshots the worker has pushed
	freed   chan *model.Model
	// latest is the loader's state after the newest batch obtained,
	// which a checkpoint saves (the worker owns the loader itself).
	latest     LoaderState
	latestStep int
	// The worker's own: the version the sampler holds, a failed push
	// (which fails the batches after it), and its idle time and push time,
	// charged to the next batch.
	held     int64
	pushErr  error
	idle     time.Duration
	pushTime time.Duration
	// fresh is the newest snapshot the trainer has published
	// (max_staleness), which the worker pushes before a batch.
	mu    sync.Mutex
	fresh *snapshot
}

// snapshot is a copy of the trainer's weights of one version.
type snapshot struct {
	w *model.Model
	v int64
}

// future is a batch being collected; only the trainer's goroutine waits.
type future struct {
	ch chan *batch
	b  *batch
}

func (f *future) wait() *batch {
	if f.b == nil {
		f.b = <-f.ch
	}
	return f.b
}

// ahead is how many steps the rollout runs ahead of the trainer:
// rollout.staleness or max_staleness (0: the synchronous loop).
func (l *Loop) ahead() int { return max(l.R.Rollout.Staleness, l.R.Rollout.MaxStaleness) }

// async reports whether the rollout runs ahead of the trainer.
func (l *Loop) async() bool { return l.ahead() > 0 }

// freshest reports whether each batch samples the newest weights there are
// when it starts (max_staleness) rather than exactly those of k steps
// before its own (staleness).
func (l *Loop) freshest() bool { return l.R.Rollout.MaxStaleness > 0 }

// startPipeline starts the rollout worker and queues the batches of the
// steps after l.Step that the weights of version l.Step sample (those not
// restored from a checkpoint).
func (l *Loop) startPipeline() {
	k := l.ahead()
	p := &pipeline{jobs: make(chan func(), 2*k+8), done: make(chan struct{}), freed: make(chan *model.Model, k+2),
		pending: map[int]*future{}, pushed: int64(l.Step), held: int64(l.Step), latest: l.Loader.State(), latestStep: l.Step}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for _, b := range l.restored {
		p.pending[b.step] = &future{b: b}
		p.note(b)
	}
	first := l.Step + 1 + len(l.restored)
	l.restored = nil
	go p.work()
	l.pipe = p
	for s := first; s <= min(l.Step+k, l.R.Train.Steps); s++ {
		l.enqueueCollect(s, int64(l.Step))
	}
}

// work runs the jobs in order until the queue is closed.
func (p *pipeline) work() {
	defer close(p.done)
	for {
		t := time.Now()
		j, ok := <-p.jobs
		p.idle += time.Since(t)
		if !ok {
			return
		}
		j()
	}
}

// note records b as obtained, for the loader state a checkpoint saves.
func (p *pipeline) note(b *batch) {
	if b.err == nil && b.step > p.latestStep {
		p.latest, p.latestStep = b.loader, b.step
	}
}

// enqueueCollect queues the collection of step's batch from the weights of
// version want (the sampler's by then), or (max_staleness) of the newest
// version published when the batch starts, want at least.
func (l *Loop) enqueueCollect(step int, want int64) {
	p := l.pipe
	f := &future{ch: make(chan *batch, 1)}
	p.pending[step] = f
	p.jobs <- func() {
		if p.ctx.Err() != nil {
			f.ch <- &batch{step: step, err: errClosed}
			return
		}
		if l.freshest() {
			l.pushFresh()
		}
		var b *batch
		switch {
		case p.pushErr != nil:
			b = &batch{step: step, err: fmt.Errorf("weight push: %w", p.pushErr)}
		case p.held < want || (p.held != want && !l.freshest()):
			b = &batch{step: step, err: fmt.Errorf("rollout: the sampler holds weights of version %d, step %d needs version %d", p.held, step, want)}
		default:
			b = l.collect(step, p.held)
		}
		if b.err == nil {
			if sm, ok := l.Sampler.(SamplerMetrics); ok {
				for k, v := range sm.Metrics() {
					b.metrics[k] = v
				}
			}
		}
		b.idle, p.idle = p.idle, 0
		if b.err == nil {
			if _, ok := b.metrics["time/weight_load"]; !ok { // a remote sampler reports its own
				b.metrics["time/weight_load"] = p.pushTime.Seconds()
			}
		}
		p.pushTime = 0
		f.ch <- b
	}
}

// advance queues, as step starts, the push of the weights it starts from
// (version step-1) and the collection of the batch they sample, step+k's.
// It returns the time taken to snapshot the weights.
func (l *Loop) advance(step int) (time.Duration, error) {
	p := l.pipe
	next, v := step+l.ahead(), int64(step-1)
	// Exactly k behind, weights no batch will sample need no push; the
	// newest ones, published, may still reach batches in progress.
	if next > l.R.Train.Steps && !l.freshest() {
		return 0, nil
	}
	t := time.Now()
	if p.pushed != v {
		w, err := l.snapshot()
		if err != nil {
			return 0, fmt.Errorf("weight push: %w", err)
		}
		p.pushed = v
		if l.freshest() {
			p.publish(&snapshot{w: w, v: v})
		} else {
			p.jobs <- func() { l.pushWeights(w, v) }
		}
	}
	d := time.Since(t)
	if next <= l.R.Train.Steps {
		l.enqueueCollect(next, v)
	}
	return d, nil
}

// pushWeights sends w as version v to the sampler (on the worker) and
// hands the copy back.
func (l *Loop) pushWeights(w *model.Model, v int64) {
	p := l.pipe
	if p.pushErr == nil && p.ctx.Err() == nil {
		t := time.Now()
		if p.pushErr = l.Sampler.UpdateWeights(p.ctx, w, v); p.pushErr == nil {
			p.held = v
		}
		p.pushTime += time.Since(t)
	}
	p.freed <- w
}

// publish makes s the newest snapshot, handing back the one it replaces
// if the worker never took it.
func (p *pipeline) publish(s *snapshot) {
	p.mu.Lock()
	old := p.fresh
	p.fresh = s
	p.mu.Unlock()
	if old != nil {
		p.freed <- old.w
	}
}

// pushFresh pushes the newest published snapshot, on the worker, before a
// batch (max_staleness).
func (l *Loop) pushFresh() {
	p := l.pipe
	p.mu.Lock()
	s := p.fresh
	p.fresh = nil
	p.mu.Unlock()
	if s != nil {
		l.pushWeights(s.w, s.v)
	}
}

// switchingSampler is a sampler that can take new weights in the middle of
// a generation (the in-process engine).
type switchingSampler interface {
	GenerateSwitching(prompts [][]int32, n int, sp rollout.Sampling, next func() *rollout.Switch) ([]rollout.Sample, error)
}

// turnSampler is a sampler that runs multi-turn episodes (the in-process
// engine).
type turnSampler interface {
	GenerateTurnsSwitching(prompts [][]int32, n int, sp rollout.Sampling, turns rollout.Turns, next func() *rollout.Switch) ([]rollout.Sample, error)
}

// generate samples a round, as episodes of sess's environment when sess
// is not nil: with rollout.partial: switch, sequences in progress take the
// newest published weights between decoding steps.
func (l *Loop) generate(ids [][]int32, n int, sp rollout.Sampling, sess *env.Session) ([]rollout.Sample, error) {
	switching := l.pipe != nil && l.R.Rollout.Partial == PartialSwitch
	if sess != nil {
		var next func() *rollout.Switch
		if switching {
			next = l.nextSwitch
		}
		return l.Sampler.(turnSampler).GenerateTurnsSwitching(ids, n, sp, sess, next)
	}
	if ss, ok := l.Sampler.(switchingSampler); ok && switching {
		return ss.GenerateSwitching(ids, n, sp, l.nextSwitch)
	}
	return l.Sampler.Generate(ids, n, sp)
}

// nextSwitch hands the engine the newest published weights, if newer than
// those it holds (on the worker, between decoding steps).
func (l *Loop) nextSwitch() *rollout.Switch {
	p := l.pipe
	p.mu.Lock()
	s := p.fresh
	if s != nil && s.v > p.held {
		p.fresh = nil
	} else {
		s = nil
	}
	p.mu.Unlock()
	if s == nil {
		return nil
	}
	t := time.Now()
	return &rollout.Switch{Model: s.w, Version: s.v, Release: func(loaded bool) {
		if loaded {
			p.held = s.v
		}
		p.pushTime += time.Since(t)
		p.freed <- s.w
	}}
}

// snapshot copies the trainer's weights for the worker to push, reusing
// a copy it has pushed already.
func (l *Loop) snapshot() (*model.Model, error) {
	p := l.pipe
	for len(p.freed) > 0 {
		p.free = append(p.free, <-p.freed)
	}
	w, err := l.Trainer.Weights()
	if err != nil {
		return nil, err
	}
	var c *model.Model
	if n := len(p.free); n > 0 {
		c, p.free = p.free[n-1], p.free[:n-1]
	} else {
		c = w.ZeroLike()
	}
	if len(c.Arena) != len(w.Arena) {
		return nil, errors.New("weights changed size")
	}
	copy(c.Arena, w.Arena)
	return c, nil
}

// take returns step's batch, waiting for the worker, and how long the
// trainer waited.
func (l *Loop) take(step int) (*batch, time.Duration) {
	p := l.pipe
	t := time.Now()
	f, ok := p.pending[step]
	if !ok {
		return &batch{step: step, err: fmt.Errorf("rollout: no batch queued for step %d", step)}, 0
	}
	b := f.wait()
	delete(p.pending, step)
	p.note(b)
	return b, time.Since(t)
}

// errClosed fails the batches of a loop being closed.
var errClosed = errors.New("rl: the loop is closed")

// Close stops the rollout worker: the job it is running ends (a weight
// push is aborted), the queued ones fail at once. The loop takes no step
// afterwards.
func (l *Loop) Close() {
	l.closed = true
	if p := l.pipe; p != nil {
		p.cancel()
		close(p.jobs)
		<-p.done
	}
}

// CheckpointState is what a checkpoint of the loop after l.Step holds
// besides the weights: the loader's position and, when the rollout runs
// ahead, the batches already sampled for the steps after l.Step (waiting
// for the ones in progress), so that a resumed run trains on exactly
// what this one would have.
func (l *Loop) CheckpointState() (LoaderState, []SavedBatch, error) {
	p := l.pipe
	if p == nil {
		// Not started (no step since the resume): what was restored is
		// still in flight, and the loader stands after it.
		var saved []SavedBatch
		for _, b := range l.restored {
			saved = append(saved, saveBatch(b))
		}
		return l.Loader.State(), saved, nil
	}
	steps := make([]int, 0, len(p.pending))
	for s := range p.pending {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	var saved []SavedBatch
	for _, s := range steps {
		b := p.pending[s].wait()
		if b.err != nil {
			return LoaderState{}, nil, fmt.Errorf("rollout of step %d: %w", s, b.err)
		}
		p.note(b)
		saved = append(saved, saveBatch(b))
	}
	return p.latest, saved, nil
}

// SavedBatch is a batch sampled ahead, as a checkpoint stores it (JSON,
// exactly: log mu as float32 bits, other numbers as strconv strings, so
// that NaN and infinities survive and a resumed run trains on the same
// bits).
type SavedBatch struct {
	Step      int               `json:"step"`
	Rounds    int               `json:"rounds"`
	GenTokens int               `json:"gen_tokens"`
	Metrics   map[string]string `json:"metrics"`
	Rollout   float64           `json:"rollout_s"`
	Score     float64           `json:"score_s"`
	Idle      float64           `json:"idle_s"`
	Loader    LoaderState       `json:"loader"`
	Groups    [][]SavedSample   `json:"groups"`
}

// SavedSample is one sample of a SavedBatch: what the rollout and the
// scorer made of it (the training engine's values are recomputed).
type SavedSample struct {
	Row       int            `json:"row"`
	Response  []int32        `json:"response"`
	Obs       []rollout.Span `json:"obs,omitempty"`     // observation spans (multi-turn)
	Episode   *env.Outcome   `json:"episode,omitempty"` // how its episode ended (multi-turn)
	LogMu     []uint32       `json:"log_mu_bits"`       // math.Float32bits of log mu per model token
	Routes    *model.Routes  `json:"routes,omitempty"`
	Version   int64          `json:"version"`
	Versions  []int64        `json:"versions,omitempty"`
	Finish    string         `json:"finish"`
	Reward    exactFloat     `json:"reward"`
	Correct   exactFloat     `json:"correct"`
	Advantage exactFloat     `json:"advantage"`
}

// exactFloat is a float64 written as a JSON string that parses back to
// the same bits, NaN and infinities included.
type exactFloat float64

// MarshalJSON writes the shortest string that parses back exactly.
func (f exactFloat) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(strconv.FormatFloat(float64(f), 'g', -1, 64))), nil
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (f *exactFloat) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("%s is not a quoted number", b)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return err
	}
	*f = exactFloat(v)
	return nil
}

func saveBatch(b *batch) SavedBatch {
	sb := SavedBatch{Step: b.step, Rounds: b.rounds, GenTokens: b.genTokens, Metrics: map[string]string{},
		Rollout: b.rollout.Seconds(), Score: b.score.Seconds(), Idle: b.idle.Seconds(), Loader: b.loader}
	for k, v := range b.metrics {
		sb.Metrics[k] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	for _, g := range b.groups {
		sg := make([]SavedSample, len(g))
		for i, s := range g {
			bits := make([]uint32, len(s.LogMu))
			for j, v := range s.LogMu {
				bits[j] = math.Float32bits(v)
			}
			sg[i] = SavedSample{Row: s.Prompt.Row, Response: s.Response, Obs: s.Obs, Episode: s.Episode, LogMu: bits, Routes: s.Routes, Version: s.Version,
				Versions: s.Versions, Finish: s.Finish, Reward: exactFloat(s.Reward), Correct: exactFloat(s.Correct),
				Advantage: exactFloat(s.Advantage)}
		}
		sb.Groups = append(sb.Groups, sg)
	}
	return sb
}

// Restore hands the loop the batches a checkpoint saved, before its first
// step: they must be those of the steps right after l.Step, at most as
// many as the rollout runs ahead. Their prompts are found by row in the
// loader's prompt set.
func (l *Loop) Restore(saved []SavedBatch) error {
	if len(saved) > l.ahead() {
		return fmt.Errorf("the checkpoint holds %d batches sampled ahead; the rollout runs %d step(s) ahead: resume with the staleness the run had", len(saved), l.ahead())
	}
	for i, sb := range saved {
		if sb.Step != l.Step+1+i {
			return fmt.Errorf("saved batch %d is of step %d, want %d", i, sb.Step, l.Step+1+i)
		}
		b, err := l.restoreBatch(sb)
		if err != nil {
			return fmt.Errorf("saved batch of step %d: %w", sb.Step, err)
		}
		l.restored = append(l.restored, b)
	}
	return nil
}

// restoreBatch rebuilds one saved batch, checking what it can.
func (l *Loop) restoreBatch(sb SavedBatch) (*batch, error) {
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	b := &batch{step: sb.Step, rounds: sb.Rounds, genTokens: sb.GenTokens, metrics: map[string]float64{},
		rollout: sec(sb.Rollout), score: sec(sb.Score), idle: sec(sb.Idle), loader: sb.Loader}
	for k, v := range sb.Metrics {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: %v", k, err)
		}
		b.metrics[k] = f
	}
	for gi, sg := range sb.Groups {
		g := make([]*Sample, len(sg))
		for i, ss := range sg {
			p, ok := l.Loader.byRow(ss.Row)
			if !ok {
				return nil, fmt.Errorf("no prompt of row %d in the data", ss.Row)
			}
			if err := checkSpans(ss.Obs, len(ss.Response)); err != nil {
				return nil, fmt.Errorf("a sample of row %d: %w", ss.Row, err)
			}
			n := (&Sample{Response: ss.Response, Obs: ss.Obs}).tokens()
			if n == 0 || len(ss.LogMu) != n {
				return nil, fmt.Errorf("a sample of row %d has %d tokens of the model and %d log-probs", ss.Row, n, len(ss.LogMu))
			}
			if err := checkVersions(ss.Version, ss.Versions, n); err != nil {
				return nil, fmt.Errorf("a sample of row %d: %w", ss.Row, err)
			}
			if ss.Routes != nil {
				if err := ss.Routes.Check(); err != nil {
					return nil, fmt.Errorf("a sample of row %d: %w", ss.Row, err)
				}
			}
			logMu := make([]float32, len(ss.LogMu))
			for j, bits := range ss.LogMu {
				logMu[j] = math.Float32frombits(bits)
			}
			g[i] = &Sample{Group: gi, Prompt: p, Response: ss.Response, Obs: ss.Obs, Episode: ss.Episode, LogMu: logMu, Routes: ss.Routes, Version: ss.Version,
				Versions: ss.Versions, Finish: ss.Finish, Reward: float64(ss.Reward), Correct: float64(ss.Correct),
				Advantage: float64(ss.Advantage)}
		}
		b.groups = append(b.groups, g)
	}
	return b, nil
}

// checkSpans checks a sample's observation spans: in order, apart, non-empty
// and within its n response tokens.
func checkSpans(obs []rollout.Span, n int) error {
	at := 0
	for k, o := range obs {
		if o.Start < at || o.End <= o.Start || o.End > n {
			return fmt.Errorf("observation %d spans tokens [%d, %d) of %d, after token %d", k, o.Start, o.End, n, at)
		}
		at = o.End
	}
	return nil
}

// checkVersions checks a sample's per-token versions: none (every token
// of version), or one per token, starting at version and never going back.
func checkVersions(version int64, versions []int64, tokens int) error {
	if versions == nil {
		return nil
	}
	if len(versions) != tokens {
		return fmt.Errorf("%d tokens and %d token versions", tokens, len(versions))
	}
	if versions[0] != version {
		return fmt.Errorf("its first token is of version %d, the sample of %d", versions[0], version)
	}
	for j := 1; j < len(versions); j++ {
		if versions[j] < versions[j-1] {
			return fmt.Errorf("token %d is of version %d, older than the token before (%d)", j, versions[j], versions[j-1])
		}
	}
	return nil
}
