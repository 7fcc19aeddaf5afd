package rollout

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// Weights switched in the middle of a generation (exact precision): every
// token sampled before the switch has the old weights' log-probability
// of the whole sequence, every token after it the new weights', bit for
// bit, as if the sequence so far had been fed to the new weights; the
// samples say which version sampled each token; and the routes of every
// position are the new weights'. Prompts are shared by several samples
// and prefilled in chunks, and there are fewer slots than sequences, so
// the switch finds sequences decoding, prefilling and waiting.
func TestGenerateSwitching(t *testing.T) {
	for _, cfg := range []model.Config{denseConfig(), moeConfig()} {
		old, neu := randomModel(cfg, 3), randomModel(cfg, 4)
		e, err := New(old, Options{Precision: Exact, Slots: 5, MaxLen: 64, StepRows: 8})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.UpdateWeights(t.Context(), old, 7); err != nil {
			t.Fatal(err)
		}
		prompts := testPrompts(rand.New(rand.NewPCG(1, 1)), cfg.VocabSize, 5, 1, 12, 7)
		calls, released := 0, false
		next := func() *Switch {
			calls++
			if calls != 4 {
				return nil
			}
			return &Switch{Model: neu, Version: 8, Release: func(loaded bool) { released = loaded }}
		}
		sp := Sampling{Temperature: 1, MaxNewTokens: 12, Seed: 9}
		samples, err := e.GenerateSwitching(prompts, 3, sp, next)
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !released {
			t.Fatal("the switch's weights were never released as loaded")
		}
		oldEng, newEng := train.New(old), train.New(neu)
		mixed, newOnly := 0, 0
		for i, s := range samples {
			seq := append(slices.Clone(prompts[s.Prompt]), s.Tokens...)
			pl := len(prompts[s.Prompt])
			ro, err := oldEng.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true})
			if err != nil {
				t.Fatal(err)
			}
			rn, err := newEng.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true, Record: true})
			if err != nil {
				t.Fatal(err)
			}
			vers := s.TokenVersions
			if vers == nil {
				vers = make([]int64, len(s.Tokens))
				for j := range vers {
					vers[j] = s.Version
				}
			} else {
				mixed++
			}
			if vers[0] != s.Version || len(vers) != len(s.Tokens) {
				t.Fatalf("sample %d: Version %d, token versions %v", i, s.Version, vers)
			}
			for j, v := range vers {
				want := ro.LogProbs[0][pl-1+j]
				if v == 8 {
					want = rn.LogProbs[0][pl-1+j]
				} else if v != 7 {
					t.Fatalf("sample %d token %d: version %d, want 7 or 8", i, j, v)
				}
				if j > 0 && v < vers[j-1] {
					t.Fatalf("sample %d: versions go back: %v", i, vers)
				}
				if math.Float32bits(s.LogProbs[j]) != math.Float32bits(want) {
					t.Fatalf("sample %d token %d (version %d): log mu %v, the training engine's %v", i, j, v, s.LogProbs[j], want)
				}
			}
			if vers[0] == 8 {
				newOnly++
			}
			if s.Routes != nil && vers[len(vers)-1] == 8 {
				// Every position but the last was computed again by the new weights.
				for p := 0; p < s.Routes.Tokens-1; p++ {
					for l := 0; l < s.Routes.Layers; l++ {
						for k := 0; k < s.Routes.K; k++ {
							if s.Routes.At(p, l, k) != rn.Routes[0].At(p, l, k) {
								t.Fatalf("sample %d: position %d layer %d: route %d, the new weights' %d", i, p, l, s.Routes.At(p, l, k), rn.Routes[0].At(p, l, k))
							}
						}
					}
				}
			}
		}
		if mixed == 0 || newOnly == 0 {
			t.Fatalf("%s: %d samples switched mid-way and %d started on the new weights: the test exercises neither", cfg.Architecture, mixed, newOnly)
		}
	}
}
