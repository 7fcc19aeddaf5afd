package rollout

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/keel-rl/keel/model"
)

// cpuOf returns the CPU backend under an engine built by New (for tests
// that choose its forward path).
func cpuOf(e *Engine) *cpuBackend { return e.b.(*cpuBackend) }

// checkedBackend forwards to another Backend, counting the calls and
// checking that every StepBatch keeps the contract: rows within the
// limits, each slot's rows contiguous and in increasing position, each
// row's earlier positions cached for its slot (by an earlier step or a
// CopyPrefix) or earlier rows of the step, at most one output row per
// slot. It fails the step (failStep) or the load (failLoad) when told.
type checkedBackend struct {
	Backend
	t                      *testing.T
	steps, rows, copies    int
	loads                  int
	valid                  []int // per slot: positions computed for its sequence
	failStep, failLoad     error
	stepsLeft              int // with failStep: steps that succeed first
	seenSlot, seenOutSlots []bool
}

func newChecked(t *testing.T, b Backend) *checkedBackend {
	S := b.Options().Slots
	return &checkedBackend{Backend: b, t: t, valid: make([]int, S), seenSlot: make([]bool, S), seenOutSlots: make([]bool, S)}
}

func (c *checkedBackend) Step(b *StepBatch) error {
	if c.failStep != nil {
		if c.stepsLeft == 0 {
			return c.failStep
		}
		c.stepsLeft--
	}
	if err := c.check(b); err != nil {
		c.t.Error(err)
		return err
	}
	c.steps++
	c.rows += b.Rows()
	return c.Backend.Step(b)
}

// check verifies b against the StepBatch contract and advances valid.
func (c *checkedBackend) check(b *StepBatch) error {
	opt := c.Options()
	if b.Rows() > opt.StepRows || len(b.OutRow) > opt.Slots || len(b.Pos) != b.Rows() || len(b.Tok) != b.Rows() || len(b.OutTemp) != len(b.OutRow) {
		return fmt.Errorf("step %d: %d rows, %d output rows", c.steps, b.Rows(), len(b.OutRow))
	}
	clear(c.seenSlot)
	clear(c.seenOutSlots)
	for r, s := range b.Slot {
		p := int(b.Pos[r])
		if r > 0 && b.Slot[r-1] == s && b.Pos[r-1] != b.Pos[r]-1 {
			return fmt.Errorf("step %d row %d: slot %d position %d after %d", c.steps, r, s, p, b.Pos[r-1])
		}
		if c.seenSlot[s] && b.Slot[r-1] != s {
			return fmt.Errorf("step %d row %d: slot %d's rows are not contiguous", c.steps, r, s)
		}
		if p > c.valid[s] || p >= opt.MaxLen {
			return fmt.Errorf("step %d row %d: slot %d position %d, %d cached", c.steps, r, s, p, c.valid[s])
		}
		c.seenSlot[s] = true
		c.valid[s] = p + 1
	}
	for _, r := range b.OutRow {
		s := b.Slot[r]
		if c.seenOutSlots[s] {
			return fmt.Errorf("step %d: two output rows for slot %d", c.steps, s)
		}
		c.seenOutSlots[s] = true
	}
	return nil
}

func (c *checkedBackend) CopyPrefix(dst, src, n int) {
	if n > c.valid[src] || dst == src {
		c.t.Errorf("CopyPrefix(%d, %d, %d) with %d positions of slot %d computed", dst, src, n, c.valid[src], src)
	}
	c.valid[dst] = n
	c.copies++
	c.Backend.CopyPrefix(dst, src, n)
}

func (c *checkedBackend) Load(m *model.Model) error {
	c.loads++
	if c.failLoad != nil {
		return c.failLoad
	}
	return c.Backend.Load(m)
}

// checkedEngine builds an engine with NewWithBackend over a checkedBackend
// over the CPU backend.
func checkedEngine(t *testing.T, m *model.Model, opt Options) (*Engine, *checkedBackend) {
	t.Helper()
	cb, err := newCPUBackend(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	c := newChecked(t, cb)
	e, err := NewWithBackend(c)
	if err != nil {
		t.Fatal(err)
	}
	return e, c
}

// The batcher uses its backend through the Backend interface alone: over
// a wrapper of the CPU backend (its own sampling workers, every step
// checked against the StepBatch contract) Generate gives New's samples bit
// for bit, before and after a weight update, in every precision, for
// dense and MoE models, with prompt sharing, prefill in chunks,
// truncation and top log-probs.
func TestGenerateOverBackend(t *testing.T) {
	sps := []Sampling{
		{Temperature: 1, MaxNewTokens: 10, Seed: 4},
		{Temperature: 0.8, TopK: 5, TopP: 0.9, TopLogProbs: 3, MaxNewTokens: 9, Seed: 5, Stop: []int32{3}},
		{MaxNewTokens: 7},
	}
	for _, cfg := range []model.Config{denseConfig(), moeConfig()} {
		m, m2 := randomModel(cfg, 21), randomModel(cfg, 22)
		prompts := testPrompts(rand.New(rand.NewPCG(21, 21)), cfg.VocabSize, 9, 1, 14, 4, 6)
		for _, p := range []Precision{Exact, FP32, BF16, FP8, FP4} {
			t.Run(fmt.Sprintf("%d-experts/%s", cfg.NumExperts, p), func(t *testing.T) {
				opt := Options{Precision: p, Slots: 5, StepRows: 7, MaxLen: 32}
				ref, err := New(m, opt)
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				e, c := checkedEngine(t, m, opt)
				defer e.Close()
				if !reflect.DeepEqual(e.Options(), ref.Options()) || !reflect.DeepEqual(e.Config(), ref.Config()) {
					t.Fatalf("options %+v, want %+v", e.Options(), ref.Options())
				}
				for v, w := range []*model.Model{m, m2} {
					if v > 0 {
						for _, x := range []*Engine{ref, e} {
							if err := x.UpdateWeights(context.Background(), w, int64(v)); err != nil {
								t.Fatal(err)
							}
						}
					}
					for _, sp := range sps {
						want, err := ref.Generate(prompts, 3, sp)
						if err != nil {
							t.Fatal(err)
						}
						got, err := e.Generate(prompts, 3, sp)
						if err != nil {
							t.Fatal(err)
						}
						identical(t, got, want)
					}
				}
				if c.steps == 0 || c.copies == 0 || c.loads != 1 {
					t.Fatalf("%d steps, %d prefix copies, %d loads through the wrapper", c.steps, c.copies, c.loads)
				}
			})
		}
	}
}

// A backend's failures reach the caller: a failed step ends Generate with
// its error, and a failed load keeps the version and fails Generate until
// a load succeeds.
func TestBackendErrors(t *testing.T) {
	m := randomModel(moeConfig(), 23)
	e, c := checkedEngine(t, m, Options{Slots: 2, MaxLen: 16})
	defer e.Close()
	prompts := [][]int32{{1, 2, 3}, {4, 5}}
	sp := Sampling{Temperature: 1, MaxNewTokens: 6, Seed: 1}
	boom := errors.New("device lost")
	c.failStep, c.stepsLeft = boom, 2
	if _, err := e.Generate(prompts, 2, sp); !errors.Is(err, boom) {
		t.Fatalf("Generate over a failing step: err = %v", err)
	}
	c.failStep = nil
	want, err := e.Generate(prompts, 2, sp)
	if err != nil {
		t.Fatal(err)
	}
	c.failLoad = boom
	if err := e.UpdateWeights(context.Background(), m, 3); !errors.Is(err, boom) || e.Version() != 0 {
		t.Fatalf("failed load: err = %v, version %d", err, e.Version())
	}
	if _, err := e.Generate(prompts, 2, sp); !errors.Is(err, boom) {
		t.Fatalf("Generate after a failed load: err = %v", err)
	}
	c.failLoad = nil
	if err := e.UpdateWeights(context.Background(), m, 4); err != nil {
		t.Fatal(err)
	}
	got, err := e.Generate(prompts, 2, sp)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		want[i].Version = 4
	}
	identical(t, got, want)
	if _, err := NewWithBackend(nil); err == nil {
		t.Fatal("NewWithBackend(nil) accepted")
	}
}

// A Scheduler whose backend fails a step ends the requests in flight with
// the error and goes on serving the next ones.
func TestSchedulerBackendError(t *testing.T) {
	m := randomModel(moeConfig(), 24)
	e, c := checkedEngine(t, m, Options{Slots: 3, MaxLen: 24})
	defer e.Close()
	boom := errors.New("device lost")
	c.failStep, c.stepsLeft = boom, 3
	s := NewScheduler(e)
	defer s.Close()
	r := Request{Prompt: []int32{1, 2, 3, 4}, N: 2, Sampling: Sampling{Temperature: 1, MaxNewTokens: 8, Seed: 9}}
	if _, err := s.Do(context.Background(), r); !errors.Is(err, boom) {
		t.Fatalf("Do over a failing step: err = %v", err)
	}
	s.Pause()
	c.failStep = nil
	s.Continue()
	got, err := s.Do(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	want := generate(t, m, Options{Slots: 2, MaxLen: 24}, nil, [][]int32{r.Prompt}, r.N, r.Sampling)
	identical(t, got, want)
}

// drawingBackend is a Drawer over another backend: after its step it
// draws the rows the batcher asks it to by DrawRow, then spoils those
// rows' log-probabilities (NaN), as a GPU backend leaves them unwritten,
// so that a batcher that read them would sample garbage. badToken, when
// not 0, is drawn instead (a broken backend).
type drawingBackend struct {
	Backend
	drawn     int // rows drawn
	truncated int // rows drawn from a truncated distribution
	tops      int // rows whose top log-probabilities it reported
	badToken  int32
}

func (d *drawingBackend) Draws() bool { return true }

// drawerPair returns an engine over m with opt, and one over a
// drawingBackend over m's CPU backend with opt (and that backend), closed
// when the test ends.
func drawerPair(t *testing.T, m *model.Model, opt Options) (ref, e *Engine, d *drawingBackend) {
	t.Helper()
	ref, err := New(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ref.Close)
	cb, err := newCPUBackend(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	d = &drawingBackend{Backend: cb}
	if e, err = NewWithBackend(d); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return ref, e, d
}

func (d *drawingBackend) Step(b *StepBatch) error {
	if err := d.Backend.Step(b); err != nil {
		return err
	}
	V := d.Config().VocabSize
	for o, u := range b.Draw {
		if u < 0 {
			continue
		}
		z := b.LogProbs[o*V : (o+1)*V]
		if b.Truncates(o) && b.OutTemp[o] != 0 {
			b.Drawn[o], b.DrawnLP[o], b.DrawnTLP[o] = DrawTruncated(z, u, int(b.TopK[o]), b.TopP[o])
			d.truncated++
		} else {
			b.Drawn[o], b.DrawnLP[o] = DrawRow(z, u, b.OutTemp[o])
			b.DrawnTLP[o] = b.DrawnLP[o]
		}
		if n := int(b.TopN[o]); n > 0 {
			topTokens(b.Top[o*MaxTopLogProbs:o*MaxTopLogProbs+n], z)
			d.tops++
		}
		if d.badToken != 0 {
			b.Drawn[o] = d.badToken
		}
		for i := range z {
			z[i] = float32(math.NaN())
		}
		d.drawn++
	}
	return nil
}

// A backend that draws the tokens itself gives the batcher's own samples
// bit for bit: the same uniforms from the same streams, drawn by the same
// rule, for every policy (greedy, truncated and those that report top
// log-probabilities included, alone and mixed in a scheduler's steps);
// and a token out of the vocabulary is an error, not a panic.
func TestBackendDraws(t *testing.T) {
	for _, cfg := range []model.Config{denseConfig(), moeConfig()} {
		m := randomModel(cfg, 31)
		prompts := testPrompts(rand.New(rand.NewPCG(31, 31)), cfg.VocabSize, 9, 1, 14, 4, 6)
		ref, e, d := drawerPair(t, m, Options{Precision: FP8, Slots: 5, StepRows: 7, MaxLen: 40})
		for _, sp := range []Sampling{
			{Temperature: 1, MaxNewTokens: 10, Seed: 4},
			{Temperature: 0.7, MaxNewTokens: 8, Seed: 9, Stop: []int32{3}},
			{MaxNewTokens: 7},
			{Temperature: 0.8, TopK: 5, TopP: 0.9, MaxNewTokens: 9, Seed: 5},
			{Temperature: 1, TopLogProbs: 2, MaxNewTokens: 6, Seed: 6},
		} {
			before := d.drawn
			want, err := ref.Generate(prompts, 3, sp)
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.Generate(prompts, 3, sp)
			if err != nil {
				t.Fatal(err)
			}
			identical(t, got, want)
			if d.drawn == before {
				t.Fatalf("%+v: the backend drew no row", sp)
			}
		}
		reqs := mixedRequests(rand.New(rand.NewPCG(31, uint64(cfg.NumExperts))), cfg.VocabSize, 14)
		want := reference(t, m, FP8, reqs)
		s := NewScheduler(e)
		got, _ := serve(t, s, reqs)
		s.Close()
		for i := range reqs {
			identical(t, got[i], want[i])
		}
		if d.truncated == 0 || d.tops == 0 {
			t.Fatalf("%d truncated rows drawn, %d rows' top log-probabilities reported", d.truncated, d.tops)
		}
		d.badToken = int32(cfg.VocabSize)
		if _, err := e.Generate(prompts, 1, Sampling{Temperature: 1, MaxNewTokens: 3}); err == nil || !strings.Contains(err.Error(), "drew token") {
			t.Fatalf("a token out of the vocabulary: %v", err)
		}
	}
}

// DrawTruncated and NearTruncBoundary by hand: tokens in descending
// probability (1, 3, 2, 0; ties in id order), each cut alone and both, the
// draw against the kept total, and the boundaries of the cut and the draw.
func TestDrawTruncated(t *testing.T) {
	ln := func(p float64) float32 { return float32(math.Log(p)) }
	z := []float32{ln(0.1), ln(0.4), ln(0.2), ln(0.3)}
	for _, c := range []struct {
		k    int
		p, u float64
		want int32
		kept float64
	}{
		{2, 0, 0.5, 1, 0.7}, {2, 0, 0.6, 3, 0.7}, // 0.35 and 0.42 of 0.7
		{0, 0.65, 0.6, 3, 0.7}, {0, 0.75, 0.9, 2, 0.9}, {3, 0.5, 0.99, 3, 0.7},
		{4, 0, 0.95, 0, 1}, {0, 0.2, 0.99, 1, 0.4}, {1, 0, 0, 1, 0.4},
	} {
		tok, lp, tlp := DrawTruncated(z, c.u, c.k, c.p)
		if tok != c.want || lp != z[c.want] || math.Abs(float64(tlp)-math.Log(math.Exp(float64(lp))/c.kept)) > 1e-6 {
			t.Errorf("top-k %d top-p %v u %v: token %d (%v, truncated %v), want %d of a kept %v", c.k, c.p, c.u, tok, lp, tlp, c.want, c.kept)
		}
	}
	eq := []float32{ln(0.25), ln(0.25), ln(0.25), ln(0.25)}
	if tok, _, _ := DrawTruncated(eq, 0.7, 2, 0); tok != 1 { // 0.35 of tokens 0 and 1
		t.Errorf("equal log-probs, top-k 2: token %d, want 1", tok)
	}
	for _, c := range []struct {
		k    int
		p, u float64
		want bool
	}{
		{0, 0.7, 0.1, true},          // the top-p cut at 0.4 + 0.3
		{0, 0.65, 0.4 / 0.7, true},   // the draw at 0.4 of the kept 0.7
		{0, 0.65, 0.5, false},        // 0.35 of 0.7
		{2, 0.9, 0.4 / 0.7, true},    // top-k 2 keeps 0.7
		{3, 0, 0.4 / 0.9, true},      // top-k 3 keeps 0.9
		{3, 0, 0.4 / 0.7, false},     // 0.4/0.7 of 0.9: no boundary
		{0, 0.95, 0.0001, false},     // all kept: 0.0001 of 1
		{0, 0.95, 0.4 + 2e-7, true},  // within 1e-6 of 0.4
		{0, 0.95, 0.4 + 2e-5, false}, // not within
	} {
		if got := NearTruncBoundary(z, c.u, c.k, c.p); got != c.want {
			t.Errorf("NearTruncBoundary(top-k %d, top-p %v, u %v) = %v", c.k, c.p, c.u, got)
		}
	}
}

// DrawRow by hand: the inverse CDF in token order over exp(z), a token of
// probability 0 never drawn, and the argmax (lowest id first) at
// temperature 0.
func TestDrawRow(t *testing.T) {
	ln := func(p float64) float32 { return float32(math.Log(p)) }
	z := []float32{ln(0.25), float32(math.Inf(-1)), ln(0.5), ln(0.25)}
	for _, c := range []struct {
		u    float64
		want int32
	}{{0, 0}, {0.2499, 0}, {0.2501, 2}, {0.7499, 2}, {0.7501, 3}, {0.999999, 3}} {
		if got, lp := DrawRow(z, c.u, 1); got != c.want || lp != z[c.want] {
			t.Errorf("u %v: token %d (%v), want %d", c.u, got, lp, c.want)
		}
	}
	// The boundaries of z's inverse CDF lie at 0.25 (after token 0) and
	// 0.75 (after token 2).
	for _, c := range []struct {
		u    float64
		i    int32
		want bool
	}{{0.25, 0, true}, {0.2500001, 0, true}, {0.3, 0, false}, {0.75, 2, true}, {0.75, 0, false}} {
		if got := NearDrawBoundary(z, c.u, c.i); got != c.want {
			t.Errorf("NearDrawBoundary(u %v, token %d) = %v", c.u, c.i, got)
		}
	}
	if got, _ := DrawRow([]float32{-2, -0.5, -0.5, -3}, 0.9, 0); got != 1 {
		t.Errorf("greedy: token %d, want 1", got)
	}
}
