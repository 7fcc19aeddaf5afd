package train

import (
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

type engCase struct {
	name               string
	moe, normTopK, tie bool
	replay             bool
}

var engCases = []engCase{
	{name: "dense-tied", tie: true},
	{name: "dense-untied"},
	{name: "moe-norm", moe: true, normTopK: true},
	{name: "moe-nonorm-tied", moe: true, tie: true},
	{name: "moe-norm-replay", moe: true, normTopK: true, replay: true},
	{name: "moe-nonorm-replay", moe: true, replay: true},
}

// engRandomRoutes draws valid routes: k distinct experts per token and layer.
func engRandomRoutes(r *rand.Rand, c model.Config, n int) *model.Routes {
	nl, E, k := len(c.MoELayers()), c.NumExperts, c.NumExpertsPerTok
	rt := model.NewRoutes(n, nl, k, E)
	for t := 0; t < n; t++ {
		for l := 0; l < nl; l++ {
			perm := r.Perm(E)
			for s := 0; s < k; s++ {
				rt.Set(t, l, s, perm[s])
			}
		}
	}
	return rt
}

func engCoefs(r *rand.Rand, seqs [][]int32) [][]float32 {
	out := make([][]float32, len(seqs))
	for s, q := range seqs {
		out[s] = make([]float32, len(q)-1)
		for i := range out[s] {
			out[s][i] = float32(r.NormFloat64())
		}
	}
	return out
}

// TestForwardMatchesReference compares log-probs, entropies and the aux loss
// with the float64 reference, including a sequence longer than one
// attention backward block and a one-token sequence.
func TestForwardMatchesReference(t *testing.T) {
	for _, tc := range engCases {
		t.Run(tc.name, func(t *testing.T) {
			c := engTinyConfig(tc.moe, tc.normTopK, tc.tie)
			m := engRandomModel(c, 1)
			r := rand.New(rand.NewPCG(2, 3))
			seqs := engRandomSeqs(r, c.VocabSize, 5, 1, 70, 9)
			opt := ForwardOptions{Record: true}
			if tc.replay {
				for _, s := range seqs {
					opt.Replay = append(opt.Replay, engRandomRoutes(r, c, len(s)))
				}
			}
			e := New(m)
			res, err := e.Forward(seqs, opt)
			if err != nil {
				t.Fatal(err)
			}
			routes := res.Routes
			if tc.replay {
				for s := range routes {
					if !routes[s].Equal(opt.Replay[s]) {
						t.Fatalf("seq %d: recorded routes differ from the replayed ones", s)
					}
				}
			}
			ref := newRefModel(m).run(seqs, routes, nil, nil, 0)
			for s := range seqs {
				if len(res.LogProbs[s]) != len(seqs[s])-1 || len(res.Entropy[s]) != len(seqs[s])-1 {
					t.Fatalf("seq %d: %d log-probs, %d entropies for %d tokens", s, len(res.LogProbs[s]), len(res.Entropy[s]), len(seqs[s]))
				}
				for i := range res.LogProbs[s] {
					if d := math.Abs(float64(res.LogProbs[s][i]) - ref.logp[s][i]); d > 2e-5 {
						t.Errorf("seq %d pos %d: logp %v, reference %v", s, i, res.LogProbs[s][i], ref.logp[s][i])
					}
					if d := math.Abs(float64(res.Entropy[s][i]) - ref.ent[s][i]); d > 2e-5 {
						t.Errorf("seq %d pos %d: entropy %v, reference %v", s, i, res.Entropy[s][i], ref.ent[s][i])
					}
				}
			}
			if d := math.Abs(res.AuxLoss - ref.aux); d > 1e-6 {
				t.Errorf("aux loss %v, reference %v", res.AuxLoss, ref.aux)
			}
			if !tc.moe && (res.AuxLoss != 0 || res.Routes != nil) {
				t.Errorf("dense model: aux %v, routes %v", res.AuxLoss, res.Routes)
			}
		})
	}
}

// TestLiveRoutingIsTopK checks the recorded live routes against the
// reference router: the top-k of the full softmax in descending order.
func TestLiveRoutingIsTopK(t *testing.T) {
	c := engTinyConfig(true, true, false)
	m := engRandomModel(c, 5)
	r := rand.New(rand.NewPCG(5, 5))
	seqs := engRandomSeqs(r, c.VocabSize, 12)
	e := New(m)
	res, err := e.Forward(seqs, ForwardOptions{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	// The first MoE layer is layer 0: its router input is
	// post_attention_layernorm(h), which the engine saved.
	a := &e.fw.layers[0]
	for tk := 0; tk < 12; tk++ {
		p := a.moe.probs[tk*c.NumExperts : (tk+1)*c.NumExperts]
		ids := res.Routes[0].Slots(nil, tk, 0)
		for s := 1; s < len(ids); s++ {
			if p[ids[s]] > p[ids[s-1]] {
				t.Fatalf("token %d: routes %v not in descending probability %v", tk, ids, p)
			}
		}
		for ex := range p {
			chosen := false
			for _, id := range ids {
				chosen = chosen || int(id) == ex
			}
			if !chosen && p[ex] > p[ids[len(ids)-1]] {
				t.Fatalf("token %d: expert %d (p=%v) beats chosen %v", tk, ex, p[ex], ids)
			}
		}
	}
}

// TestGradientsMatchFiniteDifferences checks Backward (log-prob, entropy
// and aux terms together) against central differences of the float64
// reference for sampled elements of every parameter tensor.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	for _, tc := range engCases {
		t.Run(tc.name, func(t *testing.T) {
			c := engTinyConfig(tc.moe, tc.normTopK, tc.tie)
			m := engRandomModel(c, 11)
			r := rand.New(rand.NewPCG(12, 13))
			seqs := engRandomSeqs(r, c.VocabSize, 6, 2, 9)
			opt := ForwardOptions{Record: true}
			if tc.replay {
				for _, s := range seqs {
					opt.Replay = append(opt.Replay, engRandomRoutes(r, c, len(s)))
				}
			}
			lc, le := engCoefs(r, seqs), engCoefs(r, seqs)
			auxW := 0.0
			if tc.moe {
				auxW = 3
			}
			e := New(m)
			res, err := e.Forward(seqs, opt)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Backward(Loss{LogProb: lc, Entropy: le, Aux: auxW}); err != nil {
				t.Fatal(err)
			}
			rm := newRefModel(m)
			fd := func(i int) float64 {
				const h = 1e-4
				w0 := rm.w[i]
				rm.w[i] = w0 + h
				lp := rm.run(seqs, res.Routes, lc, le, auxW).loss
				rm.w[i] = w0 - h
				lm := rm.run(seqs, res.Routes, lc, le, auxW).loss
				rm.w[i] = w0
				return (lp - lm) / (2 * h)
			}
			off := 0
			for _, p := range m.Params() {
				for j := 0; j < 3; j++ {
					i := off + r.IntN(p.Size())
					want := fd(i)
					got := float64(e.Grad.Arena[i])
					if math.Abs(got-want) > 1e-3*max(1, math.Abs(want)) {
						t.Errorf("%s[%d]: grad %v, finite difference %v", p.Name, i-off, got, want)
					}
				}
				off += p.Size()
			}
		})
	}
}

// TestRouterGradientUnderReplay checks that a replayed expert the live
// router would not pick still gets its router gradient (the gates come from
// the live scores over the replayed set).
func TestRouterGradientUnderReplay(t *testing.T) {
	c := engTinyConfig(true, true, false)
	m := engRandomModel(c, 21)
	r := rand.New(rand.NewPCG(22, 23))
	seqs := engRandomSeqs(r, c.VocabSize, 8)
	e := New(m)
	live, err := e.Forward(seqs, ForwardOptions{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	// Replay the experts the live router ranked lowest.
	rt := model.NewRoutes(8, 1, 2, c.NumExperts)
	for tk := 0; tk < 8; tk++ {
		n := 0
		for ex := 0; ex < c.NumExperts && n < 2; ex++ {
			if ex != live.Routes[0].At(tk, 0, 0) && ex != live.Routes[0].At(tk, 0, 1) {
				rt.Set(tk, 0, n, ex)
				n++
			}
		}
	}
	if _, err := e.Forward(seqs, ForwardOptions{Replay: []*model.Routes{rt}}); err != nil {
		t.Fatal(err)
	}
	lc := engCoefs(r, seqs)
	if err := e.Backward(Loss{LogProb: lc}); err != nil {
		t.Fatal(err)
	}
	gr := e.Grad.Layers[0].Router.Data
	H := c.HiddenSize
	for ex := 0; ex < c.NumExperts; ex++ {
		var s float64
		for _, v := range gr[ex*H : (ex+1)*H] {
			s += math.Abs(float64(v))
		}
		if s == 0 {
			t.Errorf("router row of expert %d has a zero gradient", ex)
		}
	}
}

// TestBatchInvariance: a sequence's log-probs, entropies and routes are
// bitwise the same alone and packed with others, in any position.
func TestBatchInvariance(t *testing.T) {
	for _, tc := range []struct {
		moe, wide bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		moe := tc.moe
		c := engTinyConfig(moe, true, false)
		lens := []int{13, 40, 7, 66}
		if tc.wide {
			// Large enough that kernels.Gemm splits its work across threads.
			c.HiddenSize, c.IntermediateSize, c.MoeIntermediateSize = 64, 192, 96
			c.HeadDim, c.VocabSize = 16, 300
			lens = []int{13, 150, 7, 66}
		}
		m := engRandomModel(c, 31)
		r := rand.New(rand.NewPCG(32, 33))
		batch := engRandomSeqs(r, c.VocabSize, lens...)
		e := New(m)
		all, err := e.Forward(batch, ForwardOptions{Record: true})
		if err != nil {
			t.Fatal(err)
		}
		for s := range batch {
			alone, err := New(m).Forward(batch[s:s+1], ForwardOptions{Record: true})
			if err != nil {
				t.Fatal(err)
			}
			if !equalF32(alone.LogProbs[0], all.LogProbs[s]) || !equalF32(alone.Entropy[0], all.Entropy[s]) {
				t.Errorf("moe=%v seq %d: log-probs or entropies differ alone and in the batch", moe, s)
			}
			if moe && !alone.Routes[0].Equal(all.Routes[s]) {
				t.Errorf("seq %d: routes differ alone and in the batch", s)
			}
		}
	}
}

// TestDeterministicAcrossGOMAXPROCS: forward and backward give the same bits
// with 1 and several threads, and buffer reuse does not change them.
func TestDeterministicAcrossGOMAXPROCS(t *testing.T) {
	for _, tc := range []struct {
		moe, wide bool
	}{{false, false}, {true, false}, {false, true}, {true, true}} {
		moe := tc.moe
		c := engTinyConfig(moe, true, false)
		lens := []int{70, 33, 50, 3}
		if tc.wide {
			// Large enough that kernels.Gemm splits its work across threads.
			c.HiddenSize, c.IntermediateSize, c.MoeIntermediateSize = 64, 192, 96
			c.HeadDim, c.VocabSize = 16, 300
			lens = []int{150, 70, 33, 3}
		}
		m := engRandomModel(c, 41)
		r := rand.New(rand.NewPCG(42, 43))
		seqs := engRandomSeqs(r, c.VocabSize, lens...)
		lc, le := engCoefs(r, seqs), engCoefs(r, seqs)
		run := func(procs int, e *Engine) ([]float32, []float32) {
			old := runtime.GOMAXPROCS(procs)
			defer runtime.GOMAXPROCS(old)
			e.ZeroGrad()
			res, err := e.Forward(seqs, ForwardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Backward(Loss{LogProb: lc, Entropy: le, Aux: 0.5}); err != nil {
				t.Fatal(err)
			}
			var lp []float32
			for _, x := range res.LogProbs {
				lp = append(lp, x...)
			}
			return lp, append([]float32(nil), e.Grad.Arena...)
		}
		e := New(m)
		lp1, g1 := run(1, e)
		for _, procs := range []int{2, 3, 4} {
			lp, g := run(procs, e)
			if !equalF32(lp1, lp) {
				t.Errorf("moe=%v GOMAXPROCS=%d: log-probs differ from GOMAXPROCS=1", moe, procs)
			}
			if !equalF32(g1, g) {
				t.Errorf("moe=%v GOMAXPROCS=%d: gradients differ from GOMAXPROCS=1", moe, procs)
			}
		}
	}
}

// TestBackwardAccumulates: two Backward calls after one Forward give twice
// the gradient (up to rounding); ZeroGrad clears it.
func TestBackwardAccumulates(t *testing.T) {
	c := engTinyConfig(true, true, false)
	e := New(engRandomModel(c, 51))
	r := rand.New(rand.NewPCG(52, 53))
	seqs := engRandomSeqs(r, c.VocabSize, 6, 4)
	if _, err := e.Forward(seqs, ForwardOptions{NoEntropy: true}); err != nil {
		t.Fatal(err)
	}
	l := Loss{LogProb: engCoefs(r, seqs), Entropy: engCoefs(r, seqs), Aux: 1}
	if err := e.Backward(l); err != nil {
		t.Fatal(err)
	}
	g1 := append([]float32(nil), e.Grad.Arena...)
	if err := e.Backward(l); err != nil {
		t.Fatal(err)
	}
	for i, v := range e.Grad.Arena {
		if math.Abs(float64(v-2*g1[i])) > 1e-5*max(1, math.Abs(float64(v))) {
			t.Fatalf("grad[%d] = %v after two calls, want %v", i, v, 2*g1[i])
		}
	}
	e.ZeroGrad()
	for i, v := range e.Grad.Arena {
		if v != 0 {
			t.Fatalf("grad[%d] = %v after ZeroGrad", i, v)
		}
	}
}

func TestForwardErrors(t *testing.T) {
	c := engTinyConfig(true, true, false)
	m := engRandomModel(c, 61)
	e := New(m)
	good := []int32{1, 2, 3}
	badRoutes := model.NewRoutes(3, 1, 2, c.NumExperts) // expert 0 twice
	wrongTokens := engRandomRoutes(rand.New(rand.NewPCG(1, 1)), c, 4)
	cases := []struct {
		name string
		seqs [][]int32
		opt  ForwardOptions
		want string
	}{
		{"no sequences", nil, ForwardOptions{}, "no sequences"},
		{"empty", [][]int32{good, {}}, ForwardOptions{}, "sequence 1 is empty"},
		{"token too large", [][]int32{{1, 11}}, ForwardOptions{}, "token 11 out of vocabulary"},
		{"negative token", [][]int32{{-1}}, ForwardOptions{}, "token -1"},
		{"too long", [][]int32{make([]int32, 257)}, ForwardOptions{}, "max_position_embeddings"},
		{"replay count", [][]int32{good}, ForwardOptions{Replay: []*model.Routes{nil, nil}}, "Replay has 2 entries"},
		{"replay duplicate", [][]int32{good}, ForwardOptions{Replay: []*model.Routes{badRoutes}}, "chosen twice"},
		{"replay tokens", [][]int32{good}, ForwardOptions{Replay: []*model.Routes{wrongTokens}}, "covers 4 tokens"},
		{"replay shape", [][]int32{good}, ForwardOptions{Replay: []*model.Routes{model.NewRoutes(3, 2, 2, c.NumExperts)}}, "does not match"},
	}
	for _, tc := range cases {
		_, err := e.Forward(tc.seqs, tc.opt)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
	if err := e.Backward(Loss{}); err == nil || !strings.Contains(err.Error(), "without a successful Forward") {
		t.Errorf("Backward after failed Forward: %v", err)
	}
	dense := New(engRandomModel(engTinyConfig(false, false, false), 1))
	if _, err := dense.Forward([][]int32{good}, ForwardOptions{Replay: []*model.Routes{model.NewRoutes(3, 1, 2, c.NumExperts)}}); err == nil {
		t.Error("dense model accepted replay routes")
	}
	bc := c
	bc.NumKeyValueHeads = 3
	if _, err := New(model.New(bc)).Forward([][]int32{good}, ForwardOptions{}); err == nil || !strings.Contains(err.Error(), "num_key_value_heads") {
		t.Errorf("bad config: %v", err)
	}
}

func TestBackwardErrors(t *testing.T) {
	c := engTinyConfig(false, false, false)
	e := New(engRandomModel(c, 71))
	seqs := [][]int32{{1, 2, 3}, {4, 5}}
	if _, err := e.Forward(seqs, ForwardOptions{}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		l    Loss
		want string
	}{
		{Loss{LogProb: [][]float32{{1, 1}}}, "Loss.LogProb has 1 sequences"},
		{Loss{LogProb: [][]float32{{1, 1}, {1, 1}}}, "Loss.LogProb[1] has 2 entries, want 1"},
		{Loss{LogProb: [][]float32{{1, 1}, {1}}, Entropy: [][]float32{{1}, {1}}}, "Loss.Entropy[0]"},
		{Loss{LogProb: [][]float32{{1, float32(math.NaN())}, {1}}}, "not finite"},
		{Loss{LogProb: [][]float32{{1, 1}, {1}}, Aux: math.Inf(1)}, "Loss.Aux"},
	}
	for _, tc := range cases {
		if err := e.Backward(tc.l); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one containing %q", err, tc.want)
		}
	}
	for _, v := range e.Grad.Arena {
		if v != 0 {
			t.Fatal("a rejected Backward changed the gradient")
		}
	}
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// routeIDs returns all of r's expert ids in its layout, (t·Layers + l)·K + s.
func routeIDs(r *model.Routes) []int32 {
	out := make([]int32, 0, r.Tokens*r.Layers*r.K)
	for t := 0; t < r.Tokens; t++ {
		for l := 0; l < r.Layers; l++ {
			out = append(out, r.Slots(nil, t, l)...)
		}
	}
	return out
}

func equalI32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestChunkedHead: with the lm_head split into row chunks (as for a real
// vocabulary) the log-probs and entropies are bitwise those of one chunk
// and the gradients agree to rounding.
func TestChunkedHead(t *testing.T) {
	c := engTinyConfig(true, true, true)
	m := engRandomModel(c, 81)
	r := rand.New(rand.NewPCG(82, 83))
	seqs := engRandomSeqs(r, c.VocabSize, 30, 9, 21)
	l := Loss{LogProb: engCoefs(r, seqs), Entropy: engCoefs(r, seqs), Aux: 0.7}
	run := func() (*Result, []float32) {
		e := New(m)
		res, err := e.Forward(seqs, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Backward(l); err != nil {
			t.Fatal(err)
		}
		return res, e.Grad.Arena
	}
	one, g1 := run()
	old := headChunkElems
	headChunkElems = 16 * c.VocabSize // 16-row chunks over 60 tokens
	defer func() { headChunkElems = old }()
	chunked, g2 := run()
	for s := range seqs {
		if !equalF32(one.LogProbs[s], chunked.LogProbs[s]) || !equalF32(one.Entropy[s], chunked.Entropy[s]) {
			t.Fatalf("seq %d: chunked head changed log-probs or entropies", s)
		}
	}
	for i := range g1 {
		if math.Abs(float64(g1[i]-g2[i])) > 1e-5*max(1, math.Abs(float64(g1[i]))) {
			t.Fatalf("grad[%d]: %v with one chunk, %v chunked", i, g1[i], g2[i])
		}
	}
}

// TestFusedProjections: q/k/v and gate/up run as one GEMM when the weights
// are adjacent in the arena (always for model.New); the per-layer fallback
// gives bitwise the same forward and the same gradients up to rounding.
func TestFusedProjections(t *testing.T) {
	c := engTinyConfig(true, true, false)
	m := engRandomModel(c, 91)
	r := rand.New(rand.NewPCG(92, 93))
	seqs := engRandomSeqs(r, c.VocabSize, 17, 5)
	l := Loss{LogProb: engCoefs(r, seqs), Entropy: engCoefs(r, seqs), Aux: 0.2}
	run := func(fused bool) (*Result, []float32) {
		e := New(m)
		if !fused {
			e.noFuse = true
		}
		res, err := e.Forward(seqs, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for li := range e.fw.layers {
			a := &e.fw.layers[li]
			if got := a.qkvG.fw != nil && a.qkvG.fg != nil; got != fused {
				t.Fatalf("layer %d: q/k/v fused = %v, want %v", li, got, fused)
			}
		}
		if err := e.Backward(l); err != nil {
			t.Fatal(err)
		}
		return res, e.Grad.Arena
	}
	r1, g1 := run(true)
	r2, g2 := run(false)
	for s := range seqs {
		if !equalF32(r1.LogProbs[s], r2.LogProbs[s]) {
			t.Fatalf("seq %d: fused and per-layer projections give different log-probs", s)
		}
	}
	for i := range g1 {
		if math.Abs(float64(g1[i]-g2[i])) > 1e-5*max(1, math.Abs(float64(g1[i]))) {
			t.Fatalf("grad[%d]: fused %v, per-layer %v", i, g1[i], g2[i])
		}
	}
	// A parameter whose Data no longer views the arena is not fused.
	m2 := m.Clone()
	m2.Layers[0].K.Data = append([]float32(nil), m2.Layers[0].K.Data...)
	e := New(m2)
	if _, err := e.Forward(seqs, ForwardOptions{}); err != nil {
		t.Fatal(err)
	}
	if e.fw.layers[0].qkvG.fw != nil {
		t.Fatal("q/k/v fused although k's Data left the arena")
	}
}

// TestNaNWeightsDoNotPanic: a diverged model gives NaN log-probs, not a
// crash (live routing still picks k distinct experts).
func TestNaNWeightsDoNotPanic(t *testing.T) {
	c := engTinyConfig(true, true, false)
	m := engRandomModel(c, 95)
	for i := range m.Layers[0].Router.Data {
		m.Layers[0].Router.Data[i] = float32(math.NaN())
	}
	e := New(m)
	res, err := e.Forward([][]int32{{1, 2, 3, 4}}, ForwardOptions{Record: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Routes[0].Validate(1, c.NumExperts, c.NumExpertsPerTok); err != nil {
		t.Fatalf("routes of a NaN router: %v", err)
	}
	if err := e.Backward(Loss{LogProb: [][]float32{{1, 1, 1}}}); err != nil {
		t.Fatal(err)
	}
}

// TestPrefixInvariance: the log-probs of a prefix are bitwise the first
// log-probs of the whole sequence (causality with row-invariant kernels),
// which is what lets a KV-cache decoder reproduce the training engine.
func TestPrefixInvariance(t *testing.T) {
	for _, moe := range []bool{false, true} {
		c := engTinyConfig(moe, true, false)
		m := engRandomModel(c, 101)
		r := rand.New(rand.NewPCG(102, 103))
		seq := engRandomSeqs(r, c.VocabSize, 75)[0]
		full, err := New(m).Forward([][]int32{seq}, ForwardOptions{Record: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, 2, 9, 64, 65} {
			pre, err := New(m).Forward([][]int32{seq[:n]}, ForwardOptions{Record: true})
			if err != nil {
				t.Fatal(err)
			}
			if !equalF32(pre.LogProbs[0], full.LogProbs[0][:n-1]) || !equalF32(pre.Entropy[0], full.Entropy[0][:n-1]) {
				t.Errorf("moe=%v prefix %d: log-probs differ from the full sequence's", moe, n)
			}
			if moe && !equalI32(routeIDs(pre.Routes[0]), routeIDs(full.Routes[0])[:n*full.Routes[0].Layers*full.Routes[0].K]) {
				t.Errorf("prefix %d: routes differ from the full sequence's", n)
			}
		}
	}
}

func TestModelMismatchErrors(t *testing.T) {
	c := engTinyConfig(false, false, false)
	m := engRandomModel(c, 111)
	e := New(m)
	m.Layers[1].V.Data = m.Layers[1].V.Data[:3]
	if _, err := e.Forward([][]int32{{1, 2}}, ForwardOptions{}); err == nil || !strings.Contains(err.Error(), "model.layers.1.self_attn.v_proj.weight has 3 values") {
		t.Errorf("short parameter: %v", err)
	}
	e = New(engRandomModel(c, 111))
	e.Grad = model.New(engTinyConfig(true, true, false))
	if _, err := e.Forward([][]int32{{1, 2}}, ForwardOptions{}); err == nil || !strings.Contains(err.Error(), "Grad has") {
		t.Errorf("mismatched Grad: %v", err)
	}
	// Replacing the model (same shapes) is fine: its arena is re-indexed.
	e = New(engRandomModel(c, 111))
	m2 := engRandomModel(c, 112)
	want, err := New(m2).Forward([][]int32{{1, 2, 3}}, ForwardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.Model = m2
	got, err := e.Forward([][]int32{{1, 2, 3}}, ForwardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !equalF32(got.LogProbs[0], want.LogProbs[0]) {
		t.Error("replaced model: log-probs differ from a fresh engine's")
	}
}
