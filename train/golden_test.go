package train

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/safetensors"
)

// goldenCase is one case written by tools/torchref/make_goldens.py: an
// independent PyTorch implementation of Qwen3 / Qwen3-MoE in float64.
type goldenCase struct {
	Tokens    [][]int32     `json:"tokens"`
	Coef      [][]float32   `json:"coef"`
	EntCoef   [][]float32   `json:"ent_coef"`
	AuxWeight float64       `json:"aux_weight"`
	Replay    [][][][]int32 `json:"replay"` // [seq][pos][moe layer][k]
	LogProbs  [][]float64   `json:"logprobs"`
	Entropy   [][]float64   `json:"entropy"`
	Routes    [][][][]int32 `json:"routes"`
	AuxLoss   float64       `json:"aux_loss"`
	Differ    *float64      `json:"replay_differs_from_live"`
}

func nestedRoutes(r [][][]int32, layers, k, experts int) *model.Routes {
	out := model.NewRoutes(len(r), layers, k, experts)
	for t := range r {
		for l := range r[t] {
			out.SetSlots(t, l, r[t][l])
		}
	}
	return out
}

// TestGoldenTorch holds the training engine to the PyTorch reference:
// log-probs and entropies within 1e-5, the aux loss within 1e-6 relative,
// live routes identical, and every gradient tensor within 1e-4 of the
// reference relative to that tensor's largest entry.
func TestGoldenTorch(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join("testdata", "golden", "*"))
	if len(dirs) == 0 {
		t.Fatal("no golden files in testdata/golden (tools/torchref/make_goldens.py writes them)")
	}
	for _, dir := range dirs {
		cases, _ := filepath.Glob(filepath.Join(dir, "case-*.json"))
		for _, cpath := range cases {
			name := filepath.Base(dir) + "/" + strings.TrimSuffix(strings.TrimPrefix(filepath.Base(cpath), "case-"), ".json")
			t.Run(name, func(t *testing.T) { checkGolden(t, dir, cpath) })
		}
	}
}

func checkGolden(t *testing.T, dir, cpath string) {
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cpath)
	if err != nil {
		t.Fatal(err)
	}
	var gc goldenCase
	if err := json.Unmarshal(b, &gc); err != nil {
		t.Fatal(err)
	}
	c := m.Config
	layers := len(c.MoELayers())
	opt := ForwardOptions{Record: layers > 0}
	if gc.Replay != nil {
		if gc.Differ == nil || *gc.Differ < 0.3 {
			t.Fatalf("replayed routes should differ from the live ones on a good share of tokens (%v)", gc.Differ)
		}
		for _, r := range gc.Replay {
			opt.Replay = append(opt.Replay, nestedRoutes(r, layers, c.NumExpertsPerTok, c.NumExperts))
		}
	}
	e := New(m)
	res, err := e.Forward(gc.Tokens, opt)
	if err != nil {
		t.Fatal(err)
	}
	var lpErr, gradErr float64
	for s := range gc.LogProbs {
		for i, want := range gc.LogProbs[s] {
			lpErr = math.Max(lpErr, math.Abs(float64(res.LogProbs[s][i])-want))
			if d := math.Abs(float64(res.LogProbs[s][i]) - want); d > 1e-5 {
				t.Errorf("seq %d token %d: log-prob %v, reference %v", s, i, res.LogProbs[s][i], want)
			}
			if d := math.Abs(float64(res.Entropy[s][i]) - gc.Entropy[s][i]); d > 1e-5 {
				t.Errorf("seq %d token %d: entropy %v, reference %v", s, i, res.Entropy[s][i], gc.Entropy[s][i])
			}
		}
		if layers > 0 {
			want := routeIDs(nestedRoutes(gc.Routes[s], layers, c.NumExpertsPerTok, c.NumExperts))
			got := routeIDs(res.Routes[s])
			for j := range want {
				if got[j] != want[j] {
					t.Errorf("seq %d: route %d is %d, reference %d", s, j, got[j], want[j])
					break
				}
			}
		}
	}
	if d := math.Abs(res.AuxLoss - gc.AuxLoss); d > 1e-6*math.Max(1, math.Abs(gc.AuxLoss)) {
		t.Errorf("aux loss %v, reference %v", res.AuxLoss, gc.AuxLoss)
	}
	e.ZeroGrad()
	if err := e.Backward(Loss{LogProb: gc.Coef, Entropy: gc.EntCoef, Aux: gc.AuxWeight}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(strings.TrimSuffix(cpath, ".json") + ".grads.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checked := 0
	for i, p := range e.Grad.Params() {
		if c.TieWordEmbeddings && p == e.Grad.LMHead && p != e.Grad.Embed {
			continue
		}
		name := m.Params()[i].Name
		info, ok := f.Info(name)
		if !ok {
			if name == "lm_head.weight" && c.TieWordEmbeddings {
				continue
			}
			t.Fatalf("reference has no gradient for %s", name)
		}
		ref := make([]float32, info.NumElements())
		if err := f.ReadFloat32(name, ref); err != nil {
			t.Fatal(err)
		}
		var scale, worst float64
		for _, v := range ref {
			scale = math.Max(scale, math.Abs(float64(v)))
		}
		for j, v := range ref {
			worst = math.Max(worst, math.Abs(float64(p.Data[j])-float64(v)))
		}
		if scale > 0 {
			gradErr = math.Max(gradErr, worst/scale)
		}
		if worst > 1e-4*scale || scale == 0 && worst > 0 {
			t.Errorf("%s: gradient differs by %.3g (relative to max %.3g: %.3g)", name, worst, scale, worst/scale)
		}
		checked++
	}
	t.Logf("max |log-prob error| %.2g, max relative gradient error %.2g over %d tensors", lpErr, gradErr, checked)
	if checked != len(f.Tensors()) {
		t.Errorf("checked %d gradient tensors of the reference's %d", checked, len(f.Tensors()))
	}
}
