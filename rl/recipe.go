package rl

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/keel-rl/keel/env"
	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/rollout"
	rolldevice "github.com/keel-rl/keel/rollout/device"
	"github.com/keel-rl/keel/rollout/remote"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/device"
)

// Recipe is an RL run as a YAML file describes it (README: "RL recipes"
// documents every key). Parsing is strict: an unknown key, a wrong type or
// an incompatible combination is an error naming the key.
type Recipe struct {
	// Name names the run; Out defaults to runs/NAME.
	Name string `yaml:"name"`
	Out  string `yaml:"out"`
	// Seed fixes the data order, every sample and so the whole run.
	Seed      uint64          `yaml:"seed"`
	Model     RLModel         `yaml:"model"`
	Data      RLData          `yaml:"data"`
	Rollout   RolloutSettings `yaml:"rollout"`
	Algorithm Algorithm       `yaml:"algorithm"`
	Train     TrainSettings   `yaml:"train"`
	Eval      RLEval          `yaml:"eval"`
	Log       RLLog           `yaml:"log"`
	Guards    Guards          `yaml:"guards"`
	// Reward is where rewards come from: the task's verifier (unset) or
	// the user's own program.
	Reward RewardSettings `yaml:"reward,omitempty"`
	// Env makes rollouts multi-turn episodes of an environment (tools,
	// games); unset, each response is one turn scored by the reward.
	Env EnvSettings `yaml:"env,omitempty"`
	// Device puts both engines on one device (cpu, cuda or cuda:N): the
	// default of train.device and rollout.device.
	Device string `yaml:"device,omitempty"`
}

// EnvSettings choose a multi-turn environment (package env): a built-in
// one by name, or one served over HTTP (name http, url). Its episodes'
// rewards replace the verifier's. Left unset, nothing of it is written to
// the resolved recipe.
type EnvSettings struct {
	Name string `yaml:"name,omitempty"`
	// URL is the environment server's base URL (name http).
	URL string `yaml:"url,omitempty"`
	// MaxTurns bounds the model's turns per episode (default 4);
	// rollout.max_new_tokens bounds each turn.
	MaxTurns int `yaml:"max_turns,omitempty"`
	// MaxTokens bounds an episode's tokens after the prompt, the model's
	// and the observations' (default max_turns x max_new_tokens); it is
	// also the length budget of the objectives that have one.
	MaxTokens int `yaml:"max_tokens,omitempty"`
	// SystemPrompt is the system message put before every prompt: full
	// (the default: the environment's own, for tools their schemas as
	// Qwen3's chat template renders them), compact (one line naming the
	// tools, for tiny models with a character tokenizer, which cannot
	// afford the schemas) or none.
	SystemPrompt string `yaml:"system_prompt,omitempty"`
	// Timeout bounds one request to an HTTP environment, seconds
	// (default 60); Retries is how often a failed one is tried again
	// (default 2).
	Timeout float64 `yaml:"timeout,omitempty"`
	Retries *int    `yaml:"retries,omitempty"`
}

// On reports whether rollouts are episodes of an environment.
func (e *EnvSettings) On() bool { return e.Name != "" }

// responseBudget is the most tokens a response holds: an episode's token
// budget with an environment, else rollout.max_new_tokens. It is the
// constant of the objectives and penalties that normalise by a budget.
func (r *Recipe) responseBudget() int {
	if r.Env.On() {
		return r.Env.MaxTokens
	}
	return r.Rollout.MaxNewTokens
}

// Reward kinds (reward.kind).
const (
	RewardVerifier = "verifier"
	RewardHTTP     = "http"
	RewardCommand  = "command"
)

// RewardSettings choose the reward: the task's built-in verifier (kind
// unset or verifier, the default, with no other key), or an external
// program speaking the keel-reward/1 protocol (package reward): an HTTP
// endpoint (kind http, url) or a command kept running (kind command,
// command). Left unset, nothing of it is written to the resolved recipe.
type RewardSettings struct {
	Kind string `yaml:"kind,omitempty"`
	// URL is the HTTP grader's endpoint (kind http), POSTed to.
	URL string `yaml:"url,omitempty"`
	// APIKeyEnv names the environment variable holding the HTTP grader's
	// API key, sent as a bearer token; the key itself never goes in the
	// recipe, which is saved to the run directory.
	APIKeyEnv string `yaml:"api_key_env,omitempty"`
	// Command is the grader's argv (kind command).
	Command []string `yaml:"command,omitempty"`
	// Timeout bounds one request, seconds (default 60).
	Timeout float64 `yaml:"timeout,omitempty"`
	// Retries is how often a failed request is tried again (default 2).
	Retries *int `yaml:"retries,omitempty"`
	// Concurrency bounds the requests in flight (http, default 4) or the
	// command's processes (command, default 1).
	Concurrency int `yaml:"concurrency,omitempty"`
	// Batch is the most responses per request (default 64).
	Batch int `yaml:"batch,omitempty"`
	// MaxRestarts bounds the restarts of a command that dies or hangs,
	// over the run (default 3; 0: never restarted).
	MaxRestarts *int `yaml:"max_restarts,omitempty"`
	// OnError: fail (the default: a failed or malformed answer stops the
	// run with an error naming the row and field) or zero (the response
	// gets reward 0, counted in the metric reward/external_errors).
	OnError string `yaml:"on_error,omitempty"`
}

// RLModel is the policy's starting point: a Hugging Face model directory
// (config.json, safetensors, tokenizer.json).
type RLModel struct {
	Path string `yaml:"path"`
}

// RLData is the prompt set: a file (JSONL or Parquet, keel's or verl's
// layout) or problems generated from the built-in task families.
type RLData struct {
	File       string   `yaml:"file"`
	Tasks      []string `yaml:"tasks,omitempty"` // generate: task families
	N          int      `yaml:"n"`               // generate: problems
	Difficulty string   `yaml:"difficulty"`      // generate: levels, e.g. "1-4"
}

// RolloutSettings configure the rollout engine and its sampling.
type RolloutSettings struct {
	// Precision is the discrepancy dial: exact, fp32, bf16, fp8 or fp4.(the
	// in-process engine's; remote servers run their own, so it stays unset
	// with Servers).
	Precision    string  `yaml:"precision,omitempty"`
	Temperature  float64 `yaml:"temperature"`
	TopK         int     `yaml:"top_k"`
	TopP         float64 `yaml:"top_p"`
	MaxNewTokens int     `yaml:"max_new_tokens"`
	Slots        int     `yaml:"slots"` // sequences decoded at once
	// Staleness k > 0 runs the rollout ahead of the trainer: step s
	// trains on samples of the weights of step s-k exactly (of version
	// max(0, s-1-k)), sampled while the steps before it train; runs stay
	// deterministic and resume bit for bit. 0: the synchronous loop.
	Staleness int `yaml:"staleness,omitempty"`
	// MaxStaleness k > 0 runs the rollout ahead as far as it can: each
	// batch samples the newest weights the trainer has made when the
	// batch starts, at most k versions behind its step's (at least those
	// of step s-k). Faster when the rollout is the slower side, but runs
	// are not bitwise reproducible: which weights a batch gets depends on
	// timing. Exclusive with Staleness.
	MaxStaleness int `yaml:"max_staleness,omitempty"`
	// Partial says what a sequence in progress does when newer weights
	// arrive (max_staleness; in process or on keel servers): "finish" (the default:
	// a batch samples one version) or "switch" (partial rollouts: it
	// continues on the new weights, every token carrying the version that
	// sampled it and its log mu under that version).
	Partial string `yaml:"partial,omitempty"`

	// Servers moves rollout to a fleet of inference servers (base URLs,
	// like http://10.0.0.5:30000) so that generation can run on other
	// machines' accelerators; empty: the in-process engine. The remaining
	// fields configure that fleet (see remote.Client); the API key, a
	// secret, comes from the environment (remote.APIKeyEnv), never from
	// the recipe, which is saved to the run directory.
	Servers []string `yaml:"servers,omitempty"`
	// ServerKind is the servers' protocol: keel (keel serve), sglang
	// (SGLang's native API) or vllm (vLLM's OpenAI-compatible API).
	ServerKind string `yaml:"server_kind,omitempty"`
	// WeightsDir is where each step's weights are written for the servers
	// to load: a path every server can read under the same name.
	WeightsDir string `yaml:"weights_dir,omitempty"`
	// RequestTimeout bounds one HTTP request, seconds.
	RequestTimeout float64 `yaml:"request_timeout,omitempty"`
	// MaxConcurrency bounds the requests (prompts) in flight per server.
	MaxConcurrency int `yaml:"max_concurrency,omitempty"`
	// Device is where the in-process engine decodes: cpu (the default),
	// cuda or cuda:N (the GPU backend: exact, bf16, fp8 and fp4 precision).
	Device string `yaml:"device,omitempty"`
	// GPUMemory is the share of the GPU's free memory, once what the
	// training engine on the same GPU will take is set aside, that the
	// rollout engines (the training rollout's and the evaluation's) may
	// take; each decodes with as many of Slots as fit in it (samples do not
	// depend on the number of slots). 0: 0.9.
	GPUMemory float64 `yaml:"gpu_memory,omitempty"`
}

// Algorithm is the objective, its corrections and Routing Replay.
type Algorithm struct {
	// Objective: minirl, minirl-no-is, minirl-lennorm, minirl-old-is,
	// no-clip, grpo, dr-grpo, dapo, cispo, gspo, gspo-token or ppo.
	Objective string `yaml:"objective"`
	// Advantage: group-mean, group-mean-std or rloo (default: the
	// objective's own).
	Advantage string `yaml:"advantage"`
	// Aggregation: seq-sum-mean, token-mean, seq-mean-token-mean or
	// constant-normalised (default: the objective's own; minirl
	// variants fix theirs).
	Aggregation string   `yaml:"aggregation"`
	EpsLow      *float64 `yaml:"eps_low"`  // default: the objective's
	EpsHigh     *float64 `yaml:"eps_high"` // default: the objective's
	ISCap       float64  `yaml:"is_cap"`   // MiniRL's C (default 5)
	// Correction is the training-inference correction: none, token-tis,
	// token-mis, seq-tis, seq-mis or geo-mask, with its thresholds.
	Correction     string  `yaml:"correction"`
	CorrectionCap  float64 `yaml:"correction_cap"`  // default 2 (verl's)
	CorrectionLow  float64 `yaml:"correction_low"`  // geo-mask, default 0.999
	CorrectionHigh float64 `yaml:"correction_high"` // geo-mask, default 1.001
	// Replay is Routing Replay: none, r2 or r3 (MoE models only).
	Replay string `yaml:"replay"`
	// KLCoef weighs a k3 KL penalty to the starting model (0: none).
	KLCoef float64 `yaml:"kl_coef"`
	// EntropyCoef weighs an entropy bonus (0: none).
	EntropyCoef float64 `yaml:"entropy_coef"`
	// DynamicSampling drops groups whose rewards are all equal (DAPO) and
	// samples further prompts, up to MaxRounds batches, to refill the step.
	DynamicSampling bool `yaml:"dynamic_sampling"`
	MaxRounds       int  `yaml:"max_rounds"`
	// OverlongBuffer > 0 enables DAPO's soft overlong penalty over the last
	// OverlongBuffer tokens of the budget (reaching -OverlongPenalty).
	OverlongBuffer  int     `yaml:"overlong_buffer"`
	OverlongPenalty float64 `yaml:"overlong_penalty"`
}

// TrainSettings size a step and configure the optimiser.
type TrainSettings struct {
	Steps int `yaml:"steps"` // global steps
	// PromptsPerStep (B) prompts, GroupSize (G) samples each, split into
	// MiniBatches (N) optimiser steps with groups kept whole.
	PromptsPerStep int `yaml:"prompts_per_step"`
	GroupSize      int `yaml:"group_size"`
	MiniBatches    int `yaml:"mini_batches"`
	// MicroBatchTokens bounds the tokens of one forward/backward.
	MicroBatchTokens int     `yaml:"micro_batch_tokens"`
	LR               float64 `yaml:"lr"`
	Warmup           int     `yaml:"warmup"` // optimiser steps
	Schedule         string  `yaml:"schedule"`
	MinLR            float64 `yaml:"min_lr"`
	WeightDecay      float64 `yaml:"weight_decay"`
	Beta1            float64 `yaml:"beta1"`
	Beta2            float64 `yaml:"beta2"`
	ClipNorm         float64 `yaml:"clip_norm"`
	AuxLoss          float64 `yaml:"aux_loss"` // MoE load-balancing coefficient
	// Device is where the training engine runs: cpu (the default), cuda
	// or cuda:N (the GPU engine).
	Device string `yaml:"device"`
	// Precision of the training engine's products: fp32 (the default) or
	// bf16 (the GPU engine's mixed precision).
	Precision string `yaml:"precision,omitempty"`
	// Recompute turns on activation checkpointing (the GPU engine).
	Recompute bool `yaml:"recompute,omitempty"`
}

// Engine returns the training engine's options.
func (t *TrainSettings) Engine() device.Options {
	return device.Options{Device: t.Device, Precision: t.Precision, Recompute: t.Recompute}
}

// RLEval is the held-out evaluation: avg@k before training, every Every
// steps and at the end.
type RLEval struct {
	File         string `yaml:"file"`
	N            int    `yaml:"n"` // first N rows (0: all)
	K            int    `yaml:"k"`
	Every        int    `yaml:"every"` // 0: before and after only
	MaxNewTokens int    `yaml:"max_new_tokens"`
	Precision    string `yaml:"precision"` // the evaluating engine's (default exact)
	Skip         bool   `yaml:"skip"`
	// Decontaminate drops the training prompts that are held-out prompts
	// (default true). A game whose prompt is the same for every hidden
	// answer ("Guess my number from 1 to 30.") sets it false: its held-out
	// problems differ from the training ones only in what the model
	// cannot see. Unset means true (and is not written to the resolved
	// recipe).
	Decontaminate *bool `yaml:"decontaminate,omitempty"`
}

// RLLog controls what the run writes.
type RLLog struct {
	SamplesEvery    int  `yaml:"samples_every"`    // samples/step-N.jsonl every N steps
	CheckpointEvery int  `yaml:"checkpoint_every"` // steps
	Keep            int  `yaml:"keep"`             // checkpoints kept
	TensorBoard     bool `yaml:"tensorboard"`
}

// Guards stop or flag a run going wrong.
type Guards struct {
	// MaxNonFinite consecutive steps with a NaN or Inf loss or gradient
	// stop the run (each such step is skipped and logged).
	MaxNonFinite int `yaml:"max_nonfinite"`
	// KLMax and ISMax > 0: when the train-infer KL (k3) or the largest IS
	// weight of a step exceeds them, Action ("warn" or "stop") is taken.
	KLMax  float64 `yaml:"kl_max"`
	ISMax  float64 `yaml:"is_max"`
	Action string  `yaml:"action"`
}

// Quickstart is the built-in recipe `keel rl` runs without arguments.
//
//go:embed quickstart.yaml
var Quickstart []byte

// ReadRecipe reads a recipe file strictly and applies overrides
// ("key.path=value", YAML values) before the defaults and checks.
func ReadRecipe(path string, overrides []string) (*Recipe, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := ParseRecipe(b, overrides)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// ParseRecipe parses recipe YAML, applies overrides, fills defaults and
// checks the result.
func ParseRecipe(b []byte, overrides []string) (*Recipe, error) {
	var r Recipe
	// The file alone first, so that errors give its own line numbers.
	if err := strictDecode(b, &r); err != nil {
		return nil, err
	}
	if len(overrides) > 0 {
		var doc yaml.Node
		if err := yaml.Unmarshal(b, &doc); err != nil {
			return nil, errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
		}
		if doc.Kind == 0 {
			doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
		}
		for _, o := range overrides {
			if err := setKey(&doc, o); err != nil {
				return nil, err
			}
		}
		var buf bytes.Buffer
		if err := yaml.NewEncoder(&buf).Encode(&doc); err != nil {
			return nil, err
		}
		r = Recipe{}
		if err := strictDecode(buf.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("with --set %s: %w", strings.Join(overrides, " "), err)
		}
	}
	if err := r.fill(); err != nil {
		return nil, err
	}
	return &r, nil
}

// strictDecode decodes recipe YAML, refusing unknown keys; an empty
// document leaves r as it is.
func strictDecode(b []byte, r *Recipe) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(r); err != nil && !errors.Is(err, io.EOF) {
		return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return nil
}

// setKey applies one "a.b.c=value" override to a YAML document, creating
// missing mappings; the value is parsed as YAML (so 3, 0.5, true, [a, b]
// and strings all work). Unknown keys are caught by the strict decode.
func setKey(doc *yaml.Node, kv string) error {
	key, val, ok := strings.Cut(kv, "=")
	if !ok || key == "" {
		return fmt.Errorf("--set %q: want key=value", kv)
	}
	var v yaml.Node
	if err := yaml.Unmarshal([]byte(val), &v); err != nil {
		return fmt.Errorf("--set %s: value: %v", key, err)
	}
	value := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: ""}
	if v.Kind == yaml.DocumentNode && len(v.Content) == 1 {
		value = v.Content[0]
	}
	node := doc.Content[0]
	parts := strings.Split(key, ".")
	for i, p := range parts {
		if node.Kind != yaml.MappingNode {
			return fmt.Errorf("--set %s: %s is not a mapping", key, strings.Join(parts[:i], "."))
		}
		var next *yaml.Node
		for j := 0; j+1 < len(node.Content); j += 2 {
			if node.Content[j].Value == p {
				next = node.Content[j+1]
				if i == len(parts)-1 {
					node.Content[j+1] = value
				}
				break
			}
		}
		if i == len(parts)-1 {
			if next == nil {
				node.Content = append(node.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: p}, value)
			}
			return nil
		}
		if next != nil && next.Kind != yaml.MappingNode && next.Tag != "!!null" {
			return fmt.Errorf("--set %s: %s is not a mapping", key, strings.Join(parts[:i+1], "."))
		}
		if next == nil || next.Kind != yaml.MappingNode {
			next = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			found := false
			for j := 0; j+1 < len(node.Content); j += 2 {
				if node.Content[j].Value == p {
					node.Content[j+1] = next
					found = true
				}
			}
			if !found {
				node.Content = append(node.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: p}, next)
			}
		}
		node = next
	}
	return nil
}

// What a sequence in progress does when newer weights arrive
// (rollout.partial).
const (
	PartialFinish = "finish"
	PartialSwitch = "switch"
)

// Replay modes.
const (
	ReplayNone = "none"
	ReplayR2   = "r2"
	ReplayR3   = "r3"
)

// fill sets defaults and checks every setting, section by section, naming
// the key at fault.
func (r *Recipe) fill() error {
	orDefault(&r.Name, "rl")
	orDefault(&r.Out, "runs/"+r.Name)
	orDefault(&r.Seed, 1)
	if r.Model.Path == "" {
		return bad("model.path", "a model directory is required")
	}
	if _, err := kc.ParseDevice(r.Device); err != nil {
		return bad("device", "%v", err)
	}
	orDefault(&r.Train.Device, r.Device)
	if len(r.Rollout.Servers) == 0 {
		orDefault(&r.Rollout.Device, r.Device)
	}
	// In order: the algorithm and eval sections default to the rollout's
	// budget, filled by then.
	for _, f := range []func() error{
		r.Data.fill,
		func() error { return r.Rollout.fill(r.Out) },
		func() error { return r.Env.fill(r.Rollout.MaxNewTokens) },
		func() error { return r.Algorithm.fill(r.responseBudget()) },
		r.fillTrain,
		func() error { return r.Eval.fill(r.Rollout.MaxNewTokens) },
		r.Log.fill,
		r.Guards.fill,
		r.Reward.fill,
		r.fillEnvCombinations,
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// maxStaleness bounds rollout.staleness and max_staleness: each step ahead
// holds a batch of samples in memory and in every checkpoint.
const maxStaleness = 64

// bad is a recipe error naming the key at fault.
func bad(key string, format string, a ...any) error {
	return fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...))
}

// fill checks the data section: a file, or task families to generate.
func (d *RLData) fill() error {
	switch {
	case d.File != "" && len(d.Tasks) > 0:
		return bad("data", "give file or tasks, not both")
	case d.File == "" && len(d.Tasks) == 0:
		return bad("data", "give file (JSONL or Parquet) or tasks to generate problems")
	}
	if d.File != "" && (d.N != 0 || d.Difficulty != "") {
		return bad("data", "n and difficulty apply to generated problems (data.tasks), not to data.file")
	}
	if len(d.Tasks) > 0 {
		orDefault(&d.N, 20000)
		if d.N < 0 {
			return bad("data.n", "%d, want > 0", d.N)
		}
		orDefault(&d.Difficulty, "1-4")
	}
	return nil
}

// fill checks the rollout section: the in-process engine's precision, or
// the remote fleet's settings (out is the run directory), and sampling.
func (ro *RolloutSettings) fill(out string) error {
	if len(ro.Servers) > 0 {
		if err := ro.fillRemote(out); err != nil {
			return err
		}
	} else {
		if ro.ServerKind != "" || ro.WeightsDir != "" || ro.RequestTimeout != 0 || ro.MaxConcurrency != 0 {
			return bad("rollout", "server_kind, weights_dir, request_timeout and max_concurrency configure remote rollout: give rollout.servers too, or leave them unset")
		}
		orDefault(&ro.Precision, "exact")
		p, err := rollout.ParsePrecision(ro.Precision)
		if err != nil {
			return bad("rollout.precision", "%v", err)
		}
		if _, err := kc.ParseDevice(ro.Device); err != nil {
			return bad("rollout.device", "%v", err)
		}
		if err := rolldevice.Check(ro.Device, p); err != nil {
			return bad("rollout.device", "%s with rollout.precision %s: %v", ro.Device, ro.Precision, err)
		}
	}
	orDefault(&ro.Temperature, 1)
	if !(ro.Temperature > 0) || math.IsInf(ro.Temperature, 0) {
		return bad("rollout.temperature", "%g, want a finite value > 0 (RL samples; greedy decoding has no policy gradient)", ro.Temperature)
	}
	if ro.TopK < 0 {
		return bad("rollout.top_k", "%d, want >= 0 (0: off)", ro.TopK)
	}
	if ro.TopP < 0 || ro.TopP > 1 {
		return bad("rollout.top_p", "%g, want within [0, 1] (0 or 1: off)", ro.TopP)
	}
	orDefault(&ro.MaxNewTokens, 256)
	if ro.MaxNewTokens < 1 {
		return bad("rollout.max_new_tokens", "%d, want >= 1", ro.MaxNewTokens)
	}
	orDefault(&ro.Slots, 256)
	if ro.Slots < 1 {
		return bad("rollout.slots", "%d, want >= 1", ro.Slots)
	}
	if !(ro.GPUMemory >= 0 && ro.GPUMemory <= 1) {
		return bad("rollout.gpu_memory", "%g, want within (0, 1] (0: 0.9)", ro.GPUMemory)
	}
	if ro.Staleness < 0 || ro.Staleness > maxStaleness {
		return bad("rollout.staleness", "%d, want within [0, %d] (0: the synchronous loop)", ro.Staleness, maxStaleness)
	}
	if ro.MaxStaleness < 0 || ro.MaxStaleness > maxStaleness {
		return bad("rollout.max_staleness", "%d, want within [0, %d] (0: off)", ro.MaxStaleness, maxStaleness)
	}
	switch ro.Partial {
	case "", PartialFinish:
	case PartialSwitch:
		if ro.MaxStaleness == 0 {
			return bad("rollout.partial", "switch changes weights inside a batch: it needs rollout.max_staleness")
		}
		if len(ro.Servers) > 0 && ro.ServerKind != remote.KindKeel {
			return bad("rollout.partial", "switch on remote servers needs keel serve (rollout.server_kind: keel), which reports the weight version of every token; %s does not", ro.ServerKind)
		}
	default:
		return bad("rollout.partial", "unknown %q (want %s or %s)", ro.Partial, PartialFinish, PartialSwitch)
	}
	if ro.Staleness > 0 && ro.MaxStaleness > 0 {
		return bad("rollout.max_staleness", "give staleness (exactly k steps behind, reproducible) or max_staleness (at most k, as fresh as the rollout can), not both")
	}
	return nil
}

// fill checks the algorithm section against the objective registry;
// budget is rollout.max_new_tokens.
func (a *Algorithm) fill(budget int) error {
	orDefault(&a.Objective, MiniRLDefault)
	spec, ok := lookupObjective(a.Objective)
	if !ok {
		return bad("algorithm.objective", "unknown %q (want %s)", a.Objective, objectiveNames())
	}
	if a.Aggregation != "" && spec.FixedAggregation {
		return bad("algorithm.aggregation", "%s fixes its own aggregation (%s): leave it unset", a.Objective, spec.Aggregation)
	}
	if a.EpsLow == nil {
		a.EpsLow = &spec.EpsLow
	}
	if a.EpsHigh == nil {
		a.EpsHigh = &spec.EpsHigh
	}
	if !(*a.EpsLow >= 0 && *a.EpsLow < 1) {
		return bad("algorithm.eps_low", "%g, want within [0, 1)", *a.EpsLow)
	}
	if !(*a.EpsHigh >= 0) || math.IsInf(*a.EpsHigh, 0) {
		return bad("algorithm.eps_high", "%g, want a finite value >= 0", *a.EpsHigh)
	}
	orDefault(&a.Advantage, spec.Advantage)
	switch a.Advantage {
	case GroupMean, GroupMeanStd, RLOO:
	default:
		return bad("algorithm.advantage", "unknown %q (want %s, %s or %s)", a.Advantage, GroupMean, GroupMeanStd, RLOO)
	}
	if a.Aggregation != "" {
		switch a.Aggregation {
		case SeqSumMean, TokenMean, SeqMeanTokenMean, ConstantNorm:
		default:
			return bad("algorithm.aggregation", "unknown %q (want %s, %s, %s or %s)", a.Aggregation, SeqSumMean, TokenMean, SeqMeanTokenMean, ConstantNorm)
		}
	}
	orDefault(&a.ISCap, 5)
	if !(a.ISCap > 0) || math.IsInf(a.ISCap, 0) {
		return bad("algorithm.is_cap", "%g, want a finite value > 0", a.ISCap)
	}
	orDefault(&a.Correction, CorrectionNone)
	orDefault(&a.CorrectionCap, 2)
	orDefault(&a.CorrectionLow, 0.999)
	orDefault(&a.CorrectionHigh, 1.001)
	if err := a.correction().Validate(); err != nil {
		return bad("algorithm.correction", "%v", err)
	}
	if a.Correction != CorrectionNone && spec.OwnIS {
		return bad("algorithm.correction", "%s already corrects the training-inference discrepancy with its own IS weight; use objective minirl-no-is to pair MiniRL's clipping with %s", a.Objective, a.Correction)
	}
	orDefault(&a.Replay, ReplayNone)
	switch a.Replay {
	case ReplayNone, ReplayR2, ReplayR3:
	default:
		return bad("algorithm.replay", "unknown %q (want none, r2 or r3)", a.Replay)
	}
	if !(a.KLCoef >= 0) || math.IsInf(a.KLCoef, 0) {
		return bad("algorithm.kl_coef", "%g, want a finite value >= 0", a.KLCoef)
	}
	if !(a.EntropyCoef >= 0) || math.IsInf(a.EntropyCoef, 0) {
		return bad("algorithm.entropy_coef", "%g, want a finite value >= 0", a.EntropyCoef)
	}
	orDefault(&a.MaxRounds, 3)
	if a.MaxRounds < 1 {
		return bad("algorithm.max_rounds", "%d, want >= 1", a.MaxRounds)
	}
	if a.OverlongBuffer < 0 || a.OverlongBuffer >= budget && a.OverlongBuffer > 0 {
		return bad("algorithm.overlong_buffer", "%d, want within [0, rollout.max_new_tokens = %d)", a.OverlongBuffer, budget)
	}
	orDefault(&a.OverlongPenalty, 1)
	return nil
}

// fillTrain checks the train section: a step's sizes and the optimiser.
func (r *Recipe) fillTrain() error {
	t := &r.Train
	orDefault(&t.Steps, 100)
	if t.Steps < 1 {
		return bad("train.steps", "%d, want >= 1", t.Steps)
	}
	orDefault(&t.PromptsPerStep, 32)
	orDefault(&t.GroupSize, 8)
	orDefault(&t.MiniBatches, 1)
	if t.PromptsPerStep < 1 {
		return bad("train.prompts_per_step", "%d, want >= 1", t.PromptsPerStep)
	}
	if t.GroupSize < 2 {
		return bad("train.group_size", "%d, want >= 2 (advantages compare a prompt's samples)", t.GroupSize)
	}
	if t.MiniBatches < 1 || t.PromptsPerStep%t.MiniBatches != 0 {
		return bad("train.mini_batches", "%d must divide train.prompts_per_step = %d (groups stay whole)", t.MiniBatches, t.PromptsPerStep)
	}
	orDefault(&t.MicroBatchTokens, 4096)
	if t.MicroBatchTokens < 1 {
		return bad("train.micro_batch_tokens", "%d, want >= 1", t.MicroBatchTokens)
	}
	orDefault(&t.LR, 1e-5)
	orDefault(&t.Schedule, train.ScheduleConstant)
	orDefault(&t.Beta1, 0.9)
	orDefault(&t.Beta2, 0.999)
	orDefault(&t.ClipNorm, 1)
	if t.Schedule == train.ScheduleCosine && t.Warmup >= t.Steps*t.MiniBatches {
		return bad("train.warmup", "%d optimiser steps, must be below train.steps x train.mini_batches = %d with a cosine schedule", t.Warmup, t.Steps*t.MiniBatches)
	}
	if err := r.schedule().Validate(); err != nil {
		return bad("train", "%v", err)
	}
	if err := r.AdamW().Validate(); err != nil {
		return bad("train", "%v", err)
	}
	if !(t.AuxLoss >= 0) || math.IsInf(t.AuxLoss, 0) {
		return bad("train.aux_loss", "%g, want a finite value >= 0", t.AuxLoss)
	}
	if _, err := device.Parse(t.Device); err != nil {
		return bad("train.device", "%v", err)
	}
	if err := t.Engine().Check(); err != nil {
		return bad("train", "%v", err)
	}
	return nil
}

// fill checks the eval section; budget is rollout.max_new_tokens, the
// default evaluation budget.
func (e *RLEval) fill(budget int) error {
	if !e.Skip {
		if e.File == "" {
			return bad("eval.file", "a held-out data set is required (or eval.skip: true)")
		}
		orDefault(&e.K, 4)
		if e.K < 1 {
			return bad("eval.k", "%d, want >= 1", e.K)
		}
		if e.N < 0 {
			return bad("eval.n", "%d, want >= 0 (0: every row)", e.N)
		}
		if e.Every < 0 {
			return bad("eval.every", "%d, want >= 0", e.Every)
		}
		orDefault(&e.MaxNewTokens, budget)
		orDefault(&e.Precision, "exact")
		if _, err := rollout.ParsePrecision(e.Precision); err != nil {
			return bad("eval.precision", "%v", err)
		}
	}
	return nil
}

// fill checks the log section.
func (l *RLLog) fill() error {
	orDefault(&l.SamplesEvery, 10)
	orDefault(&l.CheckpointEvery, 20)
	orDefault(&l.Keep, 2)
	if l.SamplesEvery < 0 || l.CheckpointEvery < 0 || l.Keep < 0 {
		return bad("log", "samples_every, checkpoint_every and keep must be >= 0")
	}
	return nil
}

// fill checks the guards section.
func (g *Guards) fill() error {
	orDefault(&g.MaxNonFinite, 3)
	if g.MaxNonFinite < 1 {
		return bad("guards.max_nonfinite", "%d, want >= 1", g.MaxNonFinite)
	}
	orDefault(&g.Action, "warn")
	if g.Action != "warn" && g.Action != "stop" {
		return bad("guards.action", "%q, want warn or stop", g.Action)
	}
	if g.KLMax < 0 || g.ISMax < 0 {
		return bad("guards", "kl_max and is_max must be >= 0 (0: off)")
	}
	return nil
}

// envName is an environment variable's name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// fill checks the env section; budget is rollout.max_new_tokens (one
// turn's).
func (e *EnvSettings) fill(budget int) error {
	if !e.On() {
		if e.URL != "" || e.MaxTurns != 0 || e.MaxTokens != 0 || e.SystemPrompt != "" || e.Timeout != 0 || e.Retries != nil {
			return bad("env", "url, max_turns, max_tokens, system_prompt, timeout and retries configure an environment: set env.name (%s, or http with env.url), or leave them unset", strings.Join(env.Names(), ", "))
		}
		return nil
	}
	switch {
	case e.Name == EnvHTTP:
		if u, err := url.Parse(e.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return bad("env.url", "%q: want an http or https URL without credentials (the environment server's base URL)", e.URL)
		}
	case slices.Contains(env.Names(), e.Name):
		if e.URL != "" || e.Timeout != 0 || e.Retries != nil {
			return bad("env.url", "url, timeout and retries are for env.name http, not the built-in %s", e.Name)
		}
	default:
		return bad("env.name", "unknown %q (want %s, or %s with env.url)", e.Name, strings.Join(env.Names(), ", "), EnvHTTP)
	}
	orDefault(&e.MaxTurns, 4)
	if e.MaxTurns < 1 || e.MaxTurns > 1000 {
		return bad("env.max_turns", "%d, want within [1, 1000]", e.MaxTurns)
	}
	orDefault(&e.MaxTokens, e.MaxTurns*budget)
	if e.MaxTokens < 1 {
		return bad("env.max_tokens", "%d, want >= 1", e.MaxTokens)
	}
	orDefault(&e.SystemPrompt, SystemPromptFull)
	if e.SystemPrompt != SystemPromptFull && e.SystemPrompt != SystemPromptCompact && e.SystemPrompt != SystemPromptNone {
		return bad("env.system_prompt", "unknown %q (want %s, %s or %s)", e.SystemPrompt, SystemPromptFull, SystemPromptCompact, SystemPromptNone)
	}
	if e.Name == EnvHTTP {
		orDefault(&e.Timeout, 60)
		if !(e.Timeout > 0) || math.IsInf(e.Timeout, 0) {
			return bad("env.timeout", "%g, want a finite number of seconds > 0", e.Timeout)
		}
		if e.Retries == nil {
			two := 2
			e.Retries = &two
		}
		if *e.Retries < 0 || *e.Retries > 100 {
			return bad("env.retries", "%d, want within [0, 100]", *e.Retries)
		}
	}
	return nil
}

// budgets are the episodes' budgets.
func (e *EnvSettings) budgets() env.Budgets {
	return env.Budgets{MaxTurns: e.MaxTurns, MaxTokens: e.MaxTokens}
}

// scoresAnyTask reports whether the environment scores rows whatever their
// task (one served over HTTP): the rows need no built-in verifier.
func (e *EnvSettings) scoresAnyTask() bool { return e.Name == EnvHTTP }

// OpenEnvironment checks settings given outside a recipe (keel eval's
// flags) as a recipe's env section, maxNewTokens being one turn's
// budget, and builds the environment: with the system prompt it puts
// before every prompt and the episodes' budgets. An unset name is an
// error.
func OpenEnvironment(e *EnvSettings, maxNewTokens int) (env.Environment, string, env.Budgets, error) {
	if !e.On() {
		return nil, "", env.Budgets{}, bad("env.name", "required")
	}
	if err := e.fill(maxNewTokens); err != nil {
		return nil, "", env.Budgets{}, err
	}
	en, system, err := newEnvironment(e)
	return en, system, e.budgets(), err
}

// newEnvironment builds the recipe's environment (nil without one) and
// the system prompt it puts before every prompt ("" for none).
func newEnvironment(e *EnvSettings) (env.Environment, string, error) {
	if !e.On() {
		return nil, "", nil
	}
	var en env.Environment
	var err error
	if e.Name == EnvHTTP {
		en, err = env.NewHTTP(e.URL, env.HTTPOptions{Timeout: time.Duration(e.Timeout * float64(time.Second)), Retries: *e.Retries})
	} else {
		en, err = env.Lookup(e.Name)
	}
	if err != nil {
		return nil, "", fmt.Errorf("env: %w", err)
	}
	system := ""
	switch p, ok := en.(env.Prompter); {
	case e.SystemPrompt == SystemPromptCompact:
		system = env.CompactSystemPrompt(en)
	case e.SystemPrompt == SystemPromptFull && ok:
		system = p.SystemPrompt()
	}
	return en, system, nil
}

// Values of env.system_prompt.
const (
	SystemPromptFull    = "full"
	SystemPromptCompact = "compact"
	SystemPromptNone    = "none"
)

// EnvHTTP is env.name for an environment served over HTTP.
const EnvHTTP = "http"

// fillEnvCombinations refuses what an environment cannot be combined with
// (yet).
func (r *Recipe) fillEnvCombinations() error {
	if !r.Env.On() {
		return nil
	}
	if r.Reward.External() {
		return bad("reward", "an environment gives the episodes' rewards: leave reward unset with env.name set")
	}
	if len(r.Rollout.Servers) > 0 && r.Rollout.Partial == PartialSwitch {
		return bad("rollout.partial", "switch with an environment needs the in-process engine: remote episodes keep one weight version per turn's request")
	}
	return nil
}

// External reports whether the reward comes from an external program.
func (w *RewardSettings) External() bool {
	return w.Kind == RewardHTTP || w.Kind == RewardCommand
}

// fill checks the reward section; a verifier's leaves every other key
// unset, so that existing recipes resolve to the same YAML.
func (w *RewardSettings) fill() error {
	switch w.Kind {
	case "", RewardVerifier:
		if w.URL != "" || w.APIKeyEnv != "" || len(w.Command) > 0 || w.Timeout != 0 || w.Retries != nil ||
			w.Concurrency != 0 || w.Batch != 0 || w.MaxRestarts != nil || w.OnError != "" {
			return bad("reward", "url, api_key_env, command, timeout, retries, concurrency, batch, max_restarts and on_error configure an external reward: set reward.kind to http or command, or leave them unset")
		}
		return nil
	case RewardHTTP:
		if len(w.Command) > 0 || w.MaxRestarts != nil {
			return bad("reward.command", "command and max_restarts are for kind command, not http")
		}
		u, err := url.Parse(w.URL)
		if w.URL == "" {
			return bad("reward.url", "required with kind http (the grader's endpoint, like http://127.0.0.1:8000/reward)")
		}
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return bad("reward.url", "%q: want an http or https URL without credentials (the API key comes from the variable reward.api_key_env names)", w.URL)
		}
		if w.APIKeyEnv != "" && !envName.MatchString(w.APIKeyEnv) {
			return bad("reward.api_key_env", "%q is not an environment variable's name: name the variable holding the key, never the key itself", w.APIKeyEnv)
		}
		orDefault(&w.Concurrency, 4)
	case RewardCommand:
		if w.URL != "" || w.APIKeyEnv != "" {
			return bad("reward.url", "url and api_key_env are for kind http, not command")
		}
		if len(w.Command) == 0 || w.Command[0] == "" {
			return bad("reward.command", "required with kind command: the grader's argv, like [python3, grader.py]")
		}
		orDefault(&w.Concurrency, 1)
		if w.MaxRestarts == nil {
			w.MaxRestarts = new(int)
			*w.MaxRestarts = 3
		}
		if *w.MaxRestarts < 0 {
			return bad("reward.max_restarts", "%d, want >= 0", *w.MaxRestarts)
		}
	default:
		return bad("reward.kind", "unknown %q (want %s, %s or %s)", w.Kind, RewardVerifier, RewardHTTP, RewardCommand)
	}
	orDefault(&w.Timeout, 60)
	if !(w.Timeout > 0) || math.IsInf(w.Timeout, 0) {
		return bad("reward.timeout", "%g, want a finite number of seconds > 0", w.Timeout)
	}
	if w.Retries == nil {
		w.Retries = new(int)
		*w.Retries = 2
	}
	if *w.Retries < 0 || *w.Retries > 100 {
		return bad("reward.retries", "%d, want within [0, 100]", *w.Retries)
	}
	if w.Concurrency < 1 {
		return bad("reward.concurrency", "%d, want >= 1", w.Concurrency)
	}
	orDefault(&w.Batch, 64)
	if w.Batch < 1 {
		return bad("reward.batch", "%d, want >= 1 responses per request", w.Batch)
	}
	orDefault(&w.OnError, "fail")
	if w.OnError != "fail" && w.OnError != "zero" {
		return bad("reward.on_error", "%q, want fail or zero", w.OnError)
	}
	return nil
}

// fillRemote checks and completes the settings of remote rollout
// (rollout.servers set); out is the run directory, home of the default
// weights directory.
func (ro *RolloutSettings) fillRemote(out string) error {
	if ro.Device != "" {
		return bad("rollout.device", "%q places the in-process engine; with rollout.servers the servers decode: leave it unset", ro.Device)
	}
	if ro.Precision != "" {
		return bad("rollout.precision", "%q sets the in-process engine's precision; with rollout.servers every server runs its own: leave it unset", ro.Precision)
	}
	seen := map[string]bool{}
	for i, s := range ro.Servers {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return bad("rollout.servers", "entry %d, %q: want an http or https base URL such as http://10.0.0.5:30000 (no query, fragment or credentials: the API key comes from %s)", i, s, remote.APIKeyEnv)
		}
		s = strings.TrimRight(s, "/")
		if seen[s] {
			return bad("rollout.servers", "%s is listed twice", s)
		}
		seen[s] = true
		ro.Servers[i] = s
	}
	orDefault(&ro.ServerKind, remote.KindKeel)
	if err := remote.CheckKind(ro.ServerKind); err != nil {
		return bad("rollout.server_kind", "%v", err)
	}
	orDefault(&ro.WeightsDir, filepath.Join(out, "rollout-weights"))
	orDefault(&ro.RequestTimeout, 600)
	if !(ro.RequestTimeout > 0) || math.IsInf(ro.RequestTimeout, 0) {
		return bad("rollout.request_timeout", "%g, want a finite number of seconds > 0", ro.RequestTimeout)
	}
	orDefault(&ro.MaxConcurrency, 64)
	if ro.MaxConcurrency < 1 {
		return bad("rollout.max_concurrency", "%d, want >= 1 request per server", ro.MaxConcurrency)
	}
	return nil
}

func (a *Algorithm) correction() Correction {
	return Correction{Mode: a.Correction, Cap: a.CorrectionCap, Low: a.CorrectionLow, High: a.CorrectionHigh}
}

// objective builds the recipe's objective (Objectives' entry with the
// recipe's settings); budget is the generation budget (Dr. GRPO's
// constant).
func (a *Algorithm) objective(budget int) Objective {
	spec, ok := lookupObjective(a.Objective)
	if !ok || a.EpsLow == nil || a.EpsHigh == nil {
		return nil // a recipe that skipped fill: Loop.Init refuses it
	}
	return spec.build(a, budget)
}

// aggregation is the per-response multiplier rule of the objective, for
// the KL and entropy terms: the recipe's, or the objective's own.
func (a *Algorithm) aggregation() string {
	spec, _ := lookupObjective(a.Objective)
	if a.Aggregation != "" && !spec.FixedAggregation {
		return a.Aggregation
	}
	return spec.Aggregation
}

func (r *Recipe) schedule() train.Schedule {
	t := &r.Train
	total := t.Steps * t.MiniBatches
	return train.Schedule{Kind: t.Schedule, PeakLR: t.LR, WarmupSteps: t.Warmup, TotalSteps: total, MinLR: t.MinLR}
}

// AdamW returns the optimiser's hyper-parameters for the training engine.
func (r *Recipe) AdamW() train.AdamWConfig {
	t := &r.Train
	return train.AdamWConfig{Beta1: t.Beta1, Beta2: t.Beta2, Eps: 1e-8, WeightDecay: t.WeightDecay}
}

// YAML returns the resolved recipe (every default filled) as YAML.
func (r *Recipe) YAML() []byte {
	b, _ := yaml.Marshal(r)
	return b
}

// itoa is strconv.Itoa, short for metric names.
func itoa(i int) string { return strconv.Itoa(i) }

// orDefault sets *p to v when it holds its type's zero value (unset in the
// recipe).
func orDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}
