package remote

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/serve"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
)

// Partial rollouts on a real keel serve (exact precision): weights pushed
// in place while the requests run; the sequences in flight continue on
// them, and every token's log mu is that of the weights its answer says
// sampled it, given the whole sequence, bit for bit. Whether the switch
// lands while sequences are in flight depends on timing (a loaded machine
// can starve the client's poll until the generation ends), so a run
// without one is tried again, up to five times; the bits are checked on
// every run.
func TestGenerateSwitchingInPlace(t *testing.T) {
	cfg := model.Config{
		Architecture: model.ArchQwen3MoE, VocabSize: 128, HiddenSize: 32, IntermediateSize: 40,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 8,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 256,
		NumExperts: 6, NumExpertsPerTok: 2, MoeIntermediateSize: 24, NormTopKProb: true, DecoderSparseStep: 1,
	}
	m1, m2 := testmodel.Random(cfg, 1), testmodel.Random(cfg, 2)
	r := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]int32, 8)
	for i := range prompts {
		for range 5 {
			prompts[i] = append(prompts[i], int32(5+r.IntN(90)))
		}
	}
	e1, e2 := train.New(m1), train.New(m2)
	var url string
	for attempt := 1; ; attempt++ {
		var switched int
		url, switched = switchingRun(t, cfg, m1, m2, e1, e2, prompts)
		if switched > 0 {
			break
		}
		if attempt == 5 {
			t.Fatalf("no sample was switched in flight in %d runs", attempt)
		}
		t.Logf("run %d: no sample was switched in flight; again", attempt)
	}
	// Without in-place pushes the client refuses to switch, and other
	// kinds of servers cannot push in place.
	if _, err := New(Options{Servers: []string{url}, Kind: KindSGLang, Config: cfg, InPlace: true}); err == nil {
		t.Fatal("in-place pushes accepted for kind sglang")
	}
}

// switchingRun serves m1 on a fresh keel serve, generates 8 samples of
// each prompt with a push of m2 offered once 50 tokens are sampled, checks
// every token's log mu against the training engine of the weights that
// sampled it (e1, e2), and returns the server's address and the number of
// samples switched in flight.
func switchingRun(t *testing.T, cfg model.Config, m1, m2 *model.Model, e1, e2 *train.Engine, prompts [][]int32) (string, int) {
	t.Helper()
	eng, err := rollout.New(m1, rollout.Options{Precision: rollout.Exact, Slots: 8, MaxLen: 256})
	if err != nil {
		t.Fatal(err)
	}
	sched := rollout.NewScheduler(eng)
	srv := serve.New(sched, tokenizer.NewChar(), cfg, 256, serve.Options{})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close(); eng.Close() })

	c, err := New(Options{Servers: []string{ts.URL}, Kind: KindKeel, WeightsDir: t.TempDir(), Config: cfg, MaxLen: 256, InPlace: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.UpdateWeights(context.Background(), m1, 0); err != nil {
		t.Fatal(err)
	}
	// The switch comes once the server has sampled some tokens: 64
	// sequences of up to 240 tokens in 8 slots, several waves of them.
	calls, loaded, offered := 0, false, false
	next := func() *rollout.Switch {
		calls++
		if offered || sched.Stats().SampledTokens < 50 {
			return nil
		}
		offered = true
		return &rollout.Switch{Model: m2, Version: 1, Release: func(ok bool) { loaded = ok }}
	}
	out, err := c.GenerateSwitching(prompts, 8, rollout.Sampling{Temperature: 1, MaxNewTokens: 240, Seed: 3}, next)
	if err != nil {
		t.Fatal(err)
	}
	if offered && (!loaded || c.Version() != 1) {
		t.Fatalf("the switch was not loaded (version %d)", c.Version())
	}
	switched := 0
	for i, s := range out {
		seq := append(slices.Clone(prompts[s.Prompt]), s.Tokens...)
		r1, _ := e1.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true})
		r2, _ := e2.Forward([][]int32{seq}, train.ForwardOptions{NoEntropy: true})
		if s.TokenVersions != nil {
			switched++
		}
		for j := range s.Tokens {
			v := s.Version
			if s.TokenVersions != nil {
				v = s.TokenVersions[j]
			}
			want := r1.LogProbs[0][len(prompts[s.Prompt])-1+j]
			if v == 1 {
				want = r2.LogProbs[0][len(prompts[s.Prompt])-1+j]
			}
			if math.Float32bits(s.LogProbs[j]) != math.Float32bits(want) {
				t.Fatalf("sample %d token %d (version %d): log mu %g, the training engine %g", i, j, v, s.LogProbs[j], want)
			}
		}
	}
	if switched == 0 {
		t.Logf("%d polls, %v offered", calls, offered)
	}
	return ts.URL, switched
}
