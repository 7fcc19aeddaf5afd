package serve

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// SGLang's native API, as RL frameworks (slime, verl, AReaL) drive it. The
// fields follow SGLang's GenerateReqInput and its answers (the sources are
// listed in rollout/remote/remote.go, whose client speaks the same
// protocol):
//
//   - POST /generate: input_ids (one prompt, or a batch) or text,
//     sampling_params (one object, or one per prompt) with temperature,
//     top_p, top_k (-1: off), min_p (0 only), the penalties (neutral only),
//     max_new_tokens, stop_token_ids, no_stop_trim, n and sampling_seed;
//     return_logprob, return_sampling_mask, return_routed_experts, stream
//     (false only). Each answer: text, output_ids, meta_info {id,
//     finish_reason {type, matched | length}, prompt_tokens,
//     completion_tokens, cached_tokens, weight_version,
//     output_token_logprobs [[logprob, id, null]...],
//     output_token_sampling_logprobs, routed_experts}. One prompt with n = 1
//     answers an object, otherwise a list, prompt-major.
//   - routed_experts: base64 of little-endian int32 expert ids of shape
//     [positions, num_hidden_layers, num_experts_per_tok]. SGLang gives the
//     positions of prompt and response but the last; keel gives all of
//     them (the last is the one a training forward also routes), which
//     SGLang-protocol clients that slice by length read alike.
//   - Sample k of a request with n samples and sampling_seed S is sample k
//     of keel's Generate([prompt], n, Seed S): what keel's RL client relies
//     on to reproduce a local run over any number of servers.

type sglParams struct {
	Temperature       *float64 `json:"temperature"`
	TopP              *float64 `json:"top_p"`
	TopK              *int     `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty"`
	PresencePenalty   *float64 `json:"presence_penalty"`
	MaxNewTokens      *int     `json:"max_new_tokens"`
	StopTokenIDs      []int32  `json:"stop_token_ids"`
	Stop              any      `json:"stop"`
	NoStopTrim        bool     `json:"no_stop_trim"`
	IgnoreEOS         bool     `json:"ignore_eos"`
	SkipSpecialTokens *bool    `json:"skip_special_tokens"`
	N                 *int     `json:"n"`
	SamplingSeed      *uint64  `json:"sampling_seed"`
}

type sglGenerateRequest struct {
	Text                any             `json:"text"`
	InputIDs            json.RawMessage `json:"input_ids"`
	SamplingParams      json.RawMessage `json:"sampling_params"`
	ReturnLogprob       bool            `json:"return_logprob"`
	ReturnSamplingMask  bool            `json:"return_sampling_mask"`
	ReturnRoutedExperts bool            `json:"return_routed_experts"`
	ReturnTextInLogprob bool            `json:"return_text_in_logprobs"`
	LogprobStartLen     *int            `json:"logprob_start_len"`
	TopLogprobsNum      *int            `json:"top_logprobs_num"`
	Stream              bool            `json:"stream"`
	RID                 any             `json:"rid"`
}

// sglAnswer is one /generate answer.
type sglAnswer struct {
	Text      string  `json:"text"`
	OutputIDs []int32 `json:"output_ids"`
	MetaInfo  sglMeta `json:"meta_info"`
}

// sglMeta is an answer's meta_info. Its fields stand in alphabetical
// order, as the map answered before wrote them; those a request asks for
// (return_logprob, return_sampling_mask, return_routed_experts) are left
// out when nil.
type sglMeta struct {
	CachedTokens                int          `json:"cached_tokens"`
	CompletionTokens            int          `json:"completion_tokens"`
	E2ELatency                  float64      `json:"e2e_latency"`
	FinishReason                sglFinish    `json:"finish_reason"`
	ID                          string       `json:"id"`
	InputTokenLogprobs          []sglLogprob `json:"input_token_logprobs,omitzero"`
	OutputTokenLogprobs         []sglLogprob `json:"output_token_logprobs,omitzero"`
	OutputTokenSamplingLogprobs []float32    `json:"output_token_sampling_logprobs,omitzero"`
	PromptTokens                int          `json:"prompt_tokens"`
	RoutedExperts               *string      `json:"routed_experts,omitempty"`
	WeightVersion               string       `json:"weight_version"`
	// OutputTokenWeightVersions (keel's) gives the weight version of each
	// output token when an in-place update (pause_generation with mode
	// in_place, then update_weights_from_disk) switched the request;
	// weight_version is then its first token's.
	OutputTokenWeightVersions []int64 `json:"output_token_weight_versions,omitempty"`
}

// sglLogprob is SGLang's log-probability of a token: [logprob, token id,
// its text or null].
type sglLogprob [3]any

// sglFinish is SGLang's finish_reason: stop with the token matched,
// length with the tokens sampled, or abort with why.
type sglFinish struct {
	Length  *int   `json:"length,omitempty"`
	Matched *int32 `json:"matched,omitempty"`
	Message string `json:"message,omitempty"`
	Type    string `json:"type"`
}

// sglAborted answers a sample of a request aborted by pause_generation
// or a shutdown, as SGLang does: no tokens, finish_reason abort (the
// client sends the request again).
type sglAborted struct {
	MetaInfo struct {
		FinishReason  sglFinish `json:"finish_reason"`
		ID            string    `json:"id"`
		WeightVersion string    `json:"weight_version"`
	} `json:"meta_info"`
	OutputIDs []int32 `json:"output_ids"`
	Text      string  `json:"text"`
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request) error {
	var req sglGenerateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	jobs, params, batch, err := s.sglJobs(&req)
	if err != nil {
		return err
	}
	g := s.newGeneration(jobs, nil, 0)
	start := time.Now()
	err = g.run(r.Context(), nil)
	if errors.Is(err, errAborted) || errors.Is(err, errShutdown) {
		answers := make([]sglAborted, len(g.choices))
		for i := range answers {
			a := &answers[i]
			a.OutputIDs = []int32{}
			a.MetaInfo.FinishReason = sglFinish{Type: "abort", Message: err.Error()}
			a.MetaInfo.ID, a.MetaInfo.WeightVersion = newID(""), strconv.FormatInt(s.sched.Version(), 10)
		}
		writeSGL(w, answers, batch)
		return nil
	}
	if err != nil {
		return genError(err)
	}
	latency := time.Since(start).Seconds()
	answers := make([]sglAnswer, len(g.choices))
	for i, c := range g.choices {
		answers[i] = s.sglAnswerOf(&req, jobs[c.job], params[c.job].NoStopTrim, c, latency)
	}
	writeSGL(w, answers, batch)
	return nil
}

// writeSGL answers as SGLang does: a request of one prompt (not a batch)
// sampled once with its answer, any other with the list of them,
// prompt-major.
func writeSGL[A any](w http.ResponseWriter, answers []A, batch bool) {
	if !batch && len(answers) == 1 {
		writeJSON(w, http.StatusOK, answers[0])
		return
	}
	writeJSON(w, http.StatusOK, answers)
}

// sglJobs checks a /generate request and makes a job of each of its
// prompts, returning their sampling_params and whether it is a batch.
func (s *Server) sglJobs(req *sglGenerateRequest) ([]genJob, []sglParams, bool, error) {
	if req.Stream {
		return nil, nil, false, badRequest("stream", "stream: streaming /generate is not supported; use /v1/completions with stream")
	}
	if req.TopLogprobsNum != nil && *req.TopLogprobsNum != 0 {
		return nil, nil, false, badRequest("top_logprobs_num", "top_logprobs_num: not supported on /generate (use /v1/completions logprobs)")
	}
	if req.LogprobStartLen != nil && *req.LogprobStartLen != -1 {
		return nil, nil, false, badRequest("logprob_start_len", "logprob_start_len: only -1 (no prompt log-probabilities) is supported")
	}
	prompts, batch, err := s.sglPrompts(req)
	if err != nil {
		return nil, nil, false, err
	}
	batchField := "input_ids"
	if req.Text != nil {
		batchField = "text"
	}
	// Bound the samples before reading one sampling_params per prompt.
	if err := s.checkSamples(batchField, len(prompts)); err != nil {
		return nil, nil, false, err
	}
	params, err := sglParamList(req.SamplingParams, len(prompts))
	if err != nil {
		return nil, nil, false, err
	}
	var jobs []genJob
	samples := 0
	for i, p := range prompts {
		field := "input_ids"
		if batch {
			field = fmt.Sprintf("input_ids[%d]", i)
		}
		if err := s.checkIDs(field, p); err != nil {
			return nil, nil, false, err
		}
		sp, n, err := s.sglSampling(params[i], len(p), batch, i)
		if err != nil {
			return nil, nil, false, err
		}
		samples += n
		if err := s.checkSamples(batchField, samples); err != nil {
			return nil, nil, false, err
		}
		jobs = append(jobs, genJob{prompt: p, n: n, sp: sp})
	}
	return jobs, params, batch, nil
}

// sglPrompts reads input_ids (one list, or a list of lists) or text (a
// string or a list of strings), reporting whether it was a batch.
func (s *Server) sglPrompts(req *sglGenerateRequest) ([][]int32, bool, error) {
	hasIDs := len(req.InputIDs) > 0 && string(req.InputIDs) != "null"
	if hasIDs == (req.Text != nil) {
		return nil, false, badRequest("input_ids", "exactly one of input_ids and text is required")
	}
	if req.Text != nil {
		switch t := req.Text.(type) {
		case string:
			return [][]int32{s.tok.Encode(t)}, false, nil
		case []any:
			out := make([][]int32, len(t))
			for i, v := range t {
				str, ok := v.(string)
				if !ok {
					return nil, false, badRequest("text", "text[%d]: want a string", i)
				}
				out[i] = s.tok.Encode(str)
			}
			if len(out) == 0 {
				return nil, false, badRequest("text", "text: an empty batch")
			}
			return out, true, nil
		}
		return nil, false, badRequest("text", "text: want a string or a list of strings")
	}
	var one []int64
	if err := json.Unmarshal(req.InputIDs, &one); err == nil {
		p, err := toIDs("input_ids", one)
		return [][]int32{p}, false, err
	}
	var many [][]int64
	if err := json.Unmarshal(req.InputIDs, &many); err != nil || len(many) == 0 {
		return nil, false, badRequest("input_ids", "input_ids: want a list of token ids or a non-empty list of such lists")
	}
	out := make([][]int32, len(many))
	for i, l := range many {
		p, err := toIDs(fmt.Sprintf("input_ids[%d]", i), l)
		if err != nil {
			return nil, false, err
		}
		out[i] = p
	}
	return out, true, nil
}

// sglParamList reads sampling_params: absent, one object for every
// prompt, or one per prompt.
func sglParamList(raw json.RawMessage, n int) ([]sglParams, error) {
	out := make([]sglParams, n)
	if len(raw) == 0 || string(raw) == "null" {
		return out, nil
	}
	strict := func(b []byte, v any) error {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		return dec.Decode(v)
	}
	var one sglParams
	if err := strict(raw, &one); err == nil {
		for i := range out {
			out[i] = one
		}
		return out, nil
	} else if raw[0] == '{' {
		return nil, paramErr("sampling_params", err)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("sampling_params", "sampling_params: want an object or a list of objects")
	}
	if len(list) != n {
		return nil, badRequest("sampling_params", "sampling_params: %d entries for %d prompts", len(list), n)
	}
	for i, b := range list {
		if err := strict(b, &out[i]); err != nil {
			return nil, paramErr(fmt.Sprintf("sampling_params[%d]", i), err)
		}
	}
	return out, nil
}

func paramErr(field string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return badRequest(field+"."+te.Field, "%s.%s: a JSON %s where %s was expected", field, te.Field, te.Value, te.Type)
	}
	return badRequest(field, "%s: %v", field, err)
}

// sglSampling checks one prompt's sampling_params and makes the engine's.
func (s *Server) sglSampling(p sglParams, promptLen int, batch bool, i int) (rollout.Sampling, int, error) {
	field := "sampling_params"
	if batch {
		field = fmt.Sprintf("sampling_params[%d]", i)
	}
	f := func(name string) string { return field + "." + name }
	sp := rollout.Sampling{Temperature: 1, MaxNewTokens: min(128, s.maxLen-promptLen)}
	if p.Temperature != nil {
		if t := *p.Temperature; !(t >= 0) || t > 100 {
			return sp, 0, badRequest(f("temperature"), "%s = %g, want >= 0", f("temperature"), t)
		} else if t > 0 && t < rollout.MinTemperature {
			return sp, 0, badRequest(f("temperature"), "%s = %g: too small to sample with (at least %g); use 0 for greedy decoding", f("temperature"), t, rollout.MinTemperature)
		}
		sp.Temperature = *p.Temperature
	}
	if p.TopP != nil {
		if v := *p.TopP; !(v > 0 && v <= 1) {
			return sp, 0, badRequest(f("top_p"), "%s = %g, want a value in (0, 1]", f("top_p"), v)
		}
		sp.TopP = *p.TopP
	}
	if p.TopK != nil {
		k := *p.TopK
		if k < -1 || k == 0 || k > s.cfg.VocabSize && k != 1<<30 {
			return sp, 0, badRequest(f("top_k"), "%s = %d, want -1 (off) or 1 to %d", f("top_k"), k, s.cfg.VocabSize)
		}
		if k > 0 && k <= s.cfg.VocabSize {
			sp.TopK = k
		}
	}
	neutral := map[string]struct {
		v    *float64
		want float64
	}{"min_p": {p.MinP, 0}, "repetition_penalty": {p.RepetitionPenalty, 1}, "frequency_penalty": {p.FrequencyPenalty, 0}, "presence_penalty": {p.PresencePenalty, 0}}
	for name, x := range neutral {
		if x.v != nil && *x.v != x.want {
			return sp, 0, badRequest(f(name), "%s = %g: only %g (off) is supported", f(name), *x.v, x.want)
		}
	}
	if p.Stop != nil && !reflect.ValueOf(p.Stop).IsZero() {
		if l, ok := p.Stop.([]any); !ok || len(l) > 0 {
			return sp, 0, badRequest(f("stop"), "%s: stop strings are not supported on /generate; use stop_token_ids", f("stop"))
		}
	}
	if p.MaxNewTokens != nil {
		n, err := s.maxNew(f("max_new_tokens"), p.MaxNewTokens, promptLen, 0)
		if err != nil {
			return sp, 0, err
		}
		sp.MaxNewTokens = n
	}
	if sp.MaxNewTokens < 1 {
		return sp, 0, badRequest(f("max_new_tokens"), "the prompt's %d tokens fill this server's context of %d", promptLen, s.maxLen)
	}
	if !p.IgnoreEOS {
		sp.Stop = append(sp.Stop, s.stops...)
	}
	for j, id := range p.StopTokenIDs {
		if id < 0 || int(id) >= s.cfg.VocabSize {
			return sp, 0, badRequest(f("stop_token_ids"), "%s[%d]: id %d outside the vocabulary [0, %d)", f("stop_token_ids"), j, id, s.cfg.VocabSize)
		}
		sp.Stop = append(sp.Stop, id)
	}
	n := 1
	if p.N != nil {
		n = *p.N
	}
	if err := s.checkN(f("n"), n); err != nil {
		return sp, 0, err
	}
	if p.SamplingSeed != nil {
		sp.Seed = *p.SamplingSeed
	} else {
		sp.Seed = uint64(time.Now().UnixNano())
	}
	return sp, n, nil
}

// sglAnswerOf renders one choice as SGLang answers it: its text without
// the stop token that ended it unless noStopTrim (output_ids keep it).
func (s *Server) sglAnswerOf(req *sglGenerateRequest, jb genJob, noStopTrim bool, c *choice, latency float64) sglAnswer {
	meta := sglMeta{
		ID:                        newID(""),
		PromptTokens:              len(jb.prompt),
		CompletionTokens:          len(c.ids),
		WeightVersion:             strconv.FormatInt(c.version, 10),
		E2ELatency:                latency,
		OutputTokenWeightVersions: c.versions,
		FinishReason:              sglFinish{Type: "length", Length: ptr(len(c.ids))},
	}
	if c.finish == "stop" {
		meta.FinishReason = sglFinish{Type: "stop"}
		if n := len(c.ids); n > 0 {
			meta.FinishReason.Matched = ptr(c.ids[n-1])
		}
	}
	if req.ReturnLogprob {
		meta.OutputTokenLogprobs = make([]sglLogprob, len(c.ids))
		for t, id := range c.ids {
			var text any
			if req.ReturnTextInLogprob {
				text = s.tok.DecodeLenient([]int32{id})
			}
			meta.OutputTokenLogprobs[t] = sglLogprob{c.lps[t], id, text}
		}
		meta.InputTokenLogprobs = []sglLogprob{}
		if req.ReturnSamplingMask && c.tlps != nil {
			meta.OutputTokenSamplingLogprobs = c.tlps
		}
	}
	if req.ReturnRoutedExperts && c.routes != nil {
		meta.RoutedExperts = ptr(encodeRoutes(c.routes, &s.cfg))
	}
	text := c.text
	if noStopTrim {
		text = s.tok.DecodeLenient(c.ids)
	}
	return sglAnswer{Text: text, OutputIDs: c.ids, MetaInfo: meta}
}

// encodeRoutes writes routes as SGLang's routed_experts: base64 of
// little-endian int32 ids, [positions, num_hidden_layers, top-k], zeros
// at layers without experts.
func encodeRoutes(rt *model.Routes, c *model.Config) string {
	L, K := c.NumHiddenLayers, c.NumExpertsPerTok
	var moe []int
	for l := range L {
		if c.IsMoELayer(l) {
			moe = append(moe, l)
		}
	}
	T := rt.Tokens
	buf := make([]byte, T*L*K*4)
	slots := make([]int32, K)
	for t := range T {
		for ml, l := range moe {
			for k, e := range rt.Slots(slots, t, ml) {
				binary.LittleEndian.PutUint32(buf[((t*L+l)*K+k)*4:], uint32(e))
			}
		}
	}
	return base64.StdEncoding.EncodeToString(buf)
}

type updateRequest struct {
	ModelPath         string `json:"model_path"`
	LoadFormat        string `json:"load_format"`
	WeightVersion     any    `json:"weight_version"`
	FlushCache        *bool  `json:"flush_cache"`
	AbortAllRequests  bool   `json:"abort_all_requests"`
	IsAsync           bool   `json:"is_async"`
	TorchEmptyCache   bool   `json:"torch_empty_cache"`
	KeepPauseState    bool   `json:"keep_pause"`
	RecaptureCudaGrph bool   `json:"recapture_cuda_graph"`
}

func (s *Server) updateWeightsFromDisk(w http.ResponseWriter, r *http.Request) error {
	var req updateRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.ModelPath == "" {
		return badRequest("model_path", "model_path is required")
	}
	version, given, err := weightVersion(req.WeightVersion)
	if err != nil {
		return err
	}
	s.updateLock.Lock()
	defer s.updateLock.Unlock()
	if !given {
		// Read under the lock: an update before this one may be loading.
		version = s.sched.Version() + 1
	}
	inPlace := s.pausedInPlace()
	if st := s.sched.Stats(); s.isPaused() && !inPlace && st.Running > 0 {
		// The scheduler finishes running sequences on the old weights
		// first, which a pause forbids.
		return &apiError{status: http.StatusConflict, param: "model_path", msg: fmt.Sprintf("%d sequences are paused in flight: pause with mode abort or in_place, or continue generation, before updating the weights", st.Running)}
	}
	start := time.Now()
	m, err := s.opt.Load(req.ModelPath)
	if err != nil {
		return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("model_path: %v", err), sglang: true}
	}
	if !reflect.DeepEqual(m.Config, s.cfg) {
		return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("model_path %s: its configuration differs from the served model's", req.ModelPath), sglang: true}
	}
	update := s.sched.UpdateWeights
	if inPlace {
		// Partial rollouts: the sequences in flight continue on the new
		// weights (their caches recomputed), each token's version in
		// meta_info.output_token_weight_versions.
		update = s.sched.UpdateWeightsInPlace
	}
	if err := update(m, version); err != nil {
		return &apiError{status: http.StatusInternalServerError, msg: err.Error(), sglang: true}
	}
	s.mu.Lock()
	s.modelPath = req.ModelPath
	s.mu.Unlock()
	s.metrics.weightUpdate(time.Since(start))
	writeJSON(w, http.StatusOK, sglStatus{Success: true, Message: fmt.Sprintf("loaded %s as weight version %d in %.3fs", req.ModelPath, version, time.Since(start).Seconds()), NumPausedRequests: ptr(0)})
	return nil
}

// weightVersion reads an update's weight_version: SGLang's string, or a
// number (both integers for keel), and whether one was given (if not,
// the update takes the version after the served one).
func weightVersion(v any) (int64, bool, error) {
	switch v := v.(type) {
	case nil:
		return 0, false, nil
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, true, badRequest("weight_version", "weight_version %q: keel's versions are integers", v)
		}
		return n, true, nil
	case float64:
		if v != float64(int64(v)) {
			return 0, true, badRequest("weight_version", "weight_version %v: keel's versions are integers", v)
		}
		return int64(v), true, nil
	}
	return 0, true, badRequest("weight_version", "weight_version: want a string")
}

func orAbort(mode string) string {
	if mode == "" {
		return "abort"
	}
	return mode
}

type pauseRequest struct {
	Mode string `json:"mode"`
}

func (s *Server) pauseGeneration(w http.ResponseWriter, r *http.Request) error {
	var req pauseRequest
	if err := decodeOptional(r, &req); err != nil {
		return err
	}
	switch req.Mode {
	case "", "in_place", "retract", "abort":
	default:
		return badRequest("mode", "mode %q: want abort, retract or in_place", req.Mode)
	}
	s.pause(req.Mode == "in_place")
	aborted := 0
	if req.Mode == "" || req.Mode == "abort" {
		// Answer once the aborted requests are out of the scheduler, as
		// SGLang does: a weight update sent next must not find them in
		// flight.
		ids := s.abortIDs(errAborted)
		aborted = len(ids)
		if !s.waitGone(ids, 10*time.Second) {
			return &apiError{status: http.StatusInternalServerError, msg: fmt.Sprintf("pause_generation: %d aborted requests did not end within 10 s", aborted)}
		}
	}
	writeJSON(w, http.StatusOK, sglStatus{Success: true, Message: fmt.Sprintf("generation paused (mode %s), %d requests aborted", orAbort(req.Mode), aborted)})
	return nil
}

func (s *Server) continueGeneration(w http.ResponseWriter, r *http.Request) error {
	s.resume()
	writeJSON(w, http.StatusOK, sglStatus{Success: true, Message: "generation continued"})
	return nil
}

// sglModelInfo is SGLang's /get_model_info answer, with the layout of
// keel's routed experts (see encodeRoutes), its fields in the order the
// map answered before wrote them.
type sglModelInfo struct {
	Architectures           []string  `json:"architectures"`
	HasAudioUnderstanding   bool      `json:"has_audio_understanding"`
	HasImageUnderstanding   bool      `json:"has_image_understanding"`
	IsGeneration            bool      `json:"is_generation"`
	MaxTotalNumTokens       int       `json:"max_total_num_tokens"`
	ModelPath               string    `json:"model_path"`
	ModelType               string    `json:"model_type"`
	NumExpertsPerTok        int       `json:"num_experts_per_tok"`
	NumHiddenLayers         int       `json:"num_hidden_layers"`
	PreferredSamplingParams *struct{} `json:"preferred_sampling_params"` // null: none
	ReturnRoutedExpertsEach string    `json:"return_routed_experts_each"`
	ServedModelName         string    `json:"served_model_name"`
	TokenizerPath           string    `json:"tokenizer_path"`
	WeightVersion           string    `json:"weight_version"`
}

func (s *Server) modelInfo(w http.ResponseWriter, r *http.Request) error {
	path := s.currentModelPath()
	writeJSON(w, http.StatusOK, sglModelInfo{
		ModelPath:               path,
		TokenizerPath:           path,
		IsGeneration:            true,
		WeightVersion:           strconv.FormatInt(s.sched.Version(), 10),
		ModelType:               modelType(s.cfg),
		Architectures:           []string{s.cfg.Architecture},
		ServedModelName:         s.opt.Name,
		MaxTotalNumTokens:       s.maxLen,
		NumHiddenLayers:         s.cfg.NumHiddenLayers,
		NumExpertsPerTok:        s.cfg.NumExpertsPerTok,
		ReturnRoutedExpertsEach: "position",
	})
	return nil
}

// modelType is Hugging Face's model_type of the served architecture.
func modelType(c model.Config) string {
	if c.Architecture == model.ArchQwen3MoE {
		return "qwen3_moe"
	}
	return "qwen3"
}
