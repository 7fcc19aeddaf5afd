package serve

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
)

// samplingFields are the sampling settings OpenAI's two endpoints share,
// with vLLM's extras (top_k, stop_token_ids, ignore_eos,
// return_tokens_as_token_ids). Unknown fields are 400s; logit_bias is
// known but accepted only empty (it would change the distribution
// sampled from).
type samplingFields struct {
	Model       string          `json:"model"`
	N           *int            `json:"n"`
	Temperature *float64        `json:"temperature"`
	TopP        *float64        `json:"top_p"`
	TopK        *int            `json:"top_k"`
	Stop        json.RawMessage `json:"stop"`
	StopIDs     []int32         `json:"stop_token_ids"`
	IgnoreEOS   bool            `json:"ignore_eos"`
	Seed        *int64          `json:"seed"`
	Stream      bool            `json:"stream"`
	StreamOpts  *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	User             string             `json:"user"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	TokensAsIDs      bool               `json:"return_tokens_as_token_ids"`
	LogitBias        map[string]float64 `json:"logit_bias"`
}

type completionRequest struct {
	samplingFields
	Prompt    json.RawMessage `json:"prompt"`
	MaxTokens *int            `json:"max_tokens"`
	Logprobs  *int            `json:"logprobs"`
	Echo      bool            `json:"echo"`
	BestOf    *int            `json:"best_of"` // accepted only equal to n: every sample is returned
}

type chatRequest struct {
	samplingFields
	Messages            []chatMessage `json:"messages"`
	MaxTokens           *int          `json:"max_tokens"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	Logprobs            bool          `json:"logprobs"`
	TopLogprobs         *int          `json:"top_logprobs"`
}

// chatMessage takes content as a string or as OpenAI's list of parts
// (text parts only).
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
}

// sampling turns the shared fields into the engine's settings for a
// prompt of promptLen tokens with budget maxNew.
func (s *Server) sampling(f *samplingFields, maxNew int) (rollout.Sampling, []string, int, error) {
	if err := s.checkModel(f.Model); err != nil {
		return rollout.Sampling{}, nil, 0, err
	}
	n := 1
	if f.N != nil {
		n = *f.N
	}
	if err := s.checkN("n", n); err != nil {
		return rollout.Sampling{}, nil, 0, err
	}
	sp := rollout.Sampling{Temperature: 1, MaxNewTokens: maxNew}
	if f.Temperature != nil {
		t := *f.Temperature
		if !(t >= 0 && t <= 2) {
			return sp, nil, 0, badRequest("temperature", "temperature = %g, want 0 to 2", t)
		}
		if t > 0 && t < rollout.MinTemperature {
			return sp, nil, 0, badRequest("temperature", "temperature = %g: too small to sample with (at least %g); use 0 for greedy decoding", t, rollout.MinTemperature)
		}
		sp.Temperature = t
	}
	if f.TopP != nil {
		p := *f.TopP
		if !(p > 0 && p <= 1) {
			return sp, nil, 0, badRequest("top_p", "top_p = %g, want a value in (0, 1]", p)
		}
		sp.TopP = p
	}
	if f.TopK != nil {
		k := *f.TopK
		if k < -1 || k > s.cfg.VocabSize {
			return sp, nil, 0, badRequest("top_k", "top_k = %d, want -1 or 0 (off) to %d", k, s.cfg.VocabSize)
		}
		sp.TopK = max(k, 0)
	}
	for name, v := range map[string]*float64{"frequency_penalty": f.FrequencyPenalty, "presence_penalty": f.PresencePenalty} {
		if v != nil && *v != 0 {
			return sp, nil, 0, badRequest(name, "%s is not supported (only 0)", name)
		}
	}
	if len(f.LogitBias) > 0 {
		return sp, nil, 0, badRequest("logit_bias", "logit_bias is not supported (only empty)")
	}
	if f.Seed != nil {
		sp.Seed = uint64(*f.Seed)
	} else {
		var b [8]byte
		rand.Read(b[:])
		sp.Seed = binary.LittleEndian.Uint64(b[:])
	}
	stops, err := stopStrings(f.Stop)
	if err != nil {
		return sp, nil, 0, err
	}
	if !f.IgnoreEOS {
		sp.Stop = append(sp.Stop, s.stops...)
	}
	for i, id := range f.StopIDs {
		if id < 0 || int(id) >= s.cfg.VocabSize {
			return sp, nil, 0, badRequest("stop_token_ids", "stop_token_ids[%d]: id %d outside the vocabulary [0, %d)", i, id, s.cfg.VocabSize)
		}
		sp.Stop = append(sp.Stop, id)
	}
	return sp, stops, n, nil
}

// stopStrings reads OpenAI's stop: null, a string or a list of strings.
func stopStrings(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		if one == "" {
			return nil, badRequest("stop", "stop: an empty string")
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop: want a string or a list of strings")
	}
	if len(many) > 4 {
		return nil, badRequest("stop", "stop: %d strings, at most 4", len(many))
	}
	for i, st := range many {
		if st == "" {
			return nil, badRequest("stop", "stop[%d]: an empty string", i)
		}
	}
	return many, nil
}

// prompts reads OpenAI's completion prompt: a string, a list of strings,
// a list of token ids or a list of lists of token ids.
func (s *Server) prompts(raw json.RawMessage) ([][]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return [][]int32{s.tok.Encode(text)}, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil && len(texts) > 0 {
		out := make([][]int32, len(texts))
		for i, t := range texts {
			out[i] = s.tok.Encode(t)
		}
		return out, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		p, err := toIDs("prompt", ids)
		return [][]int32{p}, err
	}
	var lists [][]int64
	if json.Unmarshal(raw, &lists) == nil && len(lists) > 0 {
		out := make([][]int32, len(lists))
		for i, l := range lists {
			p, err := toIDs(fmt.Sprintf("prompt[%d]", i), l)
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	}
	return nil, badRequest("prompt", "prompt: want a string, a list of strings, a list of token ids or a list of such lists")
}

func toIDs(field string, v []int64) ([]int32, error) {
	out := make([]int32, len(v))
	for i, x := range v {
		if x < 0 || x > math.MaxInt32 {
			return nil, badRequest(field, "%s[%d]: token id %d out of range", field, i, x)
		}
		out[i] = int32(x)
	}
	return out, nil
}

// newID makes a response id with OpenAI's prefixes.
func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// tokenText is a token as OpenAI's logprobs name it: its text, or
// "token_id:N" with vLLM's return_tokens_as_token_ids.
func (s *Server) tokenText(id int32, asIDs bool) string {
	if asIDs {
		return "token_id:" + strconv.Itoa(int(id))
	}
	return s.tok.DecodeLenient([]int32{id})
}

// openAIResponse is the envelope of OpenAI's answers and stream chunks,
// completions' and chat's, whose choices are of type C. (Usage is in
// answers and, with stream_options.include_usage, in a stream's last
// chunk only.)
type openAIResponse[C any] struct {
	Choices []C    `json:"choices"`
	Created int64  `json:"created"`
	ID      string `json:"id"`
	Model   string `json:"model"`
	Object  string `json:"object"`
	Usage   *usage `json:"usage,omitempty"`
}

// newResponse starts an answer of object type object (or every chunk of
// a stream), with a new id of prefix.
func newResponse[C any](s *Server, prefix, object string) openAIResponse[C] {
	return openAIResponse[C]{ID: newID(prefix), Object: object, Created: time.Now().Unix(), Model: s.opt.Name}
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// completionLP is the logprobs object of tokens ids[lo:hi] of c, text
// offsets counted from base, and the offset after them.
func (s *Server) completionLP(c *choice, lo, hi, base int, asIDs bool) (*completionLogprobs, int) {
	lp := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	off := base
	for t := lo; t < hi && t < c.nText; t++ {
		tok := s.tokenText(c.ids[t], asIDs)
		lp.Tokens = append(lp.Tokens, tok)
		lp.TokenLogprobs = append(lp.TokenLogprobs, c.lps[t])
		lp.TextOffset = append(lp.TextOffset, off)
		off += len(tok)
		m := map[string]float32{}
		if t < len(c.top) {
			for _, a := range c.top[t] {
				m[s.tokenText(a.Token, asIDs)] = a.LogProb
			}
		}
		lp.TopLogprobs = append(lp.TopLogprobs, m)
	}
	return lp, off
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) error {
	var req completionRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	jobs, stops, topN, err := s.completionJobs(&req)
	if err != nil {
		return err
	}
	g := s.newGeneration(jobs, stops, topN)
	env := newResponse[completionChoice](s, "cmpl-", "text_completion")
	// echo is the prompt's text for a choice's first chunk (once, even
	// when its first tokens are held back), with echo.
	echo := func(c *choice) string {
		if req.Echo && !c.echoed {
			c.echoed = true
			return s.tok.DecodeLenient(jobs[c.job].prompt)
		}
		return ""
	}
	if req.Stream {
		return stream(w, r, g, env, streamFormat[completionChoice]{
			logprobs: req.Logprobs != nil, usage: req.StreamOpts != nil && req.StreamOpts.IncludeUsage, prefix: echo,
			choice: func(c *choice, text string, lo, hi int, finish *string) completionChoice {
				ch := completionChoice{Index: s.choiceIndex(g, c), Text: text, FinishReason: finish}
				if hi > lo {
					ch.Logprobs, c.lpOff = s.completionLP(c, lo, hi, c.lpOff, req.TokensAsIDs)
				}
				return ch
			},
		})
	}
	if err := g.run(r.Context(), nil); err != nil {
		return genError(err)
	}
	out := make([]completionChoice, len(g.choices))
	for i, c := range g.choices {
		out[i] = completionChoice{Index: i, Text: echo(c) + c.text, FinishReason: ptr(c.finish)}
		if req.Logprobs != nil {
			out[i].Logprobs, _ = s.completionLP(c, 0, len(c.lps), 0, req.TokensAsIDs)
		}
	}
	env.Choices, env.Usage = out, ptr(g.usage())
	writeJSON(w, http.StatusOK, env)
	return nil
}

// completionJobs checks a completion request and makes a job of each of
// its prompts, with the stop strings and the top log-probs to return.
func (s *Server) completionJobs(req *completionRequest) ([]genJob, []string, int, error) {
	prompts, err := s.prompts(req.Prompt)
	if err != nil {
		return nil, nil, 0, err
	}
	topN := 0
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > rollout.MaxTopLogProbs {
			return nil, nil, 0, badRequest("logprobs", "logprobs = %d, want 0 to %d", *req.Logprobs, rollout.MaxTopLogProbs)
		}
		topN = *req.Logprobs
		if req.Echo {
			return nil, nil, 0, badRequest("echo", "echo with logprobs is not supported: the engine computes no log-probabilities of prompt tokens")
		}
	}
	sp, stops, n, err := s.sampling(&req.samplingFields, 0)
	if err != nil {
		return nil, nil, 0, err
	}
	if req.BestOf != nil && *req.BestOf != n {
		return nil, nil, 0, badRequest("best_of", "best_of = %d: only best_of = n (%d) is supported (every sample is returned)", *req.BestOf, n)
	}
	if err := s.checkSamples("prompt", len(prompts)*n); err != nil {
		return nil, nil, 0, err
	}
	var jobs []genJob
	for i, p := range prompts {
		field := "prompt"
		if len(prompts) > 1 {
			field = fmt.Sprintf("prompt[%d]", i)
		}
		if err := s.checkIDs(field, p); err != nil {
			return nil, nil, 0, err
		}
		maxNew, err := s.maxNew("max_tokens", req.MaxTokens, len(p), 16)
		if err != nil {
			return nil, nil, 0, err
		}
		// Prompt i draws from PromptSeed(seed, i), as in one Generate
		// call of every prompt: prompts do not share a random stream.
		psp := sp
		psp.MaxNewTokens, psp.Seed = maxNew, rollout.PromptSeed(sp.Seed, i)
		jobs = append(jobs, genJob{prompt: p, n: n, sp: psp})
	}
	return jobs, stops, topN, nil
}

// choiceIndex numbers choices across prompts, as OpenAI does.
func (s *Server) choiceIndex(g *generation, c *choice) int {
	i := 0
	for j := range c.job {
		i += g.jobs[j].n
	}
	return i + c.index
}

func (g *generation) usage() usage {
	var u usage
	for _, jb := range g.jobs {
		u.PromptTokens += len(jb.prompt)
	}
	for _, c := range g.choices {
		u.CompletionTokens += len(c.ids)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// genError maps a generation's error to an answer: 503 for a request
// aborted, or refused by a closed scheduler (send it again, elsewhere);
// 499 for a cancelled client (which needs none); 400 for the rest, which
// are the engine's checks of the request (Do's only other errors).
func genError(err error) *apiError {
	switch {
	case errors.Is(err, errAborted):
		return &apiError{status: http.StatusServiceUnavailable, msg: "the request was aborted by pause_generation (a weight update); send it again"}
	case errors.Is(err, errShutdown), errors.Is(err, rollout.ErrClosed):
		return &apiError{status: http.StatusServiceUnavailable, msg: "the server is shutting down; send the request to another"}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &apiError{status: 499, msg: "request cancelled"}
	}
	return &apiError{status: http.StatusBadRequest, msg: err.Error()}
}

func ptr[T any](v T) *T { return &v }

// Chat completions.

type chatLogprob struct {
	Token       string       `json:"token"`
	Logprob     float32      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []chatTopAlt `json:"top_logprobs"`
}

type chatTopAlt struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

func bytesOf(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}

func (s *Server) chatLP(c *choice, lo, hi int, asIDs bool) *chatLogprobs {
	out := &chatLogprobs{Content: []chatLogprob{}}
	for t := lo; t < hi && t < c.nText; t++ {
		tok := s.tokenText(c.ids[t], asIDs)
		e := chatLogprob{Token: tok, Logprob: c.lps[t], Bytes: bytesOf(tok), TopLogprobs: []chatTopAlt{}}
		if t < len(c.top) {
			for _, a := range c.top[t] {
				at := s.tokenText(a.Token, asIDs)
				e.TopLogprobs = append(e.TopLogprobs, chatTopAlt{Token: at, Logprob: a.LogProb, Bytes: bytesOf(at)})
			}
		}
		out.Content = append(out.Content, e)
	}
	return out
}

// messages reads the chat's messages, content as a string or text parts.
func messages(in []chatMessage) ([]tokenizer.Message, error) {
	if len(in) == 0 {
		return nil, badRequest("messages", "messages: at least one message is required")
	}
	out := make([]tokenizer.Message, len(in))
	for i, m := range in {
		switch m.Role {
		case "system", "user", "assistant", "developer", "tool":
		default:
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role: %q is not a chat role", i, m.Role)
		}
		var text string
		if err := json.Unmarshal(m.Content, &text); err != nil {
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return nil, badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content: want a string or a list of text parts", i)
			}
			for j, p := range parts {
				if p.Type != "text" {
					return nil, badRequest(fmt.Sprintf("messages[%d].content[%d].type", i, j), "messages[%d].content[%d]: only text parts are supported, not %q", i, j, p.Type)
				}
				text += p.Text
			}
		}
		out[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	return out, nil
}

// chatReply is the assistant's message of a chat choice.
type chatReply struct {
	Content string `json:"content"`
	Role    string `json:"role"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      chatReply     `json:"message"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// chatDeltaBody is what a chunk adds to a streamed message: the role
// first, then content; an empty object when a chunk carries only
// log-probabilities or the finish reason.
type chatDeltaBody struct {
	Content *string `json:"content,omitempty"`
	Role    string  `json:"role,omitempty"`
}

// chatDelta is a streamed chat choice.
type chatDelta struct {
	Index        int           `json:"index"`
	Delta        chatDeltaBody `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) error {
	var req chatRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	job, stops, topN, err := s.chatJob(&req)
	if err != nil {
		return err
	}
	g := s.newGeneration([]genJob{job}, stops, topN)
	if req.Stream {
		roles := make([]chatDelta, job.n)
		for i := range roles {
			roles[i] = chatDelta{Index: i, Delta: chatDeltaBody{Role: "assistant", Content: ptr("")}}
		}
		return stream(w, r, g, newResponse[chatDelta](s, "chatcmpl-", "chat.completion.chunk"), streamFormat[chatDelta]{
			first: roles, logprobs: req.Logprobs, usage: req.StreamOpts != nil && req.StreamOpts.IncludeUsage,
			choice: func(c *choice, text string, lo, hi int, finish *string) chatDelta {
				ch := chatDelta{Index: c.index, FinishReason: finish}
				if text != "" {
					ch.Delta.Content = &text
				}
				if hi > lo {
					ch.Logprobs = s.chatLP(c, lo, hi, req.TokensAsIDs)
				}
				return ch
			},
		})
	}
	env := newResponse[chatChoice](s, "chatcmpl-", "chat.completion")
	if err := g.run(r.Context(), nil); err != nil {
		return genError(err)
	}
	out := make([]chatChoice, len(g.choices))
	for i, c := range g.choices {
		out[i] = chatChoice{Index: i, Message: chatReply{Role: "assistant", Content: c.text}, FinishReason: ptr(c.finish)}
		if req.Logprobs {
			out[i].Logprobs = s.chatLP(c, 0, len(c.lps), req.TokensAsIDs)
		}
	}
	env.Choices, env.Usage = out, ptr(g.usage())
	writeJSON(w, http.StatusOK, env)
	return nil
}

// chatJob checks a chat request and makes its one job, with the stop
// strings and the top log-probs to return.
func (s *Server) chatJob(req *chatRequest) (genJob, []string, int, error) {
	msgs, err := messages(req.Messages)
	if err != nil {
		return genJob{}, nil, 0, err
	}
	prompt := s.tok.EncodeChat(msgs, true)
	if err := s.checkIDs("messages", prompt); err != nil {
		return genJob{}, nil, 0, err
	}
	budget, field := req.MaxCompletionTokens, "max_completion_tokens"
	if budget == nil {
		budget, field = req.MaxTokens, "max_tokens"
	}
	maxNew, err := s.maxNew(field, budget, len(prompt), s.maxLen)
	if err != nil {
		return genJob{}, nil, 0, err
	}
	sp, stops, n, err := s.sampling(&req.samplingFields, maxNew)
	if err != nil {
		return genJob{}, nil, 0, err
	}
	topN := 0
	if req.TopLogprobs != nil {
		if !req.Logprobs {
			return genJob{}, nil, 0, badRequest("top_logprobs", "top_logprobs needs logprobs: true")
		}
		if *req.TopLogprobs < 0 || *req.TopLogprobs > rollout.MaxTopLogProbs {
			return genJob{}, nil, 0, badRequest("top_logprobs", "top_logprobs = %d, want 0 to %d", *req.TopLogprobs, rollout.MaxTopLogProbs)
		}
		topN = *req.TopLogprobs
	}
	return genJob{prompt: prompt, n: n, sp: sp}, stops, topN, nil
}
