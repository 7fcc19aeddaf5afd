package rl

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/run"
)

// Remote rollout is tested against fake servers that speak SGLang's native
// API (what keel serve speaks) and vLLM's over keel's own rollout engine:
// one Generate call per request, serialised, with the request's seed as the
// one-prompt call's seed. Faults are injected into their answers.

// remoteMoEConfig has a dense layer between MoE layers (mlp_only_layers),
// so that SGLang's routes, laid out per model layer, must be mapped to the
// MoE layers.
func remoteMoEConfig() model.Config {
	return model.Config{
		Architecture: model.ArchQwen3MoE, VocabSize: 41, HiddenSize: 32, IntermediateSize: 40,
		NumHiddenLayers: 3, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 8,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 128,
		NumExperts: 6, NumExpertsPerTok: 2, MoeIntermediateSize: 24, NormTopKProb: true,
		DecoderSparseStep: 1, MlpOnlyLayers: []int{1}, TieWordEmbeddings: true,
	}
}

// fakeParams is SGLang's sampling_params as keel sends them (unknown
// fields are refused, so keel sends nothing SGLang would not take).
type fakeParams struct {
	Temperature       float64 `json:"temperature"`
	TopP              float64 `json:"top_p"`
	TopK              int     `json:"top_k"`
	MinP              float64 `json:"min_p"`
	RepetitionPenalty float64 `json:"repetition_penalty"`
	FrequencyPenalty  float64 `json:"frequency_penalty"`
	PresencePenalty   float64 `json:"presence_penalty"`
	MaxNewTokens      int     `json:"max_new_tokens"`
	StopTokenIDs      []int32 `json:"stop_token_ids"`
	NoStopTrim        bool    `json:"no_stop_trim"`
	N                 int     `json:"n"`
	SamplingSeed      uint64  `json:"sampling_seed"`
	// IgnoreEOS: keel serve stops at the model's end tokens unless told
	// (kind keel must send it); SGLang's turns stop_token_ids off too
	// (kind sglang must not).
	IgnoreEOS bool `json:"ignore_eos"`
}

func (p *fakeParams) sampling() rollout.Sampling {
	return rollout.Sampling{Temperature: p.Temperature, TopK: max(p.TopK, 0), TopP: p.TopP,
		MaxNewTokens: p.MaxNewTokens, Stop: p.StopTokenIDs, Seed: p.SamplingSeed}
}

// fakeServer speaks SGLang's native RL API over an in-process engine.
type fakeServer struct {
	t   testing.TB
	url string
	cfg model.Config

	mu        sync.Mutex
	eng       *rollout.Engine
	weights   *model.Model // the weights loaded last
	version   string
	loaded    []string // model_path of every update
	paused    bool
	generates int      // /generate requests received
	batches   []int    // samples per /generate request
	calls     []string // control endpoints, in order

	// Faults.
	dieAfter  int    // > 0: every /generate request after this many fails
	dieMode   string // "close" (the connection is dropped) or "500"
	status    int    // answers /generate with this status
	failPush  bool   // update_weights_from_disk answers success false
	tamper    func(outs []map[string]any)
	rawBody   func(b []byte) []byte
	sglRoutes bool // routes of T-1 positions, as SGLang (keel serve sends all T)
}

func newFakeServer(t testing.TB, m *model.Model) *fakeServer {
	t.Helper()
	eng, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	f := &fakeServer{t: t, cfg: m.Config, eng: eng, weights: m, version: "default"}
	ts := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(ts.Close)
	f.url = ts.URL
	return f
}

func (f *fakeServer) set(fn func(f *fakeServer)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// strictJSON decodes a request body refusing unknown fields.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func (f *fakeServer) serve(w http.ResponseWriter, req *http.Request) {
	body := new(bytes.Buffer)
	body.ReadFrom(req.Body)
	switch req.Method + " " + req.URL.Path {
	case "POST /generate":
		f.generate(w, body.Bytes())
	case "POST /pause_generation":
		var p struct {
			Mode string `json:"mode"`
		}
		if err := strictJSON(body.Bytes(), &p); err != nil || p.Mode != "abort" {
			writeJSON(w, 400, map[string]any{"error": fmt.Sprint("bad pause ", err, p.Mode)})
			return
		}
		f.set(func(f *fakeServer) { f.paused = true; f.calls = append(f.calls, "pause") })
		writeJSON(w, 200, map[string]any{"message": "Generation paused successfully."})
	case "POST /continue_generation":
		f.set(func(f *fakeServer) { f.paused = false; f.calls = append(f.calls, "continue") })
		writeJSON(w, 200, map[string]any{"message": "Generation continued successfully."})
	case "POST /update_weights_from_disk":
		f.update(w, body.Bytes())
	case "GET /get_model_info":
		f.mu.Lock()
		info := map[string]any{"model_path": "fake", "tokenizer_path": "fake", "is_generation": true, "weight_version": f.version}
		f.mu.Unlock()
		writeJSON(w, 200, info)
	case "GET /health":
		w.WriteHeader(200)
	default:
		http.NotFound(w, req)
	}
}

func (f *fakeServer) update(w http.ResponseWriter, body []byte) {
	var p struct {
		ModelPath     string `json:"model_path"`
		WeightVersion string `json:"weight_version"`
		FlushCache    bool   `json:"flush_cache"`
	}
	fail := func(msg string) {
		writeJSON(w, 400, map[string]any{"success": false, "message": msg, "num_paused_requests": 0})
	}
	if err := strictJSON(body, &p); err != nil {
		fail(err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failPush {
		fail("Failed to get weights iterator: injected fault")
		return
	}
	if !f.paused {
		f.calls = append(f.calls, "update-while-running")
	}
	m, err := model.Load(p.ModelPath)
	if err != nil {
		fail(err.Error())
		return
	}
	v, err := strconv.ParseInt(p.WeightVersion, 10, 64)
	if err != nil {
		fail(err.Error())
		return
	}
	if err := f.eng.UpdateWeights(m, v); err != nil {
		fail(err.Error())
		return
	}
	f.weights, f.version = m, p.WeightVersion
	f.loaded = append(f.loaded, p.ModelPath)
	f.calls = append(f.calls, "update")
	writeJSON(w, 200, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
}

func (f *fakeServer) generate(w http.ResponseWriter, body []byte) {
	var req struct {
		InputIDs            json.RawMessage `json:"input_ids"`
		SamplingParams      json.RawMessage `json:"sampling_params"`
		ReturnLogprob       bool            `json:"return_logprob"`
		ReturnSamplingMask  bool            `json:"return_sampling_mask"`
		ReturnRoutedExperts bool            `json:"return_routed_experts"`
		Stream              bool            `json:"stream"`
	}
	if err := strictJSON(body, &req); err != nil {
		writeJSON(w, 400, map[string]any{"error": err.Error()})
		return
	}
	f.mu.Lock()
	f.generates++
	die := f.dieAfter > 0 && f.generates > f.dieAfter
	mode, status, paused := f.dieMode, f.status, f.paused
	f.mu.Unlock()
	switch {
	case die && mode == "close":
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case die:
		http.Error(w, "Internal Server Error", 500)
		return
	case status != 0:
		writeJSON(w, status, map[string]any{"error": map[string]any{"message": "injected", "code": status}})
		return
	case paused:
		writeJSON(w, 503, map[string]any{"error": "paused"})
		return
	}
	// One prompt with its n samples (keel), or a batch of prompts, one
	// sample each (SGLang's own n > 1 shares one seed).
	type one struct {
		ids []int32
		n   int
		p   fakeParams
	}
	var jobs []one
	var single []int32
	var batch [][]int32
	var p1 fakeParams
	var ps []fakeParams
	switch {
	case json.Unmarshal(req.InputIDs, &single) == nil && strictJSON(req.SamplingParams, &p1) == nil:
		if !p1.IgnoreEOS {
			writeJSON(w, 400, map[string]any{"error": "kind keel without ignore_eos: keel serve would stop at <|endoftext|> too"})
			return
		}
		jobs = []one{{single, max(p1.N, 1), p1}}
	case json.Unmarshal(req.InputIDs, &batch) == nil && strictJSON(req.SamplingParams, &ps) == nil && len(batch) == len(ps):
		for k := range batch {
			if ps[k].N > 1 {
				writeJSON(w, 400, map[string]any{"error": "n with a batch"})
				return
			}
			if ps[k].IgnoreEOS {
				writeJSON(w, 400, map[string]any{"error": "ignore_eos: SGLang would ignore stop_token_ids"})
				return
			}
			jobs = append(jobs, one{batch[k], 1, ps[k]})
		}
	default:
		writeJSON(w, 400, map[string]any{"error": "bad input_ids or sampling_params"})
		return
	}
	if !req.ReturnLogprob || req.Stream {
		writeJSON(w, 400, map[string]any{"error": "keel asks for log-probs, unstreamed"})
		return
	}
	var outs []map[string]any
	f.mu.Lock()
	for _, jb := range jobs {
		res, err := f.eng.Generate([][]int32{jb.ids}, jb.n, jb.p.sampling())
		if err != nil {
			f.mu.Unlock()
			writeJSON(w, 400, map[string]any{"error": err.Error()})
			return
		}
		for _, s := range res {
			outs = append(outs, f.output(jb.ids, jb.p, s, req.ReturnSamplingMask, req.ReturnRoutedExperts))
		}
	}
	f.batches = append(f.batches, len(outs))
	tamper, raw := f.tamper, f.rawBody
	f.mu.Unlock()
	if tamper != nil {
		tamper(outs)
	}
	var v any = outs
	if len(jobs) == 1 && single != nil && len(outs) == 1 {
		v = outs[0]
	}
	b, _ := json.Marshal(v)
	if raw != nil {
		b = raw(b)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// output is one sample as SGLang's /generate returns it (called with
// f.mu held).
func (f *fakeServer) output(prompt []int32, p fakeParams, s rollout.Sample, mask, routes bool) map[string]any {
	lps := make([]any, len(s.Tokens))
	for t, id := range s.Tokens {
		lps[t] = []any{s.LogProbs[t], id, nil}
	}
	fin := map[string]any{"type": s.Finish}
	if s.Finish == "stop" {
		fin["matched"] = s.Tokens[len(s.Tokens)-1]
	} else {
		fin["length"] = p.MaxNewTokens
	}
	meta := map[string]any{
		"id": fmt.Sprintf("%032x", f.generates), "finish_reason": fin, "prompt_tokens": len(prompt),
		"weight_version": f.version, "output_token_logprobs": lps, "completion_tokens": len(s.Tokens),
		"cached_tokens": 0, "e2e_latency": 0.01,
	}
	if mask && s.TruncLogProbs != nil {
		meta["output_token_sampling_logprobs"] = s.TruncLogProbs
		sup := make([][]int32, len(s.Tokens))
		for t, id := range s.Tokens {
			sup[t] = []int32{id}
		}
		meta["output_token_sampling_mask"] = sup
	}
	if routes && s.Routes != nil {
		rows := s.Routes.Tokens
		if f.sglRoutes {
			rows--
		}
		meta["routed_experts"] = encodeRoutes(s.Routes, f.cfg, rows)
	}
	return map[string]any{"text": "", "output_ids": s.Tokens, "meta_info": meta}
}

// encodeRoutes writes routes as SGLang does: base64 of little-endian int32
// [rows][num_hidden_layers][k], dense layers' entries 0.
func encodeRoutes(rt *model.Routes, c model.Config, rows int) string {
	L, K := c.NumHiddenLayers, c.NumExpertsPerTok
	b := make([]byte, rows*L*K*4)
	for t := 0; t < rows; t++ {
		for ml, li := range c.MoELayers() {
			for s := 0; s < K; s++ {
				binary.LittleEndian.PutUint32(b[((t*L+li)*K+s)*4:], uint32(rt.At(t, ml, s)))
			}
		}
	}
	return base64.StdEncoding.EncodeToString(b)
}

func (f *fakeServer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.generates
}

func urls(fs ...*fakeServer) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.url)
	}
	return out
}

// events collects a sampler's events.
type events struct {
	mu  sync.Mutex
	msg []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.msg = append(e.msg, s)
}

func (e *events) all() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.msg, "\n")
}

func newRemote(t testing.TB, opt RemoteOptions) *RemoteSampler {
	t.Helper()
	if opt.Kind == "" {
		opt.Kind = ServerKeel
	}
	if opt.WeightsDir == "" {
		opt.WeightsDir = t.TempDir()
	}
	r, err := NewRemoteSampler(opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func randomPrompts(seed uint64, n, vocab int) [][]int32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([][]int32, n)
	for i := range out {
		out[i] = make([]int32, 2+rng.IntN(6))
		for j := range out[i] {
			out[i][j] = int32(2 + rng.IntN(vocab-2))
		}
	}
	return out
}

// sameSamples compares two sample lists bit for bit.
func sameSamples(t *testing.T, what string, a, b []rollout.Sample) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d samples vs %d", what, len(a), len(b))
	}
	bits := func(x []float32) []uint32 {
		if x == nil {
			return nil
		}
		out := make([]uint32, len(x))
		for i, v := range x {
			out[i] = math.Float32bits(v)
		}
		return out
	}
	for i := range a {
		x, y := &a[i], &b[i]
		switch {
		case x.Prompt != y.Prompt || x.Index != y.Index:
			t.Fatalf("%s: sample %d is (%d, %d) vs (%d, %d)", what, i, x.Prompt, x.Index, y.Prompt, y.Index)
		case !slices.Equal(x.Tokens, y.Tokens):
			t.Fatalf("%s: sample %d tokens %v vs %v", what, i, x.Tokens, y.Tokens)
		case !slices.Equal(bits(x.LogProbs), bits(y.LogProbs)):
			t.Fatalf("%s: sample %d log-probs %v vs %v", what, i, x.LogProbs, y.LogProbs)
		case !slices.Equal(bits(x.TruncLogProbs), bits(y.TruncLogProbs)):
			t.Fatalf("%s: sample %d truncated log-probs %v vs %v", what, i, x.TruncLogProbs, y.TruncLogProbs)
		case (x.Routes == nil) != (y.Routes == nil) || (x.Routes != nil && !x.Routes.Equal(y.Routes)):
			t.Fatalf("%s: sample %d routes differ", what, i)
		case x.Finish != y.Finish || x.Version != y.Version:
			t.Fatalf("%s: sample %d finish %s / version %d vs %s / %d", what, i, x.Finish, x.Version, y.Finish, y.Version)
		}
	}
}

// PromptSeed gives a one-prompt Generate the samples of that prompt in a
// many-prompt call, bit for bit; any other seed does not.
func TestRemotePromptSeed(t *testing.T) {
	m := testmodel.Random(remoteMoEConfig(), 3)
	eng, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	prompts := randomPrompts(4, 6, 41)
	for _, sp := range []rollout.Sampling{
		{Temperature: 1, MaxNewTokens: 12, Stop: []int32{1}, Seed: 77},
		{Temperature: 0.7, TopK: 5, TopP: 0.9, MaxNewTokens: 9, Seed: 1 << 63},
	} {
		all, err := eng.Generate(prompts, 3, sp)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range prompts {
			one := sp
			one.Seed = rollout.PromptSeed(sp.Seed, i)
			got, err := eng.Generate([][]int32{p}, 3, one)
			if err != nil {
				t.Fatal(err)
			}
			for k := range got {
				got[k].Prompt = i
			}
			sameSamples(t, fmt.Sprintf("prompt %d alone", i), all[i*3:(i+1)*3], got)
			if i > 0 {
				wrong, _ := eng.Generate([][]int32{p}, 3, sp) // the call's seed, not the prompt's
				same := true
				for k := range wrong {
					same = same && slices.Equal(wrong[k].Tokens, all[i*3+k].Tokens)
				}
				if same {
					t.Fatalf("prompt %d: the call's own seed gives the same samples: the test cannot tell seeds apart", i)
				}
			}
		}
	}
}

// stepSamples runs n steps and returns the weights, each step's metrics
// (timings and the fleet's own measures aside) and samples.
func stepSamples(t *testing.T, l *Loop, n int) ([]float32, []map[string]float64, [][]*Sample) {
	t.Helper()
	var ms []map[string]float64
	var ss [][]*Sample
	for range n {
		res, err := l.RunStep()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for k, v := range res.Metrics {
			if !strings.HasPrefix(k, "time/") && !strings.HasPrefix(k, "tokens_per_s/") && !strings.HasPrefix(k, "rollout/servers_") && k != "rollout/retries" {
				m[k] = v
			}
		}
		ms = append(ms, m)
		ss = append(ss, res.Samples)
	}
	return slices.Clone(l.Policy.Arena), ms, ss
}

// An RL run whose rollout runs on two servers is the run with the local
// engine, bit for bit: samples (tokens, log mu, routes), weights and
// metrics; with R3, top-k truncation and two mini-batches too.
func TestRemoteExactMatchesLocal(t *testing.T) {
	for _, sets := range [][]string{nil, {"algorithm.replay=r3", "rollout.top_k=8", "train.mini_batches=2"}} {
		t.Run(strings.Join(append([]string{"default"}, sets...), ","), func(t *testing.T) {
			r := testRecipe(t, sets...)
			w1, m1, s1 := stepSamples(t, testLoop(t, r, true), 3)

			remote := testLoop(t, r, true)
			// The servers start from other weights: only the pushed ones
			// can give the local run's samples.
			other := testmodel.Random(tinyConfig(true), 99)
			a, b := newFakeServer(t, other), newFakeServer(t, other)
			rs := newRemote(t, RemoteOptions{Servers: urls(a, b), Config: remote.Policy.Config, MaxLen: 32, MaxConcurrency: 2})
			if err := rs.UpdateWeights(remote.Policy, 0); err != nil {
				t.Fatal(err)
			}
			remote.Sampler = rs
			w2, m2, s2 := stepSamples(t, remote, 3)
			if alive := rs.Metrics()["rollout/servers_alive"]; alive != 2 {
				t.Fatalf("servers alive %v, want 2", alive)
			}
			for s := range s1 {
				if len(s1[s]) != len(s2[s]) {
					t.Fatalf("step %d: %d samples vs %d", s+1, len(s1[s]), len(s2[s]))
				}
				for i, x := range s1[s] {
					y := s2[s][i]
					a, b := rollout.Sample{Tokens: x.Response, LogProbs: x.LogMu, Routes: x.Routes, Finish: x.Finish, Version: x.Version},
						rollout.Sample{Tokens: y.Response, LogProbs: y.LogMu, Routes: y.Routes, Finish: y.Finish, Version: y.Version}
					sameSamples(t, fmt.Sprintf("step %d sample %d", s+1, i), []rollout.Sample{a}, []rollout.Sample{b})
				}
			}
			sameRun(t, "remote vs local", w1, w2, m1, m2)
			if a.count() == 0 || b.count() == 0 {
				t.Fatalf("requests per server %d, %d: the fleet was not used", a.count(), b.count())
			}
		})
	}
}

// A server that dies mid-rollout (its connections closed, or HTTP 500 for
// every request after the second): the rollout completes on the other
// server with every sample there once, the same as the local engine's; the
// server is dropped with an event. With every server down the rollout is a
// clear error.
func TestRemoteServerDies(t *testing.T) {
	for _, mode := range []string{"close", "500"} {
		t.Run(mode, func(t *testing.T) {
			c := remoteMoEConfig()
			m := testmodel.Random(c, 5)
			prompts := randomPrompts(6, 12, c.VocabSize)
			sp := rollout.Sampling{Temperature: 1, MaxNewTokens: 10, Stop: []int32{1}, Seed: 9}
			eng, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 7})
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			if err := eng.UpdateWeights(m, 1); err != nil {
				t.Fatal(err)
			}
			want, err := eng.Generate(prompts, 4, sp)
			if err != nil {
				t.Fatal(err)
			}

			a, b := newFakeServer(t, m), newFakeServer(t, m)
			var ev events
			rs := newRemote(t, RemoteOptions{Servers: urls(a, b), Config: c, MaxConcurrency: 2, MaxFailures: 2, Events: ev.add})
			if err := rs.UpdateWeights(m, 1); err != nil {
				t.Fatal(err)
			}
			a.set(func(f *fakeServer) { f.dieAfter, f.dieMode = 2, mode })
			got, err := rs.Generate(prompts, 4, sp)
			if err != nil {
				t.Fatal(err)
			}
			sameSamples(t, "after a server died", want, got)
			met := rs.Metrics()
			if met["rollout/retries"] < 1 || met["rollout/servers_dropped"] != 1 || met["rollout/servers_alive"] != 1 {
				t.Fatalf("metrics %v: want a retry, one server dropped, one alive", met)
			}
			if e := ev.all(); !strings.Contains(e, a.url) || !strings.Contains(e, "dropped") {
				t.Fatalf("events %q do not report %s dropped", e, a.url)
			}
			if b.count() < len(prompts)/2+1 {
				t.Fatalf("server b answered %d requests", b.count())
			}

			b.set(func(f *fakeServer) { f.dieAfter, f.dieMode = f.generates, mode })
			_, err = rs.Generate(prompts, 4, sp)
			if !errors.Is(err, ErrNoServers) || !strings.Contains(err.Error(), "every inference server is down") {
				t.Fatalf("every server down: error %v", err)
			}
		})
	}
}

// A bad answer ends the rollout with an error naming the server and the
// field; a bad answer is never retried elsewhere and never a sample.
func TestRemoteBadAnswers(t *testing.T) {
	c := remoteMoEConfig()
	m := testmodel.Random(c, 7)
	prompts := randomPrompts(8, 1, c.VocabSize) // one request: a retry would show
	sp := rollout.Sampling{Temperature: 1, MaxNewTokens: 8, Seed: 3}
	meta := func(o map[string]any) map[string]any { return o["meta_info"].(map[string]any) }
	cases := []struct {
		name, field string
		fault       func(f *fakeServer)
	}{
		{"stale weight version", "meta_info.weight_version", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { meta(outs[1])["weight_version"] = "0" }
		}},
		{"weight version missing", "meta_info.weight_version", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { delete(meta(outs[0]), "weight_version") }
		}},
		{"weights changed mid-request", "meta_info.weight_versions", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) {
				meta(outs[0])["weight_versions"] = []any{map[string]any{"version": "0"}, map[string]any{"version": "1"}}
			}
		}},
		{"truncated body", "body", func(f *fakeServer) { f.rawBody = func(b []byte) []byte { return b[:len(b)/2] } }},
		{"not JSON", "body", func(f *fakeServer) { f.rawBody = func([]byte) []byte { return []byte("<html>502</html>") } }},
		{"a number for the weight version", "meta_info.weight_version", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { meta(outs[0])["weight_version"] = 1 }
		}},
		{"log-probs of the wrong length", "meta_info.output_token_logprobs", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) {
				lp := meta(outs[0])["output_token_logprobs"].([]any)
				meta(outs[0])["output_token_logprobs"] = lp[:len(lp)-1]
			}
		}},
		{"a log-prob for another token", "meta_info.output_token_logprobs", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) {
				lp := meta(outs[0])["output_token_logprobs"].([]any)
				e := lp[0].([]any)
				lp[0] = []any{e[0], e[1].(int32) + 1, nil}
			}
		}},
		{"a log-prob that is not a number", "meta_info.output_token_logprobs", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) {
				meta(outs[0])["output_token_logprobs"].([]any)[0] = []any{"-inf", 3, nil}
			}
		}},
		{"id outside the vocabulary", "output_ids", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { outs[0]["output_ids"].([]int32)[0] = 41 }
		}},
		{"no output", "output_ids", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { outs[2]["output_ids"] = []int32{} }
		}},
		{"too few outputs", "body", func(f *fakeServer) {
			f.rawBody = func(b []byte) []byte {
				var outs []json.RawMessage
				json.Unmarshal(b, &outs)
				b, _ = json.Marshal(outs[:2])
				return b
			}
		}},
		{"routes of the wrong shape", "meta_info.routed_experts", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) {
				s := meta(outs[0])["routed_experts"].(string)
				b, _ := base64.StdEncoding.DecodeString(s)
				meta(outs[0])["routed_experts"] = base64.StdEncoding.EncodeToString(b[:len(b)-4])
			}
		}},
		{"routes of too few positions", "meta_info.routed_experts", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) {
				s := meta(outs[0])["routed_experts"].(string)
				b, _ := base64.StdEncoding.DecodeString(s)
				meta(outs[0])["routed_experts"] = base64.StdEncoding.EncodeToString(b[:len(b)-2*3*2*4])
			}
		}},
		{"an expert out of range", "meta_info.routed_experts", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) {
				s := meta(outs[0])["routed_experts"].(string)
				b, _ := base64.StdEncoding.DecodeString(s)
				binary.LittleEndian.PutUint32(b, 6)
				meta(outs[0])["routed_experts"] = base64.StdEncoding.EncodeToString(b)
			}
		}},
		{"routes missing", "meta_info.routed_experts", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { delete(meta(outs[0]), "routed_experts") }
		}},
		{"unfinished", "meta_info.finish_reason", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { meta(outs[0])["finish_reason"] = nil }
		}},
		{"another prompt", "meta_info.prompt_tokens", func(f *fakeServer) {
			f.tamper = func(outs []map[string]any) { meta(outs[0])["prompt_tokens"] = 99 }
		}},
		{"a bad request", "", func(f *fakeServer) { f.status = 400 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeServer(t, m)
			rs := newRemote(t, RemoteOptions{Servers: urls(f), Config: c})
			if err := rs.UpdateWeights(m, 1); err != nil {
				t.Fatal(err)
			}
			f.set(tc.fault)
			got, err := rs.Generate(prompts, 3, sp)
			var se *ServerError
			if !errors.As(err, &se) {
				t.Fatalf("error %v (%d samples), want a ServerError", err, len(got))
			}
			if se.Server != f.url || !strings.HasSuffix(se.Field, tc.field) || se.Transient {
				t.Fatalf("error names server %q field %q (transient %v), want %s and %q: %v", se.Server, se.Field, se.Transient, f.url, tc.field, err)
			}
			if msg := err.Error(); !strings.Contains(msg, f.url) || !strings.Contains(msg, tc.field) {
				t.Fatalf("message %q does not name the server and the field", msg)
			}
			if tc.field == "" && !strings.Contains(err.Error(), "HTTP 400") {
				t.Fatalf("message %q does not give the status", err)
			}
			if f.count() != 1 {
				t.Fatalf("%d requests: a bad answer was retried", f.count())
			}
		})
	}
}

// SGLang sends the routes of all positions but the last: the last repeats
// the one before; every other position is the server's.
func TestRemoteSGLangRoutes(t *testing.T) {
	c := remoteMoEConfig()
	m := testmodel.Random(c, 11)
	prompts := randomPrompts(12, 4, c.VocabSize)
	sp := rollout.Sampling{Temperature: 1, MaxNewTokens: 6, Seed: 5}
	full, short := newFakeServer(t, m), newFakeServer(t, m)
	short.sglRoutes = true
	var got [2][]rollout.Sample
	for i, f := range []*fakeServer{full, short} {
		rs := newRemote(t, RemoteOptions{Servers: urls(f), Config: c})
		if err := rs.UpdateWeights(m, 2); err != nil {
			t.Fatal(err)
		}
		var err error
		if got[i], err = rs.Generate(prompts, 2, sp); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]int32, 2)
	for i := range got[0] {
		a, b := got[0][i].Routes, got[1][i].Routes
		T := a.Tokens
		for pos := 0; pos < T; pos++ {
			for l := 0; l < a.Layers; l++ {
				want := a.Slots(nil, pos, l)
				if pos == T-1 {
					want = a.Slots(buf, pos-1, l)
				}
				if g := b.Slots(nil, pos, l); !slices.Equal(g, want) {
					t.Fatalf("sample %d position %d layer %d: %v, want %v", i, pos, l, g, want)
				}
			}
		}
	}
}

// UpdateWeights writes a model directory (with WriteFiles' files) the
// servers load between pause and continue, then report the version; older
// directories go; a server that fails the push is dropped and comes back
// at a later push; none loading is an error.
func TestRemoteWeightSync(t *testing.T) {
	c := remoteMoEConfig()
	start, m := testmodel.Random(c, 1), testmodel.Random(c, 2)
	a, b := newFakeServer(t, start), newFakeServer(t, start)
	var ev events
	wd := t.TempDir()
	rs := newRemote(t, RemoteOptions{Servers: urls(a, b), Config: c, WeightsDir: wd, Events: ev.add,
		WriteFiles: func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"fake": true}`), 0o644)
		}})
	if err := rs.UpdateWeights(m, 5); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(wd, "v000005")
	for _, f := range []*fakeServer{a, b} {
		f.mu.Lock()
		if len(f.loaded) != 1 || f.loaded[0] != dir || f.version != "5" || !slices.Equal(f.calls, []string{"pause", "update", "continue"}) {
			t.Fatalf("server loaded %v as %q with calls %v, want %s as 5 between pause and continue", f.loaded, f.version, f.calls, dir)
		}
		for i, v := range f.weights.Arena {
			if math.Float32bits(v) != math.Float32bits(m.Arena[i]) {
				t.Fatalf("server weight %d: %v, pushed %v", i, v, m.Arena[i])
			}
		}
		f.mu.Unlock()
	}
	for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if rs.Version() != 5 {
		t.Fatalf("version %d", rs.Version())
	}
	// The samples are the pushed weights'.
	prompts := randomPrompts(3, 5, c.VocabSize)
	sp := rollout.Sampling{Temperature: 1, MaxNewTokens: 7, Seed: 4}
	eng, err := rollout.New(m, rollout.Options{Precision: rollout.Exact})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if err := eng.UpdateWeights(m, 5); err != nil {
		t.Fatal(err)
	}
	want, _ := eng.Generate(prompts, 2, sp)
	got, err := rs.Generate(prompts, 2, sp)
	if err != nil {
		t.Fatal(err)
	}
	sameSamples(t, "after the push", want, got)

	if err := rs.UpdateWeights(m, 6); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(wd)
	if len(entries) != 1 || entries[0].Name() != "v000006" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("weights directory holds %v, want only v000006", names)
	}

	b.set(func(f *fakeServer) { f.failPush = true })
	if err := rs.UpdateWeights(m, 7); err != nil {
		t.Fatal(err)
	}
	if met := rs.Metrics(); met["rollout/servers_alive"] != 1 || met["rollout/servers_dropped"] != 1 {
		t.Fatalf("after a failed push: %v", met)
	}
	if e := ev.all(); !strings.Contains(e, b.url+" dropped: weight push failed") || !strings.Contains(e, "success") {
		t.Fatalf("events %q", e)
	}
	if _, err := rs.Generate(prompts, 2, sp); err != nil { // on a alone
		t.Fatal(err)
	}
	b.set(func(f *fakeServer) { f.failPush = false })
	if err := rs.UpdateWeights(m, 8); err != nil {
		t.Fatal(err)
	}
	if met := rs.Metrics(); met["rollout/servers_alive"] != 2 || !strings.Contains(ev.all(), b.url+" is back") {
		t.Fatalf("after b recovered: %v, events %q", met, ev.all())
	}
	a.set(func(f *fakeServer) { f.failPush = true })
	b.set(func(f *fakeServer) { f.failPush = true })
	if err := rs.UpdateWeights(m, 9); !errors.Is(err, ErrNoServers) {
		t.Fatalf("no server loading: error %v", err)
	}
}

// kind sglang sends a prompt's samples as a batch, one seed each (SGLang's
// seeded sampler would give n samples of one seed the same tokens): the
// samples differ, and are the same whatever the number of servers.
func TestRemoteSGLangKind(t *testing.T) {
	c := remoteMoEConfig()
	m := testmodel.Random(c, 13)
	prompts := randomPrompts(14, 6, c.VocabSize)
	sp := rollout.Sampling{Temperature: 1, MaxNewTokens: 8, Seed: 21}
	var got [2][]rollout.Sample
	var fs []*fakeServer
	for i, n := range []int{1, 3} {
		var fleet []*fakeServer
		for range n {
			fleet = append(fleet, newFakeServer(t, m))
		}
		fs = fleet
		rs := newRemote(t, RemoteOptions{Servers: urls(fleet...), Kind: ServerSGLang, Config: c, MaxConcurrency: 1})
		if err := rs.UpdateWeights(m, 1); err != nil {
			t.Fatal(err)
		}
		var err error
		if got[i], err = rs.Generate(prompts, 4, sp); err != nil {
			t.Fatal(err)
		}
	}
	sameSamples(t, "1 server vs 3", got[0], got[1])
	for _, f := range fs {
		for _, n := range f.batches {
			if n != 4 {
				t.Fatalf("a request held %d samples, want one prompt's 4", n)
			}
		}
	}
	distinct := false
	for i := 0; i < len(got[0]); i += 4 {
		for k := 1; k < 4; k++ {
			distinct = distinct || !slices.Equal(got[0][i].Tokens, got[0][i+k].Tokens)
		}
	}
	if !distinct {
		t.Fatal("every prompt's samples are the same: one seed for all of them")
	}
}

// fixtureConfig is a Qwen3-MoE-shaped configuration for the fixtures: the
// vocabulary of Qwen3, two MoE layers of top-2 of 8 experts.
func fixtureConfig() model.Config {
	return model.Config{Architecture: model.ArchQwen3MoE, VocabSize: 151936, HiddenSize: 32, IntermediateSize: 64,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 8, RMSNormEps: 1e-6, RopeTheta: 1e6,
		MaxPositionEmbeddings: 64, NumExperts: 8, NumExpertsPerTok: 2, MoeIntermediateSize: 16, NormTopKProb: true,
		DecoderSparseStep: 1}
}

// fixtureJob is the request of testdata/sglang_generate_request.json: two
// samples of one prompt, up to 3 tokens, under weight version 7.
func fixtureJob() job {
	sp := rollout.Sampling{Temperature: 1, MaxNewTokens: 3, Stop: []int32{151645}, Seed: 12345}
	return job{i: 0, ids: []int32{151644, 872, 198, 17}, n: 2, sp: sp, seed: rollout.PromptSeed(sp.Seed, 0), maxNew: 3, version: 7}
}

func jsonEqual(t *testing.T, what string, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("%s:\n%s\nwant\n%s", what, got, want)
	}
}

// The /generate request keel sends (kind sglang) is the fixture's, in
// SGLang's field names, and the fixture's answer (SGLang's shape: a list of
// outputs, meta_info with [logprob, id, null] triples, base64 routes of all
// positions but the last, weight_version as a string) decodes.
func TestRemoteSGLangFixture(t *testing.T) {
	c := fixtureConfig()
	r := &RemoteSampler{opt: RemoteOptions{Kind: ServerSGLang, Config: c}, moeLayers: c.MoELayers()}
	j := fixtureJob()

	// What keel sends for it.
	f := &captureServer{}
	ts := httptest.NewServer(f)
	defer ts.Close()
	r.client, r.opt.RequestTimeout = ts.Client(), 10e9
	r.sglGenerate(context.Background(), &server{url: ts.URL}, j)
	want, err := os.ReadFile("testdata/sglang_generate_request.json")
	if err != nil {
		t.Fatal(err)
	}
	if f.path != "/generate" {
		t.Fatalf("request to %s", f.path)
	}
	jsonEqual(t, "request", f.body, want)

	body, err := os.ReadFile("testdata/sglang_generate_response.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.decodeSGL("fixture", body, j)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !slices.Equal(got[0].Tokens, []int32{20, 220, 151645}) || !slices.Equal(got[1].Tokens, []int32{20, 10, 18}) {
		t.Fatalf("samples %+v", got)
	}
	if got[0].Finish != "stop" || got[1].Finish != "length" || got[0].Version != 7 {
		t.Fatalf("finish %s, %s, version %d", got[0].Finish, got[1].Finish, got[0].Version)
	}
	if got[0].LogProbs[0] != float32(-0.6931472) || got[1].LogProbs[1] != float32(-2.3025851) {
		t.Fatalf("log-probs %v %v", got[0].LogProbs, got[1].LogProbs)
	}
	rt := got[1].Routes
	if rt.Tokens != 7 || rt.Layers != 2 || rt.K != 2 {
		t.Fatalf("routes shape [%d, %d, %d]", rt.Tokens, rt.Layers, rt.K)
	}
	// Position 4 of sample 1: layer 0 [7, 6], layer 1 [0, 1]; the last
	// (position 6) repeats position 5: [5, 4], [3, 2].
	for _, tc := range []struct{ pos, layer, a, b int }{{4, 0, 7, 6}, {4, 1, 0, 1}, {5, 0, 5, 4}, {6, 0, 5, 4}, {6, 1, 3, 2}} {
		if rt.At(tc.pos, tc.layer, 0) != tc.a || rt.At(tc.pos, tc.layer, 1) != tc.b {
			t.Fatalf("position %d layer %d: %v", tc.pos, tc.layer, rt.Slots(nil, tc.pos, tc.layer))
		}
	}
	// The same answer for another step's weights is refused.
	j.version = 8
	if _, err := r.decodeSGL("fixture", body, j); err == nil || !strings.Contains(err.Error(), "[0].meta_info.weight_version") {
		t.Fatalf("stale fixture: %v", err)
	}
}

// captureServer records one request and answers 500.
type captureServer struct {
	path string
	body []byte
}

func (c *captureServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	buf := new(bytes.Buffer)
	buf.ReadFrom(r.Body)
	c.path, c.body = r.URL.Path, buf.Bytes()
	http.Error(w, "captured", 500)
}

// The vLLM fixture (a completions answer, choices out of order) decodes.
func TestRemoteVLLMFixture(t *testing.T) {
	c := fixtureConfig()
	c.Architecture, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize, c.DecoderSparseStep = model.ArchQwen3, 0, 0, 0, 0
	r := &RemoteSampler{opt: RemoteOptions{Kind: ServerVLLM, Config: c}}
	body, err := os.ReadFile("testdata/vllm_completions_response.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.decodeVLLM("fixture", body, fixtureJob())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got[0].Tokens, []int32{20, 220, 151645}) || got[0].Finish != "stop" || got[1].Finish != "length" ||
		got[1].LogProbs[2] != float32(-0.9162907) || got[0].Version != 7 {
		t.Fatalf("samples %+v", got)
	}
}

// FuzzRemoteAnswer: no answer, however malformed, panics the decoders.
func FuzzRemoteAnswer(f *testing.F) {
	for _, name := range []string{"sglang_generate_response.json", "vllm_completions_response.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
		f.Add(bytes.ReplaceAll(b, []byte(`"weight_version": "7"`), []byte(`"weight_version": null`)))
	}
	f.Add([]byte(`[{"output_ids": [1], "meta_info": {"weight_version": "7", "finish_reason": "stop", "output_token_logprobs": [[-1, 1]], "routed_experts": "AAAA"}}]`))
	f.Add([]byte(`{"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[], [1e400, 2]]}}`))
	c := fixtureConfig()
	r := &RemoteSampler{opt: RemoteOptions{Config: c}, moeLayers: c.MoELayers()}
	f.Fuzz(func(t *testing.T, b []byte) {
		j := fixtureJob()
		r.decodeSGL("fuzz", b, j)
		j.n = 1
		r.decodeSGL("fuzz", b, j)
		r.decodeVLLM("fuzz", b, j)
		decodeRoutes(string(b), &c, c.MoELayers(), 5)
	})
}

// fakeVLLM speaks vLLM's OpenAI-compatible completions and its dev-mode
// control endpoints over an in-process engine; sample j of n draws with
// seed + j, as vLLM's parallel sampling does.
type fakeVLLM struct {
	url     string
	mu      sync.Mutex
	eng     *rollout.Engine
	model   string // update_config's model path
	weights *model.Model
	calls   []string
}

func newFakeVLLM(t *testing.T, m *model.Model) *fakeVLLM {
	eng, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	f := &fakeVLLM{eng: eng}
	ts := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(ts.Close)
	f.url = ts.URL
	return f
}

func (f *fakeVLLM) serve(w http.ResponseWriter, req *http.Request) {
	buf := new(bytes.Buffer)
	buf.ReadFrom(req.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	op := req.Method + " " + req.URL.Path
	switch op {
	case "GET /v1/models":
		writeJSON(w, 200, map[string]any{"object": "list", "data": []any{map[string]any{"id": "keel-policy", "object": "model"}}})
	case "POST /pause", "POST /resume", "POST /reset_prefix_cache":
		f.calls = append(f.calls, req.URL.Path)
		writeJSON(w, 200, map[string]any{"status": "ok"})
	case "POST /collective_rpc":
		var rpc struct {
			Method string `json:"method"`
			Args   []struct {
				ModelConfig struct {
					Model string `json:"model"`
				} `json:"model_config"`
			} `json:"args"`
		}
		if err := strictJSON(buf.Bytes(), &rpc); err != nil {
			writeJSON(w, 400, map[string]any{"error": err.Error()})
			return
		}
		f.calls = append(f.calls, rpc.Method)
		switch rpc.Method {
		case "update_config":
			f.model = rpc.Args[0].ModelConfig.Model
		case "reload_weights":
			m, err := model.Load(f.model)
			if err == nil {
				err = f.eng.UpdateWeights(m, 0)
			}
			if err != nil {
				writeJSON(w, 500, map[string]any{"error": err.Error()})
				return
			}
			f.weights = m
		}
		writeJSON(w, 200, map[string]any{"results": []any{nil}})
	case "POST /v1/completions":
		var r struct {
			Model                  string  `json:"model"`
			Prompt                 []int32 `json:"prompt"`
			N                      int     `json:"n"`
			MaxTokens              int     `json:"max_tokens"`
			Temperature            float64 `json:"temperature"`
			TopP                   float64 `json:"top_p"`
			TopK                   int     `json:"top_k"`
			MinP                   float64 `json:"min_p"`
			RepetitionPenalty      float64 `json:"repetition_penalty"`
			FrequencyPenalty       float64 `json:"frequency_penalty"`
			PresencePenalty        float64 `json:"presence_penalty"`
			Seed                   uint64  `json:"seed"`
			Logprobs               int     `json:"logprobs"`
			ReturnTokensAsTokenIDs bool    `json:"return_tokens_as_token_ids"`
			ReturnTokenIDs         bool    `json:"return_token_ids"`
			StopTokenIDs           []int32 `json:"stop_token_ids"`
			SkipSpecialTokens      bool    `json:"skip_special_tokens"`
			Stream                 bool    `json:"stream"`
		}
		if err := strictJSON(buf.Bytes(), &r); err != nil || r.Model != "keel-policy" || !r.ReturnTokensAsTokenIDs {
			writeJSON(w, 400, map[string]any{"error": fmt.Sprint("bad request ", err)})
			return
		}
		var choices []any
		for k := r.N - 1; k >= 0; k-- { // out of order, as a server may
			sp := rollout.Sampling{Temperature: r.Temperature, TopK: max(r.TopK, 0), TopP: r.TopP, MaxNewTokens: r.MaxTokens,
				Stop: r.StopTokenIDs, Seed: r.Seed + uint64(k)}
			res, err := f.eng.Generate([][]int32{r.Prompt}, 1, sp)
			if err != nil {
				writeJSON(w, 400, map[string]any{"error": err.Error()})
				return
			}
			s := res[0]
			lp := s.LogProbs
			if s.TruncLogProbs != nil { // --logprobs-mode processed_logprobs
				lp = s.TruncLogProbs
			}
			toks := make([]string, len(s.Tokens))
			for i, id := range s.Tokens {
				toks[i] = "token_id:" + strconv.Itoa(int(id))
			}
			choices = append(choices, map[string]any{"index": k, "text": "", "finish_reason": s.Finish, "token_ids": s.Tokens,
				"logprobs": map[string]any{"tokens": toks, "token_logprobs": lp, "text_offset": make([]int, len(toks))}})
		}
		writeJSON(w, 200, map[string]any{"id": "cmpl-1", "object": "text_completion", "model": r.Model, "choices": choices})
	default:
		http.NotFound(w, req)
	}
}

// kind vllm: generation through /v1/completions (sample j of prompt i
// drawn with the prompt's seed + j), weights through pause, collective_rpc
// update_config and reload_weights, reset_prefix_cache, resume; an MoE
// policy is refused (keel reads no routes from vLLM).
func TestRemoteVLLM(t *testing.T) {
	c := remoteMoEConfig()
	if _, err := NewRemoteSampler(RemoteOptions{Servers: []string{"http://127.0.0.1:1"}, Kind: ServerVLLM, Config: c, WeightsDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "MoE") {
		t.Fatalf("MoE policy with vLLM: %v", err)
	}
	c = model.Config{Architecture: model.ArchQwen3, VocabSize: 37, HiddenSize: 32, IntermediateSize: 48,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 16,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 128}
	start, m := testmodel.Random(c, 1), testmodel.Random(c, 2)
	f := newFakeVLLM(t, start)
	wd := t.TempDir()
	rs := newRemote(t, RemoteOptions{Servers: []string{f.url}, Kind: ServerVLLM, Config: c, WeightsDir: wd})
	if err := rs.UpdateWeights(m, 3); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/pause", "update_config", "reload_weights", "/reset_prefix_cache", "/resume"}; !slices.Equal(f.calls, want) || f.model != filepath.Join(wd, "v000003") {
		t.Fatalf("calls %v loading %s, want %v loading v000003", f.calls, f.model, want)
	}
	prompts := randomPrompts(5, 4, c.VocabSize)
	for _, sp := range []rollout.Sampling{{Temperature: 1, MaxNewTokens: 6, Seed: 8}, {Temperature: 0.8, TopK: 4, MaxNewTokens: 6, Seed: 9}} {
		got, err := rs.Generate(prompts, 3, sp)
		if err != nil {
			t.Fatal(err)
		}
		eng, _ := rollout.New(m, rollout.Options{Precision: rollout.Exact})
		var want []rollout.Sample
		for i, p := range prompts {
			for k := range 3 {
				one := sp
				one.Seed = rollout.PromptSeed(sp.Seed, i)&(1<<62-1) + uint64(k)
				s, _ := eng.Generate([][]int32{p}, 1, one)
				s[0].Prompt, s[0].Index, s[0].Version = i, k, 3
				if s[0].TruncLogProbs != nil {
					s[0].LogProbs = s[0].TruncLogProbs
				}
				want = append(want, s[0])
			}
		}
		eng.Close()
		sameSamples(t, "vllm", want, got)
	}
}

// The recipe keys of remote rollout: defaults, normalised URLs, and an
// error naming the key for each bad setting; the resolved local recipe is
// unchanged.
func TestRemoteRecipe(t *testing.T) {
	remote := []string{"rollout.precision=", `rollout.servers=["http://10.0.0.5:30000/", "https://b.example:8443"]`}
	r := testRecipe(t, remote...)
	ro := r.Rollout
	if !slices.Equal(ro.Servers, []string{"http://10.0.0.5:30000", "https://b.example:8443"}) || ro.ServerKind != ServerKeel ||
		ro.WeightsDir != filepath.Join("runs", "test", "rollout-weights") || ro.RequestTimeout != 600 || ro.MaxConcurrency != 64 || ro.Precision != "" {
		t.Fatalf("remote defaults: %+v", ro)
	}
	again, err := ParseRecipe(r.YAML(), nil)
	if err != nil || !reflect.DeepEqual(again.Rollout, r.Rollout) {
		t.Fatalf("the resolved remote recipe does not read back: %v\n%s", err, r.YAML())
	}
	if y := string(testRecipe(t).YAML()); strings.Contains(y, "server") || strings.Contains(y, "weights_dir") || !strings.Contains(y, "precision: exact") {
		t.Fatalf("local recipe YAML changed:\n%s", y)
	}
	for _, tc := range []struct {
		sets []string
		key  string
	}{
		{[]string{`rollout.servers=["http://a:1"]`}, "rollout.precision"},
		{append(slices.Clone(remote), `rollout.servers=["ftp://a:1"]`), "rollout.servers"},
		{append(slices.Clone(remote), `rollout.servers=["a:1"]`), "rollout.servers"},
		{append(slices.Clone(remote), `rollout.servers=["http://u:p@a:1"]`), "rollout.servers"},
		{append(slices.Clone(remote), `rollout.servers=["http://a:1", "http://a:1/"]`), "rollout.servers"},
		{append(slices.Clone(remote), "rollout.server_kind=triton"), "rollout.server_kind"},
		{append(slices.Clone(remote), "rollout.request_timeout=-1"), "rollout.request_timeout"},
		{append(slices.Clone(remote), "rollout.max_concurrency=-2"), "rollout.max_concurrency"},
		{[]string{"rollout.server_kind=sglang"}, "rollout: server_kind"},
		{[]string{"rollout.weights_dir=/tmp/w"}, "rollout: server_kind"},
		{append(slices.Clone(remote), "rollout.api_key=secret"), "api_key"},
	} {
		_, err := ParseRecipe([]byte(testRecipeYAML), tc.sets)
		if err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%v: error %v, want one naming %s", tc.sets, err, tc.key)
		}
	}
}

// keel rl with rollout.servers: the run of the local engine, bit for bit
// (metrics, samples written, final weights), the evaluation still local;
// the weights directory keeps the last version only. Servers dying
// mid-run stop it with a clear error and its last checkpoint intact.
func TestRemoteRunMatchesLocal(t *testing.T) {
	tmp := t.TempDir()
	local := filepath.Join(tmp, "local")
	if _, err := Run(context.Background(), runRecipe(t, local, "train.steps=3", "rollout.precision=exact"), false, Progress{}); err != nil {
		t.Fatal(err)
	}
	base, err := model.Load("../models/tiny-moe-base")
	if err != nil {
		t.Fatal(err)
	}
	a, b := newFakeServer(t, base), newFakeServer(t, base)
	servers := fmt.Sprintf(`rollout.servers=[%q, %q]`, a.url, b.url)
	remote := filepath.Join(tmp, "remote")
	var ev events
	if _, err := Run(context.Background(), runRecipe(t, remote, "train.steps=3", "rollout.precision=", servers), false, Progress{Warn: ev.add}); err != nil {
		t.Fatal(err)
	}
	w1, m1 := readRun(t, local)
	w2, m2 := readRun(t, remote)
	for _, rec := range m2[1:] {
		if rec["rollout/servers_alive"] != 2.0 {
			t.Fatalf("step %v: servers alive %v", rec["step"], rec["rollout/servers_alive"])
		}
		for _, k := range []string{"rollout/servers_alive", "rollout/servers_dropped", "rollout/retries"} {
			delete(rec, k)
		}
	}
	sameFiles(t, "remote vs local run", w1, w2, m1, m2)
	for _, f := range []string{"samples/step-000001.jsonl", "samples/step-000002.jsonl"} {
		x, err1 := os.ReadFile(filepath.Join(local, f))
		y, err2 := os.ReadFile(filepath.Join(remote, f))
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s differs (%v, %v)", f, err1, err2)
		}
	}
	wd := filepath.Join(remote, "rollout-weights")
	entries, _ := os.ReadDir(wd)
	if len(entries) != 1 || entries[0].Name() != "v000003" {
		t.Fatalf("weights directory: %v", entries)
	}
	for _, f := range []*fakeServer{a, b} {
		if last := f.loaded[len(f.loaded)-1]; f.version != "3" || !strings.HasSuffix(last, filepath.Join("rollout-weights", "v000003")) || len(f.loaded) != 4 {
			t.Fatalf("server loaded %v, reports %q", f.loaded, f.version)
		}
	}
	if ev.all() != "" {
		t.Fatalf("events in a healthy run: %s", ev.all())
	}

	// Both servers die at step 3 (two requests each per step): the run
	// stops with the checkpoint of step 2.
	dying := filepath.Join(tmp, "dying")
	for _, f := range []*fakeServer{a, b} {
		f.set(func(f *fakeServer) { f.dieAfter, f.dieMode = f.generates+4, "500" })
	}
	_, err = Run(context.Background(), runRecipe(t, dying, "train.steps=3", "rollout.precision=", servers), false, Progress{Warn: ev.add})
	if err == nil || !errors.Is(err, ErrNoServers) || !strings.Contains(err.Error(), "step 3") || !strings.Contains(err.Error(), "checkpoint of step 2") {
		t.Fatalf("servers down: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dying, "checkpoints", run.StepDir(2))); err != nil {
		entries, _ := os.ReadDir(filepath.Join(dying, "checkpoints"))
		t.Fatalf("checkpoint of step 2: %v (%v)", err, entries)
	}
	if e := ev.all(); !strings.Contains(e, a.url) || !strings.Contains(e, b.url) {
		t.Fatalf("events %q", e)
	}
}
