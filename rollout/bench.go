package rollout

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/keel-rl/keel/model"
)

// DecodeResult is one decode-throughput measurement.
type DecodeResult struct {
	Preset    string
	Precision Precision
	Slots     int
	// SamplesPerPrompt is how many of the Slots sequences share a prompt
	// (1: all prompts distinct; RL samples a group of G per prompt).
	SamplesPerPrompt int
	PromptLen        int
	NewTokens        int
	TokensPerS       float64 // generated tokens per second, prefill included in the time
	// The measured runs' full decoding steps (every sequence decoding, no
	// prompt row: the steady state, without the ramps at a batch's start
	// and end, where sequences are admitted and finish): how many, their
	// median wall time in milliseconds, and their mean context a row (the
	// positions a row attends to).
	FullSteps   int
	StepMS      float64
	StepContext float64
}

// BenchDecode measures generation throughput on a randomly initialised
// preset model: slots concurrent sequences (one per slot) with random
// prompts of promptLen tokens, each sampling exactly newTokens tokens at
// temperature 1. It warms up on short responses, then runs repeatedly for
// about d (at least once) and reports the best run.
func BenchDecode(preset string, vocab int, p Precision, slots, promptLen, newTokens int, d time.Duration) (DecodeResult, error) {
	return BenchDecodeGroups(preset, vocab, p, slots, 1, promptLen, newTokens, d)
}

// BenchDecodeGroups is BenchDecode with the slots sequences drawn as
// groups of group samples per prompt (slots/group distinct prompts), the
// shape of an RL rollout: the samples of a prompt share its prefill.
func BenchDecodeGroups(preset string, vocab int, p Precision, slots, group, promptLen, newTokens int, d time.Duration) (DecodeResult, error) {
	return BenchDecodeOn(DecodeSpec{Preset: preset, Vocab: vocab, Precision: p, Slots: slots, Group: group, PromptLen: promptLen, NewTokens: newTokens, Time: d})
}

// DecodeSpec is one decode measurement: the model (a preset, its layers
// optionally changed), the engine and the load.
type DecodeSpec struct {
	Preset    string
	Layers    int // 0: the preset's
	Vocab     int
	Precision Precision
	Slots     int
	Group     int // samples per prompt
	PromptLen int
	NewTokens int
	Time      time.Duration
	// NewEngine makes the engine (nil: New, the CPU engine); a GPU
	// backend's engine comes from rollout/device.
	NewEngine func(m *model.Model, opt Options) (*Engine, error)
}

// BenchDecodeOn measures what spec asks, as BenchDecodeGroups does.
func BenchDecodeOn(spec DecodeSpec) (DecodeResult, error) {
	preset, vocab, p, slots, group, promptLen, newTokens, d := spec.Preset, spec.Vocab, spec.Precision, spec.Slots, spec.Group, spec.PromptLen, spec.NewTokens, spec.Time
	res := DecodeResult{Preset: preset, Precision: p, Slots: slots, SamplesPerPrompt: group, PromptLen: promptLen, NewTokens: newTokens}
	if group < 1 || slots%group != 0 {
		return res, fmt.Errorf("rollout bench: %d samples per prompt do not divide %d sequences", group, slots)
	}
	cfg, err := model.Preset(preset, vocab)
	if err != nil {
		return res, err
	}
	if spec.Layers > 0 {
		cfg.NumHiddenLayers = spec.Layers
	}
	m := model.New(cfg)
	model.Init(m, 1)
	newEngine := spec.NewEngine
	if newEngine == nil {
		newEngine = New
	}
	var (
		measuring bool
		full      int       // the engine's slots: the rows of a full step
		times     []float64 // the full steps' milliseconds
		context   int64     // and their positions, summed over rows
	)
	onStep := func(s StepInfo) {
		if measuring && s.Rows == full && s.PromptRows == 0 {
			times = append(times, float64(s.Time)/float64(time.Millisecond))
			context += s.Context
		}
	}
	e, err := newEngine(m, Options{Precision: p, Slots: slots, MaxLen: promptLen + newTokens, OnStep: onStep})
	if err != nil {
		return res, err
	}
	defer e.Close()
	full = e.Options().Slots // a GPU backend may take fewer than asked for
	r := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]int32, slots/group)
	for i := range prompts {
		prompts[i] = make([]int32, promptLen)
		for j := range prompts[i] {
			prompts[i][j] = int32(r.IntN(vocab))
		}
	}
	sp := Sampling{Temperature: 1, MaxNewTokens: newTokens, Seed: 1}
	run := func() (float64, error) {
		start := time.Now()
		out, err := e.Generate(prompts, group, sp)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, s := range out {
			n += len(s.Tokens)
		}
		if n != slots*newTokens {
			return 0, fmt.Errorf("rollout bench: %d tokens generated, want %d", n, slots*newTokens)
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}
	// Warm up (first touch of the KV cache, code paths) on short responses.
	warm := sp
	warm.MaxNewTokens = min(newTokens, 8)
	if _, err := e.Generate(prompts, group, warm); err != nil {
		return res, err
	}
	deadline := time.Now().Add(d)
	measuring = true
	for i := 0; i < 1 || time.Now().Before(deadline); i++ {
		v, err := run()
		if err != nil {
			return res, err
		}
		res.TokensPerS = max(res.TokensPerS, v)
	}
	if res.FullSteps = len(times); res.FullSteps > 0 {
		slices.Sort(times)
		res.StepMS = times[len(times)/2]
		res.StepContext = float64(context) / float64(len(times)*full)
	}
	return res, nil
}
