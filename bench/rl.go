package bench

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/train"
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

// RLStep times whole steps of the RL loop (MiniRL, one mini-batch) on a
// preset with random weights: B random 32-token prompts, G samples each
// of up to maxNew tokens from the rollout engine in precision prec, a
// synthetic reward (1 when a response's first token is even) so that
// groups have mixed rewards, and the weight push. One warm-up step, then
// the mean of steps steps.
func RLStep(preset string, vocab int, prec rollout.Precision, prompts, group, maxNew, steps int) (RLStepResult, error) {
	cfg, err := model.Preset(preset, vocab)
	if err != nil {
		return RLStepResult{}, err
	}
	cfg.MaxPositionEmbeddings = 32 + maxNew
	m := model.New(cfg)
	model.Init(m, 1)
	recipe := []byte(`
model: {path: preset}
data: {tasks: [arithmetic]}
eval: {skip: true}
`)
	r, err := rl.ParseRecipe(recipe, []string{
		"rollout.precision=" + prec.String(), fmt.Sprintf("rollout.max_new_tokens=%d", maxNew),
		fmt.Sprintf("train.prompts_per_step=%d", prompts), fmt.Sprintf("train.group_size=%d", group),
		"train.lr=1.0e-5", fmt.Sprintf("rollout.slots=%d", prompts*group),
	})
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
	eng, err := rollout.New(m, rollout.Options{Precision: prec, Slots: prompts * group, MaxLen: 32 + maxNew})
	if err != nil {
		return RLStepResult{}, err
	}
	defer eng.Close()
	tr, err := train.NewTrainer(m, r.AdamW(), nil)
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
	res := RLStepResult{Preset: preset, Precision: prec.String(), Prompts: prompts, Group: group, MaxNew: maxNew}
	for s := 0; s <= steps; s++ {
		sr, err := l.RunStep(context.Background())
		if err != nil {
			return RLStepResult{}, err
		}
		if s == 0 {
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
	n := float64(steps)
	for _, p := range []*float64{&res.Step, &res.Rollout, &res.Score, &res.PiOld, &res.Update, &res.Push, &res.Other, &res.TrainEngine, &res.LoopOverhead, &res.SampledTokensPerStep} {
		*p /= n
	}
	return res, nil
}
