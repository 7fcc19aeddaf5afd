package bench

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/rollout"
	rolldevice "github.com/keel-rl/keel/rollout/device"
	traindevice "github.com/keel-rl/keel/train/device"
)

// RLStepResult is where the time of one RL step goes (seconds, averaged
// over the measured steps).
type RLStepResult struct {
	Preset, Precision      string
	Prompts, Group, MaxNew int
	Step                   float64
	Rollout, Score, PiOld  float64
	Update, Push, Other    float64
	TrainEngine            float64 // inside the training engine (pi_old, updates)
	LoopOverhead           float64 // outside both engines and the push
	SampledTokensPerStep   float64
}

// RLStepSpec is one RL-step measurement.
type RLStepSpec struct {
	Preset string
	Vocab  int
	Layers int // 0: the preset's
	// Rollout is the rollout engine's precision.
	Rollout                rollout.Precision
	Prompts, Group, MaxNew int
	Steps                  int // measured, after one warm-up step
	// Device puts both engines on cpu (or ""), cuda or cuda:N;
	// TrainPrecision and Recompute are the training engine's (on a GPU).
	Device, TrainPrecision string
	Recompute              bool
}

// RLStep times whole steps of the RL loop (MiniRL, one mini-batch) on a
// preset with random weights: s.Prompts random 32-token prompts, s.Group
// samples each of up to s.MaxNew tokens from the rollout engine, a
// synthetic reward (1 when a response's first token is even) so that
// groups have mixed rewards, and the weight push (device to device when
// both engines share a GPU). The engines are opened as the RL runner
// opens them: the rollout first, leaving the training engine's memory
// plan free on a shared GPU. One warm-up step, then the mean of s.Steps.
func RLStep(s RLStepSpec) (RLStepResult, error) {
	preset, vocab, prompts, group, maxNew := s.Preset, s.Vocab, s.Prompts, s.Group, s.MaxNew
	cfg, err := model.Preset(preset, vocab)
	if err != nil {
		return RLStepResult{}, err
	}
	if s.Layers > 0 {
		cfg.NumHiddenLayers = s.Layers
	}
	cfg.MaxPositionEmbeddings = 32 + maxNew
	if err := cfg.Validate(); err != nil {
		return RLStepResult{}, err
	}
	m := model.New(cfg)
	model.Init(m, 1)
	recipe := []byte(`
model: {path: preset}
data: {tasks: [arithmetic]}
eval: {skip: true}
`)
	set := []string{
		"rollout.precision=" + s.Rollout.String(), fmt.Sprintf("rollout.max_new_tokens=%d", maxNew),
		fmt.Sprintf("train.prompts_per_step=%d", prompts), fmt.Sprintf("train.group_size=%d", group),
		"train.lr=1.0e-5", fmt.Sprintf("rollout.slots=%d", prompts*group),
	}
	if s.Device != "" {
		set = append(set, "device="+s.Device)
	}
	if s.TrainPrecision != "" {
		set = append(set, "train.precision="+s.TrainPrecision)
	}
	if s.Recompute {
		set = append(set, "train.recompute=true")
	}
	r, err := rl.ParseRecipe(recipe, set)
	if err != nil {
		return RLStepResult{}, err
	}
	rng := rand.New(rand.NewPCG(5, 5))
	ps := make([]rl.Prompt, 4*prompts)
	for i := range ps {
		ids := make([]int32, 32)
		for j := range ids {
			ids[j] = int32(rng.IntN(vocab))
		}
		ps[i] = rl.Prompt{Row: i, IDs: ids}
	}
	te := r.Train.Engine()
	var reserve int64
	if gpu, _ := traindevice.Parse(s.Device); gpu >= 0 {
		plan, err := te.Plan(&cfg, max(r.Train.MicroBatchTokens, 32+maxNew))
		if err != nil {
			return RLStepResult{}, err
		}
		reserve = plan.Total()
	}
	eng, err := rolldevice.Engine(s.Device, m, rollout.Options{Precision: s.Rollout, Slots: prompts * group, MaxLen: 32 + maxNew,
		Reserve: reserve, MemoryFraction: r.Rollout.GPUMemory})
	if err != nil {
		return RLStepResult{}, err
	}
	defer eng.Close()
	tr, err := traindevice.Trainer(te, m, r.AdamW(), nil)
	if err != nil {
		return RLStepResult{}, err
	}
	defer tr.Close()
	l := &rl.Loop{R: r, Trainer: tr, Sampler: eng, Loader: rl.NewLoader(ps, 1), Stop: []int32{0}, // token 0 ends a response: random weights give lengths of all sizes
		Score: func(_ *rl.Prompt, resp []int32) (float64, float64) {
			v := float64(1 - resp[0]%2)
			return v, v
		}}
	if err := l.Init(); err != nil {
		return RLStepResult{}, err
	}
	res := RLStepResult{Preset: preset, Precision: s.Rollout.String(), Prompts: prompts, Group: group, MaxNew: maxNew}
	for step := 0; step <= s.Steps; step++ {
		sr, err := l.RunStep(context.Background())
		if err != nil {
			return RLStepResult{}, err
		}
		if step == 0 {
			continue // warm-up: buffers grow to size
		}
		mt := sr.Metrics
		res.Step += mt["time/step"]
		res.Rollout += mt["time/rollout"]
		res.Score += mt["time/score"]
		res.PiOld += mt["time/old_logprobs"]
		res.Update += mt["time/update"]
		res.Push += mt["time/weight_push"]
		res.Other += mt["time/other"]
		res.TrainEngine += mt["time/train_engine"]
		res.LoopOverhead += mt["time/loop_overhead"]
		res.SampledTokensPerStep += mt["response_length/mean"] * float64(prompts*group)
	}
	n := float64(s.Steps)
	for _, p := range []*float64{&res.Step, &res.Rollout, &res.Score, &res.PiOld, &res.Update, &res.Push, &res.Other, &res.TrainEngine, &res.LoopOverhead, &res.SampledTokensPerStep} {
		*p /= n
	}
	return res, nil
}
