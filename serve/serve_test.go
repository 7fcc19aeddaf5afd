package serve

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
	"github.com/keel-rl/keel/train"
)

const testMaxLen = 64

func testModel(t *testing.T, seed uint64) *model.Model {
	t.Helper()
	cfg, err := model.Preset("tiny-moe", 128)
	if err != nil {
		t.Fatal(err)
	}
	m := model.New(cfg)
	model.Init(m, seed)
	return m
}

// testServer serves a random tiny MoE model in exact precision.
type testServer struct {
	*httptest.Server
	m     *model.Model
	srv   *Server
	tok   *tokenizer.Tokenizer
	sched *rollout.Scheduler
}

func newTestServer(t *testing.T, opt Options) *testServer {
	t.Helper()
	m := testModel(t, 1)
	e, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 8, MaxLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	sched := rollout.NewScheduler(e)
	tok := tokenizer.NewChar()
	if opt.Name == "" {
		opt.Name = "tiny"
	}
	srv := New(sched, tok, m.Config, testMaxLen, opt)
	ts := &testServer{Server: httptest.NewServer(srv.Handler()), m: m, srv: srv, tok: tok, sched: sched}
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
		e.Close()
	})
	return ts
}

// post sends a JSON body and decodes the answer into out (when non-nil),
// returning the status.
func (ts *testServer) post(t *testing.T, path string, body any, out any) int {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		b, _ = json.Marshal(v)
	}
	resp, err := http.Post(ts.URL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %v in %s", path, err, raw)
		}
	}
	return resp.StatusCode
}

// reference samples prompt n times on a fresh engine of m, as a request
// with this seed must give.
func reference(t *testing.T, m *model.Model, prompt []int32, n int, sp rollout.Sampling) []rollout.Sample {
	t.Helper()
	e, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 8, MaxLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	out, err := e.Generate([][]int32{prompt}, n, sp)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type sglTestAnswer struct {
	Text      string  `json:"text"`
	OutputIDs []int32 `json:"output_ids"`
	MetaInfo  struct {
		FinishReason        map[string]any `json:"finish_reason"`
		PromptTokens        int            `json:"prompt_tokens"`
		CompletionTokens    int            `json:"completion_tokens"`
		WeightVersion       string         `json:"weight_version"`
		OutputTokenLogprobs [][3]any       `json:"output_token_logprobs"`
		RoutedExperts       string         `json:"routed_experts"`
	} `json:"meta_info"`
}

// /generate answers with exactly the engine's samples: tokens, log-probs
// (as float32), routes of every position, finish reasons and version,
// whether one request or sixteen concurrent ones arrive.
func TestGenerateMatchesEngine(t *testing.T) {
	ts := newTestServer(t, Options{})
	stops := ts.srv.stops
	var wg sync.WaitGroup
	for c := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt := []int32{1, 5 + int32(c), 40, 41, 42, 4}
			seed := uint64(100 + c)
			temp := 0.7 + 0.1*float64(c%4)
			var got []sglTestAnswer
			code := ts.post(t, "/generate", map[string]any{"input_ids": prompt, "return_logprob": true, "return_routed_experts": true,
				"sampling_params": map[string]any{"n": 3, "sampling_seed": seed, "temperature": temp, "max_new_tokens": 20, "top_k": -1}}, &got)
			if code != 200 || len(got) != 3 {
				t.Errorf("request %d: status %d, %d answers", c, code, len(got))
				return
			}
			ref := reference(t, ts.m, prompt, 3, rollout.Sampling{Temperature: temp, MaxNewTokens: 20, Seed: seed, Stop: stops})
			for k, a := range got {
				r := ref[k]
				if !slices.Equal(a.OutputIDs, r.Tokens) {
					t.Errorf("request %d sample %d: ids %v, engine %v", c, k, a.OutputIDs, r.Tokens)
					continue
				}
				for j, e := range a.MetaInfo.OutputTokenLogprobs {
					if lp := float32(e[0].(float64)); lp != r.LogProbs[j] || int32(e[1].(float64)) != r.Tokens[j] {
						t.Errorf("request %d sample %d token %d: %v, engine %v", c, k, j, e, r.LogProbs[j])
					}
				}
				if a.MetaInfo.WeightVersion != "0" || a.MetaInfo.PromptTokens != len(prompt) || a.MetaInfo.CompletionTokens != len(r.Tokens) {
					t.Errorf("request %d sample %d: meta %+v", c, k, a.MetaInfo)
				}
				if want := map[string]string{"stop": "stop", "length": "length"}[r.Finish]; a.MetaInfo.FinishReason["type"] != want {
					t.Errorf("request %d sample %d: finish %v, engine %s", c, k, a.MetaInfo.FinishReason, r.Finish)
				}
				checkRoutes(t, a.MetaInfo.RoutedExperts, r.Routes, &ts.m.Config)
			}
		}()
	}
	wg.Wait()
}

func checkRoutes(t *testing.T, b64 string, want *model.Routes, c *model.Config) {
	t.Helper()
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	L, K := c.NumHiddenLayers, c.NumExpertsPerTok
	if len(data) != want.Tokens*L*K*4 {
		t.Fatalf("routed_experts: %d bytes for %d positions", len(data), want.Tokens)
	}
	for p := range want.Tokens {
		for l := range L {
			for k := range K {
				if got := int(binary.LittleEndian.Uint32(data[((p*L+l)*K+k)*4:])); got != want.At(p, l, k) {
					t.Fatalf("position %d layer %d slot %d: expert %d, engine %d", p, l, k, got, want.At(p, l, k))
				}
			}
		}
	}
}

// The SGLang request that keel's RL client sends for kind sglang (the
// fixture in rollout/remote/testdata, matched against SGLang's source) is
// accepted: a batch of prompts with one sampling_params each, every field
// of it.
func TestGenerateSGLangFixture(t *testing.T) {
	ts := newTestServer(t, Options{})
	raw, err := os.ReadFile("../rollout/remote/testdata/sglang_generate_request.json")
	if err != nil {
		t.Fatal(err)
	}
	var req map[string]any
	if err := json.Unmarshal(raw, &req); err != nil {
		t.Fatal(err)
	}
	// Its ids are Qwen's; the test model's vocabulary is 128.
	req["input_ids"] = [][]int32{{1, 50, 51, 4}, {1, 50, 51, 4}}
	for _, p := range req["sampling_params"].([]any) {
		p.(map[string]any)["stop_token_ids"] = []int{2}
	}
	var answer []map[string]any
	if code := ts.post(t, "/generate", req, &answer); code != 200 || len(answer) != 2 {
		t.Fatalf("status %d, %d answers", code, len(answer))
	}
	var fixture []map[string]any
	raw, _ = os.ReadFile("../rollout/remote/testdata/sglang_generate_response.json")
	json.Unmarshal(raw, &fixture)
	for _, key := range []string{"text", "output_ids", "meta_info"} {
		if _, ok := answer[0][key]; !ok {
			t.Errorf("answer lacks %s", key)
		}
	}
	for key := range fixture[0]["meta_info"].(map[string]any) {
		switch key {
		case "id", "finish_reason", "prompt_tokens", "completion_tokens", "weight_version", "output_token_logprobs", "routed_experts":
			if _, ok := answer[0]["meta_info"].(map[string]any)[key]; !ok && key != "routed_experts" {
				t.Errorf("meta_info lacks %s", key)
			}
		}
	}
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
	} `json:"error"`
}

// Bad requests answer 400 (or 401, 404, 413) with an OpenAI-style error
// naming the field, and nothing reaches the engine.
func TestBadRequests(t *testing.T) {
	ts := newTestServer(t, Options{MaxBodyBytes: 4096})
	long := make([]int32, testMaxLen)
	cases := []struct {
		path  string
		body  any
		code  int
		param string
	}{
		{"/v1/completions", `{"prompt": "hi"`, 400, ""},
		{"/v1/completions", `{"prompt": "hi", "bogus": 1}`, 400, "bogus"},
		{"/v1/completions", map[string]any{"prompt": []int{1, 500}}, 400, "prompt"},
		{"/v1/completions", map[string]any{"prompt": long}, 400, "prompt"},
		{"/v1/completions", map[string]any{"prompt": "hi", "n": 1000}, 400, "n"},
		{"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 1000}, 400, "max_tokens"},
		{"/v1/completions", map[string]any{"prompt": "hi", "temperature": -1}, 400, "temperature"},
		{"/v1/completions", map[string]any{"prompt": "hi", "logprobs": 50}, 400, "logprobs"},
		{"/v1/completions", map[string]any{"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"},
		{"/v1/completions", map[string]any{"prompt": "hi", "model": "gpt-9"}, 404, "model"},
		{"/v1/completions", map[string]any{"prompt": strings.Repeat("x", 5000)}, 413, ""},
		{"/v1/chat/completions", map[string]any{"messages": []any{}}, 400, "messages"},
		{"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "wizard", "content": "hi"}}}, 400, "messages[0].role"},
		{"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}, "top_logprobs": 2}, 400, "top_logprobs"},
		{"/generate", map[string]any{"input_ids": []int{1, -3}}, 400, "input_ids"},
		{"/generate", map[string]any{"input_ids": []int{1, 2}, "sampling_params": map[string]any{"top_q": 1}}, 400, "sampling_params"},
		{"/generate", map[string]any{"input_ids": []int{1, 2}, "sampling_params": map[string]any{"min_p": 0.1}}, 400, "sampling_params.min_p"},
		{"/generate", map[string]any{"input_ids": [][]int{{1, 2}}, "sampling_params": []any{map[string]any{}, map[string]any{}}}, 400, "sampling_params"},
		{"/generate", map[string]any{}, 400, "input_ids"},
		{"/update_weights_from_disk", map[string]any{"model_path": "/nonexistent", "weight_version": "x"}, 400, "weight_version"},
	}
	for _, c := range cases {
		var e openAIError
		code := ts.post(t, c.path, c.body, &e)
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if code != c.code || param != c.param || e.Error.Message == "" {
			t.Errorf("%s %v: %d %q %q, want %d naming %q", c.path, c.body, code, param, e.Error.Message, c.code, c.param)
		}
	}
	if st := ts.sched.Stats(); st.Steps != 0 {
		t.Errorf("bad requests ran %d forward steps", st.Steps)
	}
}

// With an API key, requests without it (or with another) get 401; with
// it they pass.
func TestAPIKey(t *testing.T) {
	ts := newTestServer(t, Options{APIKey: "s3cret"})
	for _, h := range []string{"", "Bearer wrong", "s3cret"} {
		req, _ := http.NewRequest("GET", ts.URL+"/v1/models", nil)
		if h != "" {
			req.Header.Set("Authorization", h)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("Authorization %q: %d", h, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest("GET", ts.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(list.Data) != 1 || list.Data[0].ID != "tiny" {
		t.Errorf("with the key: %d %+v", resp.StatusCode, list)
	}
}

type completionAnswer struct {
	Choices []struct {
		Index    int    `json:"index"`
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float32            `json:"token_logprobs"`
			TopLogprobs   []map[string]float32 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
		} `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

// Completions with log-probs: the text and log-probs are the engine's,
// and the top alternatives are the training engine's most probable tokens
// at the sampling temperature (exact precision: the same numbers).
func TestCompletionsLogprobs(t *testing.T) {
	ts := newTestServer(t, Options{})
	var a completionAnswer
	// Token ids as names (vLLM's return_tokens_as_token_ids): the model's
	// 128 ids outnumber the tokenizer's 100 pieces.
	body := map[string]any{"prompt": "12+", "n": 2, "max_tokens": 12, "temperature": 0.8, "seed": 7, "logprobs": 3, "ignore_eos": true,
		"return_tokens_as_token_ids": true}
	if code := ts.post(t, "/v1/completions", body, &a); code != 200 || len(a.Choices) != 2 {
		t.Fatalf("status %d, %+v", code, a)
	}
	prompt := ts.tok.Encode("12+")
	ref := reference(t, ts.m, prompt, 2, rollout.Sampling{Temperature: 0.8, MaxNewTokens: 12, Seed: 7})
	if a.Usage.PromptTokens != len(prompt) || a.Usage.CompletionTokens != 24 {
		t.Errorf("usage %+v", a.Usage)
	}
	for k, c := range a.Choices {
		r := ref[k]
		if c.Logprobs.Tokens[0] != fmt.Sprintf("token_id:%d", r.Tokens[0]) {
			t.Errorf("choice %d: tokens %v", k, c.Logprobs.Tokens)
		}
		if c.Text != ts.tok.DecodeLenient(r.Tokens) || c.FinishReason != "length" {
			t.Errorf("choice %d: %q %s, engine %q", k, c.Text, c.FinishReason, ts.tok.DecodeLenient(r.Tokens))
		}
		if !slices.Equal(c.Logprobs.TokenLogprobs, r.LogProbs) {
			t.Errorf("choice %d: log-probs %v, engine %v", k, c.Logprobs.TokenLogprobs, r.LogProbs)
		}
		// The top 3 at each position: the training engine's log-probability
		// of every token of the vocabulary after the response so far.
		eng := train.New(ts.m)
		for j := range r.Tokens {
			prefix := append(slices.Clone(prompt), r.Tokens[:j]...)
			seqs := make([][]int32, ts.m.Config.VocabSize)
			for v := range seqs {
				seqs[v] = append(slices.Clone(prefix), int32(v))
			}
			res, err := eng.Forward(seqs, train.ForwardOptions{Temperature: 0.8, NoEntropy: true})
			if err != nil {
				t.Fatal(err)
			}
			row := make([]float32, len(seqs))
			ids := make([]int, len(seqs))
			for v := range seqs {
				row[v], ids[v] = res.LogProbs[v][len(prefix)-1], v
			}
			sort.SliceStable(ids, func(x, y int) bool { return row[ids[x]] > row[ids[y]] })
			top := c.Logprobs.TopLogprobs[j]
			if len(top) != 3 {
				t.Fatalf("choice %d token %d: %d alternatives", k, j, len(top))
			}
			for _, id := range ids[:3] {
				got, ok := top[fmt.Sprintf("token_id:%d", id)]
				if !ok || math.Abs(float64(got-row[id])) > 1e-6 {
					t.Errorf("choice %d token %d: alternative %d: %v, %v; training engine %v", k, j, id, got, ok, row[id])
				}
			}
		}
	}
}

// readSSE collects a stream's data events up to [DONE].
func readSSE(t *testing.T, resp *http.Response) []map[string]any {
	t.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	var events []map[string]any
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		events = append(events, ev)
	}
	if !done {
		t.Fatal("the stream did not end with [DONE]")
	}
	return events
}

func postStream(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// A streamed completion and a streamed chat carry, chunk by chunk, the
// text the same request gives without streaming, and end with [DONE]; a
// stop string cuts the text before it, streamed or not.
func TestStreaming(t *testing.T) {
	ts := newTestServer(t, Options{})
	for _, stop := range []any{nil, "e"} {
		body := map[string]any{"prompt": "ab", "n": 2, "max_tokens": 20, "seed": 3, "ignore_eos": true, "stop": stop}
		var whole completionAnswer
		ts.post(t, "/v1/completions", body, &whole)
		body["stream"] = true
		body["stream_options"] = map[string]any{"include_usage": true}
		texts := map[int]string{}
		finish := map[int]string{}
		var gotUsage bool
		for _, ev := range readSSE(t, postStream(t, ts.URL+"/v1/completions", body)) {
			if u, ok := ev["usage"]; ok && u != nil {
				gotUsage = true
			}
			for _, c := range ev["choices"].([]any) {
				ch := c.(map[string]any)
				i := int(ch["index"].(float64))
				texts[i] += ch["text"].(string)
				if f, ok := ch["finish_reason"].(string); ok {
					finish[i] = f
				}
			}
		}
		for i, c := range whole.Choices {
			if texts[i] != c.Text || finish[i] != c.FinishReason {
				t.Errorf("stop %v, choice %d: streamed %q (%s), whole %q (%s)", stop, i, texts[i], finish[i], c.Text, c.FinishReason)
			}
			if stop != nil && strings.Contains(c.Text, "e") {
				t.Errorf("choice %d: %q holds the stop string", i, c.Text)
			}
		}
		if !gotUsage {
			t.Error("no usage chunk with include_usage")
		}
	}
	chat := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Compute 2+2."}}, "max_tokens": 16, "seed": 5, "logprobs": true, "top_logprobs": 2}
	var whole struct {
		Choices []struct {
			Message struct {
				Role, Content string
			} `json:"message"`
			Logprobs struct {
				Content []struct {
					Token       string           `json:"token"`
					TopLogprobs []map[string]any `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if code := ts.post(t, "/v1/chat/completions", chat, &whole); code != 200 || len(whole.Choices) != 1 || whole.Choices[0].Message.Role != "assistant" {
		t.Fatalf("chat: %d %+v", code, whole)
	}
	if lc := whole.Choices[0].Logprobs.Content; len(lc) == 0 || len(lc[0].TopLogprobs) != 2 {
		t.Errorf("chat logprobs %+v", lc)
	}
	chat["stream"] = true
	var text, role string
	for _, ev := range readSSE(t, postStream(t, ts.URL+"/v1/chat/completions", chat)) {
		if ev["object"] != "chat.completion.chunk" {
			t.Errorf("object %v", ev["object"])
		}
		for _, c := range ev["choices"].([]any) {
			d := c.(map[string]any)["delta"].(map[string]any)
			if r, ok := d["role"].(string); ok {
				role = r
			}
			if s, ok := d["content"].(string); ok {
				text += s
			}
		}
	}
	if role != "assistant" || text != whole.Choices[0].Message.Content {
		t.Errorf("streamed chat %q (%s), whole %q", text, role, whole.Choices[0].Message.Content)
	}
}

// Streamed log-probs are those of the streamed text, token for token, as
// without streaming: a token held back as a possible start of a stop
// string comes with its text (at the end of a stream too), tokens cut by
// a stop string never come, and none comes twice. (Found by the openai
// npm package's check, tools/openai-check: a stop string of two
// characters streamed the token before the cut twice and the cut token.)
func TestStreamedLogprobsFollowText(t *testing.T) {
	ts := newTestServer(t, Options{})
	base := map[string]any{"prompt": "ab", "n": 2, "max_tokens": 24, "seed": 11, "ignore_eos": true, "logprobs": 2}
	var plain completionAnswer
	ts.post(t, "/v1/completions", base, &plain)
	text := []rune(plain.Choices[0].Text)
	if len(text) < 8 {
		t.Fatalf("text %q too short", string(text))
	}
	// A stop string met mid-text, and one whose first character ends the
	// text but which is never met (its token is held back to the end).
	mid := string(text[len(text)/2 : len(text)/2+2])
	held := string(text[len(text)-1:]) + "\u2603"
	for _, stop := range []any{nil, mid, held} {
		body := maps.Clone(base)
		body["stop"] = stop
		var whole completionAnswer
		if code := ts.post(t, "/v1/completions", body, &whole); code != 200 || len(whole.Choices) != 2 {
			t.Fatalf("stop %q: status %d %+v", stop, code, whole)
		}
		body["stream"] = true
		type streamed struct {
			text string
			toks []string
			lps  []float32
			offs []int
		}
		got := map[int]*streamed{}
		for _, ev := range readSSE(t, postStream(t, ts.URL+"/v1/completions", body)) {
			for _, c := range ev["choices"].([]any) {
				ch := c.(map[string]any)
				i := int(ch["index"].(float64))
				if got[i] == nil {
					got[i] = &streamed{}
				}
				s := got[i]
				s.text += ch["text"].(string)
				if lp, ok := ch["logprobs"].(map[string]any); ok {
					for k, tok := range lp["tokens"].([]any) {
						s.toks = append(s.toks, tok.(string))
						s.lps = append(s.lps, float32(lp["token_logprobs"].([]any)[k].(float64)))
						s.offs = append(s.offs, int(lp["text_offset"].([]any)[k].(float64)))
					}
				}
			}
		}
		for i, c := range whole.Choices {
			s := got[i]
			if s == nil {
				t.Fatalf("stop %q: choice %d not streamed", stop, i)
			}
			// (A stop string within a token's text cuts the text there and
			// leaves the token out.)
			if !strings.HasPrefix(c.Text, strings.Join(c.Logprobs.Tokens, "")) {
				t.Errorf("stop %q, choice %d: tokens %q are not the start of %q", stop, i, c.Logprobs.Tokens, c.Text)
			}
			if s.text != c.Text || !slices.Equal(s.toks, c.Logprobs.Tokens) || !slices.Equal(s.lps, c.Logprobs.TokenLogprobs) || !slices.Equal(s.offs, c.Logprobs.TextOffset) {
				t.Errorf("stop %q, choice %d: streamed %q tokens %q offsets %v; whole %q tokens %q offsets %v",
					stop, i, s.text, s.toks, s.offs, c.Text, c.Logprobs.Tokens, c.Logprobs.TextOffset)
			}
		}
	}
	// Chat, with the mid-text stop of its own answer.
	chat := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Compute 2+2."}}, "max_tokens": 24, "seed": 5,
		"ignore_eos": true, "logprobs": true, "top_logprobs": 2}
	type chatAnswer struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			Logprobs struct {
				Content []struct {
					Token   string  `json:"token"`
					Logprob float32 `json:"logprob"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	var first chatAnswer
	ts.post(t, "/v1/chat/completions", chat, &first)
	ctext := []rune(first.Choices[0].Message.Content)
	if len(ctext) < 8 {
		t.Fatalf("chat text %q too short", string(ctext))
	}
	for _, stop := range []any{nil, string(ctext[len(ctext)/2 : len(ctext)/2+2]), string(ctext[len(ctext)-1:]) + "\u2603"} {
		body := maps.Clone(chat)
		body["stop"] = stop
		var whole chatAnswer
		if code := ts.post(t, "/v1/chat/completions", body, &whole); code != 200 || len(whole.Choices) != 1 {
			t.Fatalf("chat stop %q: status %d %+v", stop, code, whole)
		}
		var want []string
		var wantLP []float32
		for _, e := range whole.Choices[0].Logprobs.Content {
			want, wantLP = append(want, e.Token), append(wantLP, e.Logprob)
		}
		body["stream"] = true
		var text string
		var toks []string
		var lps []float32
		for _, ev := range readSSE(t, postStream(t, ts.URL+"/v1/chat/completions", body)) {
			for _, c := range ev["choices"].([]any) {
				ch := c.(map[string]any)
				if s, ok := ch["delta"].(map[string]any)["content"].(string); ok {
					text += s
				}
				if lp, ok := ch["logprobs"].(map[string]any); ok {
					for _, e := range lp["content"].([]any) {
						toks = append(toks, e.(map[string]any)["token"].(string))
						lps = append(lps, float32(e.(map[string]any)["logprob"].(float64)))
					}
				}
			}
		}
		c := whole.Choices[0]
		if !strings.HasPrefix(c.Message.Content, strings.Join(want, "")) {
			t.Errorf("chat stop %q: tokens %q are not the start of %q", stop, want, c.Message.Content)
		}
		if text != c.Message.Content || !slices.Equal(toks, want) || !slices.Equal(lps, wantLP) {
			t.Errorf("chat stop %q: streamed %q tokens %q; whole %q tokens %q", stop, text, toks, c.Message.Content, want)
		}
	}
}

// A streamed completion with echo sends the prompt once, also when its
// first token is held back as a possible start of a stop string. (Found
// with the openai npm package's check: the prompt came again with every
// chunk until the first text was sent.)
func TestStreamedEchoOnce(t *testing.T) {
	ts := newTestServer(t, Options{})
	body := map[string]any{"prompt": "ab", "max_tokens": 8, "seed": 4, "ignore_eos": true, "logprobs": 0}
	var first completionAnswer
	ts.post(t, "/v1/completions", body, &first)
	if len(first.Choices) != 1 || len(first.Choices[0].Logprobs.Tokens) == 0 {
		t.Fatalf("%+v", first)
	}
	delete(body, "logprobs")
	body["echo"] = true
	body["stop"] = first.Choices[0].Logprobs.Tokens[0] + "\u2603" // holds the first token back
	var whole completionAnswer
	ts.post(t, "/v1/completions", body, &whole)
	if want := "ab" + first.Choices[0].Text; len(whole.Choices) != 1 || whole.Choices[0].Text != want {
		t.Fatalf("echo: %+v, want %q", whole, want)
	}
	body["stream"] = true
	var text string
	for _, ev := range readSSE(t, postStream(t, ts.URL+"/v1/completions", body)) {
		for _, c := range ev["choices"].([]any) {
			text += c.(map[string]any)["text"].(string)
		}
	}
	if text != whole.Choices[0].Text {
		t.Errorf("streamed with echo %q, whole %q", text, whole.Choices[0].Text)
	}
}

// The weight-sync sequence of an RL step: pause, update from a directory
// with a version, continue. The server then reports the version, and
// samples are those of a fresh engine on the new weights.
func TestUpdateWeightsFromDisk(t *testing.T) {
	ts := newTestServer(t, Options{})
	m2 := testModel(t, 2)
	dir := filepath.Join(t.TempDir(), "v5")
	if err := model.Save(dir, m2, "float32"); err != nil {
		t.Fatal(err)
	}
	var ok map[string]any
	for _, step := range []struct {
		path string
		body any
	}{
		{"/pause_generation", map[string]any{"mode": "in_place"}},
		{"/update_weights_from_disk", map[string]any{"model_path": dir, "weight_version": "5", "flush_cache": true}},
		{"/continue_generation", map[string]any{}},
	} {
		if code := ts.post(t, step.path, step.body, &ok); code != 200 || ok["success"] != true {
			t.Fatalf("%s: %d %v", step.path, code, ok)
		}
	}
	resp, err := http.Get(ts.URL + "/get_model_info")
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	json.NewDecoder(resp.Body).Decode(&info)
	resp.Body.Close()
	if info["weight_version"] != "5" || info["model_path"] != dir {
		t.Errorf("model info %v", info)
	}
	var a sglTestAnswer
	ts.post(t, "/generate", map[string]any{"input_ids": []int{1, 60, 61}, "return_logprob": true,
		"sampling_params": map[string]any{"sampling_seed": 9, "max_new_tokens": 10, "ignore_eos": true}}, &a)
	ref := reference(t, m2, []int32{1, 60, 61}, 1, rollout.Sampling{Temperature: 1, MaxNewTokens: 10, Seed: 9})
	if !slices.Equal(a.OutputIDs, ref[0].Tokens) || a.MetaInfo.WeightVersion != "5" {
		t.Errorf("after the update: %v (version %s), fresh engine %v", a.OutputIDs, a.MetaInfo.WeightVersion, ref[0].Tokens)
	}
	// A model of another shape is refused, the served one kept.
	other, _ := model.Preset("tiny-dense", 128)
	om := model.New(other)
	model.Init(om, 3)
	odir := filepath.Join(t.TempDir(), "other")
	if err := model.Save(odir, om, "float32"); err != nil {
		t.Fatal(err)
	}
	if code := ts.post(t, "/update_weights_from_disk", map[string]any{"model_path": odir}, &ok); code != 400 || ok["success"] != false {
		t.Errorf("another shape: %d %v", code, ok)
	}
}

// /metrics speaks Prometheus' text format with the server's measures.
func TestMetrics(t *testing.T) {
	ts := newTestServer(t, Options{})
	ts.post(t, "/generate", map[string]any{"input_ids": []int{1, 2, 3}, "sampling_params": map[string]any{"max_new_tokens": 4}}, nil)
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`keel:requests_total{code="200",route="/generate"} 1`, "keel:generation_tokens_total", "keel:num_requests_waiting 0",
		"keel:request_latency_seconds_bucket", "keel:batch_rows", "keel:weight_version 0", "keel:prompt_tokens_total 3",
		"keel:num_sequences_running 0"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// It counts sequences, not requests (a request of n samples is n).
	if strings.Contains(string(b), "keel:num_requests_running") {
		t.Error("/metrics still names running sequences keel:num_requests_running")
	}
}

// pause_generation in SGLang's default mode aborts the requests in flight
// (they answer finish_reason abort, to be sent again); in place, it keeps
// them, and a weight update must wait for continue_generation.
func TestPauseAbort(t *testing.T) {
	ts := newTestServer(t, Options{})
	dir := filepath.Join(t.TempDir(), "v1")
	if err := model.Save(dir, testModel(t, 2), "float32"); err != nil {
		t.Fatal(err)
	}
	// finish is the first sample's finish reason (n = 8: a list).
	finish := func(a []map[string]any) any {
		return a[0]["meta_info"].(map[string]any)["finish_reason"].(map[string]any)["type"]
	}
	for _, mode := range []string{"in_place", "abort"} {
		// A request must be caught in flight by the pause: on a busy
		// machine it may finish first, and then the scenario is tried
		// again.
		for attempt := 0; ; attempt++ {
			if attempt == 50 {
				t.Fatalf("%s: no request was caught in flight in 50 attempts", mode)
			}
			answer := make(chan []map[string]any, 1)
			go func() {
				var a []map[string]any
				ts.post(t, "/generate", map[string]any{"input_ids": []int{1, 2, 3}, "sampling_params": map[string]any{"n": 8, "max_new_tokens": 60, "ignore_eos": true}}, &a)
				answer <- a
			}()
			deadline := time.Now().Add(10 * time.Second)
			for ts.sched.Stats().Running == 0 && len(answer) == 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			var ok map[string]any
			body := map[string]any{"mode": mode}
			if mode == "abort" {
				body = map[string]any{} // SGLang's default
			}
			if code := ts.post(t, "/pause_generation", body, &ok); code != 200 {
				t.Fatalf("pause %s: %d %v", mode, code, ok)
			}
			if mode == "in_place" && ts.sched.Stats().Running == 0 {
				// Finished before the pause (no step runs while paused, so
				// this is settled): try again.
				ts.post(t, "/continue_generation", nil, nil)
				<-answer
				continue
			}
			code := ts.post(t, "/update_weights_from_disk", map[string]any{"model_path": dir, "weight_version": "1"}, &ok)
			if mode == "in_place" {
				// Partial rollouts: the sequences in flight continue on the
				// new weights, each token's version in the answer.
				if code != 200 {
					t.Errorf("update while paused in place with a request in flight: %d %v", code, ok)
				}
				ts.post(t, "/continue_generation", nil, nil)
				a := <-answer
				if f := finish(a); f != "length" {
					t.Errorf("in place: finish %v", f)
				}
				for i, o := range a {
					meta := o["meta_info"].(map[string]any)
					vs, _ := meta["output_token_weight_versions"].([]any)
					if len(vs) != 60 || vs[0] != 0.0 || vs[59] != 1.0 || meta["weight_version"] != "0" {
						t.Errorf("in place: output %d: weight_version %v, token versions %v", i, meta["weight_version"], vs)
					}
				}
				break
			}
			if code != 200 {
				t.Errorf("update after an abort: %d %v", code, ok)
			}
			ts.post(t, "/continue_generation", nil, nil)
			a := <-answer
			if f := finish(a); f == "length" {
				continue // finished before the pause
			} else if f != "abort" {
				t.Errorf("abort: finish %v", f)
			}
			break
		}
	}
}

// newTestServerOf serves m on an engine of engineLen tokens per sequence,
// the server told sequences hold serverLen (the engine caps generation at
// its own length: a server length beyond it lets a test ask for budgets
// no test engine could hold).
func newTestServerOf(t *testing.T, m *model.Model, engineLen, serverLen int, opt Options) *testServer {
	t.Helper()
	e, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 8, MaxLen: engineLen})
	if err != nil {
		t.Fatal(err)
	}
	sched := rollout.NewScheduler(e)
	tok := tokenizer.NewChar()
	if opt.Name == "" {
		opt.Name = "tiny"
	}
	srv := New(sched, tok, m.Config, serverLen, opt)
	ts := &testServer{Server: httptest.NewServer(srv.Handler()), m: m, srv: srv, tok: tok, sched: sched}
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
		e.Close()
	})
	return ts
}

// call runs one request through the handler in process (no connection:
// fast enough to race requests against each other), with a JSON body.
func (ts *testServer) call(method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	ts.srv.Handler().ServeHTTP(rec, req)
	return rec
}

// generateWithin posts a short /generate and fails the test unless it is
// answered 200 within d (a scheduler left paused never answers).
func (ts *testServer) generateWithin(t *testing.T, d time.Duration) {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		done <- ts.call("POST", "/generate", `{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}`).Code
	}()
	select {
	case code := <-done:
		if code != 200 {
			t.Fatalf("/generate: %d", code)
		}
	case <-time.After(d):
		t.Fatalf("/generate not answered in %s: the scheduler was left paused", d)
	}
}

// pause_generation and continue_generation racing each other leave the
// scheduler as the server's flag says: after a last continue, requests
// are served. Two pauses at once both return only once no forward step
// runs. (The flag used to change under one lock and the scheduler after
// it: a continue in between left the scheduler paused for good.)
func TestPauseContinueRace(t *testing.T) {
	ts := newTestServer(t, Options{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 2000 {
				ts.call("POST", "/pause_generation", `{"mode": "in_place"}`)
			}
		})
		wg.Go(func() {
			for range 2000 {
				ts.call("POST", "/continue_generation", `{}`)
			}
		})
	}
	wg.Wait()
	ts.call("POST", "/continue_generation", `{}`)
	ts.generateWithin(t, 10*time.Second)

	// Concurrent pauses while a request decodes: once both have
	// returned, no step runs.
	for attempt := range 50 {
		answer := make(chan int, 1)
		go func() {
			answer <- ts.call("POST", "/generate", `{"input_ids": [1, 2, 3], "sampling_params": {"n": 8, "max_new_tokens": 60, "ignore_eos": true}}`).Code
		}()
		for ts.sched.Stats().Steps == 0 && len(answer) == 0 {
			time.Sleep(50 * time.Microsecond)
		}
		// Each pause notes the steps taken when it returns: none may
		// follow.
		var pw sync.WaitGroup
		var at [2]int64
		for i := range at {
			pw.Go(func() {
				ts.call("POST", "/pause_generation", `{"mode": "in_place"}`)
				at[i] = ts.sched.Stats().Steps
			})
		}
		pw.Wait()
		time.Sleep(2 * time.Millisecond)
		if now := ts.sched.Stats().Steps; now != at[0] || now != at[1] {
			t.Fatalf("attempt %d: %d and %d forward steps after the two pauses returned", attempt, now-at[0], now-at[1])
		}
		ts.call("POST", "/continue_generation", `{}`)
		if code := <-answer; code != 200 {
			t.Fatalf("attempt %d: /generate %d", attempt, code)
		}
	}
}

// A request's memory grows with the tokens it produces, not with the
// budget it asks for: 4 samples of up to 500,000 tokens each (the engine
// stops them at its 64) allocate no queue for two million tokens. (The
// token queue was pre-sized as n x max_new_tokens: a small body could ask
// for gigabytes.)
func TestRequestMemoryFollowsTokens(t *testing.T) {
	ts := newTestServerOf(t, testModel(t, 1), testMaxLen, 1<<20, Options{})
	body := `{"input_ids": [1, 2, 3], "sampling_params": {"n": 4, "max_new_tokens": 500000, "ignore_eos": true}}`
	for _, stream := range []bool{false, true} {
		path, b := "/generate", body
		if stream {
			path, b = "/v1/completions", `{"prompt": [1, 2, 3], "n": 4, "max_tokens": 500000, "ignore_eos": true, "stream": true}`
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rec := ts.call("POST", path, b)
		runtime.ReadMemStats(&after)
		if rec.Code != 200 {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
			t.Errorf("%s: %d MiB allocated for 4 x 61 tokens", path, alloc>>20)
		}
	}
}

// The samples of one request, over all its prompts, are bounded by
// MaxN: a small body cannot queue thousands of sequences. The error
// names the batch's field.
func TestRequestSamplesBounded(t *testing.T) {
	ts := newTestServer(t, Options{MaxN: 8})
	cases := []struct {
		path, body string
		param      string
	}{
		{"/generate", `{"input_ids": [[1, 2], [1, 3], [1, 4]], "sampling_params": {"n": 3, "max_new_tokens": 1}}`, "input_ids"},
		{"/generate", `{"text": ["a", "b", "c"], "sampling_params": {"n": 3, "max_new_tokens": 1}}`, "text"},
		{"/generate", `{"input_ids": [[1], [1], [1], [1], [1], [1], [1], [1], [1]], "sampling_params": {"max_new_tokens": 1}}`, "input_ids"},
		{"/generate", `{"input_ids": [1, 2], "sampling_params": {"n": 9, "max_new_tokens": 1}}`, "sampling_params.n"},
		{"/v1/completions", `{"prompt": ["a", "b", "c"], "n": 3, "max_tokens": 1}`, "prompt"},
		{"/v1/completions", `{"prompt": "a", "n": 9, "max_tokens": 1}`, "n"},
	}
	for _, c := range cases {
		var e openAIError
		code := ts.post(t, c.path, c.body, &e)
		if code != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s %s: %d %+v, want 400 naming %s", c.path, c.body, code, e.Error, c.param)
		}
	}
	if st := ts.sched.Stats(); st.Steps != 0 {
		t.Errorf("refused requests ran %d forward steps", st.Steps)
	}
	var ok []sglTestAnswer
	if code := ts.post(t, "/generate", `{"input_ids": [[1, 2], [1, 3]], "sampling_params": {"n": 4, "max_new_tokens": 1}}`, &ok); code != 200 || len(ok) != 8 {
		t.Errorf("2 prompts x 4 samples (the bound): %d, %d answers", code, len(ok))
	}
}

// A positive temperature too small for float32 sampling is refused,
// naming the field. (1e-40 gave infinite logits, NaN log-probs and a 200
// with an empty body; 1e-300 rounded to 0 and sampled as if 1.)
func TestTinyTemperature(t *testing.T) {
	ts := newTestServer(t, Options{})
	for _, temp := range []float64{1e-40, 1e-300, rollout.MinTemperature / 2} {
		var e openAIError
		if code := ts.post(t, "/v1/completions", map[string]any{"prompt": "ab", "max_tokens": 4, "temperature": temp}, &e); code != 400 ||
			e.Error.Param == nil || *e.Error.Param != "temperature" || !strings.Contains(e.Error.Message, "use 0 for greedy") {
			t.Errorf("completions, temperature %g: %d %+v", temp, code, e.Error)
		}
		e = openAIError{}
		if code := ts.post(t, "/generate", map[string]any{"input_ids": []int{1, 2}, "sampling_params": map[string]any{"temperature": temp}}, &e); code != 400 ||
			e.Error.Param == nil || *e.Error.Param != "sampling_params.temperature" {
			t.Errorf("/generate, temperature %g: %d %+v", temp, code, e.Error)
		}
	}
	var a completionAnswer
	if code := ts.post(t, "/v1/completions", map[string]any{"prompt": "ab", "max_tokens": 4, "temperature": rollout.MinTemperature}, &a); code != 200 {
		t.Errorf("temperature %g: %d", rollout.MinTemperature, code)
	}
}

// An answer that cannot be encoded is a 500 with an error body, not a 200
// with an empty one; a stream sends an error event, never an empty data
// line.
func TestEncodeFailure(t *testing.T) {
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, map[string]any{"x": math.NaN()})
	var e openAIError
	if err := json.Unmarshal(rec.Body.Bytes(), &e); rec.Code != 500 || err != nil || e.Error.Message == "" {
		t.Errorf("writeJSON of a NaN: %d %q", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	s := newSSE(rec)
	s.send(map[string]any{"x": math.NaN()})
	s.done()
	out := rec.Body.String()
	if strings.Contains(out, "data: \n") || !strings.Contains(out, `"error"`) || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Errorf("stream with an event that cannot be encoded: %q", out)
	}
}

// Stop-string work per token is bounded by the new text and the longest
// stop string, not by the text so far: 4000 tokens cost about what 4000
// one-token steps do. (Every token decoded all ids and searched all the
// text again: quadratic.)
func TestTextWorkIncremental(t *testing.T) {
	ts := newTestServer(t, Options{})
	g := ts.srv.newGeneration([]genJob{{prompt: []int32{1}, n: 1, sp: rollout.Sampling{MaxNewTokens: 4000}}}, []string{"\u2603", "never"}, 0)
	c := g.choices[0]
	const N = 4000
	var want []int32
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range N {
		id := int32(5 + i%90)
		want = append(want, id)
		c.ids, c.lps, c.tlps = append(c.ids, id), append(c.lps, 0), append(c.tlps, 0)
		g.updateText(c)
	}
	runtime.ReadMemStats(&after)
	if c.text != ts.tok.DecodeLenient(want) || c.stopped {
		t.Fatalf("text %q (stopped %v), want %q", c.text, c.stopped, ts.tok.DecodeLenient(want))
	}
	if per := (after.TotalAlloc - before.TotalAlloc) / N; per > 512 {
		t.Errorf("%d bytes allocated per token over %d tokens", per, N)
	}
}

// /generate's text leaves out the stop token that ended it, as SGLang's
// does, unless no_stop_trim; output_ids keep it either way.
func TestGenerateStopTrim(t *testing.T) {
	ts := newTestServer(t, Options{})
	greedy := map[string]any{"temperature": 0, "max_new_tokens": 1, "ignore_eos": true}
	var first sglTestAnswer
	if code := ts.post(t, "/generate", map[string]any{"input_ids": []int{1, 40, 41}, "sampling_params": greedy}, &first); code != 200 || len(first.OutputIDs) != 1 {
		t.Fatalf("%d %+v", code, first)
	}
	stop := first.OutputIDs[0]
	for _, keep := range []bool{false, true} {
		var a sglTestAnswer
		ts.post(t, "/generate", map[string]any{"input_ids": []int{1, 40, 41}, "sampling_params": map[string]any{
			"temperature": 0, "max_new_tokens": 4, "stop_token_ids": []int32{stop}, "no_stop_trim": keep}}, &a)
		want := ""
		if keep {
			want = ts.tok.DecodeLenient([]int32{stop})
		}
		if !slices.Equal(a.OutputIDs, []int32{stop}) || a.MetaInfo.FinishReason["type"] != "stop" || a.Text != want {
			t.Errorf("no_stop_trim %v: text %q ids %v finish %v; want text %q", keep, a.Text, a.OutputIDs, a.MetaInfo.FinishReason, want)
		}
	}
}

// Errors from the engine answer by their kind: 400 for a request the
// engine refuses (more top log-probs than a 16-token vocabulary has),
// 503 once the scheduler is closed.
func TestEngineErrorStatus(t *testing.T) {
	cfg, err := model.Preset("tiny-moe", 16)
	if err != nil {
		t.Fatal(err)
	}
	m := model.New(cfg)
	model.Init(m, 1)
	ts := newTestServerOf(t, m, testMaxLen, testMaxLen, Options{})
	var e openAIError
	if code := ts.post(t, "/v1/completions", map[string]any{"prompt": []int{1, 5}, "max_tokens": 2, "logprobs": 20}, &e); code != 400 ||
		e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, "top log-probs") {
		t.Errorf("logprobs 20 of a 16-token vocabulary: %d %+v", code, e.Error)
	}
	ts.sched.Close()
	for _, path := range []string{"/generate", "/v1/completions"} {
		e = openAIError{}
		body := map[string]any{"input_ids": []int{1, 5}, "prompt": []int{1, 5}}
		delete(body, map[string]string{"/generate": "prompt", "/v1/completions": "input_ids"}[path])
		if code := ts.post(t, path, body, &e); code != 503 {
			t.Errorf("%s after the scheduler closed: %d %+v", path, code, e.Error)
		}
	}
}

// A known route asked with another method answers 405 with Allow; an
// unknown route 404, both with OpenAI's error body.
func TestMethodNotAllowed(t *testing.T) {
	ts := newTestServer(t, Options{})
	for _, c := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{"GET", "/generate", 405, "POST"},
		{"POST", "/v1/models", 405, "GET, HEAD"},
		{"DELETE", "/v1/chat/completions", 405, "POST"},
		{"GET", "/nope", 404, ""},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e openAIError
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.code || resp.Header.Get("Allow") != c.allow || e.Error.Message == "" {
			t.Errorf("%s %s: %d Allow %q %+v, want %d Allow %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), e.Error, c.code, c.allow)
		}
	}
}

// Requests a browser could send from another site are refused: a
// cross-origin POST (403), a POST body that is not JSON (415); a body
// that is JSON, or none at all, passes, chunked or not.
func TestCrossOriginAndContentType(t *testing.T) {
	ts := newTestServer(t, Options{})
	do := func(path, ctype string, header map[string]string, body io.Reader) (int, openAIError) {
		req, _ := http.NewRequest("POST", ts.URL+path, body)
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e openAIError
		json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	gen := `{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}`
	for _, c := range []struct {
		name, ctype string
		header      map[string]string
		code        int
	}{
		{"cross-site fetch", "application/json", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"foreign origin", "application/json", map[string]string{"Origin": "https://evil.example"}, 403},
		{"text/plain", "text/plain", nil, 415},
		{"form", "application/x-www-form-urlencoded", nil, 415},
		{"no content type", "", nil, 415},
		{"JSON with a charset", "application/json; charset=utf-8", nil, 200},
		{"same origin", "application/json", map[string]string{"Sec-Fetch-Site": "same-origin"}, 200},
	} {
		code, e := do("/generate", c.ctype, c.header, strings.NewReader(gen))
		if code != c.code || (code != 200 && e.Error.Message == "") {
			t.Errorf("%s: %d %+v, want %d", c.name, code, e.Error, c.code)
		}
	}
	// pause_generation with no body: none, empty, or empty and chunked.
	for _, body := range []io.Reader{nil, strings.NewReader(""), io.MultiReader()} {
		if code, e := do("/pause_generation", "", nil, body); code != 200 {
			t.Errorf("pause_generation with body %T: %d %+v", body, code, e.Error)
		}
		ts.post(t, "/continue_generation", `{}`, nil)
	}
}

// Updates without a weight_version number themselves in the order they
// run: two at once get versions 1 and 2. (The default was read before
// waiting for the update before it: both took 1.)
func TestUpdateDefaultVersions(t *testing.T) {
	release := make(chan struct{})
	var loads sync.WaitGroup
	loads.Add(1)
	first := true
	var mu sync.Mutex
	ts := newTestServer(t, Options{Load: func(dir string) (*model.Model, error) {
		mu.Lock()
		wait := first
		first = false
		mu.Unlock()
		if wait {
			loads.Done()
			<-release // the first update holds the lock while the second arrives
		}
		return testModel(t, 2), nil
	}})
	var wg sync.WaitGroup
	wg.Go(func() { ts.post(t, "/update_weights_from_disk", `{"model_path": "a"}`, nil) })
	loads.Wait()
	wg.Go(func() { ts.post(t, "/update_weights_from_disk", `{"model_path": "b"}`, nil) })
	time.Sleep(100 * time.Millisecond) // the second reaches the lock
	close(release)
	wg.Wait()
	if v := ts.sched.Version(); v != 2 {
		t.Errorf("after two updates without a version: version %d, want 2", v)
	}
}

// Several prompts in one seeded completions request draw prompt i's
// samples from PromptSeed(seed, i): what one Generate call of all the
// prompts gives, not the same random stream for every prompt.
func TestCompletionsPromptSeeds(t *testing.T) {
	ts := newTestServer(t, Options{})
	var a completionAnswer
	body := map[string]any{"prompt": []string{"ab", "ab", "cd"}, "n": 2, "max_tokens": 8, "seed": 21, "ignore_eos": true, "logprobs": 0}
	if code := ts.post(t, "/v1/completions", body, &a); code != 200 || len(a.Choices) != 6 {
		t.Fatalf("%d %+v", code, a)
	}
	p := [][]int32{ts.tok.Encode("ab"), ts.tok.Encode("ab"), ts.tok.Encode("cd")}
	e, err := rollout.New(ts.m, rollout.Options{Precision: rollout.Exact, Slots: 8, MaxLen: testMaxLen})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ref, err := e.Generate(p, 2, rollout.Sampling{Temperature: 1, MaxNewTokens: 8, Seed: 21})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range a.Choices {
		if c.Text != ts.tok.DecodeLenient(ref[i].Tokens) || !slices.Equal(c.Logprobs.TokenLogprobs, ref[i].LogProbs) {
			t.Errorf("choice %d: %q, Generate's prompt %d sample %d %q", i, c.Text, ref[i].Prompt, ref[i].Index, ts.tok.DecodeLenient(ref[i].Tokens))
		}
	}
	if a.Choices[0].Text == a.Choices[2].Text && a.Choices[1].Text == a.Choices[3].Text {
		t.Errorf("two prompts drew the same samples: %q %q", a.Choices[0].Text, a.Choices[1].Text)
	}
}

// OpenAI's logit_bias and best_of are accepted when they change nothing
// (empty, or best_of = n), and refused naming them otherwise.
func TestNeutralOpenAIFields(t *testing.T) {
	ts := newTestServer(t, Options{})
	for _, c := range []struct {
		path, body string
		code       int
		param      string
	}{
		{"/v1/completions", `{"prompt": "a", "max_tokens": 1, "logit_bias": {}, "best_of": 1}`, 200, ""},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 1, "n": 2, "logit_bias": null, "best_of": 2}`, 200, ""},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 1, "best_of": null}`, 200, ""},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, "logit_bias": {}}`, 200, ""},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 1, "logit_bias": {"5": 10}}`, 400, "logit_bias"},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 1, "best_of": 3}`, 400, "best_of"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, "logit_bias": {"5": -100}}`, 400, "logit_bias"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "a"}], "max_tokens": 1, "best_of": 1}`, 400, "best_of"},
	} {
		var e openAIError
		code := ts.post(t, c.path, c.body, &e)
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if code != c.code || param != c.param {
			t.Errorf("%s %s: %d %q %q, want %d naming %q", c.path, c.body, code, param, e.Error.Message, c.code, c.param)
		}
	}
}

// A stream pushes its connection's write deadline ahead as it writes, so
// that a client that stops reading fails the write (ending the handler
// and its generation) instead of holding it forever.
func TestStreamWriteDeadline(t *testing.T) {
	w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	s := newSSE(w)
	s.send(map[string]any{"a": 1})
	s.flush()
	if len(w.deadlines) == 0 {
		t.Fatal("no write deadline set")
	}
	for _, d := range w.deadlines {
		if ahead := time.Until(d); ahead < sseWriteTimeout-5*time.Second || ahead > sseWriteTimeout {
			t.Errorf("write deadline %s ahead, want about %s", ahead, sseWriteTimeout)
		}
	}
}

// deadlineWriter records the write deadlines http.ResponseController
// sets.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (w *deadlineWriter) SetWriteDeadline(t time.Time) error {
	w.deadlines = append(w.deadlines, t)
	return nil
}

// The text built token by token is the text of every id decoded at once,
// for each kind of decoder: tokens concatenated (keel's character
// tokenizer), joined with spaces (no decoder), and Qwen's byte-level
// pieces, whose tokens may end inside a UTF-8 character. Cut at a stop
// string, it is what decoding every id at every token and cutting at the
// first match gave.
func TestIncrementalTextMatchesDecode(t *testing.T) {
	char := tokenizer.NewChar()
	raw, err := char.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	json.Unmarshal(raw, &j)
	j["decoder"] = nil
	raw, _ = json.Marshal(j)
	spaced, err := tokenizer.Parse(raw, "char-no-decoder")
	if err != nil {
		t.Fatal(err)
	}
	if raw, err = testmodel.QwenTokenizerJSON(); err != nil {
		t.Fatal(err)
	}
	qwen, err := tokenizer.Parse(raw, "qwen3")
	if err != nil {
		t.Fatal(err)
	}
	// Qwen's pieces of one byte: characters of two and more bytes cut
	// across tokens.
	var byteIDs []int32
	for _, r := range "\u00e9\u4e16\U0001f642" {
		for _, b := range []byte(string(r)) {
			byteIDs = append(byteIDs, qwen.Encode(string([]byte{b}))...)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		name string
		tok  *tokenizer.Tokenizer
		ids  func() int32
	}{
		{"concatenated", char, func() int32 { return int32(4 + rng.IntN(96)) }},
		{"spaces", spaced, func() int32 { return int32(4 + rng.IntN(96)) }},
		{"byte-level", qwen, func() int32 {
			if rng.IntN(2) == 0 {
				return byteIDs[rng.IntN(len(byteIDs))]
			}
			return int32(rng.IntN(qwen.VocabSize()))
		}},
	} {
		srv := &Server{tok: tc.tok}
		for trial := range 200 {
			ids := make([]int32, 1+rng.IntN(40))
			for i := range ids {
				ids[i] = tc.ids()
			}
			full := tc.tok.DecodeLenient(ids)
			// A stop string of one to three characters from the text, or
			// none. (Not of U+FFFD: bytes still waiting for the rest of
			// their character are not searched.)
			var stops []string
			if rs := []rune(full); trial%2 == 1 && len(rs) > 0 {
				i := rng.IntN(len(rs))
				if st := string(rs[i:min(len(rs), i+1+rng.IntN(3))]); !strings.Contains(st, "\uFFFD") {
					stops = []string{st}
				}
			}
			g := srv.newGeneration([]genJob{{n: 1}}, stops, 0)
			c := g.choices[0]
			for _, id := range ids {
				if c.stopped {
					break
				}
				c.ids, c.lps, c.tlps = append(c.ids, id), append(c.lps, 0), append(c.tlps, 0)
				g.updateText(c)
			}
			if !c.stopped {
				g.extendText(c, true)
			}
			// What decoding every id at every token gives.
			want, keep := full, len(ids)
			for n := 1; n <= len(ids) && len(stops) > 0; n++ {
				text := tc.tok.DecodeLenient(ids[:n])
				if i := strings.Index(text, stops[0]); i >= 0 {
					want, keep = text[:i], n
					for keep > 0 && len(tc.tok.DecodeLenient(ids[:keep])) > i {
						keep--
					}
					break
				}
			}
			if c.text != want || c.nText != keep || len(c.ids) != keep && c.stopped {
				t.Fatalf("%s, ids %v, stop %q: text %q (%d tokens), want %q (%d)", tc.name, ids, stops, c.text, c.nText, want, keep)
			}
		}
	}
}
