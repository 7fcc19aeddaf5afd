package remote

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// The servers' protocols and their wire formats (see the package comment
// for the sources they were matched against).

// protocol is one server API: how to ask a server who it is, to have it
// sample a prompt's responses, and to have it load a version's weights. A
// Client holds one, chosen by newProtocol, so that the code paths above it
// (retries, dropping servers, the push's two phases) are the same for
// every kind.
type protocol interface {
	// probe checks that s answers and speaks the protocol (and learns
	// what requests must name, such as vLLM's served model).
	probe(ctx context.Context, s *server) error
	// generate runs j's request on s and returns its n samples, checked
	// against the policy and j's weight version.
	generate(ctx context.Context, s *server, j job) ([]rollout.Sample, error)
	// push has s load the model directory dir as weight version version.
	push(ctx context.Context, s *server, dir string, version int64) error
}

// newProtocol is the one place a kind chooses its protocol.
func newProtocol(c *Client) (protocol, error) {
	switch c.opt.Kind {
	case KindKeel:
		return &sglang{c: c, inputs: keelInputs}, nil
	case KindSGLang:
		return &sglang{c: c, inputs: sglangInputs}, nil
	case KindVLLM:
		if len(c.moeLayers) > 0 {
			return nil, fmt.Errorf("server_kind %s: keel reads no expert routes from vLLM, and an MoE policy (%d MoE layers) needs the rollout's routes: use sglang or keel servers", KindVLLM, len(c.moeLayers))
		}
		return &vllm{c: c}, nil
	}
	return nil, fmt.Errorf("unknown server kind %q (want %s)", c.opt.Kind, kindList())
}

// sglang speaks SGLang's native API: POST /generate; pause_generation,
// update_weights_from_disk and continue_generation for weights. keel serve
// speaks it too, with the differences keelInputs lists, all in how a
// request's input_ids and sampling_params are built.
type sglang struct {
	c *Client
	// inputs builds the input_ids and sampling_params of j's request.
	inputs func(j *job) (ids, params any)
}

// sglSampling is SGLang's sampling_params. Every setting is sent, the
// neutral ones included, because SGLang fills unsent ones from the
// model's generation_config.json (--sampling-defaults model).
type sglSampling struct {
	Temperature       float64 `json:"temperature"`
	TopP              float64 `json:"top_p"`
	TopK              int     `json:"top_k"` // -1: off
	MinP              float64 `json:"min_p"`
	RepetitionPenalty float64 `json:"repetition_penalty"`
	FrequencyPenalty  float64 `json:"frequency_penalty"`
	PresencePenalty   float64 `json:"presence_penalty"`
	MaxNewTokens      int     `json:"max_new_tokens"`
	StopTokenIDs      []int32 `json:"stop_token_ids,omitempty"`
	// NoStopTrim keeps a matched stop in the text (the ids keep it anyway).
	NoStopTrim bool `json:"no_stop_trim"`
	// IgnoreEOS (kind keel only, see keelInputs): stop at StopTokenIDs
	// alone, as the local engine does; without it keel serve also stops at
	// the model's end tokens (<|endoftext|> besides <|im_end|>). SGLang's
	// ignore_eos would turn stop_token_ids off as well, so kind sglang
	// never sends it.
	IgnoreEOS    bool   `json:"ignore_eos,omitempty"`
	N            int    `json:"n,omitempty"`
	SamplingSeed uint64 `json:"sampling_seed"`
}

// sglRequest is the body of SGLang's POST /generate.
type sglRequest struct {
	// InputIDs is one prompt (kind keel: its n samples in one request) or
	// the prompt n times (kind sglang: one seed per sample).
	InputIDs       any  `json:"input_ids"`
	SamplingParams any  `json:"sampling_params"`
	ReturnLogprob  bool `json:"return_logprob"`
	// ReturnSamplingMask asks for the log-probs under the truncated
	// distribution (top-k / top-p), output_token_sampling_logprobs.
	ReturnSamplingMask  bool `json:"return_sampling_mask,omitempty"`
	ReturnRoutedExperts bool `json:"return_routed_experts,omitempty"`
	Stream              bool `json:"stream"`
}

// sglOutput is one answer of SGLang's /generate (one sample).
type sglOutput struct {
	OutputIDs []int64  `json:"output_ids"`
	MetaInfo  *sglMeta `json:"meta_info"`
}

type sglMeta struct {
	FinishReason     json.RawMessage `json:"finish_reason"`
	PromptTokens     *int64          `json:"prompt_tokens"`
	CompletionTokens *int64          `json:"completion_tokens"`
	WeightVersion    json.RawMessage `json:"weight_version"`
	WeightVersions   []struct {
		Version string `json:"version"`
	} `json:"weight_versions"`
	// OutputTokenWeightVersions is keel serve's version of each output
	// token after an in-place update switched the request.
	OutputTokenWeightVersions []int64 `json:"output_token_weight_versions"`
	// OutputTokenLogprobs holds [logprob, token_id, text or null] per
	// output token.
	OutputTokenLogprobs         [][]json.RawMessage `json:"output_token_logprobs"`
	OutputTokenSamplingLogprobs []json.RawMessage   `json:"output_token_sampling_logprobs"`
	RoutedExperts               *string             `json:"routed_experts"`
}

// sglParams is the sampling parameters of one request.
func (j *job) sglParams(n int, seed uint64) sglSampling {
	p := sglSampling{Temperature: j.sp.Temperature, TopP: j.sp.TopP, TopK: j.sp.TopK, RepetitionPenalty: 1,
		MaxNewTokens: j.maxNew, StopTokenIDs: j.sp.Stop, NoStopTrim: true, SamplingSeed: seed}
	if p.TopK == 0 {
		p.TopK = -1
	}
	if p.TopP == 0 {
		p.TopP = 1
	}
	if n > 1 {
		p.N = n
	}
	return p
}

// keelInputs builds a kind keel request. keel serve differs from SGLang in
// three ways (README, "Remote rollout"), all so that a remote
// exact-precision run is the local run bit for bit:
//
//  1. a prompt is one request with n = G (the prompt once, its prefill
//     shared) whose sample k draws from the stream (sampling_seed, k)
//     (rollout.SampleStream), as in one local Generate call; SGLang's
//     seeded sampler would give the n samples of one seed the same tokens
//     (see sglangInputs);
//  2. its routes cover every position, SGLang's all but the last (the
//     answer's difference: decodeRoutes takes both);
//  3. requests carry ignore_eos, so that the run's stop_token_ids alone
//     end a response, as in the local engine (keel serve keeps
//     stop_token_ids under ignore_eos; SGLang would drop them).
//
// The requests' differences, 1 and 3, are all here.
func keelInputs(j *job) (ids, params any) {
	p := j.sglParams(j.n, j.seed)
	p.IgnoreEOS = true
	return j.ids, p
}

// sglangInputs builds a kind sglang request: the prompt n times, a batch
// of one sample each with its own seed (sampleSeed).
func sglangInputs(j *job) (ids, params any) {
	batch := make([][]int32, j.n)
	ps := make([]sglSampling, j.n)
	for k := range batch {
		batch[k], ps[k] = j.ids, j.sglParams(1, sampleSeed(j.seed, k))
	}
	return batch, ps
}

// sampleSeed is kind sglang's seed of sample k of a prompt: SGLang's
// seeded sampler hashes (seed, position, token) only, so the n samples of
// one seed would all be the same; each gets the prompt's seed mixed with
// the key of sample k's stream in the local engine. It stays below 2^31
// (older SGLang builds hold seeds in int32).
func sampleSeed(promptSeed uint64, k int) uint64 {
	return rollout.Splitmix64(promptSeed^rollout.SampleStream(k)) & (1<<31 - 1)
}

// generate runs one prompt's request on an SGLang-protocol server.
func (p *sglang) generate(ctx context.Context, s *server, j job) ([]rollout.Sample, error) {
	req := sglRequest{ReturnLogprob: true, ReturnSamplingMask: j.sp.Truncated(),
		ReturnRoutedExperts: len(p.c.moeLayers) > 0}
	req.InputIDs, req.SamplingParams = p.inputs(&j)
	body, err := p.c.do(ctx, s, http.MethodPost, "/generate", req)
	if err != nil {
		return nil, err
	}
	return p.decode(s.url, body, j)
}

// probe asks the server for its model info: it answers and speaks the
// protocol.
func (p *sglang) probe(ctx context.Context, s *server) error {
	body, err := p.c.do(ctx, s, http.MethodGet, "/get_model_info", nil)
	if err != nil {
		return err
	}
	var info map[string]any
	if err := json.Unmarshal(body, &info); err != nil {
		return &ServerError{Server: s.url, Op: "GET /get_model_info", Field: "body", Err: fmt.Errorf("not a JSON object: %v", err)}
	}
	return nil
}

// decode reads and checks the answer of a /generate request: n outputs
// (an object when n = 1, else a list), each a sample of j's prompt under
// j's weight version.
func (p *sglang) decode(url string, body []byte, j job) ([]rollout.Sample, error) {
	bad := func(field string, format string, a ...any) error {
		return &ServerError{Server: url, Op: "POST /generate", Field: field, Err: fmt.Errorf(format, a...)}
	}
	var outs []sglOutput
	trimmed := bytes.TrimSpace(body)
	var err error
	if len(trimmed) > 0 && trimmed[0] == '{' {
		outs = make([]sglOutput, 1)
		err = json.Unmarshal(trimmed, &outs[0])
	} else {
		err = json.Unmarshal(trimmed, &outs)
	}
	if err != nil {
		return nil, jsonErr(bad, err)
	}
	if len(outs) != j.n {
		return nil, bad("body", "%d outputs, want %d (one per sample)", len(outs), j.n)
	}
	list := j.n > 1 || (len(trimmed) > 0 && trimmed[0] == '[')
	samples := make([]rollout.Sample, j.n)
	for k := range outs {
		prefix := ""
		if list {
			prefix = "[" + strconv.Itoa(k) + "]."
		}
		smp, err := p.sample(&outs[k], j, func(field string, format string, a ...any) error {
			return bad(prefix+field, format, a...)
		})
		if err != nil {
			return nil, err
		}
		samples[k] = smp
	}
	return samples, nil
}

// sample checks one output and turns it into a sample.
func (p *sglang) sample(o *sglOutput, j job, bad func(field, format string, a ...any) error) (rollout.Sample, error) {
	r := p.c
	var smp rollout.Sample
	ids, err := r.outputIDs(o.OutputIDs, j, "output_ids", bad)
	if err != nil {
		return smp, err
	}
	m := o.MetaInfo
	if m == nil {
		return smp, bad("meta_info", "missing")
	}
	// The weights that sampled it: a stale server is an error, never a
	// sample to train on.
	want := strconv.FormatInt(j.version, 10)
	var got string
	if len(m.WeightVersion) == 0 || json.Unmarshal(m.WeightVersion, &got) != nil {
		return smp, bad("meta_info.weight_version", "missing or not a string (%s): the server cannot say which weights sampled this", snippet(m.WeightVersion))
	}
	version := j.version
	if r.opt.InPlace {
		// Partial rollouts: newer weights may have sampled it, or some of it.
		v, err := strconv.ParseInt(got, 10, 64)
		r.mu.Lock()
		newest := r.newest
		r.mu.Unlock()
		if err != nil || v < j.version || v > newest {
			return smp, bad("meta_info.weight_version", "%q, want %q to %d: the server does not hold weights of this run's steps", got, want, newest)
		}
		version = v
	} else if got != want {
		return smp, bad("meta_info.weight_version", "%q, want %q: the server does not hold this step's weights", got, want)
	}
	if len(m.WeightVersions) > 1 {
		return smp, bad("meta_info.weight_versions", "%d versions sampled this response: weights changed during the request", len(m.WeightVersions))
	}
	if m.OutputTokenWeightVersions != nil {
		if !r.opt.InPlace {
			return smp, bad("meta_info.output_token_weight_versions", "weights changed during the request, which only in-place pushes allow")
		}
		if err := tokenVersions(m.OutputTokenWeightVersions, version, len(ids)); err != nil {
			return smp, bad("meta_info.output_token_weight_versions", "%v", err)
		}
		smp.TokenVersions = m.OutputTokenWeightVersions
	}
	if smp.Finish, err = sglFinish(m.FinishReason, bad); err != nil {
		return smp, err
	}
	if m.PromptTokens != nil && *m.PromptTokens != int64(len(j.ids)) {
		return smp, bad("meta_info.prompt_tokens", "%d, the prompt sent has %d tokens", *m.PromptTokens, len(j.ids))
	}
	if m.CompletionTokens != nil && *m.CompletionTokens != int64(len(ids)) {
		return smp, bad("meta_info.completion_tokens", "%d, output_ids holds %d", *m.CompletionTokens, len(ids))
	}
	if len(m.OutputTokenLogprobs) != len(ids) {
		return smp, bad("meta_info.output_token_logprobs", "%d entries for %d output tokens", len(m.OutputTokenLogprobs), len(ids))
	}
	lp := make([]float32, len(ids))
	for t, e := range m.OutputTokenLogprobs {
		if len(e) < 2 {
			return smp, bad("meta_info.output_token_logprobs", "entry %d has %d elements, want [logprob, token_id, text]", t, len(e))
		}
		if lp[t], err = parseLogProb(e[0]); err != nil {
			return smp, bad("meta_info.output_token_logprobs", "entry %d: logprob %v", t, err)
		}
		var id int64
		if err := json.Unmarshal(e[1], &id); err != nil || id != int64(ids[t]) {
			return smp, bad("meta_info.output_token_logprobs", "entry %d is for token %s, output_ids[%d] is %d", t, snippet(e[1]), t, ids[t])
		}
	}
	smp.Tokens, smp.LogProbs, smp.Version = ids, lp, version
	if j.sp.Truncated() {
		// Under truncation log mu is the truncated distribution's.
		tl := m.OutputTokenSamplingLogprobs
		if len(tl) != len(ids) {
			return smp, bad("meta_info.output_token_sampling_logprobs", "%d entries for %d output tokens (top-k / top-p sampling needs the log-probs under the truncated distribution: a server with return_sampling_mask)", len(tl), len(ids))
		}
		smp.TruncLogProbs = make([]float32, len(ids))
		for t, e := range tl {
			if smp.TruncLogProbs[t], err = parseLogProb(e); err != nil {
				return smp, bad("meta_info.output_token_sampling_logprobs", "entry %d: %v", t, err)
			}
		}
	}
	if len(r.moeLayers) > 0 {
		if m.RoutedExperts == nil {
			return smp, bad("meta_info.routed_experts", "missing: an MoE policy needs the rollout's routes (launch SGLang with --enable-return-routed-experts)")
		}
		rt, err := decodeRoutes(*m.RoutedExperts, &r.opt.Config, r.moeLayers, len(j.ids)+len(ids))
		if err != nil {
			return smp, bad("meta_info.routed_experts", "%v", err)
		}
		smp.Routes = rt
	}
	return smp, nil
}

// outputIDs checks a response's token ids: present, within the request's
// budget and the vocabulary.
func (r *Client) outputIDs(raw []int64, j job, field string, bad func(field, format string, a ...any) error) ([]int32, error) {
	if len(raw) == 0 {
		return nil, bad(field, "missing or empty")
	}
	if len(raw) > j.maxNew {
		return nil, bad(field, "%d tokens, more than the %d asked for", len(raw), j.maxNew)
	}
	vocab := r.opt.Config.VocabSize
	ids := make([]int32, len(raw))
	for t, id := range raw {
		if id < 0 || id >= int64(vocab) {
			return nil, bad(field, "token %d: id %d outside the vocabulary [0, %d)", t, id, vocab)
		}
		ids[t] = int32(id)
	}
	return ids, nil
}

// sglFinish maps meta_info.finish_reason ({"type": ...}, or a bare string)
// to the engine's "stop" / "length". An aborted request is transient: the
// server was paused or shed it.
func sglFinish(raw json.RawMessage, bad func(field, format string, a ...any) error) (string, error) {
	var typ string
	var obj struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Type != "" {
		typ = obj.Type
	} else if json.Unmarshal(raw, &typ) != nil || typ == "" {
		return "", bad("meta_info.finish_reason", "%s, want {\"type\": \"stop\" or \"length\"}: the request did not finish", snippet(raw))
	}
	switch typ {
	case "stop", "length":
		return typ, nil
	case "abort":
		err := bad("meta_info.finish_reason", "aborted: %s", obj.Message).(*ServerError)
		err.Transient = true
		return "", err
	}
	return "", bad("meta_info.finish_reason", "unknown type %q", typ)
}

// decodeRoutes reads SGLang's routed_experts (base64 of little-endian
// int32 ids, C order [positions][num_hidden_layers][k]) as the routes of
// the MoE layers at every one of T positions (prompt and response). SGLang
// sends T-1 positions (the last token is sampled, never fed through the
// model): the last position then repeats the one before it. No
// log-probability of the loss depends on the last position's routes (its
// output predicts no trained token), so R3 is unaffected; only the routing
// measures see the copy. keel serve sends all T.
func decodeRoutes(b64 string, c *model.Config, moeLayers []int, T int) (*model.Routes, error) {
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("not base64: %v", err)
	}
	L, K, E := c.NumHiddenLayers, c.NumExpertsPerTok, c.NumExperts
	row := L * K * 4
	if len(data)%row != 0 {
		return nil, fmt.Errorf("%d bytes are not whole positions of %d layers x %d experts as int32 (%d bytes each)", len(data), L, K, row)
	}
	rows := len(data) / row
	if rows != T && rows != T-1 {
		return nil, fmt.Errorf("%d positions of [%d layers x %d experts], want %d (prompt and response) or %d (all but the last)", rows, L, K, T, T-1)
	}
	if rows == 0 {
		return nil, errors.New("no positions")
	}
	rt := model.NewRoutes(T, len(moeLayers), K, E)
	for t := 0; t < rows; t++ {
		for ml, li := range moeLayers {
			for s := 0; s < K; s++ {
				id := int32(binary.LittleEndian.Uint32(data[((t*L+li)*K+s)*4:]))
				if id < 0 || int(id) >= E {
					return nil, fmt.Errorf("position %d, layer %d, slot %d: expert %d outside [0, %d)", t, li, s, id, E)
				}
				rt.Set(t, ml, s, int(id))
			}
		}
	}
	if rows == T-1 {
		buf := make([]int32, K)
		for ml := range moeLayers {
			rt.SetSlots(T-1, ml, rt.Slots(buf, T-2, ml))
		}
	}
	if err := rt.Check(); err != nil {
		return nil, err
	}
	return rt, nil
}

// jsonErr turns a decoding error into a ServerError naming the field when
// JSON says which.
func jsonErr(bad func(field, format string, a ...any) error, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return bad(te.Field, "%v", err)
	}
	return bad("body", "malformed JSON: %v", err)
}

// push has an SGLang-protocol server load dir as version: pause,
// update_weights_from_disk, continue (even after a failed update, so the
// server is not left paused), then get_model_info must report the version.
func (p *sglang) push(ctx context.Context, s *server, dir string, version int64) error {
	r := p.c
	ver := strconv.FormatInt(version, 10)
	// continue_generation is sent even when ctx is done: a server left
	// paused would answer nothing.
	cont := func() error {
		_, err := r.do(context.WithoutCancel(ctx), s, http.MethodPost, "/continue_generation", map[string]any{})
		return err
	}
	mode := "abort"
	if r.opt.InPlace {
		mode = "in_place"
	}
	if _, err := r.do(ctx, s, http.MethodPost, "/pause_generation", map[string]any{"mode": mode}); err != nil {
		if ctx.Err() != nil {
			cont() // the pause may have reached the server before ctx was done
		}
		return err
	}
	body, err := r.do(ctx, s, http.MethodPost, "/update_weights_from_disk",
		map[string]any{"model_path": dir, "weight_version": ver, "flush_cache": true})
	if err == nil {
		var res struct {
			Success *bool  `json:"success"`
			Message string `json:"message"`
		}
		if e := json.Unmarshal(body, &res); e != nil || res.Success == nil || !*res.Success {
			err = &ServerError{Server: s.url, Op: "POST /update_weights_from_disk", Field: "success",
				Err: fmt.Errorf("the server did not load %s: %s", dir, snippet(body))}
		}
	}
	cerr := cont()
	if err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	body, err = r.do(ctx, s, http.MethodGet, "/get_model_info", nil)
	if err != nil {
		return err
	}
	var info struct {
		WeightVersion json.RawMessage `json:"weight_version"`
	}
	var got string
	if json.Unmarshal(body, &info) != nil || json.Unmarshal(info.WeightVersion, &got) != nil || got != ver {
		return &ServerError{Server: s.url, Op: "GET /get_model_info", Field: "weight_version",
			Err: fmt.Errorf("%s after loading version %s from %s", snippet(info.WeightVersion), ver, dir)}
	}
	return nil
}

// tokenVersions checks an answer's per-token weight versions: one per
// output token, the first the answer's weight_version, never going back.
func tokenVersions(v []int64, first int64, n int) error {
	if len(v) != n {
		return fmt.Errorf("%d versions for %d output tokens", len(v), n)
	}
	if n > 0 && v[0] != first {
		return fmt.Errorf("the first token is of version %d, weight_version says %d", v[0], first)
	}
	for t := 1; t < n; t++ {
		if v[t] < v[t-1] {
			return fmt.Errorf("token %d is of version %d, older than the token before (%d)", t, v[t], v[t-1])
		}
	}
	return nil
}
