package rollout

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/keel-rl/keel/internal/sysmem"
	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/kernels"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// randomModel is a model with unit-scale activations (larger weights
// than model.Init's), so that routing and sampling are far from uniform.
func randomModel(c model.Config, seed uint64) *model.Model { return testmodel.Random(c, seed) }

func denseConfig() model.Config {
	return model.Config{
		Architecture: model.ArchQwen3, VocabSize: 37, HiddenSize: 32, IntermediateSize: 48,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 16,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 256,
	}
}

func moeConfig() model.Config {
	return model.Config{
		Architecture: model.ArchQwen3MoE, VocabSize: 41, HiddenSize: 32, IntermediateSize: 40,
		NumHiddenLayers: 3, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 8,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 256,
		NumExperts: 6, NumExpertsPerTok: 2, MoeIntermediateSize: 24, NormTopKProb: true,
		DecoderSparseStep: 1, MlpOnlyLayers: []int{1}, TieWordEmbeddings: true,
	}
}

// headDim and kvHeads return c with another head size or number of key
// and value heads.
func headDim(c model.Config, d int) model.Config { c.HeadDim = d; return c }

func kvHeads(c model.Config, n int) model.Config { c.NumKeyValueHeads = n; return c }

func testPrompts(r *rand.Rand, vocab int, lens ...int) [][]int32 {
	out := make([][]int32, len(lens))
	for i, n := range lens {
		out[i] = make([]int32, n)
		for j := range out[i] {
			out[i][j] = int32(r.IntN(vocab))
		}
	}
	return out
}

// TestExactMatchesTraining is the exact mode's contract: for every sampled
// token, log mu is the training engine's log pi on the same sequence, bit
// for bit, and the routes are identical at every position — with
// continuous batching (fewer slots than sequences) and chunked prefill,
// for dense and MoE models with tied and untied heads, and whatever the
// sampler (log mu is the full softmax at temperature 1; greedy decoding
// reports that distribution too).
func TestExactMatchesTraining(t *testing.T) {
	untie := func(c model.Config, tie bool) model.Config { c.TieWordEmbeddings = tie; return c }
	for _, tc := range []struct {
		name string
		cfg  model.Config
	}{
		{"dense", denseConfig()}, {"dense-tied", untie(denseConfig(), true)},
		{"moe-tied", moeConfig()}, {"moe", untie(moeConfig(), false)},
		{"moe-hd32", headDim(moeConfig(), 32)}, // AttendRow2's fast path
		{"dense-1kv", kvHeads(headDim(denseConfig(), 32), 1)},
	} {
		for _, sp := range []Sampling{
			{Temperature: 1, Stop: []int32{3}},
			{Temperature: 1, TopK: 4, TopP: 0.8},
			{Temperature: 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				sp.MaxNewTokens, sp.Seed = 20, 5
				exactCheck(t, tc.cfg, sp)
			})
		}
	}
}

// forwardPaths are the ways a step's rows can be scheduled: fused (each
// chunk of rows through a whole layer up to its experts) with chunks of
// one slot or of a few tiles, and operation by operation. A test that
// runs under each checks both paths whatever GOMAXPROCS is.
var forwardPaths = []struct {
	name            string
	fuse, blockUnit int
}{{"fused-1", 1, 1}, {"fused-28", 1, 0}, {"unfused", -1, 0}, {"auto", 0, 0}}

func exactCheck(t *testing.T, cfg model.Config, sp Sampling) {
	for _, path := range forwardPaths {
		t.Run(path.name, func(t *testing.T) { exactCheckPath(t, cfg, sp, path.fuse, path.blockUnit) })
	}
}

func exactCheckPath(t *testing.T, cfg model.Config, sp Sampling, fuse, blockUnit int) {
	m := randomModel(cfg, 3)
	e, err := New(m, Options{Precision: Exact, Slots: 3, MaxLen: 64, StepRows: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cpuOf(e).fuse, cpuOf(e).blockUnit = fuse, blockUnit
	prompts := testPrompts(rand.New(rand.NewPCG(1, 1)), cfg.VocabSize, 5, 1, 12, 7)
	samples, err := e.Generate(prompts, 2, sp)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 8 {
		t.Fatalf("%d samples, want 8", len(samples))
	}
	var seqs [][]int32
	for _, s := range samples {
		seqs = append(seqs, append(slices.Clone(prompts[s.Prompt]), s.Tokens...))
	}
	res, err := train.New(m).Forward(seqs, train.ForwardOptions{Record: true, NoEntropy: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range samples {
		pl := len(prompts[s.Prompt])
		if len(s.LogProbs) != len(s.Tokens) || len(s.Tokens) == 0 {
			t.Fatalf("sample %d: %d tokens, %d log-probs", i, len(s.Tokens), len(s.LogProbs))
		}
		for j, lp := range s.LogProbs {
			if want := res.LogProbs[i][pl-1+j]; math.Float32bits(lp) != math.Float32bits(want) {
				t.Fatalf("sample %d token %d: log mu %v, training engine %v", i, j, lp, want)
			}
		}
		if s.Routes == nil {
			if cfg.NumExperts > 0 {
				t.Fatalf("sample %d: no routes", i)
			}
			continue
		}
		if err := s.Routes.Check(); err != nil {
			t.Fatal(err)
		}
		want := res.Routes[i]
		if s.Routes.Tokens != len(seqs[i]) || s.Routes.Layers != want.Layers {
			t.Fatalf("sample %d: routes shape [%d, %d], want [%d, %d]", i, s.Routes.Tokens, s.Routes.Layers, len(seqs[i]), want.Layers)
		}
		if !s.Routes.Equal(want) {
			t.Fatalf("sample %d: routes differ from the training engine's", i)
		}
	}
}

// generate runs Generate on a fresh engine (set up further by tweak, when
// not nil) and closes it.
func generate(t *testing.T, m *model.Model, opt Options, tweak func(*Engine), prompts [][]int32, n int, sp Sampling) []Sample {
	t.Helper()
	e, err := New(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if tweak != nil {
		tweak(e)
	}
	got, err := e.Generate(prompts, n, sp)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func sameSamples(t *testing.T, a, b []Sample) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d vs %d samples", len(a), len(b))
	}
	for i := range a {
		if a[i].Prompt != b[i].Prompt || a[i].Index != b[i].Index || len(a[i].Tokens) != len(b[i].Tokens) {
			t.Fatalf("sample %d differs: %+v vs %+v", i, a[i], b[i])
		}
		for j := range a[i].Tokens {
			if a[i].Tokens[j] != b[i].Tokens[j] || math.Float32bits(a[i].LogProbs[j]) != math.Float32bits(b[i].LogProbs[j]) {
				t.Fatalf("sample %d token %d differs", i, j)
			}
		}
		if (a[i].Routes == nil) != (b[i].Routes == nil) {
			t.Fatalf("sample %d: routes on one side only", i)
		}
		if a[i].Routes != nil && !a[i].Routes.Equal(b[i].Routes) {
			t.Fatalf("sample %d: routes differ", i)
		}
	}
}

// Samples depend on the seed alone, not on the slot count, the step size
// or the order sequences share batches, in every precision.
func TestReproducibleAcrossSlots(t *testing.T) {
	// head_dim 8 (MoE) runs the portable bf16 attention, 16 (dense) the
	// assembly where there is some.
	for _, cfg := range []model.Config{moeConfig(), denseConfig()} {
		m := randomModel(cfg, 4)
		prompts := testPrompts(rand.New(rand.NewPCG(2, 2)), cfg.VocabSize, 3, 9, 4)
		sp := Sampling{Temperature: 0.9, TopP: 0.95, MaxNewTokens: 12, Seed: 11}
		for _, p := range []Precision{Exact, FP32, BF16, FP8, FP4} {
			var ref []Sample
			for _, opt := range []Options{{Slots: 1, MaxLen: 32}, {Slots: 4, MaxLen: 32, StepRows: 4}, {Slots: 6, MaxLen: 32}} {
				opt.Precision = p
				got := generate(t, m, opt, nil, prompts, 3, sp)
				if ref == nil {
					ref = got
					continue
				}
				sameSamples(t, ref, got)
			}
		}
	}
}

// An engine runs Generate after Generate from clean state (its slots are
// reused): the same call gives the same samples, also after a different
// one, and a call allocates little beyond its outputs.
func TestGenerateReusesState(t *testing.T) {
	cfg := moeConfig()
	cfg.MaxPositionEmbeddings = 2000
	m := randomModel(cfg, 7)
	e, err := New(m, Options{Slots: 3, MaxLen: 2000})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompts := testPrompts(rand.New(rand.NewPCG(7, 7)), 41, 4, 8)
	sp := Sampling{Temperature: 1, MaxNewTokens: 30, Seed: 9}
	a, _ := e.Generate(prompts, 2, sp)
	if _, err := e.Generate(prompts[1:], 3, Sampling{Temperature: 0.5, TopK: 3, MaxNewTokens: 40, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	b, _ := e.Generate(prompts, 2, sp)
	sameSamples(t, a, b)
	if raceEnabled {
		return // the race detector allocates on its own
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	e.Generate(prompts, 2, sp)
	runtime.ReadMemStats(&after)
	// Outputs: 4 samples of at most 38 positions of tokens, log-probs and
	// 2×2 route bytes, a few kilobytes; the slots' buffers (2,000
	// positions of 16 bytes per slot) would be 96 KB.
	if got := after.TotalAlloc - before.TotalAlloc; got > 48<<10 {
		t.Errorf("a Generate call allocated %d bytes", got)
	}
}

// The samples of a prompt share its keys and values: the first sample
// computes the prompt, the others only its last row, whether they are
// admitted with it (and wait for it) or later; with one slot nothing can
// be shared. The samples are the same either way (bit for bit, as
// TestReproducibleAcrossSlots and TestExactMatchesTraining check).
func TestPromptSharing(t *testing.T) {
	m := randomModel(moeConfig(), 4)
	prompts := testPrompts(rand.New(rand.NewPCG(5, 5)), 41, 12, 5)
	sp := Sampling{Temperature: 1, MaxNewTokens: 4, Seed: 2}
	for _, c := range []struct {
		opt  Options
		want int
	}{
		{Options{Slots: 6, StepRows: 8, MaxLen: 32}, 12 + 5 + 2*(1+1)}, // owner's prefill spans two steps
		{Options{Slots: 1, MaxLen: 32}, 3 * (12 + 5)},
	} {
		e, err := New(m, c.opt)
		if err != nil {
			t.Fatal(err)
		}
		g, err := e.newGen(prompts, 3, sp)
		if err != nil {
			t.Fatal(err)
		}
		for g.admit() {
			if err := g.step(); err != nil {
				t.Fatal(err)
			}
		}
		e.Close()
		if len(g.out) != 6 || g.promptRows != c.want {
			t.Errorf("%d slots: %d samples, %d prompt rows computed, want 6 and %d", c.opt.Slots, len(g.out), g.promptRows, c.want)
		}
	}
}

// The truncated set and its normaliser, checked by hand on a 5-token
// vocabulary.
func TestTruncation(t *testing.T) {
	p := []float64{0.1, 0.4, 0.05, 0.3, 0.15}
	z := make([]float32, len(p))
	for i, v := range p {
		z[i] = float32(math.Log(v))
	}
	buf := make([]int32, len(z))
	pb := make([]float32, len(z))
	kernels.Exp(pb, z)
	cases := []struct {
		topK int
		topP float64
		want []int32
	}{
		{2, 0, []int32{1, 3}},
		{0, 0.69, []int32{1, 3}},
		{0, 0.71, []int32{1, 3, 4}},
		{3, 0.5, []int32{1, 3}},
		{0, 0.99, []int32{1, 3, 4, 0, 2}},
	}
	for _, c := range cases {
		got := candidates(z, pb, buf, c.topK, c.topP)
		if len(got) != len(c.want) {
			t.Fatalf("top-k %d top-p %v: %v, want %v", c.topK, c.topP, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("top-k %d top-p %v: %v, want %v", c.topK, c.topP, got, c.want)
			}
		}
	}
	// Top-2 keeps tokens 1 and 3 (mass 0.7): the truncated log-probability
	// of token 3 is log(0.3/0.7), its full one log 0.3.
	// A top-k taken by insertion (up to insertionTopK) is the sorted row's
	// first k, ties in id order.
	r := rand.New(rand.NewPCG(3, 3))
	zr := make([]float32, 500)
	for i := range zr {
		zr[i] = float32(r.IntN(40)) / 8 // many equal values
	}
	pr, all := make([]float32, len(zr)), make([]int32, len(zr))
	for i := range all {
		all[i] = int32(i)
	}
	sortByProb(all, zr)
	for _, k := range []int{1, 2, 17, insertionTopK, insertionTopK + 1, 499} {
		got := candidates(zr, pr, make([]int32, len(zr)), k, 0)
		if !slices.Equal(got, all[:k]) {
			t.Fatalf("top-k %d: %v, want %v", k, got, all[:k])
		}
	}
	// Top-p over a prefix of the order (topPPrefix) cuts where sorting the
	// whole row cuts, token for token: flat and peaked rows, many equal
	// values, impossible tokens, mass far below the largest, cuts near 0
	// and 1, with and without a top-k.
	for trial := 0; trial < 60; trial++ {
		V := 1 + r.IntN(3000)
		zt := make([]float32, V)
		for i := range zt {
			switch trial % 5 {
			case 0:
				zt[i] = float32(2 * r.NormFloat64())
			case 1:
				zt[i] = float32(-1.5 * math.Log(float64(1+r.IntN(V))))
			case 2:
				zt[i] = float32(r.IntN(6)) / 2
			case 3:
				zt[i] = float32(math.Inf(-1))
				if r.IntN(3) == 0 {
					zt[i] = float32(r.NormFloat64())
				}
			case 4:
				zt[i] = -40 - float32(r.Float64()) // all far below the largest
			}
		}
		zt[r.IntN(V)] = 5
		kernels.LogSoftmax(zt, zt)
		pt := make([]float32, V)
		kernels.Exp(pt, zt)
		tp := []float64{1e-6, 0.3, 0.9, 0.999, 1 - 1e-12}[trial%5]
		k := []int{0, 0, 3, 100, V}[(trial/5)%5]
		want := make([]int32, V)
		for i := range want {
			want[i] = int32(i)
		}
		sort.SliceStable(want, func(a, b int) bool { return zt[want[a]] > zt[want[b]] })
		if k > 0 && k < V {
			want = want[:k]
		}
		var cum float64
		for i, id := range want {
			if cum += float64(pt[id]); cum >= tp {
				want = want[:i+1]
				break
			}
		}
		got := candidates(zt, pt, make([]int32, V), k, tp)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d (V %d, top-k %d, top-p %v): %d candidates, sorting the row gives %d", trial, V, k, tp, len(got), len(want))
		}
	}
	g := &policy{sp: Sampling{Temperature: 1, TopK: 2}}
	var rng rand.PCG
	counts := map[int32]int{}
	for i := 0; i < 2000; i++ {
		tok, lp, tlp := g.sampleOne(z, &rng, buf, make([]float32, len(z)))
		counts[tok]++
		if tok == 3 && (math.Abs(float64(lp)-math.Log(0.3)) > 1e-6 || math.Abs(float64(tlp)-math.Log(0.3/0.7)) > 1e-6) {
			t.Fatalf("token 3: log-probs %v, %v", lp, tlp)
		}
	}
	if len(counts) != 2 || counts[1] < 1000 || counts[1] > 1300 {
		t.Fatalf("top-2 draws %v, want only tokens 1 and 3, about 4:3", counts)
	}
}

// sortByProb orders by descending log-probability, ties by id, as a
// library sort with the same order does; ties are frequent on purpose.
func TestSortByProb(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{0, 1, 2, 7, 64, 301} {
		z := make([]float32, n)
		for i := range z {
			z[i] = float32(r.IntN(9)) - 4
		}
		got := make([]int32, n)
		for i := range got {
			got[i] = int32(i)
		}
		want := slices.Clone(got)
		slices.SortFunc(want, func(a, b int32) int {
			if z[a] != z[b] {
				if z[a] > z[b] {
					return -1
				}
				return 1
			}
			return int(a - b)
		})
		sortByProb(got, z)
		if !slices.Equal(got, want) {
			t.Fatalf("n %d: %v, want %v", n, got, want)
		}
	}
}

// Without truncation a draw follows the full distribution: 40,000 draws
// from a hand-made 5-token distribution land within 4.5 standard
// deviations of the expected counts; the reported log-probability is the
// token's.
func TestSampleFullDistribution(t *testing.T) {
	p := []float64{0.1, 0.4, 0.05, 0.3, 0.15}
	z := make([]float32, len(p))
	for i, v := range p {
		z[i] = float32(math.Log(v))
	}
	g := &policy{sp: Sampling{Temperature: 1}}
	rng := rand.NewPCG(1, 2)
	buf := make([]float32, len(z))
	counts := make([]int, len(p))
	const draws = 40000
	for i := 0; i < draws; i++ {
		tok, lp, tlp := g.sampleOne(z, rng, nil, buf)
		counts[tok]++
		if lp != z[tok] || tlp != z[tok] {
			t.Fatalf("token %d: log-probs %v, %v, want %v", tok, lp, tlp, z[tok])
		}
	}
	for i, c := range counts {
		mean, sd := draws*p[i], math.Sqrt(draws*p[i]*(1-p[i]))
		if math.Abs(float64(c)-mean) > 4.5*sd {
			t.Errorf("token %d drawn %d times, expected %.0f ± %.0f", i, c, mean, sd)
		}
	}
}

// Stop tokens at any id end a response, those above 255 included (they
// take the slower path).
func TestStopTokenSet(t *testing.T) {
	g := &policy{}
	for _, id := range []int32{5, 280, 0} {
		if id < 256 {
			g.stop[id] = true
		} else {
			g.stopAll = append(g.stopAll, id)
		}
	}
	for id, want := range map[int32]bool{5: true, 280: true, 0: true, 6: false, 281: false, 255: false} {
		if g.isStop(id) != want {
			t.Errorf("isStop(%d) = %v", id, !want)
		}
	}
	cfg := denseConfig()
	cfg.VocabSize = 300
	e, _ := New(randomModel(cfg, 2), Options{Slots: 2, MaxLen: 16})
	defer e.Close()
	s, err := e.Generate([][]int32{{1, 2, 3}}, 1, Sampling{MaxNewTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	first := s[0].Tokens[0]
	s, _ = e.Generate([][]int32{{1, 2, 3}}, 1, Sampling{MaxNewTokens: 3, Stop: []int32{299, first}})
	if len(s[0].Tokens) != 1 || s[0].Finish != "stop" {
		t.Fatalf("stop on token %d: %+v", first, s[0])
	}
}

func TestStopAndLength(t *testing.T) {
	m := randomModel(denseConfig(), 5)
	e, _ := New(m, Options{Slots: 2, MaxLen: 16})
	defer e.Close()
	prompts := [][]int32{{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}
	// Greedy decoding: find the first greedy token and stop on it.
	s, err := e.Generate(prompts[:1], 1, Sampling{MaxNewTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(s[0].Tokens) != 5 || s[0].Finish != "length" || s[0].TruncLogProbs != nil {
		t.Fatalf("greedy sample %+v", s[0])
	}
	first := s[0].Tokens[0]
	s, _ = e.Generate(prompts[:1], 1, Sampling{MaxNewTokens: 5, Stop: []int32{first}})
	if len(s[0].Tokens) != 1 || s[0].Finish != "stop" {
		t.Fatalf("stop on the first token: %+v", s[0])
	}
	// The second prompt has 12 tokens: MaxLen 16 leaves room for 4.
	s, _ = e.Generate(prompts[1:], 1, Sampling{Temperature: 1, MaxNewTokens: 10, Seed: 1})
	if len(s[0].Tokens) != 4 || s[0].Finish != "length" {
		t.Fatalf("MaxLen bound: %d tokens, finish %q", len(s[0].Tokens), s[0].Finish)
	}
}

func TestBadInput(t *testing.T) {
	m := randomModel(denseConfig(), 5)
	e, _ := New(m, Options{Slots: 2, MaxLen: 8})
	defer e.Close()
	sp := Sampling{Temperature: 1, MaxNewTokens: 2}
	for _, c := range []struct {
		prompts [][]int32
		sp      Sampling
		want    string
	}{
		{[][]int32{{1, 99}}, sp, "token 1: id 99"},
		{[][]int32{{}}, sp, "empty"},
		{[][]int32{{1, 2, 3, 4, 5, 6, 7, 8}}, sp, "at most 8"},
		{[][]int32{{1}}, Sampling{Temperature: -1, MaxNewTokens: 1}, "temperature"},
		{[][]int32{{1}}, Sampling{Temperature: 1}, "max new tokens"},
		{[][]int32{{1}}, Sampling{Temperature: 1, MaxNewTokens: 1, Stop: []int32{40}}, "stop token"},
	} {
		if _, err := e.Generate(c.prompts, 1, c.sp); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want one mentioning %q", c.prompts, err, c.want)
		}
	}
}

// Options the machine cannot hold are refused with an error, not a crash.
func TestNewBadOptions(t *testing.T) {
	m := randomModel(denseConfig(), 5)
	for _, c := range []struct {
		opt  Options
		want string
	}{
		{Options{Slots: -1}, "slots"},
		{Options{MaxLen: 1}, "max length"},
		{Options{MaxLen: 300}, "max_position_embeddings"},
		{Options{Slots: 8, StepRows: 4}, "step rows"},
		{Options{Precision: 7}, "precision"},
	} {
		if _, err := New(m, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v, want one mentioning %q", c.opt, err, c.want)
		}
	}
	if _, ok := sysmem.Total(); !ok {
		t.Skip("no /proc/meminfo")
	}
	big := denseConfig()
	big.MaxPositionEmbeddings = 1 << 20
	m = model.New(big)
	if _, err := New(m, Options{Slots: 1 << 12, MaxLen: 1 << 20}); err == nil || !strings.Contains(err.Error(), "KV cache would take") {
		t.Errorf("a 2 TB KV cache: err = %v", err)
	}
}

// The reduced precisions must differ from the training engine, in the
// expected order: exact 0 < fp32 < bf16 < fp8 < fp4 in mean |log mu - log pi|.
func TestPrecisionDiscrepancyOrder(t *testing.T) {
	m := randomModel(moeConfig(), 8)
	prompts := testPrompts(rand.New(rand.NewPCG(3, 3)), 41, 6, 6, 6, 6)
	var prev float64 = -1
	for _, p := range []Precision{Exact, FP32, BF16, FP8, FP4} {
		e, _ := New(m, Options{Precision: p, Slots: 8, MaxLen: 40})
		samples, err := e.Generate(prompts, 4, Sampling{Temperature: 1, MaxNewTokens: 24, Seed: 2})
		e.Close()
		if err != nil {
			t.Fatal(err)
		}
		var seqs [][]int32
		for _, s := range samples {
			seqs = append(seqs, append(append([]int32(nil), prompts[s.Prompt]...), s.Tokens...))
		}
		res, _ := train.New(m).Forward(seqs, train.ForwardOptions{NoEntropy: true})
		var sum float64
		var n int
		for i, s := range samples {
			for j, lp := range s.LogProbs {
				sum += math.Abs(float64(lp - res.LogProbs[i][len(prompts[s.Prompt])-1+j]))
				n++
			}
		}
		mean := sum / float64(n)
		t.Logf("%s: mean |delta| = %.3g over %d tokens", p, mean, n)
		if p == Exact && mean != 0 || p != Exact && !(mean > prev) {
			t.Errorf("%s: mean |delta| %.3g, previous precision %.3g", p, mean, prev)
		}
		prev = mean
	}
}

// After warm-up, a decode step allocates nothing, whatever the sampler.
func TestDecodeStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	samplers := []Sampling{
		{Temperature: 1},
		{Temperature: 1, TopK: 5},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 0.7, TopK: 20, TopP: 0.5},
		{Temperature: 0},
	}
	for _, cfg := range []model.Config{denseConfig(), moeConfig()} {
		for _, path := range forwardPaths {
			decodeAllocs(t, cfg, samplers, path.fuse, path.blockUnit)
		}
	}
}

func decodeAllocs(t *testing.T, cfg model.Config, samplers []Sampling, fuse, blockUnit int) {
	m := randomModel(cfg, 6)
	for _, p := range []Precision{Exact, BF16} {
		e, _ := New(m, Options{Precision: p, Slots: 4, MaxLen: 200})
		cpuOf(e).fuse, cpuOf(e).blockUnit = fuse, blockUnit
		for _, sp := range samplers {
			prompts := testPrompts(rand.New(rand.NewPCG(4, 4)), cfg.VocabSize, 3, 4, 5, 6)
			sp.MaxNewTokens, sp.Seed = 190, 1
			g, err := e.newGen(prompts, 1, sp)
			if err != nil {
				t.Fatal(err)
			}
			g.admit()
			step := func() {
				if err := g.step(); err != nil {
					t.Fatal(err)
				}
			}
			step() // prefill
			step()
			if a := testing.AllocsPerRun(20, step); a != 0 {
				t.Errorf("%s, %s, fuse %d, %+v: a decode step allocates %v times", cfg.Architecture, p, fuse, sp, a)
			}
		}
		e.Close()
	}
}

// UpdateWeights changes the outputs and their version, and leaves the
// engine as a fresh one built on the new weights would be, in every
// precision.
func TestUpdateWeightsVersion(t *testing.T) {
	prompts := [][]int32{{1, 2, 3}, {4, 5}}
	sp := Sampling{Temperature: 1, MaxNewTokens: 6, Seed: 3}
	for _, p := range []Precision{Exact, FP32, BF16, FP8, FP4} {
		m := randomModel(moeConfig(), 9)
		e, _ := New(m, Options{Precision: p, Slots: 2, MaxLen: 16})
		a, _ := e.Generate(prompts, 1, sp)
		m2 := randomModel(moeConfig(), 10)
		if err := e.UpdateWeights(context.Background(), m2, 7); err != nil {
			t.Fatal(err)
		}
		b, _ := e.Generate(prompts, 1, sp)
		if a[0].Version != 0 || b[0].Version != 7 || e.Version() != 7 {
			t.Fatalf("%s: versions %d, %d", p, a[0].Version, b[0].Version)
		}
		if a[0].LogProbs[0] == b[0].LogProbs[0] {
			t.Fatalf("%s: new weights gave the same log-probability", p)
		}
		fresh, _ := New(m2, Options{Precision: p, Slots: 2, MaxLen: 16})
		c, _ := fresh.Generate(prompts, 1, sp)
		sameSamples(t, b, c)
		fresh.Close()
		if err := e.UpdateWeights(context.Background(), randomModel(denseConfig(), 1), 8); err == nil {
			t.Fatalf("%s: a model of another configuration was accepted", p)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := e.UpdateWeights(ctx, m, 9); err == nil || e.Version() != 7 {
			t.Fatalf("%s: a cancelled context: error %v, version %d", p, err, e.Version())
		}
		e.Close()
	}
}

// In bf16 and fp8 the weights are re-quantised into the buffers of the
// first load: an update allocates a small fraction of the weights' size.
func TestUpdateWeightsInPlace(t *testing.T) {
	cfg, err := model.Preset("tiny-moe", 64)
	if err != nil {
		t.Fatal(err)
	}
	m := model.New(cfg)
	model.Init(m, 1)
	weightBytes := 4 * m.NumParams()
	for _, p := range []Precision{BF16, FP8, FP4} {
		e, _ := New(m, Options{Precision: p, Slots: 2, MaxLen: 16})
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if err := e.UpdateWeights(context.Background(), m, 1); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		got := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d bytes allocated by an update of %d bytes of weights", p, got, weightBytes)
		if got > uint64(weightBytes/20) {
			t.Errorf("%s: an update allocated %d bytes for %d bytes of weights", p, got, weightBytes)
		}
		e.Close()
	}
}

// TestForwardPathsAgree: in every precision, the fused and the
// operation-by-operation paths give the same samples bit for bit (tokens,
// log-probabilities, routes) on a batch large enough for the automatic
// choice to fuse with several chunks per worker.
func TestForwardPathsAgree(t *testing.T) {
	for _, cfg := range []model.Config{denseConfig(), moeConfig()} {
		m := randomModel(cfg, 9)
		r := rand.New(rand.NewPCG(2, 2))
		lens := make([]int, 40)
		for i := range lens {
			lens[i] = 1 + r.IntN(9)
		}
		prompts := testPrompts(r, cfg.VocabSize, lens...)
		sp := Sampling{Temperature: 1, MaxNewTokens: 12, Seed: 3}
		for _, p := range []Precision{Exact, FP32, BF16, FP8, FP4} {
			var ref []Sample
			for _, path := range forwardPaths {
				got := generate(t, m, Options{Precision: p, Slots: 120, MaxLen: 32}, func(e *Engine) {
					cpuOf(e).fuse, cpuOf(e).blockUnit = path.fuse, path.blockUnit
				}, prompts, 3, sp)
				if ref == nil {
					ref = got
					continue
				}
				t.Run(fmt.Sprintf("%d-experts/%s/%s", cfg.NumExperts, p, path.name), func(t *testing.T) { sameSamples(t, ref, got) })
			}
		}
	}
}

// drawFull is the inverse CDF of p = exp(z) over a real vocabulary: for
// many u, the token it returns is where a float64 running sum in token
// order crosses u·total (up to rounding at the boundary), tokens of
// probability 0 are never returned, and u near 0 and 1 give the first and
// last tokens of non-zero probability.
func TestDrawFullInverseCDF(t *testing.T) {
	for _, V := range []int{1, 7, drawBlock, drawBlock + 1, 151936} {
		r := rand.New(rand.NewPCG(uint64(V), 3))
		z := make([]float32, V)
		var ref []float64 // running sum in token order
		var total float64
		first, last := -1, -1
		for i := range z {
			z[i] = float32(r.NormFloat64() * 3)
			if V > 1 && i%97 == 5 {
				z[i] = float32(math.Inf(-1)) // probability 0
			}
			p := float64(float32(math.Exp(float64(z[i]))))
			if p > 0 {
				if first < 0 {
					first = i
				}
				last = i
			}
			total += p
			ref = append(ref, total)
		}
		p := make([]float32, V)
		for k := 0; k < 2000; k++ {
			u := r.Float64()
			switch k {
			case 0:
				u = 0
			case 1:
				u = math.Nextafter(1, 0)
			}
			i := drawFull(z, p, u)
			if z[i] == float32(math.Inf(-1)) {
				t.Fatalf("V=%d u=%v: drew token %d of probability 0", V, u, i)
			}
			target := u * total
			lo := 0.0
			if i > 0 {
				lo = ref[i-1]
			}
			tol := 1e-9 * total
			if !(lo-tol <= target && target <= ref[i]+tol) {
				t.Fatalf("V=%d u=%v: token %d covers [%v, %v], target %v", V, u, i, lo, ref[i], target)
			}
			if k == 0 && i != first || k == 1 && i != last {
				t.Fatalf("V=%d u=%v: token %d, want %d", V, u, i, map[int]int{0: first, 1: last}[k])
			}
		}
	}
}

// A positive temperature below MinTemperature is refused, by Generate and
// by a Scheduler's Do, with an error naming it and pointing to greedy
// decoding: divided by it in float32 the logits overflow to infinities
// (NaN log-probabilities), and below float32's range it rounds to 0.
func TestTinyTemperatureRefused(t *testing.T) {
	m := randomModel(denseConfig(), 5)
	e, _ := New(m, Options{Slots: 2, MaxLen: 8})
	defer e.Close()
	for _, temp := range []float64{1e-300, 1e-40, MinTemperature / 2} {
		sp := Sampling{Temperature: temp, MaxNewTokens: 2}
		if _, err := e.Generate([][]int32{{1}}, 1, sp); err == nil || !strings.Contains(err.Error(), "temperature") || !strings.Contains(err.Error(), "use 0 for greedy") {
			t.Errorf("Generate, temperature %g: err = %v", temp, err)
		}
	}
	for _, temp := range []float64{0, MinTemperature, 1} {
		out, err := e.Generate([][]int32{{1}}, 1, Sampling{Temperature: temp, MaxNewTokens: 2})
		if err != nil {
			t.Fatalf("temperature %g: %v", temp, err)
		}
		for _, lp := range out[0].LogProbs {
			if math.IsNaN(float64(lp)) || math.IsInf(float64(lp), 0) {
				t.Errorf("temperature %g: log-prob %v", temp, lp)
			}
		}
	}
	s := NewScheduler(e)
	defer s.Close()
	if _, err := s.Do(context.Background(), Request{Prompt: []int32{1}, N: 1, Sampling: Sampling{Temperature: 1e-40, MaxNewTokens: 2}}); err == nil || !strings.Contains(err.Error(), "use 0 for greedy") {
		t.Errorf("Do, temperature 1e-40: err = %v", err)
	}
}

// fakeLoader is a backend that takes weights from a source device to
// device (as the GPU backend does from a GPU training engine).
type fakeLoader struct {
	Backend
	loaded any
}

func (f *fakeLoader) LoadFrom(src any) (bool, error) { f.loaded = src; return true, nil }

type fakeSource struct{ cfg model.Config }

func (s fakeSource) Config() *model.Config { return &s.cfg }

// TestUpdateWeightsFrom: the CPU backend takes no device push (the loop
// then pushes through the host); a backend that does gets the source, and
// the version moves; a source of another configuration is not pushed.
func TestUpdateWeightsFrom(t *testing.T) {
	m := randomModel(moeConfig(), 9)
	e, err := New(m, Options{Slots: 2, MaxLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if done, err := e.UpdateWeightsFrom(context.Background(), fakeSource{m.Config}, 3); done || err != nil {
		t.Errorf("CPU backend: done %v, %v", done, err)
	}
	b, err := newCPUBackend(m, Options{Slots: 2, MaxLen: 16})
	if err != nil {
		t.Fatal(err)
	}
	fl := &fakeLoader{Backend: b}
	e2, err := NewWithBackend(fl)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	src := &fakeSource{m.Config}
	if done, err := e2.UpdateWeightsFrom(context.Background(), src, 5); !done || err != nil || e2.Version() != 5 || fl.loaded != any(src) {
		t.Errorf("device push: done %v, %v, version %d", done, err, e2.Version())
	}
	other := fakeSource{randomModel(denseConfig(), 1).Config}
	if done, _ := e2.UpdateWeightsFrom(context.Background(), other, 6); done || e2.Version() != 5 {
		t.Errorf("a source of another configuration was pushed")
	}
}

// TestOnStep: the engine tells Options.OnStep of every forward step, and
// over a Generate the steps add up: the prompts' rows as prompt rows, a
// decoding row for each token after a sequence's first (which its
// prompt's last row gives), and as context every position of a sequence
// but its last token's, 1 + 2 + ... + (P + N - 1), summed.
func TestOnStep(t *testing.T) {
	var steps []StepInfo
	e, err := New(randomModel(denseConfig(), 5), Options{Precision: FP32, Slots: 3, StepRows: 5, MaxLen: 40,
		OnStep: func(s StepInfo) { steps = append(steps, s) }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompts := testPrompts(rand.New(rand.NewPCG(5, 5)), 37, 4, 2, 7)
	const N = 6
	out, err := e.Generate(prompts, 1, Sampling{Temperature: 1, MaxNewTokens: N, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range out {
		if len(s.Tokens) != N {
			t.Fatalf("sample %d: %d tokens, want %d", i, len(s.Tokens), N)
		}
	}
	var rows, prompt int
	var ctx int64
	for i, s := range steps {
		if s.Rows < 1 || s.Rows > 5 || s.PromptRows > s.Rows || s.Time <= 0 {
			t.Errorf("step %d: %+v", i, s)
		}
		rows, prompt, ctx = rows+s.Rows, prompt+s.PromptRows, ctx+s.Context
	}
	if prompt != 4+2+7 || rows-prompt != 3*(N-1) || ctx != 9*10/2+7*8/2+12*13/2 {
		t.Errorf("%d steps: %d rows, %d of them prompt rows, context %d; want 28, 13, 151", len(steps), rows, prompt, ctx)
	}
}
