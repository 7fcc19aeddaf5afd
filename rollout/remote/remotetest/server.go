// Package remotetest provides a fake inference server for tests of remote
// rollout: it speaks SGLang's native API (what keel serve speaks) over
// keel's own rollout engine at exact precision, one Generate call per
// request, serialised, with the request's seed as the one-prompt call's
// seed, and faults can be injected into its answers. It is a package of
// its own so that the RL loop's tests (package rl) can run the loop
// through servers without speaking HTTP themselves, and package remote's
// tests share the same server.
package remotetest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// params is SGLang's sampling_params as keel sends them (unknown fields
// are refused, so keel sends nothing SGLang would not take).
type params struct {
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

// sampling is the engine's sampling of p.
func (p *params) sampling() rollout.Sampling {
	return rollout.Sampling{Temperature: p.Temperature, TopK: max(p.TopK, 0), TopP: p.TopP,
		MaxNewTokens: p.MaxNewTokens, Stop: p.StopTokenIDs, Seed: p.SamplingSeed}
}

// Server speaks SGLang's native RL API (/generate, /pause_generation,
// /update_weights_from_disk, /continue_generation, /get_model_info) over
// an in-process engine. Its exported fields are guarded by its mutex: read
// and set them within Do.
type Server struct {
	// URL is the server's base URL.
	URL string

	cfg    model.Config
	mu     sync.Mutex
	eng    *rollout.Engine
	paused bool

	// What the server did.
	Weights   *model.Model // the weights loaded last
	Version   string       // the weight_version it reports ("default" at first)
	Loaded    []string     // model_path of every update
	Generates int          // /generate requests received
	Batches   []int        // samples per /generate request
	Calls     []string     // control endpoints, in order: pause, update, continue

	// Faults.
	DieAfter int    // > 0: every /generate request after this many fails
	DieMode  string // "close" (the connection is dropped) or "500"
	Status   int    // answers /generate with this status
	FailPush bool   // update_weights_from_disk answers success false
	// Tamper edits the outputs of a /generate answer, RawBody its body.
	Tamper  func(outs []map[string]any)
	RawBody func(b []byte) []byte
	// SGLangRoutes sends routes of T-1 positions, as SGLang does (keel
	// serve sends all T).
	SGLangRoutes bool
}

// NewServer starts a server holding m's weights, closed when t ends.
func NewServer(t testing.TB, m *model.Model) *Server {
	t.Helper()
	eng, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	f := &Server{cfg: m.Config, eng: eng, Weights: m, Version: "default"}
	ts := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(ts.Close)
	f.URL = ts.URL
	return f
}

// Do runs fn with the server's state locked: to inject faults or read what
// it did.
func (f *Server) Do(fn func(f *Server)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// Count returns the number of /generate requests received.
func (f *Server) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Generates
}

// URLs returns the servers' base URLs.
func URLs(fs ...*Server) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.URL)
	}
	return out
}

// WriteJSON answers v with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// StrictJSON decodes a request body refusing unknown fields, as SGLang's
// and vLLM's request models do.
func StrictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func (f *Server) serve(w http.ResponseWriter, req *http.Request) {
	body := new(bytes.Buffer)
	body.ReadFrom(req.Body)
	switch req.Method + " " + req.URL.Path {
	case "POST /generate":
		f.generate(w, body.Bytes())
	case "POST /pause_generation":
		var p struct {
			Mode string `json:"mode"`
		}
		if err := StrictJSON(body.Bytes(), &p); err != nil || p.Mode != "abort" {
			WriteJSON(w, 400, map[string]any{"error": fmt.Sprint("bad pause ", err, p.Mode)})
			return
		}
		f.Do(func(f *Server) { f.paused = true; f.Calls = append(f.Calls, "pause") })
		WriteJSON(w, 200, map[string]any{"message": "Generation paused successfully."})
	case "POST /continue_generation":
		f.Do(func(f *Server) { f.paused = false; f.Calls = append(f.Calls, "continue") })
		WriteJSON(w, 200, map[string]any{"message": "Generation continued successfully."})
	case "POST /update_weights_from_disk":
		f.update(w, body.Bytes())
	case "GET /get_model_info":
		f.mu.Lock()
		info := map[string]any{"model_path": "fake", "tokenizer_path": "fake", "is_generation": true, "weight_version": f.Version}
		f.mu.Unlock()
		WriteJSON(w, 200, info)
	case "GET /health":
		w.WriteHeader(200)
	default:
		http.NotFound(w, req)
	}
}

func (f *Server) update(w http.ResponseWriter, body []byte) {
	var p struct {
		ModelPath     string `json:"model_path"`
		WeightVersion string `json:"weight_version"`
		FlushCache    bool   `json:"flush_cache"`
	}
	fail := func(msg string) {
		WriteJSON(w, 400, map[string]any{"success": false, "message": msg, "num_paused_requests": 0})
	}
	if err := StrictJSON(body, &p); err != nil {
		fail(err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.FailPush {
		fail("Failed to get weights iterator: injected fault")
		return
	}
	if !f.paused {
		f.Calls = append(f.Calls, "update-while-running")
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
	if err := f.eng.UpdateWeights(context.Background(), m, v); err != nil {
		fail(err.Error())
		return
	}
	f.Weights, f.Version = m, p.WeightVersion
	f.Loaded = append(f.Loaded, p.ModelPath)
	f.Calls = append(f.Calls, "update")
	WriteJSON(w, 200, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
}

func (f *Server) generate(w http.ResponseWriter, body []byte) {
	var req struct {
		InputIDs            json.RawMessage `json:"input_ids"`
		SamplingParams      json.RawMessage `json:"sampling_params"`
		ReturnLogprob       bool            `json:"return_logprob"`
		ReturnSamplingMask  bool            `json:"return_sampling_mask"`
		ReturnRoutedExperts bool            `json:"return_routed_experts"`
		Stream              bool            `json:"stream"`
	}
	if err := StrictJSON(body, &req); err != nil {
		WriteJSON(w, 400, map[string]any{"error": err.Error()})
		return
	}
	f.mu.Lock()
	f.Generates++
	die := f.DieAfter > 0 && f.Generates > f.DieAfter
	mode, status, paused := f.DieMode, f.Status, f.paused
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
		WriteJSON(w, status, map[string]any{"error": map[string]any{"message": "injected", "code": status}})
		return
	case paused:
		WriteJSON(w, 503, map[string]any{"error": "paused"})
		return
	}
	// One prompt with its n samples (keel), or a batch of prompts, one
	// sample each (SGLang's own n > 1 shares one seed).
	type one struct {
		ids []int32
		n   int
		p   params
	}
	var jobs []one
	var single []int32
	var batch [][]int32
	var p1 params
	var ps []params
	switch {
	case json.Unmarshal(req.InputIDs, &single) == nil && StrictJSON(req.SamplingParams, &p1) == nil:
		if !p1.IgnoreEOS {
			WriteJSON(w, 400, map[string]any{"error": "kind keel without ignore_eos: keel serve would stop at <|endoftext|> too"})
			return
		}
		jobs = []one{{single, max(p1.N, 1), p1}}
	case json.Unmarshal(req.InputIDs, &batch) == nil && StrictJSON(req.SamplingParams, &ps) == nil && len(batch) == len(ps):
		for k := range batch {
			if ps[k].N > 1 {
				WriteJSON(w, 400, map[string]any{"error": "n with a batch"})
				return
			}
			if ps[k].IgnoreEOS {
				WriteJSON(w, 400, map[string]any{"error": "ignore_eos: SGLang would ignore stop_token_ids"})
				return
			}
			jobs = append(jobs, one{batch[k], 1, ps[k]})
		}
	default:
		WriteJSON(w, 400, map[string]any{"error": "bad input_ids or sampling_params"})
		return
	}
	if !req.ReturnLogprob || req.Stream {
		WriteJSON(w, 400, map[string]any{"error": "keel asks for log-probs, unstreamed"})
		return
	}
	var outs []map[string]any
	f.mu.Lock()
	for _, jb := range jobs {
		res, err := f.eng.Generate([][]int32{jb.ids}, jb.n, jb.p.sampling())
		if err != nil {
			f.mu.Unlock()
			WriteJSON(w, 400, map[string]any{"error": err.Error()})
			return
		}
		for _, s := range res {
			outs = append(outs, f.output(jb.ids, jb.p, s, req.ReturnSamplingMask, req.ReturnRoutedExperts))
		}
	}
	f.Batches = append(f.Batches, len(outs))
	tamper, raw := f.Tamper, f.RawBody
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
func (f *Server) output(prompt []int32, p params, s rollout.Sample, mask, routes bool) map[string]any {
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
		"id": fmt.Sprintf("%032x", f.Generates), "finish_reason": fin, "prompt_tokens": len(prompt),
		"weight_version": f.Version, "output_token_logprobs": lps, "completion_tokens": len(s.Tokens),
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
		if f.SGLangRoutes {
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
