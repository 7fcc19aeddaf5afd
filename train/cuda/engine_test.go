package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/keel-rl/keel/internal/cudatest"
	"github.com/keel-rl/keel/kernels"
	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
)

// TestNewTrainerChecksFirst: bad input is refused with a clear error
// before any device work, also without a device.
func TestNewTrainerChecksFirst(t *testing.T) {
	dense, _ := model.Preset("tiny-dense", 64)
	if _, err := NewTrainer(nil, model.New(dense), train.DefaultAdamWConfig(), nil); err == nil || !strings.Contains(err.Error(), "no device") {
		t.Errorf("nil device: %v", err)
	}
	bad := train.DefaultAdamWConfig()
	bad.Beta1 = 1.5
	if _, err := NewTrainer(nil, model.New(dense), bad, nil); err == nil || !strings.Contains(err.Error(), "beta1") {
		t.Errorf("a bad AdamW configuration: %v", err)
	}
	broken := dense
	broken.NumKeyValueHeads = 3
	if _, err := NewTrainer(nil, model.New(broken), train.DefaultAdamWConfig(), nil); err == nil || !strings.Contains(err.Error(), "num_key_value_heads") {
		t.Errorf("a bad configuration: %v", err)
	}
}

// enginePair makes a preset model (with layers layers when not 0, seed 7)
// and the CPU and GPU engines over it, the GPU one closed with t.
func enginePair(t *testing.T, dev *kc.Device, preset string, layers, vocab int) (model.Config, *model.Model, *train.Engine, *Engine) {
	t.Helper()
	cfg, err := model.Preset(preset, vocab)
	if err != nil {
		t.Fatal(err)
	}
	if layers > 0 {
		cfg.NumHiddenLayers = layers
	}
	m := model.New(cfg)
	model.Init(m, 7)
	cpu, err := train.NewTrainer(m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := NewTrainer(dev, m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gpu.Close() })
	return cfg, m, cpu, gpu
}

func randomSeqs(r *rand.Rand, vocab int, lens ...int) [][]int32 {
	seqs := make([][]int32, len(lens))
	for i, n := range lens {
		for j := 0; j < n; j++ {
			seqs[i] = append(seqs[i], int32(r.IntN(vocab)))
		}
	}
	return seqs
}

func randomLoss(r *rand.Rand, seqs [][]int32) train.Loss {
	var l train.Loss
	for _, s := range seqs {
		lp, h := make([]float32, len(s)-1), make([]float32, len(s)-1)
		for i := range lp {
			lp[i] = float32(r.NormFloat64()) / 10
			h[i] = float32(r.NormFloat64()) / 100
		}
		l.LogProb = append(l.LogProb, lp)
		l.Entropy = append(l.Entropy, h)
	}
	return l
}

func maxAbsDiff(t *testing.T, what string, got, want [][]float32, tol float64) {
	t.Helper()
	worst := 0.0
	for s := range want {
		for i := range want[s] {
			d := math.Abs(float64(got[s][i] - want[s][i]))
			if math.IsNaN(d) {
				t.Fatalf("%s[%d][%d] is NaN", what, s, i)
			}
			worst = math.Max(worst, d)
		}
	}
	t.Logf("%s: max |GPU - CPU| = %.3g", what, worst)
	if worst > tol {
		t.Errorf("%s: max |GPU - CPU| = %.3g above %g", what, worst, tol)
	}
}

// relErr is ‖a − b‖/‖b‖ over one parameter's span.
func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i] - b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// TestEngineAgainstCPU runs the same forward, backward and AdamW step on
// both engines, float32 mode: log-probs within 1e-4, every parameter's
// gradient within 1e-3 relative, the weights after one step within 1e-5;
// a sequence's log-probs alone and inside the batch are the same bits;
// and the run resumes on the CPU from the GPU's state.
func TestEngineAgainstCPU(t *testing.T) {
	dev := cudatest.Device(t)
	t.Logf("device: %v", dev)
	for _, c := range []struct {
		preset string
		layers int
		vocab  int
	}{{"tiny-dense", 0, 300}, {"qwen3-0.6b", 2, 1000}, {"tiny-moe", 0, 300}, {"small-moe", 0, 300}} {
		t.Run(c.preset, func(t *testing.T) {
			if c.preset == "qwen3-0.6b" || c.preset == "small-moe" {
				cudatest.Larger(t, c.preset)
			}
			cfg, m, cpu, gpu := enginePair(t, dev, c.preset, c.layers, c.vocab)
			opt := train.DefaultAdamWConfig()
			r := rand.New(rand.NewPCG(1, 2))
			seqs := randomSeqs(r, c.vocab, 17, 5, 40, 2)
			moe := len(cfg.MoELayers()) > 0
			fo := train.ForwardOptions{Temperature: 0.8, Record: moe}
			if moe {
				// R3: both engines replay the routes the CPU engine records
				// on a first forward; then the second forward records live.
				first, err := cpu.Forward(seqs, fo)
				if err != nil {
					t.Fatal(err)
				}
				rfo := fo
				rfo.Replay = first.Routes
				want, err := cpu.Forward(seqs, rfo)
				if err != nil {
					t.Fatal(err)
				}
				got, err := gpu.Forward(seqs, rfo)
				if err != nil {
					t.Fatal(err)
				}
				maxAbsDiff(t, "log-probs under replay", got.LogProbs, want.LogProbs, 1e-4)
				for s := range seqs {
					if !got.Routes[s].Equal(first.Routes[s]) {
						t.Errorf("sequence %d: the GPU engine did not use the replayed routes", s)
					}
				}
			}
			want, err := cpu.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			got, err := gpu.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			maxAbsDiff(t, "log-probs", got.LogProbs, want.LogProbs, 1e-4)
			maxAbsDiff(t, "entropies", got.Entropy, want.Entropy, 1e-4)
			if moe {
				for s := range seqs {
					if !got.Routes[s].Equal(want.Routes[s]) {
						t.Errorf("sequence %d: live routes differ between the engines", s)
					}
				}
				if math.Abs(got.AuxLoss-want.AuxLoss) > 1e-5*want.AuxLoss {
					t.Errorf("aux loss: GPU %v, CPU %v", got.AuxLoss, want.AuxLoss)
				}
			}

			loss := randomLoss(r, seqs)
			if moe {
				loss.Aux = 0.01
			}
			if err := cpu.Backward(loss); err != nil {
				t.Fatal(err)
			}
			if err := gpu.Backward(loss); err != nil {
				t.Fatal(err)
			}
			gg, err := gpu.Gradients()
			if err != nil {
				t.Fatal(err)
			}
			off := 0
			for _, p := range cpu.Grad.Params() {
				n := p.Size()
				if e := relErr(gg[off:off+n], p.Data); e > 1e-3 || math.IsNaN(e) {
					t.Errorf("gradient of %s: relative error %.3g", p.Name, e)
				}
				off += n
			}

			// The optimiser on identical inputs: the CPU's gradient on both
			// engines, no clipping (the clip coefficient would carry the
			// norms' last-bit difference): the same bits, as both compute
			// AdamW with the same correctly rounded float32 operations.
			// (After different gradients the weights can differ by 2·lr:
			// AdamW's first step is ±lr wherever a gradient is near 0.)
			if err := kc.Upload(dev, gpu.g, cpu.Grad.Arena); err != nil {
				t.Fatal(err)
			}
			n2, err := gpu.Step(1e-3, 0)
			if err != nil {
				t.Fatal(err)
			}
			n1, err := cpu.Step(1e-3, 0)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(n1-n2) > 1e-12*n1 {
				t.Errorf("gradient norm of the same gradient: GPU %.17g, CPU %.17g", n2, n1)
			}
			gw, err := gpu.Weights()
			if err != nil {
				t.Fatal(err)
			}
			diff := 0
			for i, v := range gw.Arena {
				if math.Float32bits(v) != math.Float32bits(m.Arena[i]) {
					diff++
				}
			}
			// The CPU's portable AdamW (no AVX-512) rounds its fused
			// operations through float64: a last bit may differ, rarely.
			allowed := 0
			if !strings.HasPrefix(kernels.Features(), "avx512") {
				allowed = len(gw.Arena) / 10000
			}
			if diff > allowed {
				t.Errorf("one AdamW step on the same gradient: %d of %d weights differ from the CPU's (%s kernels)", diff, len(gw.Arena), kernels.Features())
			}

			// Batch invariance on the GPU.
			all, err := gpu.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			one, err := gpu.Forward(seqs[2:3], fo)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range one.LogProbs[0] {
				if math.Float32bits(v) != math.Float32bits(all.LogProbs[2][i]) {
					t.Fatalf("sequence 2 position %d alone %v, in the batch %v", i, v, all.LogProbs[2][i])
				}
			}

			// A run resumes on the other device: the GPU's weights and
			// optimiser state start a CPU engine, whose state is then the
			// same bits; the CPU's state starts a GPU engine likewise.
			st, err := gpu.OptimState()
			if err != nil {
				t.Fatal(err)
			}
			if st.Step != 1 {
				t.Errorf("optimiser state at step %d, want 1", st.Step)
			}
			wcopy := model.New(cfg)
			copy(wcopy.Arena, gw.Arena)
			onCPU, err := train.NewTrainer(wcopy, opt, st)
			if err != nil {
				t.Fatal(err)
			}
			cst, err := onCPU.OptimState()
			if err != nil {
				t.Fatal(err)
			}
			if cst.Step != st.Step || !sameFloats(cst.M, st.M) || !sameFloats(cst.V, st.V) {
				t.Error("the CPU engine resumed from the GPU's state holds other moments")
			}
			cpuState, err := cpu.OptimState()
			if err != nil {
				t.Fatal(err)
			}
			onGPU, err := NewTrainer(dev, m, opt, cpuState)
			if err != nil {
				t.Fatal(err)
			}
			defer onGPU.Close()
			gst, err := onGPU.OptimState()
			if err != nil {
				t.Fatal(err)
			}
			w2, err := onGPU.Weights()
			if err != nil {
				t.Fatal(err)
			}
			if gst.Step != cpuState.Step || !sameFloats(gst.M, cpuState.M) || !sameFloats(gst.V, cpuState.V) || !sameFloats(w2.Arena, m.Arena) {
				t.Error("the GPU engine resumed from the CPU's state holds other weights or moments")
			}
			// And it trains on: one more step runs.
			if _, err := onGPU.Forward(seqs, fo); err != nil {
				t.Fatal(err)
			}
			if err := onGPU.Backward(loss); err != nil {
				t.Fatal(err)
			}
			if _, err := onGPU.Step(1e-3, 1); err != nil || onGPU.Steps() != 2 {
				t.Errorf("resumed GPU step: %v, at step %d", err, onGPU.Steps())
			}
		})
	}
}

func sameFloats(a, b []float32) bool {
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

// TestEngineErrors: Backward without Forward and mismatched losses are
// errors, as on the CPU engine.
func TestEngineErrors(t *testing.T) {
	dev := cudatest.Device(t)
	cfg, _ := model.Preset("tiny-dense", 50)
	m := model.New(cfg)
	model.Init(m, 1)
	e, err := NewTrainer(dev, m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.Backward(train.Loss{}); err == nil {
		t.Error("Backward without Forward")
	}
	if _, err := e.Forward([][]int32{{1, 50}}, train.ForwardOptions{}); err == nil || !strings.Contains(err.Error(), "out of vocabulary") {
		t.Errorf("token out of vocabulary: %v", err)
	}
	if _, err := e.Forward([][]int32{{1, 2, 3}}, train.ForwardOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.Backward(train.Loss{LogProb: [][]float32{{1}}}); err == nil {
		t.Error("a loss of the wrong shape was accepted")
	}
	// A Forward in one precision is no Forward for a Backward in another
	// (the bf16 mode's head reads what its own forward keeps).
	if err := e.SetPrecision(BF16); err != nil {
		t.Fatal(err)
	}
	if err := e.Backward(train.Loss{LogProb: [][]float32{{1, 0}}}); err == nil {
		t.Error("Backward after a change of precision since the Forward was accepted")
	}
}

// TestEngineBF16 checks the bf16 mode against the CPU engine (float32).
// The tolerance: a product of bf16 operands carries a relative rounding
// of up to 2⁻⁹ per operand, which the float32 sums average over K terms;
// the CPU rollout's own bf16 mode differs from its training engine by a
// mean |Δ log p| of 1.1e-3 on the quickstart model (README, keel probe),
// and transformers' bf16 (bf16 attention through SDPA) differs from its
// fp32 by a mean 6.4e-3 on the Qwen3-0.6B shape in two layers (H100,
// tools/gpu/check.sh hf, session 12). keel's bf16 mode rounds attention's
// operands too (flash.cu), as transformers does. So: mean |Δ log p| at
// most 8e-3 and max at most 0.1 on dense models (no router to flip), each
// parameter's gradient within 5e-2 relative, and a step that refreshes
// the bf16 weights (the next forward moves).
func TestEngineBF16(t *testing.T) {
	dev := cudatest.Device(t)
	for _, c := range []struct {
		preset        string
		layers, vocab int
		perLaunch     bool // the experts' products one cuBLASLt launch each (KEEL_MOE_GROUP=host)
	}{{"tiny-dense", 0, 300, false}, {"qwen3-0.6b", 2, 1000, false}, {"tiny-moe", 0, 300, false}, {"tiny-moe", 0, 300, true}} {
		name := c.preset
		if c.perLaunch {
			name += "/per-expert"
		}
		t.Run(name, func(t *testing.T) {
			if c.preset == "qwen3-0.6b" {
				cudatest.Larger(t, c.preset)
			}
			cfg, _, cpu, gpu := enginePair(t, dev, c.preset, c.layers, c.vocab)
			if err := gpu.SetPrecision(BF16); err != nil {
				t.Fatal(err)
			}
			gpu.expertsPerLaunch = c.perLaunch
			r := rand.New(rand.NewPCG(3, 4))
			seqs := randomSeqs(r, c.vocab, 33, 7, 64)
			fo := train.ForwardOptions{Temperature: 0.8}
			if len(cfg.MoELayers()) > 0 {
				// The MoE model replays the CPU engine's routes, so that
				// no router near-tie flips between the precisions.
				first, err := cpu.Forward(seqs, train.ForwardOptions{Record: true})
				if err != nil {
					t.Fatal(err)
				}
				fo.Replay = first.Routes
			}
			want, err := cpu.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			got, err := gpu.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			var sum, worst float64
			n := 0
			for s := range want.LogProbs {
				for i, w := range want.LogProbs[s] {
					d := math.Abs(float64(got.LogProbs[s][i] - w))
					sum += d
					worst = math.Max(worst, d)
					n++
				}
			}
			t.Logf("bf16 log-probs against the CPU engine: mean |Δ| %.3g, max %.3g over %d tokens", sum/float64(n), worst, n)
			if sum/float64(n) > 8e-3 || worst > 0.1 || math.IsNaN(sum) {
				t.Errorf("bf16 log-probs: mean |Δ| %.3g (limit 8e-3), max %.3g (limit 0.1)", sum/float64(n), worst)
			}
			loss := randomLoss(r, seqs)
			if err := cpu.Backward(loss); err != nil {
				t.Fatal(err)
			}
			if err := gpu.Backward(loss); err != nil {
				t.Fatal(err)
			}
			gg, err := gpu.Gradients()
			if err != nil {
				t.Fatal(err)
			}
			off := 0
			for _, p := range cpu.Grad.Params() {
				n := p.Size()
				if e := relErr(gg[off:off+n], p.Data); e > 5e-2 || math.IsNaN(e) {
					t.Errorf("bf16 gradient of %s: relative error %.3g", p.Name, e)
				}
				off += n
			}
			if _, err := gpu.Step(1e-2, 1); err != nil {
				t.Fatal(err)
			}
			// The step wrote the bf16 copy of the weights as it updated
			// them (adamw_bf16): the rounding of every new float32 weight,
			// bit for bit.
			w := make([]float32, len(cpu.Model.Arena))
			if err := kc.Download(dev, w, gpu.w); err != nil {
				t.Fatal(err)
			}
			w16b, err := gpu.bf.Copy16(gpu.w)
			if err != nil {
				t.Fatal(err)
			}
			w16 := make([]uint16, len(w))
			if err := kc.Download(dev, w16, w16b); err != nil {
				t.Fatal(err)
			}
			want16 := make([]kernels.BF16, len(w))
			kernels.ToBF16(want16, w)
			for i := range w16 {
				if w16[i] != uint16(want16[i]) {
					t.Fatalf("after a step, bf16 weight %d is %#04x, the rounding of %v is %#04x", i, w16[i], w[i], uint16(want16[i]))
				}
			}
			after, err := gpu.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			if after.LogProbs[0][0] == got.LogProbs[0][0] && after.LogProbs[2][10] == got.LogProbs[2][10] {
				t.Error("a step at lr 1e-2 left the bf16 forward unchanged: the bf16 weights were not refreshed")
			}
		})
	}
}

// TestEngineRecompute: with activation checkpointing the log-probs and
// every gradient are the same bits as without (the backward recomputes
// each layer with the same kernels on its saved input), dense and MoE,
// with the MoE routes replayed or live, and in the bf16 mode (where each
// layer keeps its flash attention's output and log-sum-exp, and the
// recomputation runs everything else).
func TestEngineRecompute(t *testing.T) {
	dev := cudatest.Device(t)
	for _, c := range []struct{ preset, prec string }{{"tiny-dense", FP32}, {"tiny-moe", FP32}, {"tiny-dense", BF16}, {"tiny-moe", BF16}} {
		preset := c.preset
		t.Run(preset+"/"+c.prec, func(t *testing.T) {
			cfg, _ := model.Preset(preset, 200)
			m := model.New(cfg)
			model.Init(m, 5)
			r := rand.New(rand.NewPCG(8, 9))
			seqs := randomSeqs(r, 200, 30, 12, 50)
			loss := randomLoss(r, seqs)
			moe := len(cfg.MoELayers()) > 0
			if moe {
				loss.Aux = 0.01
			}
			var replay []*model.Routes
			for _, name := range []string{"live", "replayed"} {
				var grads [2][]float32
				var res [2]*train.Result
				for i, rc := range []bool{false, true} {
					e := recomputeTrainer(t, dev, m, c.prec, rc)
					var err error
					if res[i], err = e.Forward(seqs, train.ForwardOptions{Temperature: 0.7, Record: moe, Replay: replay}); err != nil {
						t.Fatal(err)
					}
					if err := e.Backward(loss); err != nil {
						t.Fatal(err)
					}
					if grads[i], err = e.Gradients(); err != nil {
						t.Fatal(err)
					}
					e.Close()
				}
				for s := range res[0].LogProbs {
					if !sameFloats(res[0].LogProbs[s], res[1].LogProbs[s]) {
						t.Fatalf("%s routes, sequence %d: log-probs differ with recomputation", name, s)
					}
					if moe && !res[0].Routes[s].Equal(res[1].Routes[s]) {
						t.Fatalf("%s routes, sequence %d: recorded routes differ with recomputation", name, s)
					}
				}
				if !sameFloats(grads[0], grads[1]) {
					t.Errorf("%s routes: gradients differ with recomputation", name)
				}
				if !moe {
					break
				}
				// The second round replays routes of another seed's model,
				// so that replay is not what live routing would give.
				other := model.New(cfg)
				model.Init(other, 99)
				ce, _ := train.NewTrainer(other, train.DefaultAdamWConfig(), nil)
				rr, err := ce.Forward(seqs, train.ForwardOptions{Record: true})
				if err != nil {
					t.Fatal(err)
				}
				replay = rr.Routes
			}
		})
	}
}

// TestEngineFusedQKBack: in the bf16 mode, q's and k's gradients taken
// back through RoPE and their norms and rounded in one pass
// (norm_rope_bwd_bf16) give the gradients of the kernel-by-kernel path bit
// for bit, dense and MoE.
func TestEngineFusedQKBack(t *testing.T) {
	dev := cudatest.Device(t)
	for _, preset := range []string{"tiny-dense", "tiny-moe"} {
		fused := bf16StepGrads(t, dev, preset, 1, []int{30, 12, 40}, func(*Engine) {})
		unfused := bf16StepGrads(t, dev, preset, 1, []int{30, 12, 40}, func(e *Engine) { e.unfusedQK = true })
		if !sameFloats(fused, unfused) {
			t.Errorf("%s: gradients with the fused q/k backward differ from the kernel-by-kernel path's (relative %.3g)", preset, relErr(fused, unfused))
		}
	}
}

// bf16StepGrads returns the gradients of one bf16 step of preset's engine
// (set changes it first) on random sequences of lens tokens, the loss's
// coefficients random too (seed).
func bf16StepGrads(t *testing.T, dev *kc.Device, preset string, seed uint64, lens []int, set func(*Engine)) []float32 {
	t.Helper()
	_, _, _, e := enginePair(t, dev, preset, 0, 200)
	if err := e.SetPrecision(BF16); err != nil {
		t.Fatal(err)
	}
	set(e)
	r := rand.New(rand.NewPCG(7, seed))
	seqs := randomSeqs(r, 200, lens...)
	if _, err := e.Forward(seqs, train.ForwardOptions{Temperature: 0.9}); err != nil {
		t.Fatal(err)
	}
	if err := e.Backward(randomLoss(r, seqs)); err != nil {
		t.Fatal(err)
	}
	g, err := e.Gradients()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestEngineStoredScores: in the bf16 mode, the backward that stores dS
// for flash.cu's dQ pass (KEEL_FLASH_DQ=stored) gives the gradients of the
// two passes that recompute it, bit for bit, dense and MoE, on packed
// sequences of several lengths.
func TestEngineStoredScores(t *testing.T) {
	dev := cudatest.Device(t)
	for _, preset := range []string{"tiny-dense", "tiny-moe"} {
		two := bf16StepGrads(t, dev, preset, 2, []int{30, 12, 90}, func(e *Engine) {
			if !e.flash() {
				t.Fatalf("%s: the bf16 mode does not run flash.cu", preset)
			}
		})
		stored := bf16StepGrads(t, dev, preset, 2, []int{30, 12, 90}, func(e *Engine) { e.ops.FlashDQStored = true })
		if !sameFloats(two, stored) {
			t.Errorf("%s: gradients with stored dS differ from the two passes' (relative %.3g)", preset, relErr(two, stored))
		}
	}
}

// TestEngineFlashOrder: a bf16 step's gradients with flash.cu's tiles in
// kc.FlashOrder's order (the default) and in each sequence's from its last
// (KEEL_FLASH_ORDER=0), dense and MoE, with dS recomputed and stored: bit
// for bit, since only which block takes a tile changes.
func TestEngineFlashOrder(t *testing.T) {
	dev := cudatest.Device(t)
	for _, preset := range []string{"tiny-dense", "tiny-moe"} {
		for _, stored := range []bool{false, true} {
			var engines [2]*Engine
			ordered := bf16StepGrads(t, dev, preset, 2, []int{30, 12, 90}, func(e *Engine) {
				e.ops.FlashNoOrder, e.ops.FlashDQStored, engines[0] = false, stored, e
			})
			plain := bf16StepGrads(t, dev, preset, 2, []int{30, 12, 90}, func(e *Engine) {
				e.ops.FlashNoOrder, e.ops.FlashDQStored, engines[1] = true, stored, e
			})
			for i, e := range engines {
				if !e.flash() || (e.fw.dOrder.Ptr != 0) != (i == 0) {
					t.Fatalf("%s: flash.cu %v, an order given %v, want it given %v", preset, e.flash(), e.fw.dOrder.Ptr != 0, i == 0)
				}
			}
			if !sameFloats(ordered, plain) {
				t.Errorf("%s (stored dS %v): gradients with flash.cu's tiles ordered differ from without (relative %.3g)", preset, stored, relErr(ordered, plain))
			}
		}
	}
}

// TestEngineProductsPerLayer: in the bf16 mode with flash.cu a layer's
// forward issues 4 cuBLASLt products (q, k and v as one, o, gate and up
// as one, down) and its backward 10 (two a product: dx and dW; gate's and
// up's apart), q's, k's and v's one product each way: counted as the
// difference between one layer and two.
func TestEngineProductsPerLayer(t *testing.T) {
	dev := cudatest.Device(t)
	blas, err := dev.Blas()
	if err != nil {
		t.Fatal(err)
	}
	var fwd, bwd [2]int64
	for i, layers := range []int{1, 2} {
		_, _, _, e := enginePair(t, dev, "tiny-dense", layers, 200)
		if err := e.SetPrecision(BF16); err != nil {
			t.Fatal(err)
		}
		if !e.flash() {
			t.Fatal("the bf16 mode does not run flash.cu on tiny-dense")
		}
		r := rand.New(rand.NewPCG(7, 3))
		seqs := randomSeqs(r, 200, 30, 12)
		before := blas.Products()
		if _, err := e.Forward(seqs, train.ForwardOptions{Temperature: 0.9}); err != nil {
			t.Fatal(err)
		}
		fwd[i] = blas.Products() - before
		before = blas.Products()
		if err := e.Backward(randomLoss(r, seqs)); err != nil {
			t.Fatal(err)
		}
		bwd[i] = blas.Products() - before
	}
	if f, b := fwd[1]-fwd[0], bwd[1]-bwd[0]; f != 4 || b != 10 {
		t.Errorf("a layer's products: forward %d, backward %d; want 4 and 10", f, b)
	}
}

// TestEngineKeepLogits: the bf16 mode's backward from the logits its
// forward kept gives what it gives recomputing them, bit for bit (the
// same product of the same operands), log-probs, entropies and
// gradients, over several head chunks, dense and MoE; the kept logits go
// back to the device with the Backward, and a forward-only call keeps
// none.
func TestEngineKeepLogits(t *testing.T) {
	dev := cudatest.Device(t)
	for _, preset := range []string{"tiny-dense", "tiny-moe"} {
		var grads [2][]float32
		var res [2]*train.Result
		for i, keep := range []int{keepAlways, keepNever} {
			_, _, _, e := enginePair(t, dev, preset, 0, 200)
			if err := e.SetPrecision(BF16); err != nil {
				t.Fatal(err)
			}
			e.keepLogits, e.headChunkRows = keep, 7
			r := rand.New(rand.NewPCG(3, 8))
			seqs := randomSeqs(r, 200, 30, 12, 25)
			var err error
			if res[i], err = e.Forward(seqs, train.ForwardOptions{Temperature: 0.8}); err != nil {
				t.Fatal(err)
			}
			if kept := e.fw.logits.Ptr != 0; kept != (keep == keepAlways) {
				t.Fatalf("%s: logits kept %v with keepLogits %d", preset, kept, keep)
			}
			if err := e.Backward(randomLoss(r, seqs)); err != nil {
				t.Fatal(err)
			}
			if e.fw.logits.Ptr != 0 {
				t.Fatalf("%s: the kept logits outlived the Backward", preset)
			}
			if grads[i], err = e.Gradients(); err != nil {
				t.Fatal(err)
			}
			// A forward no backward follows keeps nothing, where the
			// engine decides (keepAuto).
			e.keepLogits = keepAuto
			if _, err := e.Forward(seqs, train.ForwardOptions{}); err != nil {
				t.Fatal(err)
			}
			if e.fw.logits.Ptr != 0 {
				t.Fatalf("%s: a forward-only call kept its logits", preset)
			}
		}
		for s := range res[0].LogProbs {
			if !sameFloats(res[0].LogProbs[s], res[1].LogProbs[s]) || !sameFloats(res[0].Entropy[s], res[1].Entropy[s]) {
				t.Fatalf("%s, sequence %d: log-probs or entropies differ with the logits kept", preset, s)
			}
		}
		if !sameFloats(grads[0], grads[1]) {
			t.Errorf("%s: gradients from the kept logits differ from recomputing them (relative %.3g)", preset, relErr(grads[0], grads[1]))
		}
	}
}

// TestEngineHeadChunks: how many token rows the LM head holds at once
// changes no log-prob or entropy (per-row kernels; in the float32 mode a
// batch-invariant product, so bit for bit), and the gradients only by the
// order in which the chunks add into the head's weight gradient (float32:
// 1e-5 relative; bf16: cuBLASLt picks its algorithm by shape, so within
// bf16 noise). Chunks of 7 rows against one chunk, over several sequences.
func TestEngineHeadChunks(t *testing.T) {
	dev := cudatest.Device(t)
	for _, prec := range []string{FP32, BF16} {
		t.Run(prec, func(t *testing.T) {
			_, _, _, one := enginePair(t, dev, "tiny-dense", 0, 300)
			_, _, _, chunked := enginePair(t, dev, "tiny-dense", 0, 300)
			for _, e := range []*Engine{one, chunked} {
				if err := e.SetPrecision(prec); err != nil {
					t.Fatal(err)
				}
			}
			chunked.headChunkRows = 7
			r := rand.New(rand.NewPCG(5, 6))
			seqs := randomSeqs(r, 300, 33, 7, 20, 2)
			fo := train.ForwardOptions{Temperature: 0.8}
			a, err := one.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			b, err := chunked.Forward(seqs, fo)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for s := range a.LogProbs {
				for i := range a.LogProbs[s] {
					for _, d := range []float32{a.LogProbs[s][i] - b.LogProbs[s][i], a.Entropy[s][i] - b.Entropy[s][i]} {
						worst = math.Max(worst, math.Abs(float64(d)))
					}
				}
			}
			limit := 0.0
			if prec == BF16 {
				limit = 1e-2
			}
			if worst > limit || math.IsNaN(worst) {
				t.Errorf("log-probs and entropies in chunks of 7 rows against one chunk: largest |Δ| %.3g, limit %g", worst, limit)
			}
			loss := randomLoss(r, seqs)
			for _, e := range []*Engine{one, chunked} {
				if err := e.Backward(loss); err != nil {
					t.Fatal(err)
				}
			}
			ga, err := one.Gradients()
			if err != nil {
				t.Fatal(err)
			}
			gb, err := chunked.Gradients()
			if err != nil {
				t.Fatal(err)
			}
			glimit := 1e-5
			if prec == BF16 {
				glimit = 1e-2
			}
			e := relErr(gb, ga)
			t.Logf("%s: log-probs largest |Δ| %.3g, gradients relative error %.3g", prec, worst, e)
			if e > glimit || math.IsNaN(e) {
				t.Errorf("gradients in chunks of 7 rows against one chunk: relative error %.3g, limit %g", e, glimit)
			}
		})
	}
}

// TestDecayRuns checks AdamW's launches (decayRun) by hand on tiny-moe:
// the runs tile the arena in order, neighbours differ in decay (else they
// would be one run), and each parameter lies in a run of its own kind.
func TestDecayRuns(t *testing.T) {
	cfg, err := model.Preset("tiny-moe", 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, vectors := range []bool{false, true} {
		m := model.New(cfg)
		e := &Engine{params: m.Params(), offs: map[*model.Param]int{}, optCfg: train.DefaultAdamWConfig()}
		e.optCfg.DecayVectors = vectors
		off := 0
		for _, p := range e.params {
			e.offs[p] = off
			off += p.Size()
		}
		runs := e.decayRuns()
		if vectors && len(runs) != 1 {
			t.Errorf("every parameter decays: %d runs, want 1", len(runs))
		}
		end := 0
		for i, r := range runs {
			if r.off != end || r.n <= 0 || (i > 0 && runs[i-1].decays == r.decays) {
				t.Fatalf("run %d %+v after %+v", i, r, runs[max(i-1, 0)])
			}
			end += r.n
		}
		if end != len(m.Arena) {
			t.Errorf("runs cover %d of %d elements", end, len(m.Arena))
		}
		for _, p := range e.params {
			o := e.offs[p]
			for _, r := range runs {
				if o >= r.off && o < r.off+r.n && r.decays != (vectors || len(p.Shape) > 1) {
					t.Errorf("%s in a run with decay %v", p.Name, r.decays)
				}
			}
		}
		if !vectors {
			t.Logf("tiny-moe: %d parameters, %d AdamW launches", len(e.params), len(runs))
		}
	}
}

// TestEnginePool: the engine's buffers come from its Pool, so a training
// step after the first allocates nothing on the device (every buffer is
// one the last step freed), and that changes no bit: three steps (forward,
// backward, AdamW step) give the same log-probs, gradient norms and
// weights with the Pool on and off (KEEL_CUDA_POOL=0), in both precisions.
func TestEnginePool(t *testing.T) {
	dev := cudatest.Device(t)
	for _, c := range []struct{ preset, prec string }{{"tiny-dense", BF16}, {"tiny-moe", FP32}, {"tiny-moe", BF16}} {
		t.Run(c.preset+"/"+c.prec, func(t *testing.T) {
			cfg, _ := model.Preset(c.preset, 200)
			m := model.New(cfg)
			model.Init(m, 5)
			r := rand.New(rand.NewPCG(8, 10))
			seqs := randomSeqs(r, 200, 30, 12, 50)
			loss := randomLoss(r, seqs)
			type stepOut struct {
				lp   [][]float32
				norm float64
			}
			run := func(pool string) ([]stepOut, []float32, []kc.PoolStats) {
				t.Setenv("KEEL_CUDA_POOL", pool)
				e, err := NewTrainer(dev, m, train.DefaultAdamWConfig(), nil)
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if err := e.SetPrecision(c.prec); err != nil {
					t.Fatal(err)
				}
				var outs []stepOut
				var stats []kc.PoolStats
				for range 3 {
					res, err := e.Forward(seqs, train.ForwardOptions{Temperature: 0.7})
					if err != nil {
						t.Fatal(err)
					}
					if err := e.Backward(loss); err != nil {
						t.Fatal(err)
					}
					norm, err := e.Step(1e-3, 1)
					if err != nil {
						t.Fatal(err)
					}
					outs = append(outs, stepOut{res.LogProbs, norm})
					stats = append(stats, e.pool.Stats())
				}
				w, err := e.Weights()
				if err != nil {
					t.Fatal(err)
				}
				return outs, w.Arena, stats
			}
			on, won, stats := run("1")
			off, woff, _ := run("0")
			for s := range on {
				if on[s].norm != off[s].norm {
					t.Errorf("step %d: gradient norm %v with the Pool, %v without", s+1, on[s].norm, off[s].norm)
				}
				for i := range on[s].lp {
					if !sameFloats(on[s].lp[i], off[s].lp[i]) {
						t.Fatalf("step %d, sequence %d: log-probs differ with the Pool", s+1, i)
					}
				}
			}
			if !sameFloats(won, woff) {
				t.Error("weights after three steps differ with the Pool")
			}
			if stats[0].Allocs == 0 || stats[2].Allocs != stats[0].Allocs || stats[2].Reuses <= stats[0].Reuses {
				t.Errorf("Pool after steps 1 and 3: %+v, %+v: want no new device allocation after the first step, and reuses", stats[0], stats[2])
			}
			t.Logf("Pool after step 1: %+v; after step 3: %+v", stats[0], stats[2])
		})
	}
}

// TestEngineRecomputeMore: recomputation's bits on the shapes
// TestEngineRecompute leaves out (dense and MoE layers in one model, a head
// size flash.cu does not take in the bf16 mode, the float32 mode of the
// mixed model), and two Backwards of one Forward give the same gradients,
// with recomputation and without (the kept attention outputs are read,
// never written, by a backward).
func TestEngineRecomputeMore(t *testing.T) {
	dev := cudatest.Device(t)
	mixed, _ := model.Preset("tiny-moe", 200)
	mixed.MlpOnlyLayers = []int{0, 2}
	hd16, _ := model.Preset("tiny-dense", 200)
	hd16.HeadDim = 16
	dense, _ := model.Preset("tiny-dense", 200)
	for _, c := range []struct {
		name string
		cfg  model.Config
		prec string
	}{{"mixed/bf16", mixed, BF16}, {"head-dim-16/bf16", hd16, BF16}, {"dense/bf16", dense, BF16}, {"mixed/fp32", mixed, FP32}} {
		t.Run(c.name, func(t *testing.T) {
			m := model.New(c.cfg)
			model.Init(m, 5)
			r := rand.New(rand.NewPCG(8, 9))
			seqs := randomSeqs(r, 200, 30, 12, 50)
			loss := randomLoss(r, seqs)
			var first, second [2][]float32
			var res [2]*train.Result
			for i, rc := range []bool{false, true} {
				e := recomputeTrainer(t, dev, m, c.prec, rc)
				var err error
				if res[i], err = e.Forward(seqs, train.ForwardOptions{Temperature: 0.7, Backward: true}); err != nil {
					t.Fatal(err)
				}
				for _, g := range []*[]float32{&first[i], &second[i]} {
					e.ZeroGrad()
					if err := e.Backward(loss); err != nil {
						t.Fatal(err)
					}
					if *g, err = e.Gradients(); err != nil {
						t.Fatal(err)
					}
				}
				e.Close()
			}
			for s := range res[0].LogProbs {
				if !sameFloats(res[0].LogProbs[s], res[1].LogProbs[s]) {
					t.Errorf("sequence %d: log-probs differ with recomputation", s)
				}
			}
			if !sameFloats(first[0], first[1]) {
				t.Error("gradients differ with recomputation")
			}
			if !sameFloats(first[0], second[0]) || !sameFloats(first[1], second[1]) {
				t.Errorf("a second Backward differs from the first (without recomputation: %v, with: %v)",
					!sameFloats(first[0], second[0]), !sameFloats(first[1], second[1]))
			}
		})
	}
}

// recomputeTrainer is a trainer of m on dev in precision prec with
// recomputation on or off.
func recomputeTrainer(t *testing.T, dev *kc.Device, m *model.Model, prec string, recompute bool) *Engine {
	t.Helper()
	e, err := NewTrainer(dev, m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.SetRecompute(recompute)
	if err := e.SetPrecision(prec); err != nil {
		t.Fatal(err)
	}
	return e
}
