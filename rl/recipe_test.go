package rl

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/keel-rl/keel/sft"
	"github.com/keel-rl/keel/train"
)

// recipeBase is the smallest valid recipe: a model, generated problems and
// no evaluation. Each line is numbered in the strictness tests below.
const recipeBase = "model:\n  path: models/m\ndata:\n  tasks: [linear]\neval:\n  skip: true\n"

func parseRecipeOK(t *testing.T, y string, sets ...string) *Recipe {
	t.Helper()
	r, err := ParseRecipe([]byte(y), sets)
	if err != nil {
		t.Fatalf("ParseRecipe(%q, %q): %v", y, sets, err)
	}
	return r
}

func parseRecipeErr(t *testing.T, y string, sets ...string) error {
	t.Helper()
	r, err := ParseRecipe([]byte(y), sets)
	if err == nil {
		t.Fatalf("ParseRecipe(%q, %q): no error, got %+v", y, sets, r)
	}
	return err
}

func TestQuickstartRecipe(t *testing.T) {
	r := parseRecipeOK(t, string(Quickstart))
	type check struct {
		what      string
		got, want any
	}
	for _, c := range []check{
		{"name", r.Name, "quickstart"},
		{"out", r.Out, "runs/quickstart"},
		{"seed", r.Seed, uint64(1)},
		{"model.path", r.Model.Path, "models/tiny-moe-base"},
		{"data.file", r.Data.File, ""},
		{"data.tasks", r.Data.Tasks, []string{"arithmetic", "countdown", "linear"}},
		{"data.n", r.Data.N, 20000},
		{"data.difficulty", r.Data.Difficulty, "2-4"},
		{"rollout.precision", r.Rollout.Precision, "fp8"},
		{"rollout.temperature", r.Rollout.Temperature, 1.0},
		{"rollout.top_k", r.Rollout.TopK, 0},
		{"rollout.top_p", r.Rollout.TopP, 0.0},
		{"rollout.max_new_tokens", r.Rollout.MaxNewTokens, 200},
		{"rollout.slots", r.Rollout.Slots, 256},
		{"algorithm.objective", r.Algorithm.Objective, MiniRLDefault},
		{"algorithm.advantage", r.Algorithm.Advantage, GroupMeanStd},
		{"algorithm.aggregation", r.Algorithm.Aggregation, ""},
		{"algorithm.is_cap", r.Algorithm.ISCap, 5.0},
		{"algorithm.correction", r.Algorithm.Correction, CorrectionNone},
		{"algorithm.correction_cap", r.Algorithm.CorrectionCap, 2.0},
		{"algorithm.correction_low", r.Algorithm.CorrectionLow, 0.999},
		{"algorithm.correction_high", r.Algorithm.CorrectionHigh, 1.001},
		{"algorithm.replay", r.Algorithm.Replay, ReplayNone},
		{"algorithm.kl_coef", r.Algorithm.KLCoef, 0.0},
		{"algorithm.dynamic_sampling", r.Algorithm.DynamicSampling, false},
		{"algorithm.max_rounds", r.Algorithm.MaxRounds, 3},
		{"algorithm.overlong_buffer", r.Algorithm.OverlongBuffer, 0},
		{"algorithm.overlong_penalty", r.Algorithm.OverlongPenalty, 1.0},
		{"train.steps", r.Train.Steps, 350},
		{"train.prompts_per_step", r.Train.PromptsPerStep, 32},
		{"train.group_size", r.Train.GroupSize, 8},
		{"train.mini_batches", r.Train.MiniBatches, 1},
		{"train.micro_batch_tokens", r.Train.MicroBatchTokens, 4096},
		{"train.lr", r.Train.LR, 1e-4},
		{"train.warmup", r.Train.Warmup, 5},
		{"train.schedule", r.Train.Schedule, train.ScheduleCosine},
		{"train.min_lr", r.Train.MinLR, 1e-5},
		{"train.beta1", r.Train.Beta1, 0.9},
		{"train.beta2", r.Train.Beta2, 0.999},
		{"train.clip_norm", r.Train.ClipNorm, 1.0},
		{"eval.skip", r.Eval.Skip, false},
		{"eval.file", r.Eval.File, "recipes/heldout-d2-4.jsonl"},
		{"eval.k", r.Eval.K, 8},
		{"eval.n", r.Eval.N, 0},
		{"eval.max_new_tokens", r.Eval.MaxNewTokens, 200}, // the rollout's
		{"eval.precision", r.Eval.Precision, "exact"},
		{"log.samples_every", r.Log.SamplesEvery, 10},
		{"log.checkpoint_every", r.Log.CheckpointEvery, 20},
		{"log.keep", r.Log.Keep, 2},
		{"log.tensorboard", r.Log.TensorBoard, true},
		{"guards.max_nonfinite", r.Guards.MaxNonFinite, 3},
		{"guards.action", r.Guards.Action, "warn"},
		{"guards.kl_max", r.Guards.KLMax, 0.0},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.what, c.got, c.want)
		}
	}
	if r.Algorithm.EpsLow == nil || *r.Algorithm.EpsLow != 0.2 {
		t.Errorf("algorithm.eps_low = %v, want 0.2", r.Algorithm.EpsLow)
	}
	if r.Algorithm.EpsHigh == nil || *r.Algorithm.EpsHigh != 0.27 {
		t.Errorf("algorithm.eps_high = %v, want 0.27", r.Algorithm.EpsHigh)
	}
	if got, want := r.Algorithm.objective(r.Rollout.MaxNewTokens), DefaultMiniRL(); got != want {
		t.Errorf("objective = %#v, want the paper's %#v", got, want)
	}
}

func TestRecipeDefaults(t *testing.T) {
	r := parseRecipeOK(t, recipeBase)
	got := fmt.Sprintf("%s %s %d | %d %s | %s %g %d %d | %s %s %d %g %d | %d %d %d %d %d %g %s | %d %d %d %d %s",
		r.Name, r.Out, r.Seed,
		r.Data.N, r.Data.Difficulty,
		r.Rollout.Precision, r.Rollout.Temperature, r.Rollout.MaxNewTokens, r.Rollout.Slots,
		r.Algorithm.Objective, r.Algorithm.Correction, r.Algorithm.MaxRounds, r.Algorithm.OverlongPenalty, r.Eval.K,
		r.Train.Steps, r.Train.PromptsPerStep, r.Train.GroupSize, r.Train.MiniBatches, r.Train.MicroBatchTokens, r.Train.LR, r.Train.Schedule,
		r.Log.SamplesEvery, r.Log.CheckpointEvery, r.Log.Keep, r.Guards.MaxNonFinite, r.Guards.Action)
	want := "rl runs/rl 1 | 20000 1-4 | exact 1 256 256 | minirl none 3 1 0 | 100 32 8 1 4096 1e-05 constant | 10 20 2 3 warn"
	if got != want {
		t.Errorf("defaults\n got %s\nwant %s", got, want)
	}
	// Generation settings are filled only when problems are generated.
	r = parseRecipeOK(t, "model:\n  path: m\ndata:\n  file: d.jsonl\neval:\n  skip: true\n")
	if r.Data.N != 0 || r.Data.Difficulty != "" {
		t.Errorf("data from a file: n %d difficulty %q, want 0 and empty", r.Data.N, r.Data.Difficulty)
	}
	// Explicit values are kept.
	r = parseRecipeOK(t, recipeBase, "name=x", "out=elsewhere", "seed=7", "data.n=50", "data.difficulty=2-3", "rollout.temperature=0.6")
	if r.Name != "x" || r.Out != "elsewhere" || r.Seed != 7 || r.Data.N != 50 || r.Data.Difficulty != "2-3" || r.Rollout.Temperature != 0.6 {
		t.Errorf("explicit values changed: %+v", r)
	}
}

func TestReadRecipe(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "q.yaml")
	if err := os.WriteFile(path, Quickstart, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRecipe(path, []string{"train.steps=3"}); err == nil || !strings.Contains(err.Error(), "train.warmup") {
		t.Fatalf("3 steps under a 5-step warm-up: %v", err)
	}
	r, err := ReadRecipe(path, []string{"train.steps=3", "train.warmup=1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "quickstart" || r.Train.Steps != 3 {
		t.Errorf("ReadRecipe: name %q steps %d, want quickstart 3", r.Name, r.Train.Steps)
	}
	if _, err := ReadRecipe(filepath.Join(dir, "missing.yaml"), nil); err == nil {
		t.Error("ReadRecipe of a missing file: no error")
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(recipeBase+"train:\n  stepz: 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ReadRecipe(bad, nil)
	if err == nil || !strings.HasPrefix(err.Error(), bad+": ") || !strings.Contains(err.Error(), "stepz") {
		t.Errorf("ReadRecipe of a bad recipe: %v, want an error naming the file and stepz", err)
	}
}

func TestRecipeStrict(t *testing.T) {
	t.Run("unknown key", func(t *testing.T) {
		// recipeBase has 6 lines: train is line 7, stepz line 8.
		err := parseRecipeErr(t, recipeBase+"train:\n  stepz: 3\n")
		if msg := err.Error(); !strings.Contains(msg, "stepz") || !strings.Contains(msg, "line 8") {
			t.Errorf("error %q does not name stepz at line 8", msg)
		}
	})
	t.Run("unknown top-level key", func(t *testing.T) {
		err := parseRecipeErr(t, "# a comment\n"+recipeBase+"modle: {}\n")
		if msg := err.Error(); !strings.Contains(msg, "modle") || !strings.Contains(msg, "line 8") {
			t.Errorf("error %q does not name modle at line 8", msg)
		}
	})
	t.Run("wrong type", func(t *testing.T) {
		err := parseRecipeErr(t, recipeBase+"train:\n  steps: many\n")
		if msg := err.Error(); !strings.Contains(msg, "line 8") || !strings.Contains(msg, "many") {
			t.Errorf("error %q does not name line 8 and the value", msg)
		}
	})
	t.Run("wrong type of a section", func(t *testing.T) {
		err := parseRecipeErr(t, recipeBase+"train: 3\n")
		if msg := err.Error(); !strings.Contains(msg, "line 7") {
			t.Errorf("error %q does not name line 7", msg)
		}
	})
	t.Run("line after blank lines", func(t *testing.T) {
		// A recipe as people write it: sections apart. stepz is on line 10.
		y := "model:\n  path: models/m\n\ndata:\n  tasks: [linear]\n\neval:\n  skip: true\n\ntrain:\n  stepz: 3\n"
		err := parseRecipeErr(t, y)
		msg := err.Error()
		if !strings.Contains(msg, "stepz") {
			t.Fatalf("error %q does not name stepz", msg)
		}
		if !strings.Contains(msg, "line 11") {
			t.Errorf("error %q does not name line 11", msg)
		}
	})
	t.Run("unknown key via --set", func(t *testing.T) {
		err := parseRecipeErr(t, recipeBase, "train.bogus=1")
		if msg := err.Error(); !strings.Contains(msg, "bogus") {
			t.Errorf("error %q does not name bogus", msg)
		}
	})
	t.Run("unknown section via --set", func(t *testing.T) {
		err := parseRecipeErr(t, recipeBase, "trian.steps=1")
		if msg := err.Error(); !strings.Contains(msg, "trian") {
			t.Errorf("error %q does not name trian", msg)
		}
	})
	t.Run("wrong type via --set", func(t *testing.T) {
		err := parseRecipeErr(t, recipeBase, "train.steps=many")
		if msg := err.Error(); !strings.Contains(msg, "many") {
			t.Errorf("error %q does not name the value", msg)
		}
	})
	t.Run("not YAML", func(t *testing.T) {
		parseRecipeErr(t, "model: [unclosed\n")
	})
}

func TestRecipeIncompatible(t *testing.T) {
	withEval := "model:\n  path: models/m\ndata:\n  tasks: [linear]\neval:\n  file: e.jsonl\n"
	for _, tc := range []struct {
		name string
		yaml string
		sets []string
		key  string // the key the error starts with; "" for no error
	}{
		{"correction with minirl", recipeBase, []string{"algorithm.correction=token-tis"}, "algorithm.correction"},
		{"correction with minirl-lennorm", recipeBase, []string{"algorithm.objective=minirl-lennorm", "algorithm.correction=seq-tis"}, "algorithm.correction"},
		{"correction with minirl-old-is", recipeBase, []string{"algorithm.objective=minirl-old-is", "algorithm.correction=geo-mask"}, "algorithm.correction"},
		{"correction with no-clip", recipeBase, []string{"algorithm.objective=no-clip", "algorithm.correction=token-mis"}, "algorithm.correction"},
		{"correction with minirl-no-is", recipeBase, []string{"algorithm.objective=minirl-no-is", "algorithm.correction=token-tis"}, ""},
		{"correction with grpo", recipeBase, []string{"algorithm.objective=grpo", "algorithm.correction=geo-mask"}, ""},
		{"correction none with minirl", recipeBase, []string{"algorithm.correction=none"}, ""},
		{"unknown correction", recipeBase, []string{"algorithm.objective=grpo", "algorithm.correction=token-xis"}, "algorithm.correction"},
		{"correction cap negative", recipeBase, []string{"algorithm.objective=grpo", "algorithm.correction=token-tis", "algorithm.correction_cap=-1"}, "algorithm.correction"},
		{"geo-mask low above high", recipeBase, []string{"algorithm.objective=grpo", "algorithm.correction=geo-mask", "algorithm.correction_low=1.1"}, "algorithm.correction"},
		{"mini_batches not dividing", recipeBase, []string{"train.mini_batches=3", "train.prompts_per_step=32"}, "train.mini_batches"},
		{"mini_batches negative", recipeBase, []string{"train.mini_batches=-1"}, "train.mini_batches"},
		{"mini_batches dividing", recipeBase, []string{"train.mini_batches=4", "train.prompts_per_step=32"}, ""},
		{"train.device unknown", recipeBase, []string{"train.device=gpu"}, "train.device"},
		{"train.device cuda:1", recipeBase, []string{"train.device=cuda:1"}, ""},
		{"device unknown", recipeBase, []string{"device=tpu"}, "device"},
		{"bf16 on the CPU", recipeBase, []string{"train.precision=bf16"}, "train"},
		{"recompute on the CPU", recipeBase, []string{"train.recompute=true"}, "train"},
		{"recompute on the GPU", recipeBase, []string{"device=cuda", "rollout.precision=exact", "train.recompute=true"}, ""},
		{"bf16 on the GPU", recipeBase, []string{"train.device=cuda", "train.precision=bf16"}, ""},
		{"rollout.device with fp32", recipeBase, []string{"rollout.device=cuda", "rollout.precision=fp32"}, "rollout.device"},
		{"device cuda sets both", recipeBase, []string{"device=cuda", "rollout.precision=exact"}, ""},
		{"device cuda with fp32 rollout", recipeBase, []string{"device=cuda", "rollout.precision=fp32"}, "rollout.device"},
		{"device cuda with fp4 rollout", recipeBase, []string{"device=cuda", "rollout.precision=fp4"}, ""},
		{"device cuda with fp8 rollout", recipeBase, []string{"device=cuda", "rollout.precision=fp8"}, ""},
		{"aggregation with minirl", recipeBase, []string{"algorithm.aggregation=token-mean"}, "algorithm.aggregation"},
		{"aggregation with minirl-lennorm", recipeBase, []string{"algorithm.objective=minirl-lennorm", "algorithm.aggregation=seq-sum-mean"}, "algorithm.aggregation"},
		{"aggregation with cispo", recipeBase, []string{"algorithm.objective=cispo", "algorithm.aggregation=token-mean"}, "algorithm.aggregation"},
		{"aggregation with gspo", recipeBase, []string{"algorithm.objective=gspo", "algorithm.aggregation=seq-sum-mean"}, "algorithm.aggregation"},
		{"unknown aggregation", recipeBase, []string{"algorithm.objective=grpo", "algorithm.aggregation=sum"}, "algorithm.aggregation"},
		{"unknown aggregation with dapo", recipeBase, []string{"algorithm.objective=dapo", "algorithm.aggregation=token_mean"}, "algorithm.aggregation"},
		{"aggregation with grpo", recipeBase, []string{"algorithm.objective=grpo", "algorithm.aggregation=constant-normalised"}, ""},
		{"unknown objective", recipeBase, []string{"algorithm.objective=reinforce"}, "algorithm.objective"},
		{"unknown advantage", recipeBase, []string{"algorithm.advantage=z-score"}, "algorithm.advantage"},
		{"eps_low 1", recipeBase, []string{"algorithm.eps_low=1"}, "algorithm.eps_low"},
		{"eps_high negative", recipeBase, []string{"algorithm.eps_high=-0.1"}, "algorithm.eps_high"},
		{"is_cap negative", recipeBase, []string{"algorithm.is_cap=-5"}, "algorithm.is_cap"},
		{"unknown replay", recipeBase, []string{"algorithm.replay=r4"}, "algorithm.replay"},
		{"replay r2", recipeBase, []string{"algorithm.replay=r2"}, ""},
		{"kl_coef negative", recipeBase, []string{"algorithm.kl_coef=-1"}, "algorithm.kl_coef"},
		{"overlong_buffer at the budget", recipeBase, []string{"rollout.max_new_tokens=100", "algorithm.overlong_buffer=100"}, "algorithm.overlong_buffer"},
		{"overlong_buffer below the budget", recipeBase, []string{"rollout.max_new_tokens=100", "algorithm.overlong_buffer=99"}, ""},
		{"unknown precision", recipeBase, []string{"rollout.precision=fp6"}, "rollout.precision"},
		{"temperature negative", recipeBase, []string{"rollout.temperature=-1"}, "rollout.temperature"},
		{"temperature infinite", recipeBase, []string{"rollout.temperature=.inf"}, "rollout.temperature"},
		{"top_p above 1", recipeBase, []string{"rollout.top_p=1.5"}, "rollout.top_p"},
		{"gpu_memory above 1", recipeBase, []string{"rollout.gpu_memory=1.5"}, "rollout.gpu_memory"},
		{"gpu_memory below 0", recipeBase, []string{"rollout.gpu_memory=-0.1"}, "rollout.gpu_memory"},
		{"group_size 1", recipeBase, []string{"train.group_size=1"}, "train.group_size"},
		{"steps negative", recipeBase, []string{"train.steps=-2"}, "train.steps"},
		{"missing model.path", "data:\n  tasks: [linear]\neval:\n  skip: true\n", nil, "model.path"},
		{"missing data", "model:\n  path: m\neval:\n  skip: true\n", nil, "data"},
		{"file and tasks", recipeBase, []string{"data.file=d.jsonl"}, "data"},
		{"data.n negative", recipeBase, []string{"data.n=-1"}, "data.n"},
		{"eval without file or skip", "model:\n  path: m\ndata:\n  tasks: [linear]\n", nil, "eval.file"},
		{"eval with file", withEval, nil, ""},
		{"eval unknown precision", withEval, []string{"eval.precision=fp6"}, "eval.precision"},
		{"eval k negative", withEval, []string{"eval.k=-1"}, "eval.k"},
		{"guards action", recipeBase, []string{"guards.action=panic"}, "guards.action"},
		{"guards max_nonfinite negative", recipeBase, []string{"guards.max_nonfinite=-1"}, "guards.max_nonfinite"},
		{"env tools", recipeBase, []string{"env.name=tools"}, ""},
		{"env unknown", recipeBase, []string{"env.name=chess"}, "env.name"},
		{"env settings without a name", recipeBase, []string{"env.max_turns=3"}, "env"},
		{"env http without url", recipeBase, []string{"env.name=http"}, "env.url"},
		{"env http with credentials", recipeBase, []string{"env.name=http", "env.url=http://u:p@h:1/"}, "env.url"},
		{"env http", recipeBase, []string{"env.name=http", "env.url=http://127.0.0.1:9000"}, ""},
		{"env built-in with url", recipeBase, []string{"env.name=guess", "env.url=http://127.0.0.1:9000"}, "env.url"},
		{"env max_turns 0 is the default", recipeBase, []string{"env.name=guess", "env.max_turns=0"}, ""},
		{"env max_turns negative", recipeBase, []string{"env.name=guess", "env.max_turns=-1"}, "env.max_turns"},
		{"env max_tokens negative", recipeBase, []string{"env.name=guess", "env.max_tokens=-1"}, "env.max_tokens"},
		{"env system_prompt unknown", recipeBase, []string{"env.name=tools", "env.system_prompt=short"}, "env.system_prompt"},
		{"env with an external reward", recipeBase, []string{"env.name=tools", "reward.kind=http", "reward.url=http://127.0.0.1:1/r"}, "reward"},
		{"env with servers", recipeBase, []string{"env.name=tools", "rollout.servers=[http://127.0.0.1:1]", "rollout.precision="}, ""},
		{"env overlong_buffer within the episode", recipeBase, []string{"env.name=tools", "rollout.max_new_tokens=100", "env.max_tokens=400", "algorithm.overlong_buffer=300"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRecipe([]byte(tc.yaml), tc.sets)
			if tc.key == "" {
				if err != nil {
					t.Fatalf("want no error, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %s (recipe %+v)", tc.key, r)
			}
			if !strings.HasPrefix(err.Error(), tc.key+": ") {
				t.Errorf("error %q does not start with %q", err, tc.key+": ")
			}
		})
	}
}

func TestRecipeOverrides(t *testing.T) {
	t.Run("fields change", func(t *testing.T) {
		r := parseRecipeOK(t, string(Quickstart), "train.steps=7", "algorithm.replay=r3", "data.tasks=[linear]")
		if r.Train.Steps != 7 || r.Algorithm.Replay != ReplayR3 || !slices.Equal(r.Data.Tasks, []string{"linear"}) {
			t.Errorf("steps %d replay %q tasks %q, want 7 r3 [linear]", r.Train.Steps, r.Algorithm.Replay, r.Data.Tasks)
		}
		// Everything else is the quickstart's.
		q := parseRecipeOK(t, string(Quickstart))
		q.Train.Steps, q.Algorithm.Replay, q.Data.Tasks = 7, ReplayR3, []string{"linear"}
		if !reflect.DeepEqual(r, q) {
			t.Errorf("overrides changed more than their keys:\n%s\nwant\n%s", r.YAML(), q.YAML())
		}
	})
	t.Run("missing section created", func(t *testing.T) {
		if strings.Contains(string(Quickstart), "guards:") {
			t.Fatal("the quickstart has a guards section: this test needs one without")
		}
		r := parseRecipeOK(t, string(Quickstart), "guards.kl_max=0.5")
		if r.Guards.KLMax != 0.5 || r.Guards.Action != "warn" {
			t.Errorf("guards %+v, want kl_max 0.5 and the default action", r.Guards)
		}
		r = parseRecipeOK(t, "eval: {skip: true}\n", "model.path=m", "data.tasks=[a, b]", "train.steps=4")
		if r.Model.Path != "m" || !slices.Equal(r.Data.Tasks, []string{"a", "b"}) || r.Train.Steps != 4 {
			t.Errorf("model %q tasks %q steps %d, want m [a b] 4", r.Model.Path, r.Data.Tasks, r.Train.Steps)
		}
	})
	t.Run("empty recipe", func(t *testing.T) {
		r := parseRecipeOK(t, "", "model.path=m", "data.file=d.jsonl", "eval.skip=true")
		if r.Model.Path != "m" || r.Data.File != "d.jsonl" || !r.Eval.Skip {
			t.Errorf("got %+v", r)
		}
	})
	t.Run("null section replaced", func(t *testing.T) {
		r := parseRecipeOK(t, recipeBase+"guards:\n", "guards.is_max=3")
		if r.Guards.ISMax != 3 {
			t.Errorf("guards.is_max = %g, want 3", r.Guards.ISMax)
		}
	})
	t.Run("last wins", func(t *testing.T) {
		r := parseRecipeOK(t, recipeBase, "train.steps=7", "train.steps=9")
		if r.Train.Steps != 9 {
			t.Errorf("train.steps = %d, want 9", r.Train.Steps)
		}
	})
	t.Run("value with =", func(t *testing.T) {
		r := parseRecipeOK(t, recipeBase, "name=a=b")
		if r.Name != "a=b" || r.Out != "runs/a=b" {
			t.Errorf("name %q out %q, want a=b runs/a=b", r.Name, r.Out)
		}
	})
	t.Run("typed values", func(t *testing.T) {
		r := parseRecipeOK(t, recipeBase, "algorithm.objective=grpo", "algorithm.eps_high=0.3", "log.tensorboard=true", "train.lr=2e-5")
		if *r.Algorithm.EpsHigh != 0.3 || !r.Log.TensorBoard || r.Train.LR != 2e-5 {
			t.Errorf("eps_high %g tensorboard %v lr %g", *r.Algorithm.EpsHigh, r.Log.TensorBoard, r.Train.LR)
		}
	})
	t.Run("missing =", func(t *testing.T) {
		err := parseRecipeErr(t, recipeBase, "train.steps")
		if !strings.Contains(err.Error(), "train.steps") {
			t.Errorf("error %q does not name the override", err)
		}
		parseRecipeErr(t, recipeBase, "=3")
	})
	t.Run("through a scalar", func(t *testing.T) {
		parseRecipeErr(t, "name: run\n"+recipeBase, "name.x=1")
		parseRecipeErr(t, recipeBase, "train.steps.x=1")
		parseRecipeErr(t, recipeBase, "data.tasks.x=1")
	})
	t.Run("bad value", func(t *testing.T) {
		parseRecipeErr(t, recipeBase, "data.tasks=[linear")
	})
	t.Run("top level not a mapping", func(t *testing.T) {
		parseRecipeErr(t, "- a\n- b\n", "train.steps=1")
	})
}

func TestRecipeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		sets []string
	}{
		{"quickstart", string(Quickstart), nil},
		{"quickstart overridden", string(Quickstart), []string{"algorithm.objective=minirl-no-is", "algorithm.correction=geo-mask", "algorithm.replay=r2", "guards.kl_max=0.5", "guards.action=stop"}},
		{"grpo eps_high 0", recipeBase, []string{"algorithm.objective=grpo", "algorithm.eps_high=0", "algorithm.aggregation=token-mean", "train.schedule=cosine", "train.min_lr=1e-6"}},
		{"dapo", recipeBase, []string{"algorithm.objective=dapo", "algorithm.dynamic_sampling=true", "algorithm.overlong_buffer=32", "rollout.top_p=0.9", "rollout.top_k=20", "seed=12345678901234"}},
		{"file data", "model:\n  path: m\ndata:\n  file: d.jsonl\neval:\n  file: e.jsonl\n  every: 5\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := parseRecipeOK(t, tc.yaml, tc.sets...)
			y := r.YAML()
			r2, err := ParseRecipe(y, nil)
			if err != nil {
				t.Fatalf("the resolved recipe does not parse: %v\n%s", err, y)
			}
			if !reflect.DeepEqual(r, r2) {
				t.Errorf("round trip differs:\n%#v\n%#v\n%s", r, r2, y)
			}
			if y2 := r2.YAML(); string(y2) != string(y) {
				t.Errorf("YAML() is not a fixed point:\n%s\nthen\n%s", y, y2)
			}
		})
	}
}

func TestRecipeObjectiveDefaults(t *testing.T) {
	for _, tc := range []struct {
		objective string
		low, high float64
		advantage string
	}{
		{MiniRLDefault, 0.2, 0.27, GroupMean},
		{MiniRLNoIS, 0.2, 0.27, GroupMean},
		{MiniRLLenNorm, 0.2, 0.27, GroupMean},
		{MiniRLOldIS, 0.2, 0.27, GroupMean},
		{MiniRLNoClip, 0.2, 0.27, GroupMean},
		{ObjGRPO, 0.2, 0.2, GroupMeanStd},
		{ObjDrGRPO, 0.2, 0.2, GroupMean},
		{ObjDAPO, 0.2, 0.28, GroupMeanStd},
		{ObjCISPO, 0.2, 0.28, GroupMeanStd},
		{ObjGSPO, 3e-4, 4e-4, GroupMeanStd},
		{ObjGSPOToken, 3e-4, 4e-4, GroupMeanStd},
		{ObjPPO, 0.2, 0.2, GroupMean},
	} {
		r := parseRecipeOK(t, recipeBase, "algorithm.objective="+tc.objective)
		a := r.Algorithm
		if *a.EpsLow != tc.low || *a.EpsHigh != tc.high || a.Advantage != tc.advantage {
			t.Errorf("%s: eps %g/%g advantage %s, want %g/%g %s", tc.objective, *a.EpsLow, *a.EpsHigh, a.Advantage, tc.low, tc.high, tc.advantage)
		}
	}
	// Explicit values are kept, zero included (eps_* are pointers).
	for _, obj := range []string{ObjGRPO, MiniRLDefault, ObjGSPO} {
		r := parseRecipeOK(t, recipeBase+"algorithm:\n  objective: "+obj+"\n  eps_high: 0\n  eps_low: 0.1\n  advantage: rloo\n")
		a := r.Algorithm
		if *a.EpsHigh != 0 || *a.EpsLow != 0.1 || a.Advantage != RLOO {
			t.Errorf("%s: explicit eps_high 0, eps_low 0.1, rloo became %g, %g, %s", obj, *a.EpsHigh, *a.EpsLow, a.Advantage)
		}
		if got := objectiveEps(a.objective(100)); got != [2]float64{0.1, 0} {
			t.Errorf("%s: objective eps %v, want [0.1 0]", obj, got)
		}
	}
	// Two recipes never share the default's storage.
	r1 := parseRecipeOK(t, recipeBase)
	r2 := parseRecipeOK(t, recipeBase)
	*r1.Algorithm.EpsHigh = 0.5
	if *r2.Algorithm.EpsHigh != 0.27 {
		t.Errorf("recipes share eps_high storage: %g", *r2.Algorithm.EpsHigh)
	}
}

// objectiveEps returns an objective's clip range.
func objectiveEps(o Objective) [2]float64 {
	switch o := o.(type) {
	case MiniRL:
		return [2]float64{o.EpsLow, o.EpsHigh}
	case PPOClip:
		return [2]float64{o.EpsLow, o.EpsHigh}
	case CISPO:
		return [2]float64{o.EpsLow, o.EpsHigh}
	}
	return [2]float64{-1, -1}
}

func TestRecipeObjectiveBuilder(t *testing.T) {
	const budget = 256
	build := func(sets ...string) *Algorithm {
		t.Helper()
		r := parseRecipeOK(t, recipeBase, sets...)
		return &r.Algorithm
	}
	for _, v := range []string{MiniRLDefault, MiniRLNoIS, MiniRLLenNorm, MiniRLOldIS, MiniRLNoClip} {
		a := build("algorithm.objective="+v, "algorithm.is_cap=3")
		want := MiniRL{Variant: v, EpsLow: 0.2, EpsHigh: 0.27, ISCap: 3}
		if got := a.objective(budget); got != want {
			t.Errorf("%s: objective %#v, want %#v", v, got, want)
		}
	}
	for _, tc := range []struct {
		sets []string
		want Objective
	}{
		{[]string{"algorithm.objective=cispo"}, CISPO{EpsLow: 0.2, EpsHigh: 0.28}},
		{[]string{"algorithm.objective=cispo", "algorithm.eps_high=2"}, CISPO{EpsLow: 0.2, EpsHigh: 2}},
		{[]string{"algorithm.objective=gspo"}, PPOClip{EpsLow: 3e-4, EpsHigh: 4e-4, Aggregation: SeqSumMean, Sequence: true}},
		{[]string{"algorithm.objective=gspo-token"}, PPOClip{EpsLow: 3e-4, EpsHigh: 4e-4, Aggregation: SeqSumMean, Sequence: true}},
		{[]string{"algorithm.objective=grpo"}, GRPO()},
		{[]string{"algorithm.objective=dr-grpo"}, DrGRPO(budget)},
		{[]string{"algorithm.objective=dapo"}, DAPO()},
		{[]string{"algorithm.objective=ppo"}, PPO()},
		{[]string{"algorithm.objective=dapo", "algorithm.eps_high=0.3"}, PPOClip{EpsLow: 0.2, EpsHigh: 0.3, Aggregation: TokenMean}},
		{[]string{"algorithm.objective=grpo", "algorithm.aggregation=token-mean"}, PPOClip{EpsLow: 0.2, EpsHigh: 0.2, Aggregation: TokenMean}},
		{[]string{"algorithm.objective=grpo", "algorithm.aggregation=constant-normalised"}, PPOClip{EpsLow: 0.2, EpsHigh: 0.2, Aggregation: ConstantNorm, Budget: budget}},
	} {
		if got := build(tc.sets...).objective(budget); got != tc.want {
			t.Errorf("%q: objective %#v, want %#v", tc.sets, got, tc.want)
		}
	}
	if p, ok := build("algorithm.objective=gspo").objective(budget).(PPOClip); !ok || !p.Sequence {
		t.Errorf("gspo: objective %#v, want a sequence-level PPOClip", p)
	}

	for _, tc := range []struct {
		sets []string
		want string
	}{
		{[]string{"algorithm.objective=minirl"}, SeqSumMean},
		{[]string{"algorithm.objective=minirl-no-is"}, SeqSumMean},
		{[]string{"algorithm.objective=minirl-old-is"}, SeqSumMean},
		{[]string{"algorithm.objective=no-clip"}, SeqSumMean},
		{[]string{"algorithm.objective=minirl-lennorm"}, SeqMeanTokenMean},
		{[]string{"algorithm.objective=grpo"}, SeqMeanTokenMean},
		{[]string{"algorithm.objective=dr-grpo"}, ConstantNorm},
		{[]string{"algorithm.objective=dapo"}, TokenMean},
		{[]string{"algorithm.objective=ppo"}, TokenMean},
		{[]string{"algorithm.objective=cispo"}, TokenMean},
		{[]string{"algorithm.objective=gspo"}, SeqSumMean},
		{[]string{"algorithm.objective=grpo", "algorithm.aggregation=token-mean"}, TokenMean},
		{[]string{"algorithm.objective=dapo", "algorithm.aggregation=seq-sum-mean"}, SeqSumMean},
	} {
		if got := build(tc.sets...).aggregation(); got != tc.want {
			t.Errorf("%q: aggregation %q, want %q", tc.sets, got, tc.want)
		}
	}
}

// Every recipe shipped under recipes/paper parses: RL recipes, and the
// supervised ones of the *-sft directories.
func TestPaperRecipesParse(t *testing.T) {
	files, err := filepath.Glob("../recipes/paper/*/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no recipes under recipes/paper (%v)", err)
	}
	for _, f := range files {
		if strings.HasSuffix(filepath.Dir(f), "-sft") {
			if _, err := sft.ReadRecipe(f); err != nil {
				t.Error(err)
			}
			continue
		}
		if _, err := ReadRecipe(f, nil); err != nil {
			t.Error(err)
		}
	}
}

// The multi-turn recipes of recipes/tools parse (the cold start's with
// keel sft's parser).
func TestToolRecipesParse(t *testing.T) {
	files, err := filepath.Glob("../recipes/tools/*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("recipes/tools: %d recipes (%v)", len(files), err)
	}
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), "sft-") {
			if _, err := sft.ReadRecipe(f); err != nil {
				t.Error(err)
			}
			continue
		}
		if _, err := ReadRecipe(f, nil); err != nil {
			t.Error(err)
		}
	}
}

// TestRecipeDevice: device puts both engines on one device unless a
// section names its own; remote rollout keeps no rollout device.
func TestRecipeDevice(t *testing.T) {
	r := parseRecipeOK(t, recipeBase, "device=cuda")
	if r.Train.Device != "cuda" || r.Rollout.Device != "cuda" {
		t.Errorf("device=cuda gave train.device %q, rollout.device %q", r.Train.Device, r.Rollout.Device)
	}
	r = parseRecipeOK(t, recipeBase, "device=cuda:1", "train.device=cpu")
	if r.Train.Device != "cpu" || r.Rollout.Device != "cuda:1" {
		t.Errorf("device=cuda:1 with train.device=cpu gave %q, %q", r.Train.Device, r.Rollout.Device)
	}
	r = parseRecipeOK(t, recipeBase, "device=cuda", "rollout.servers=[http://127.0.0.1:1]", "rollout.weights_dir=/tmp/w")
	if r.Train.Device != "cuda" || r.Rollout.Device != "" {
		t.Errorf("device=cuda with servers gave %q, %q", r.Train.Device, r.Rollout.Device)
	}
}
