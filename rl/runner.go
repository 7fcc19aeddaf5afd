package rl

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/keel-rl/keel/data"
	"github.com/keel-rl/keel/env"
	"github.com/keel-rl/keel/evaluate"
	"github.com/keel-rl/keel/internal/atomicfile"
	"github.com/keel-rl/keel/internal/builtin"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	rolldevice "github.com/keel-rl/keel/rollout/device"
	"github.com/keel-rl/keel/rollout/remote"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
	traindevice "github.com/keel-rl/keel/train/device"
)

// Run executes a recipe in its run directory: a fresh run, or (resume)
// the continuation of the one there from its last checkpoint. The
// directory is locked for the run's duration. Cancelling ctx stops it after
// the current step with a checkpoint.
func Run(ctx context.Context, r *Recipe, resume bool, pr Progress) (*Result, error) {
	u := &runner{r: r, pr: pr, start: time.Now()}
	defer u.close()
	for _, f := range []func() error{
		func() error { return u.open(resume) },
		u.loadData,
		u.buildEngines,
		u.openLogs,
		func() error { return u.train(ctx) },
	} {
		if err := f(); err != nil {
			return nil, err
		}
	}
	return u.finish()
}

// runner is one Run: the run directory's session, what the run reads
// (tokenizer, prompts, held-out set), its engines and loop, and the
// writers of its metrics. Each method is one phase of Run.
type runner struct {
	r     *Recipe
	pr    Progress
	start time.Time
	res   *Result

	sess *run.Session
	ck   *run.Checkpoint // the checkpoint resumed from (nil: fresh)
	st   loopState

	modelPath string
	tok       *tokenizer.Tokenizer
	end       int32 // the token that ends a response
	policy    *model.Model
	prompts   []Prompt
	evalSet   []data.Example
	// env is the recipe's environment (nil: one-turn rollouts), system
	// the system prompt it puts before every prompt.
	env    env.Environment
	system string

	trainer train.Trainer
	loop    *Loop
	evalEng *rollout.Engine // nil without evaluation

	metrics *run.MetricsLog
	tb      *run.EventWriter // nil without TensorBoard
	saved   int              // the newest checkpoint's step (0: none)
	closers []func()         // run in reverse order by close
}

// defers registers f to run when the run ends, before what was
// registered earlier.
func (u *runner) defers(f func()) { u.closers = append(u.closers, f) }

func (u *runner) close() {
	for i := len(u.closers) - 1; i >= 0; i-- {
		u.closers[i]()
	}
}

// open locks the run directory, decides between a fresh run and a resumed
// one, and writes the resolved recipe.
func (u *runner) open(resume bool) error {
	r := u.r
	sess, err := run.OpenSession(r.Out)
	if err != nil {
		return err
	}
	u.sess = sess
	u.defers(func() { sess.Close() })
	// A run with a checkpoint is resumed, never overwritten; one that
	// stopped before its first checkpoint has nothing to keep and starts
	// afresh (its metrics log is discarded).
	u.ck = sess.Resumed
	if u.ck == nil && resume {
		return fmt.Errorf("%s has no checkpoint to resume: start it afresh with keel rl --recipe %s", r.Out, filepath.Join(r.Out, RecipeFile))
	}
	if u.ck != nil && !resume {
		return fmt.Errorf("%s: %w (checkpoint at step %d): resume it with keel rl --resume %s, or choose another name", r.Out, ErrRunExists, u.ck.Step, r.Out)
	}
	u.res = &Result{Dir: r.Out, ModelDir: sess.ModelDir(), Recipe: r}
	return atomicfile.Write(filepath.Join(r.Out, RecipeFile), func(w io.Writer) error {
		_, err := w.Write(r.YAML())
		return err
	})
}

// loadData reads the tokenizer, the policy's weights (the checkpoint's when
// resuming), the training prompts and the held-out set. The built-in model
// and held-out set come from the binary when the working directory is not
// a checkout of the repository.
func (u *runner) loadData() error {
	r := u.r
	var err error
	if u.modelPath, err = builtin.Resolve(r.Model.Path, ""); err != nil {
		return fmt.Errorf("model.path: %w", err)
	}
	if u.tok, err = tokenizer.Load(filepath.Join(u.modelPath, tokenizer.FileName)); err != nil {
		return fmt.Errorf("model.path: %w", err)
	}
	if u.ck != nil {
		u.policy = u.ck.Model
		if err := u.sess.State(&u.st); err != nil {
			return err
		}
		u.res.Resumed = u.ck.Step
		u.saved = u.ck.Step
	} else if u.policy, err = model.Load(u.modelPath); err != nil {
		return fmt.Errorf("model.path: %w", err)
	}
	if u.tok.VocabSize() > u.policy.Config.VocabSize {
		return fmt.Errorf("model.path: the tokenizer has %d tokens, the model's vocab_size is %d", u.tok.VocabSize(), u.policy.Config.VocabSize)
	}
	end, ok := u.tok.ID(tokenizer.ImEnd)
	if !ok {
		return fmt.Errorf("model.path: the tokenizer has no %s token to end responses", tokenizer.ImEnd)
	}
	u.end = end
	if u.env, u.system, err = newEnvironment(&r.Env); err != nil {
		return err
	}
	if u.prompts, err = loadPrompts(r, u.tok, u.policy.Config.MaxPositionEmbeddings, u.system); err != nil {
		return err
	}
	if r.Eval.Skip {
		return nil
	}
	return u.loadEvalSet()
}

// loadEvalSet reads the held-out set and drops the training prompts that
// are in it: held out means held out (small problems recur).
func (u *runner) loadEvalSet() error {
	r := u.r
	evalFile, err := builtin.Resolve(r.Eval.File, "")
	if err != nil {
		return fmt.Errorf("eval.file: %w", err)
	}
	if u.evalSet, err = data.Read(evalFile); err != nil {
		return fmt.Errorf("eval.file: %w", err)
	}
	if err := evaluate.CheckTasks(u.evalSet); err != nil && !r.Env.scoresAnyTask() {
		return fmt.Errorf("eval.file: %s: %w", r.Eval.File, err)
	}
	if r.Eval.N > 0 && r.Eval.N < len(u.evalSet) {
		u.evalSet = u.evalSet[:r.Eval.N]
	}
	if d := r.Eval.Decontaminate; d != nil && !*d {
		return nil
	}
	var dropped int
	if u.prompts, dropped = decontaminate(u.prompts, u.evalSet); len(u.prompts) == 0 {
		return fmt.Errorf("data: every training prompt is also in eval.file %s (a game's prompt, the same for every hidden answer, needs eval.decontaminate: false)", r.Eval.File)
	}
	u.res.Decontaminated = dropped
	return nil
}

// buildEngines makes the rollout sampler (in process or remote), the
// evaluation engine, the training engine (with the checkpoint's optimiser
// state when resuming), the reference model for a KL penalty and the
// loop.
func (u *runner) buildEngines() error {
	r := u.r
	sampler, err := u.newSampler()
	if err != nil {
		return err
	}
	if err := sampler.UpdateWeights(context.Background(), u.policy, int64(u.res.Resumed)); err != nil {
		return err
	}
	// The rollout engines first: on a GPU they size themselves to what the
	// training engines will leave free (gpuReserve).
	if err := u.newEvalEngine(); err != nil {
		return err
	}
	var optim *train.OptimState
	if u.ck != nil {
		optim = (*train.OptimState)(u.ck.Optim)
	}
	if u.trainer, err = u.newTrainer(u.policy, optim); err != nil {
		if optim != nil {
			return fmt.Errorf("%s: checkpoint of step %d: %w", filepath.Join(r.Out, run.CheckpointsDir), u.ck.Step, err)
		}
		return err
	}
	u.loop = &Loop{R: r, Trainer: u.trainer, Sampler: sampler, Loader: NewLoader(u.prompts, r.Seed), Stop: []int32{u.end},
		Score: VerifierScorer(u.tok, u.end), Step: u.res.Resumed, NonFinite: u.st.NonFinite,
		Env: u.env, Budgets: r.Env.budgets(), Tok: u.tok}
	if r.Reward.External() {
		ext, err := NewExternalScorer(&r.Reward, u.tok, u.end)
		if err != nil {
			return err
		}
		u.defers(func() { ext.Client.Close() }) // after the loop's worker stops
		u.loop.Batch = ext
	}
	u.defers(u.loop.Close) // before the sampler its worker uses
	u.loop.Loader.Seek(u.st.Loader)
	if len(u.st.Pending) > 0 {
		if !u.loop.async() {
			return fmt.Errorf("%s: the checkpoint holds %d batches sampled ahead, but rollout.staleness and max_staleness are 0", r.Out, len(u.st.Pending))
		}
		if err := u.loop.Restore(u.st.Pending); err != nil {
			return fmt.Errorf("%s: checkpoint: %w", r.Out, err)
		}
	}
	if r.Algorithm.KLCoef > 0 {
		ref, err := model.Load(u.modelPath)
		if err != nil {
			return fmt.Errorf("model.path (reference): %w", err)
		}
		if u.loop.Reference, err = u.newTrainer(ref, nil); err != nil {
			return err
		}
	}
	return u.loop.Init()
}

// newTrainer returns the training engine for m on the recipe's
// train.device.
func (u *runner) newTrainer(m *model.Model, optim *train.OptimState) (train.Trainer, error) {
	t, err := traindevice.Trainer(u.r.Train.Engine(), m, u.r.AdamW(), optim)
	if err != nil {
		return nil, err
	}
	u.defers(func() { t.Close() })
	return t, nil
}

// newSampler returns the rollout: a fleet of inference servers when the
// recipe lists them, else the in-process engine, sized for the longest
// prompt and the response budget.
func (u *runner) newSampler() (Sampler, error) {
	ro := &u.r.Rollout
	maxLen := u.sequenceLen()
	if len(ro.Servers) > 0 {
		// Remote rollout: the servers run their own precision; each step's
		// weights reach them through ro.WeightsDir.
		rs, err := remote.New(remote.Options{Servers: ro.Servers, Kind: ro.ServerKind, WeightsDir: ro.WeightsDir, InPlace: ro.Partial == PartialSwitch,
			RequestTimeout: time.Duration(ro.RequestTimeout * float64(time.Second)), MaxConcurrency: ro.MaxConcurrency,
			APIKey: os.Getenv(remote.APIKeyEnv), Config: u.policy.Config, MaxLen: maxLen, Events: u.pr.Warn,
			WriteFiles: func(dir string) error { return u.tok.WriteFile(filepath.Join(dir, tokenizer.FileName)) }})
		if err != nil {
			return nil, fmt.Errorf("rollout.servers: %w", err)
		}
		u.defers(rs.Close)
		return rs, nil
	}
	prec, _ := rollout.ParsePrecision(ro.Precision)
	reserve, err := u.gpuReserve(ro.Device, true)
	if err != nil {
		return nil, err
	}
	eng, err := u.newEngine(ro.Device, "rollout", rollout.Options{Precision: prec, Slots: ro.Slots, MaxLen: maxLen, Reserve: reserve, MemoryFraction: ro.GPUMemory})
	if err != nil {
		return nil, err
	}
	u.defers(eng.Close)
	return eng, nil
}

// sequenceLen is the longest training sequence: the longest prompt and
// the response budget, within the model's positions.
func (u *runner) sequenceLen() int {
	longest := 0
	for _, p := range u.prompts {
		longest = max(longest, len(p.IDs))
	}
	n := longest + u.r.responseBudget()
	if maxPos := u.policy.Config.MaxPositionEmbeddings; maxPos > 0 {
		n = min(n, maxPos)
	}
	return n
}

// newEngine opens an in-process rollout engine on device and says so when
// fewer slots than asked fit in a GPU's memory.
func (u *runner) newEngine(device, what string, opt rollout.Options) (*rollout.Engine, error) {
	eng, err := rolldevice.Engine(device, u.policy, opt)
	if err != nil {
		return nil, err
	}
	if got := eng.Options().Slots; got < opt.Slots && u.pr.Warn != nil {
		u.pr.Warn(fmt.Sprintf("%s on %s: %d of rollout.slots' %d fit in the GPU's memory beside the training engine (rollout.gpu_memory); samples are the same, decoding slower", what, device, got, opt.Slots))
	}
	return eng, nil
}

// evalSlotShare is the share of rollout.slots the training rollout leaves
// room for on a GPU it shares with the held-out evaluation's engine, which
// is built after it.
const evalSlotShare = 4

// evalEngineSpec is what gpuReserve needs of the held-out evaluation's
// engine: its device ("" when there is none), precision and length.
type evalEngineSpec struct {
	device string
	prec   rollout.Precision
	maxLen int
}

// gpuReserve returns gpuReserve's answer for this run's engines.
func (u *runner) gpuReserve(device string, withEval bool) (int64, error) {
	var ev evalEngineSpec
	if withEval && !u.r.Eval.Skip {
		ev.device, ev.prec, ev.maxLen = u.evalEngineSettings()
	}
	return gpuReserve(u.r, &u.policy.Config, device, u.sequenceLen(), ev)
}

// gpuReserve is the device memory an in-process rollout engine on device
// leaves free for what shares its GPU and is built after it (buildEngines
// builds the rollout engines first): the training engine on the same GPU
// (train/memplan's plan for sequences of up to trainLen tokens, or
// micro-batches of train.micro_batch_tokens: its weights, gradients,
// AdamW moments, activations), a KL reference model's engine (the same
// but the moments: it never steps), and the held-out evaluation's engine
// ev (device "" for none) with 1/evalSlotShare of the slots. On the CPU:
// nothing.
func gpuReserve(r *Recipe, cfg *model.Config, device string, trainLen int, ev evalEngineSpec) (int64, error) {
	gpu, err := rolldevice.Ordinal(device)
	if err != nil || gpu < 0 {
		return 0, err
	}
	var reserve int64
	te := r.Train.Engine()
	if tg, _ := traindevice.Parse(te.Device); tg == gpu {
		plan, err := te.Plan(cfg, max(r.Train.MicroBatchTokens, trainLen))
		if err != nil {
			return 0, fmt.Errorf("train: memory plan: %w", err)
		}
		reserve += plan.Total()
		if r.Algorithm.KLCoef > 0 {
			reserve += plan.Total() - 8*plan.Params // no AdamW moments
		}
	}
	if ev.device != "" {
		if eg, _ := rolldevice.Ordinal(ev.device); eg == gpu {
			slots := max(1, r.Rollout.Slots/evalSlotShare)
			// Its step rows are those of all the slots (rollout.Options).
			opt := rollout.Options{Precision: ev.prec, Slots: slots, MaxLen: ev.maxLen, StepRows: max(r.Rollout.Slots, 512)}
			mem, _, err := rolldevice.Memory(ev.device, cfg, opt)
			if err != nil {
				return 0, fmt.Errorf("eval: %w", err)
			}
			reserve += mem.Total(slots)
		}
	}
	return reserve, nil
}

// newEvalEngine makes the held-out evaluation's own rollout engine, in
// eval.precision, sized for the longest held-out prompt.
func (u *runner) newEvalEngine() error {
	r := u.r
	if r.Eval.Skip {
		return nil
	}
	dev, ep, evLen := u.evalEngineSettings()
	reserve, err := u.gpuReserve(dev, false)
	if err != nil {
		return err
	}
	eng, err := u.newEngine(dev, "the evaluation", rollout.Options{Precision: ep, Slots: r.Rollout.Slots, MaxLen: evLen, Reserve: reserve, MemoryFraction: r.Rollout.GPUMemory})
	if err != nil {
		return err
	}
	u.evalEng = eng
	u.defers(eng.Close)
	return nil
}

// evalEngineSettings returns the held-out evaluation engine's device,
// precision and sequence length: where the rollout decodes, unless
// eval.precision is one only the CPU engine has, and long enough for the
// longest held-out prompt and the response budget.
func (u *runner) evalEngineSettings() (string, rollout.Precision, int) {
	r := u.r
	maxPos := u.policy.Config.MaxPositionEmbeddings
	ep, _ := rollout.ParsePrecision(r.Eval.Precision)
	budget := r.Eval.MaxNewTokens
	if r.Env.On() {
		budget = r.Env.MaxTokens
	}
	evLen := budget
	for i := range u.evalSet {
		p := u.tok.Encode(tokenizer.ChatML(env.Chat(u.system, &u.evalSet[i]), true))
		evLen = max(evLen, len(p)+budget)
	}
	if maxPos > 0 {
		evLen = min(evLen, maxPos)
	}
	dev := r.Rollout.Device
	if rolldevice.Check(dev, ep) != nil {
		dev = "cpu"
	}
	return dev, ep, evLen
}

// evaluate scores the policy's current weights on the held-out set.
func (u *runner) evaluate(step int) (*evaluate.Report, error) {
	r := u.r
	w, err := u.trainer.Weights()
	if err != nil {
		return nil, err
	}
	if err := u.evalEng.UpdateWeights(context.Background(), w, int64(step)); err != nil {
		return nil, err
	}
	sp := rollout.Sampling{Temperature: r.Rollout.Temperature, TopK: r.Rollout.TopK, TopP: r.Rollout.TopP,
		MaxNewTokens: r.Eval.MaxNewTokens, Seed: r.Seed ^ 0xe7a1}
	var rep *evaluate.Report
	if u.env != nil {
		rep, err = evaluate.RunEpisodes(u.evalEng, u.tok, u.evalSet, r.Eval.K, sp, evaluate.Episodes{Env: u.env, Budgets: r.Env.budgets(), System: u.system})
	} else {
		rep, err = evaluate.Run(u.evalEng, u.tok, u.evalSet, r.Eval.K, sp)
	}
	if err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	if u.pr.Eval != nil {
		u.pr.Eval(step, rep)
	}
	return rep, nil
}

// openLogs opens the metrics log and TensorBoard's events and, for a
// fresh run, records the step-0 evaluation. A fresh run starts an empty
// log (a crash before the first checkpoint leaves nothing to keep); a
// resumed one is cut back to its checkpoint.
func (u *runner) openLogs() error {
	r := u.r
	var err error
	if u.metrics, err = u.sess.OpenMetrics(true); err != nil {
		return err
	}
	if r.Log.TensorBoard {
		if u.tb, err = run.OpenEvents(filepath.Join(r.Out, "tensorboard")); err != nil {
			return err
		}
		u.defers(func() { u.tb.Close() })
	}
	if u.ck != nil || u.evalEng == nil {
		return nil
	}
	rep, err := u.evaluate(0)
	if err != nil {
		return err
	}
	u.res.Before = rep
	m := map[string]float64{"data/prompts": float64(len(u.prompts)), "data/decontaminated": float64(u.res.Decontaminated)}
	evalMetrics(rep, m)
	return u.write(0, m)
}

// write records one step's metrics in the log and in TensorBoard.
func (u *runner) write(step int, m map[string]float64) error {
	rec := make(map[string]any, len(m)+1)
	for k, v := range m {
		rec[k] = v
	}
	rec["step"] = step
	if err := u.metrics.Write(rec); err != nil {
		return err
	}
	if u.tb != nil {
		return u.tb.Scalars(int64(step), time.Now(), m)
	}
	return nil
}

// evalMetrics adds an evaluation's scores to a step's metrics.
func evalMetrics(rep *evaluate.Report, m map[string]float64) {
	k := itoa(rep.K)
	for _, s := range rep.Scores {
		suffix := ""
		if s.Group != "all" {
			suffix = "/" + s.Group
		}
		m["eval/avg@"+k+suffix] = s.AvgAtK
		m["eval/pass@"+k+suffix] = s.PassAtK
	}
}

// elapsed is the run's time so far, the time before a resumption
// included.
func (u *runner) elapsed() float64 { return u.st.Elapsed + time.Since(u.start).Seconds() }

// checkpoint saves the trainer's weights and optimiser state with the
// loop's own state, after flushing TensorBoard.
func (u *runner) checkpoint() error {
	u.saved = u.loop.Step
	if u.tb != nil {
		if err := u.tb.Flush(); err != nil {
			return err
		}
	}
	loader, pending, err := u.loop.CheckpointState()
	if err != nil {
		return err
	}
	w, o, err := train.Snapshot(u.trainer)
	if err != nil {
		return err
	}
	return u.sess.Save(u.loop.Step, w, (*run.OptimState)(o), loopState{Loader: loader, NonFinite: u.loop.NonFinite,
		Elapsed: u.elapsed(), Pending: pending}, u.r.Log.Keep)
}

// train runs the loop's steps up to train.steps, or until ctx is
// cancelled, with a checkpoint at the end either way.
func (u *runner) train(ctx context.Context) error {
	total := u.r.Train.Steps
	for u.loop.Step < total {
		if ctx.Err() != nil {
			u.res.Stopped = true
			break
		}
		sr, err := u.loop.RunStep(ctx)
		if err != nil {
			// Whatever failed, the last checkpoint stands; say so.
			if u.saved > 0 {
				return fmt.Errorf("step %d: %w (the run resumes from its checkpoint of step %d: keel rl --resume %s)", u.loop.Step+1, err, u.saved, u.r.Out)
			}
			return fmt.Errorf("step %d: %w (no checkpoint yet: the same command starts the run afresh)", u.loop.Step+1, err)
		}
		if err := u.afterStep(sr); err != nil {
			return err
		}
	}
	return u.checkpoint()
}

// afterStep evaluates when due, writes samples and metrics, reports, acts
// on the guards and checkpoints when due.
func (u *runner) afterStep(sr *StepResult) error {
	r, step, total := u.r, u.loop.Step, u.r.Train.Steps
	m := sr.Metrics
	m["elapsed_s"] = u.elapsed()
	if u.evalEng != nil && (step == total || (r.Eval.Every > 0 && step%r.Eval.Every == 0)) {
		t := time.Now()
		rep, err := u.evaluate(step)
		if err != nil {
			return err
		}
		evalMetrics(rep, m)
		m["time/eval"] = time.Since(t).Seconds()
		if step == total {
			u.res.After = rep
		}
	}
	if r.Log.SamplesEvery > 0 && (step%r.Log.SamplesEvery == 0 || step == 1) {
		if err := writeSamples(filepath.Join(r.Out, "samples"), step, u.tok, sr.Samples); err != nil {
			return err
		}
	}
	if err := u.write(step, m); err != nil {
		return err
	}
	u.res.LastStep = m
	if u.pr.Step != nil {
		u.pr.Step(step, total, m, time.Since(u.start))
	}
	if msg := guardMessage(r, m); msg != "" {
		if r.Guards.Action == "stop" {
			if err := u.checkpoint(); err != nil {
				return err
			}
			return fmt.Errorf("step %d: %s (guards.action = stop; checkpoint saved)", step, msg)
		}
		if u.pr.Warn != nil {
			u.pr.Warn(fmt.Sprintf("step %d: %s", step, msg))
		}
	}
	if r.Log.CheckpointEvery > 0 && step%r.Log.CheckpointEvery == 0 && step < total {
		return u.checkpoint()
	}
	return nil
}

// finish reports the run and, unless it was stopped, saves the final
// model with its tokenizer.
func (u *runner) finish() (*Result, error) {
	res := u.res
	res.Steps = u.loop.Step
	res.Elapsed = time.Since(u.start)
	res.PeakRSS = peakRSS()
	if res.Stopped {
		return res, nil
	}
	w, err := u.trainer.Weights()
	if err != nil {
		return nil, err
	}
	if err := u.sess.SaveModel(w, u.tok); err != nil {
		return nil, err
	}
	return res, nil
}
