package remote

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/keel-rl/keel/rollout"
)

// vllm speaks vLLM's OpenAI-compatible API: POST /v1/completions; the
// development-mode pause, collective_rpc and resume for weights. It reads
// no routes, so New refuses it for an MoE policy.
type vllm struct{ c *Client }

// vllmRequest is the body of vLLM's POST /v1/completions. Every sampling
// setting is sent because vLLM fills unsent ones from the model's
// generation_config.json.
type vllmRequest struct {
	Model             string  `json:"model"`
	Prompt            []int32 `json:"prompt"`
	N                 int     `json:"n"`
	MaxTokens         int     `json:"max_tokens"`
	Temperature       float64 `json:"temperature"`
	TopP              float64 `json:"top_p"`
	TopK              int     `json:"top_k"` // -1: off
	MinP              float64 `json:"min_p"`
	RepetitionPenalty float64 `json:"repetition_penalty"`
	FrequencyPenalty  float64 `json:"frequency_penalty"`
	PresencePenalty   float64 `json:"presence_penalty"`
	// Seed: vLLM gives sample j of n the seed Seed + j.
	Seed uint64 `json:"seed"`
	// Logprobs 0: the sampled token's log-prob, no alternatives.
	Logprobs               int     `json:"logprobs"`
	ReturnTokensAsTokenIDs bool    `json:"return_tokens_as_token_ids"`
	ReturnTokenIDs         bool    `json:"return_token_ids"`
	StopTokenIDs           []int32 `json:"stop_token_ids,omitempty"`
	SkipSpecialTokens      bool    `json:"skip_special_tokens"`
	Stream                 bool    `json:"stream"`
}

type vllmResponse struct {
	Choices []struct {
		Index    *int `json:"index"`
		Logprobs *struct {
			Tokens        []string          `json:"tokens"`
			TokenLogprobs []json.RawMessage `json:"token_logprobs"`
		} `json:"logprobs"`
		FinishReason *string `json:"finish_reason"`
		TokenIDs     []int64 `json:"token_ids"`
	} `json:"choices"`
}

// probe learns the served model's name (GET /v1/models).
func (p *vllm) probe(ctx context.Context, s *server) error {
	r := p.c
	body, err := r.do(ctx, s, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return err
	}
	var res struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &res); err != nil || len(res.Data) == 0 || res.Data[0].ID == "" {
		return &ServerError{Server: s.url, Op: "GET /v1/models", Field: "data", Err: fmt.Errorf("no served model: %s", snippet(body))}
	}
	r.mu.Lock()
	s.model = res.Data[0].ID
	r.mu.Unlock()
	return nil
}

// generate runs one prompt's request on a vLLM server.
func (p *vllm) generate(ctx context.Context, s *server, j job) ([]rollout.Sample, error) {
	r := p.c
	r.mu.Lock()
	name := s.model
	r.mu.Unlock()
	req := vllmRequest{Model: name, Prompt: j.ids, N: j.n, MaxTokens: j.maxNew, Temperature: j.sp.Temperature,
		TopP: j.sp.TopP, TopK: j.sp.TopK, RepetitionPenalty: 1, Seed: j.seed & (1<<62 - 1),
		ReturnTokensAsTokenIDs: true, ReturnTokenIDs: true, StopTokenIDs: j.sp.Stop}
	if req.TopK == 0 {
		req.TopK = -1
	}
	if req.TopP == 0 {
		req.TopP = 1
	}
	body, err := r.do(ctx, s, http.MethodPost, "/v1/completions", req)
	if err != nil {
		return nil, err
	}
	return p.decode(s.url, body, j)
}

// decode reads and checks a completions answer: n choices, each a
// sample of j's prompt. vLLM reports no weight version: the samples carry
// the version the fleet was last given. Its one log-prob per token is the
// sampled distribution's only under --logprobs-mode processed_logprobs
// (after temperature and top-k / top-p), which keel cannot check.
func (p *vllm) decode(url string, body []byte, j job) ([]rollout.Sample, error) {
	bad := func(field string, format string, a ...any) error {
		return &ServerError{Server: url, Op: "POST /v1/completions", Field: field, Err: fmt.Errorf(format, a...)}
	}
	var res vllmResponse
	if err := json.Unmarshal(body, &res); err != nil {
		return nil, jsonErr(bad, err)
	}
	if len(res.Choices) != j.n {
		return nil, bad("choices", "%d choices, want %d (one per sample)", len(res.Choices), j.n)
	}
	samples := make([]rollout.Sample, j.n)
	seen := make([]bool, j.n)
	for c, ch := range res.Choices {
		f := "choices[" + strconv.Itoa(c) + "]."
		if ch.Index == nil || *ch.Index < 0 || *ch.Index >= j.n || seen[*ch.Index] {
			return nil, bad(f+"index", "missing, out of [0, %d) or repeated", j.n)
		}
		k := *ch.Index
		seen[k] = true
		lp := ch.Logprobs
		if lp == nil {
			return nil, bad(f+"logprobs", "missing")
		}
		raw := make([]int64, len(lp.Tokens))
		for t, tok := range lp.Tokens {
			id, err := strconv.ParseInt(strings.TrimPrefix(tok, "token_id:"), 10, 64)
			if err != nil || !strings.HasPrefix(tok, "token_id:") {
				return nil, bad(f+"logprobs.tokens", "entry %d, %q: want \"token_id:N\" (return_tokens_as_token_ids)", t, tok)
			}
			raw[t] = id
		}
		if ch.TokenIDs != nil && !slices.Equal(ch.TokenIDs, raw) {
			return nil, bad(f+"token_ids", "differ from logprobs.tokens")
		}
		ids, err := p.c.outputIDs(raw, j, f+"logprobs.tokens", bad)
		if err != nil {
			return nil, err
		}
		if len(lp.TokenLogprobs) != len(ids) {
			return nil, bad(f+"logprobs.token_logprobs", "%d entries for %d tokens", len(lp.TokenLogprobs), len(ids))
		}
		vals := make([]float32, len(ids))
		for t, e := range lp.TokenLogprobs {
			if vals[t], err = parseLogProb(e); err != nil {
				return nil, bad(f+"logprobs.token_logprobs", "entry %d: %v", t, err)
			}
		}
		smp := rollout.Sample{Tokens: ids, LogProbs: vals, Version: j.version}
		if j.sp.Truncated() {
			smp.TruncLogProbs = vals
		}
		if ch.FinishReason == nil {
			return nil, bad(f+"finish_reason", "missing: the request did not finish")
		}
		switch *ch.FinishReason {
		case "stop", "length":
			smp.Finish = *ch.FinishReason
		case "abort":
			err := bad(f+"finish_reason", "aborted").(*ServerError)
			err.Transient = true
			return nil, err
		default:
			return nil, bad(f+"finish_reason", "unknown %q", *ch.FinishReason)
		}
		samples[k] = smp
	}
	return samples, nil
}

// push has a vLLM server (VLLM_SERVER_DEV_MODE=1) load dir: pause, point
// the workers' model_config at dir and reload the weights from it
// (collective_rpc update_config, reload_weights), drop the prefix cache,
// resume (even after a failure, so the server is not left paused). vLLM
// keeps no weight version: the samples carry the one the fleet was last
// given.
func (p *vllm) push(ctx context.Context, s *server, dir string, _ int64) error {
	r := p.c
	// resume is sent even when ctx is done: a server left paused would
	// answer nothing.
	resume := func() error {
		_, err := r.do(context.WithoutCancel(ctx), s, http.MethodPost, "/resume", nil)
		return err
	}
	if _, err := r.do(ctx, s, http.MethodPost, "/pause", nil); err != nil {
		if ctx.Err() != nil {
			resume() // the pause may have reached the server before ctx was done
		}
		return err
	}
	var err error
	steps := []struct {
		path string
		body any
	}{
		{"/collective_rpc", map[string]any{"method": "update_config", "args": []any{map[string]any{"model_config": map[string]any{"model": dir}}}}},
		{"/collective_rpc", map[string]any{"method": "reload_weights"}},
		{"/reset_prefix_cache", nil},
	}
	for _, st := range steps {
		if _, err = r.do(ctx, s, http.MethodPost, st.path, st.body); err != nil {
			break
		}
	}
	rerr := resume()
	if err != nil {
		return err
	}
	return rerr
}
