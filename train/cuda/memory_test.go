package cuda

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/keel-rl/keel/internal/cudatest"
	kc "github.com/keel-rl/keel/kernels/cuda"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/train"
	"github.com/keel-rl/keel/train/memplan"
)

func TestCheckActivations(t *testing.T) {
	cfg, err := model.Preset("qwen3-0.6b", 151936)
	if err != nil {
		t.Fatal(err)
	}
	for _, prec := range []string{FP32, BF16} {
		if err := checkActivations(&cfg, 2048, 80<<30, prec, false); err != nil {
			t.Errorf("%s: 2048 tokens in 80 GiB: %v", prec, err)
		}
		err = checkActivations(&cfg, 65536, 8<<30, prec, false)
		if err == nil || !strings.Contains(err.Error(), "65536 tokens") || !strings.Contains(err.Error(), "turn on train.recompute") {
			t.Errorf("%s: 65536 tokens in 8 GiB: %v", prec, err)
		}
		// Recomputation keeps one layer's activations: 16384 tokens need
		// several times less.
		if checkActivations(&cfg, 16384, 20<<30, prec, false) == nil {
			t.Errorf("%s: 16384 tokens without recompute fit 20 GiB?", prec)
		}
		if err := checkActivations(&cfg, 16384, 20<<30, prec, true); err != nil {
			t.Errorf("%s: 16384 tokens with recompute in 20 GiB: %v", prec, err)
		}
		// The check asks exactly for the plan's activations (the
		// backward's head scratch and layer gradients counted as the plan
		// counts them, the larger only).
		for _, rc := range []bool{false, true} {
			p, err := memplan.Plan(&cfg, memplan.Shape{Seqs: 1, SeqLen: 16384}, memplan.Mode{Precision: prec, Recompute: rc})
			if err != nil {
				t.Fatal(err)
			}
			need := p.Activations()
			if err := checkActivations(&cfg, 16384, need, prec, rc); err != nil {
				t.Errorf("%s, recompute %v: the plan's %d bytes refused: %v", prec, rc, need, err)
			}
			if checkActivations(&cfg, 16384, need-1, prec, rc) == nil {
				t.Errorf("%s, recompute %v: a byte less than the plan's %d accepted", prec, rc, need)
			}
		}
		if err := checkActivations(&cfg, 0, 1<<30, prec, false); err == nil {
			t.Errorf("%s: zero tokens accepted", prec)
		}
	}
	// The bf16 mode keeps its activations in 2 bytes where fp32 keeps 4:
	// 8 × 2048 tokens need some 30 GiB in bf16 and 40 in fp32 (the
	// plans' activations, train/memplan).
	if err := checkActivations(&cfg, 8*2048, 33<<30, BF16, false); err != nil {
		t.Errorf("bf16: 16384 tokens in 33 GiB: %v", err)
	}
	if checkActivations(&cfg, 8*2048, 33<<30, FP32, false) == nil {
		t.Error("fp32: 16384 tokens fit in 33 GiB?")
	}
}

// TestCheckActivationsBenchRows: the rows tools/gpu/check.sh times on an
// 80 GB card pass the engine's memory check with room for the model, in
// both precisions: the Qwen3-0.6B shape at 8 × 2048 tokens, and at 2 ×
// 16384 with recomputation.
func TestCheckActivationsBenchRows(t *testing.T) {
	cfg, err := model.Preset("qwen3-0.6b", 151936)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tokens    int
		recompute bool
	}{{8 * 2048, false}, {2 * 16384, true}} {
		for _, prec := range []string{FP32, BF16} {
			p, err := memplan.Plan(&cfg, memplan.Shape{Seqs: 1, SeqLen: c.tokens}, memplan.Mode{Precision: prec, Recompute: c.recompute})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s, %d tokens, recompute %v: plan %.1f GiB", prec, c.tokens, c.recompute, float64(p.Total())/(1<<30))
			if err := checkActivations(&cfg, c.tokens, 60<<30, prec, c.recompute); err != nil {
				t.Errorf("%s: %d tokens (recompute %v) in 60 GiB: %v", prec, c.tokens, c.recompute, err)
			}
		}
	}
}

// The plan's copies of the engine's rules agree with the engine's.
func TestPlanRules(t *testing.T) {
	for hd := 1; hd <= 512; hd++ {
		if memplan.FlashHeadDim(hd) != kc.FlashHeadDim(hd) {
			t.Errorf("head_dim %d: memplan says flash %v, kernels/cuda %v", hd, memplan.FlashHeadDim(hd), kc.FlashHeadDim(hd))
		}
	}
	if memplan.WorkspaceBytes != kc.BlasWorkspaceBytes {
		t.Errorf("memplan's cuBLASLt workspace %d, kernels/cuda's %d", memplan.WorkspaceBytes, kc.BlasWorkspaceBytes)
	}
	for _, T := range []int{1, 63, 64, 65, 127, 128, 129, 16384, 16385} {
		if got, want := memplan.FlashOrderInts(int64(T)), kc.FlashOrderLen(T); got != int64(want) {
			t.Errorf("%d tokens: memplan counts %d ints of flash.cu's order, kernels/cuda %d", T, got, want)
		}
	}
}

// TestEnginePlan holds train/memplan's plan to what the engine allocates
// in a forward and backward: the Pool's peak (the bytes asked for) plus
// the bf16 products' operand scratch never exceeds the plan's
// activations, and falls short of them by no more than the replayed
// routes (counted, though nothing is replayed here) and 0.1%. On the
// emulator, which allocates nothing for modules or libraries, the
// memory the engine holds after a step besides the Pool's and the
// scratch is the plan's model-sized items exactly.
func TestEnginePlan(t *testing.T) {
	dev := cudatest.Device(t)
	if _, err := dev.Blas(); err != nil { // the device's cuBLASLt handle exists before the baseline
		t.Fatal(err)
	}
	mixed, _ := model.Preset("tiny-moe", 300)
	mixed.MlpOnlyLayers = []int{0, 2}
	noFlash, _ := model.Preset("tiny-dense", 300)
	noFlash.HeadDim = 16 // not a flash.cu head size: the bf16 mode's attention in fp32
	dense, _ := model.Preset("tiny-dense", 300)
	untied, _ := model.Preset("small-moe", 300)
	untied.NumHiddenLayers = 2
	for _, c := range []struct {
		name string
		cfg  model.Config
		lens []int
	}{{"tiny-dense", dense, []int{64, 64}}, {"tiny-dense/padded", dense, []int{30, 50, 7}}, {"head-dim-16", noFlash, []int{40, 41}},
		{"mixed-moe", mixed, []int{50, 45}}, {"small-moe", untied, []int{64, 33}}} {
		for _, prec := range []string{FP32, BF16} {
			for _, rc := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/recompute=%v", c.name, prec, rc), func(t *testing.T) {
					enginePlan(t, dev, c.cfg, c.lens, prec, rc)
				})
			}
		}
	}
}

func enginePlan(t *testing.T, dev *kc.Device, cfg model.Config, lens []int, prec string, rc bool) {
	free0, _, err := dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	m := model.New(cfg)
	model.Init(m, 3)
	e, err := NewTrainer(dev, m, train.DefaultAdamWConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.SetPrecision(prec); err != nil {
		t.Fatal(err)
	}
	e.SetRecompute(rc)
	e.keepLogits = keepNever // kept logits are outside the plan (headKeeps sizes them from what is free)
	r := rand.New(rand.NewPCG(1, 2))
	seqs := randomSeqs(r, cfg.VocabSize, lens...)
	loss := randomLoss(r, seqs)
	step := func() int64 {
		e.ResetPeak()
		if _, err := e.Forward(seqs, train.ForwardOptions{Backward: true}); err != nil {
			t.Fatal(err)
		}
		if err := e.Backward(loss); err != nil {
			t.Fatal(err)
		}
		asked, held := e.PeakActivations()
		if held < asked {
			t.Errorf("the Pool holds %d bytes for %d asked", held, asked)
		}
		return asked
	}
	peak := step()
	T := 0
	for _, n := range lens {
		T += n
	}
	p, err := memplan.Plan(&cfg, memplan.Shape{Seqs: 1, SeqLen: T}, memplan.Mode{Precision: prec, Recompute: rc})
	if err != nil {
		t.Fatal(err)
	}
	item := func(prefix string) int64 {
		for _, it := range p.Items {
			if strings.HasPrefix(it.Name, prefix) {
				return it.Bytes
			}
		}
		return 0
	}
	slack := item("MoE replayed routes") + peak/1000
	plan := p.Activations()
	t.Logf("%d tokens: engine %d bytes, plan %d (+%d; allowed %d)", T, peak, plan, plan-peak, slack)
	if plan < peak {
		t.Errorf("the engine took %d bytes, %d more than the plan's %d:\n%s", peak, peak-plan, plan, p)
	} else if plan-peak > slack {
		t.Errorf("the plan's %d bytes exceed the engine's %d by %d, more than the %d it may:\n%s", plan, peak, plan-peak, slack, p)
	}

	if prec == BF16 && !rc {
		// Logits kept for the backward count whole in PeakActivations
		// (an upper bound: the backward then makes no chunk of its own).
		e.keepLogits = keepAlways
		kept := step()
		if e.keptPeak != int64(T*cfg.VocabSize*4) || kept <= peak {
			t.Errorf("with kept logits: %d bytes kept (want %d), peak %d (without %d)", e.keptPeak, T*cfg.VocabSize*4, kept, peak)
		}
		e.keepLogits = keepNever
	}

	if _, err := e.Step(1e-3, 1); err != nil {
		t.Fatal(err)
	}
	if !dev.Emulated {
		return
	}
	free, _, err := dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	st := e.pool.Stats()
	held := free0 - free - st.InUse - st.Cached - e.scratchHeld() - 3*e.rope.cos.Size // the RoPE tables: cos, sin, -sin
	var fixed int64
	for _, it := range p.Items {
		if !it.Batch {
			fixed += it.Bytes
		}
	}
	if prec == BF16 {
		fixed -= memplan.WorkspaceBytes // made before free0
	}
	if held != fixed {
		t.Errorf("after a step the engine holds %d bytes besides the Pool's and the scratch; the plan's model-sized items (less the workspace) are %d", held, fixed)
	}
}
