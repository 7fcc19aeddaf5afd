// Package remote is the client of a fleet of HTTP inference servers (keel
// serve, SGLang or vLLM) that does the RL loop's rollout: a Sampler of
// package rl whose generation runs on other machines' accelerators, so
// that the loop (this process) and the rollout can be sized apart. It
// sends each prompt with its seed, checks every answer against the policy
// (weight version, vocabulary, log-probs, expert routes), retries what a
// server failed to answer on another, and pushes each step's weights as a
// Hugging Face directory the servers load.
//
// Protocols. kind keel and kind sglang speak SGLang's native API (keel
// serve speaks it too; keel differs in three ways, see keelInputs); kind
// vllm speaks vLLM's OpenAI-compatible API plus its development-mode
// control endpoints. A Client speaks one, chosen in New (see protocol).
// The fields were matched against SGLang's source as stored at these
// commits of github.com/sgl-project/sglang (its main branch after 0.5.x:
// routed_experts_start_len, return_sampling_mask and weight_versions exist
// there; no release number could be tied to them):
//
//   - python/sglang/srt/managers/io_struct.py @001067ff (GenerateReqInput:
//     input_ids, sampling_params as a dict or one per batch entry,
//     return_logprob, return_sampling_mask, return_routed_experts;
//     UpdateWeightFromDiskReqInput: model_path, weight_version (a string),
//     flush_cache; PauseGenerationReqInput: mode abort|retract|in_place;
//     ContinueGenerationReqInput),
//   - python/sglang/srt/managers/tokenizer_manager.py @001067ff (the
//     answer: output_ids and meta_info with finish_reason {"type": stop|
//     length|abort, "matched": id}, prompt_tokens, completion_tokens,
//     weight_version and the weight_versions spans,
//     output_token_logprobs as [logprob, token_id, text or null] per token,
//     output_token_sampling_logprobs, routed_experts; a list of answers for
//     a batch or n > 1),
//   - python/sglang/srt/sampling/sampling_params.py @00c17caf (temperature,
//     top_p, top_k with -1 for off, min_p, the penalties, max_new_tokens,
//     stop_token_ids, no_stop_trim, n, sampling_seed),
//   - python/sglang/srt/layers/moe/routed_experts_capturer.py @0837e911
//     (routed_experts: base64 of int32 ids, C order, shape [positions,
//     num_hidden_layers, num_experts_per_tok], the positions of prompt and
//     response but the last, seqlen - 1),
//   - python/sglang/srt/utils/weight_versions.py @19f93835 and
//     docs/advanced_features/sglang_for_rl.md @067bfe93 (pause_generation,
//     update_weights_from_disk, continue_generation; {"success", "message"}).
//
// and vLLM's at github.com/vllm-project/vllm: the completions protocol
// (prompt as token ids, n, max_tokens, temperature, top_p, top_k, min_p,
// seed, logprobs, return_tokens_as_token_ids "token_id:N", return_token_ids,
// stop_token_ids), vllm/v1/engine/parallel_sampling.py (sample j of n draws
// with seed + j), vllm/entrypoints/serve/rlhf/api_router.py @1ace43ed
// (POST /pause, /resume, VLLM_SERVER_DEV_MODE=1) and the dev-mode
// POST /collective_rpc with the workers' update_config and reload_weights,
// and the sampler's logprobs_mode (docs.vllm.ai v0.19-v0.20).
//
// None of this has been run against a real SGLang or vLLM server (no
// accelerator or Python here): the tests run fake servers that speak the
// protocol over keel's own engine.
package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
)

// The server kinds (a recipe's rollout.server_kind): which protocol the
// servers speak.
const (
	// KindKeel is keel serve: SGLang's native API, a prompt's samples in
	// one request drawn as a local Generate call draws them, so that an
	// exact-precision remote run is the local run bit for bit.
	KindKeel = "keel"
	// KindSGLang is SGLang's native API.
	KindSGLang = "sglang"
	// KindVLLM is vLLM's OpenAI-compatible API with its development-mode
	// control endpoints (dense models only: keel reads no routes from it).
	KindVLLM = "vllm"
)

// Kinds returns the server kinds New speaks, in the order messages list
// them, so that a command line or a recipe can say what is accepted.
func Kinds() []string { return []string{KindKeel, KindSGLang, KindVLLM} }

// kindList names the kinds for messages: "keel, sglang or vllm".
func kindList() string {
	k := Kinds()
	return strings.Join(k[:len(k)-1], ", ") + " or " + k[len(k)-1]
}

// CheckKind returns an error naming the accepted kinds unless New speaks
// kind's protocol, so that a recipe is refused when it is read rather than
// when its run starts.
func CheckKind(kind string) error {
	if !slices.Contains(Kinds(), kind) {
		return fmt.Errorf("unknown %q (want %s)", kind, kindList())
	}
	return nil
}

// APIKeyEnv names the environment variable holding the inference servers'
// API key (sent as a bearer token, Options.APIKey); it is kept out of
// recipes because the resolved recipe is written to the run directory.
const APIKeyEnv = "KEEL_API_KEY"

// Options configure a Client.
type Options struct {
	// Servers are the servers' base URLs.
	Servers []string
	// Kind is the protocol: KindKeel, KindSGLang or KindVLLM.
	Kind string
	// WeightsDir receives each version's weights (made absolute: the
	// servers are told its path).
	WeightsDir string
	// RequestTimeout bounds one HTTP request (default 10 minutes).
	RequestTimeout time.Duration
	// MaxConcurrency bounds the requests in flight per server (default 64).
	MaxConcurrency int
	// MaxFailures transient failures in a row drop a server (default 3).
	MaxFailures int
	// APIKey, when set, is sent as a bearer token.
	APIKey string
	// Config is the policy's configuration: the vocabulary, MoE layers and
	// experts every answer is checked against.
	Config model.Config
	// MaxLen, when > 0, caps prompt and response as the local engine's
	// MaxLen does: a request asks for at most MaxLen - len(prompt) tokens.
	MaxLen int
	// WriteFiles adds what the servers need besides config.json and the
	// weights to a version's directory (tokenizer.json).
	WriteFiles func(dir string) error
	// Events receives what happens to the fleet: a server dropped or back.
	Events func(msg string)
	// Client replaces the default HTTP client (tests).
	Client *http.Client
	// InPlace makes weight pushes partial rollouts (kind keel only): the
	// servers are paused with mode in_place and the requests in flight
	// continue on the new weights (keel serve recomputes their caches),
	// each answer saying which version sampled each token; without it, a
	// push aborts them and they are sent again.
	InPlace bool
}

// Client is a Sampler of the RL loop (package rl) over HTTP inference
// servers. A prompt's G samples go to one server (its prompt is prefilled
// once there); prompts go to the server with the fewest requests
// outstanding, at most MaxConcurrency at a time per server. A request that fails for want of an
// answer (connection, timeout, a cut transfer, HTTP 408, 429 or 5xx) is
// retried on another server with the same seed, so it gives the same
// samples; a server failing MaxFailures times in a row is dropped (an
// event) and tried again at the next weight push. An answer that breaks
// the protocol (a stale weight version, a malformed body, ids outside the
// vocabulary, log-probs or routes of the wrong shape) ends the rollout
// with a ServerError naming the server and the field: such samples are
// never trained on.
//
// Each request carries its prompt's seed (rollout.PromptSeed), so the
// samples of a step do not depend on the number of servers or on which
// answered; with kind keel they are those of the local engine.
type Client struct {
	opt       Options
	client    *http.Client
	moeLayers []int
	proto     protocol // the servers' API, chosen once by New

	mu      sync.Mutex
	servers []*server
	version int64
	// newest is the newest version pushed or being pushed: an in-place
	// answer of a newer one comes from weights keel never sent.
	newest int64
	// Counters since the last Metrics call, and the last push's phases.
	retries, dropped    int
	lastWrite, lastLoad time.Duration
}

// server is one inference server of the fleet; its counters are guarded
// by the client's mutex.
type server struct {
	url         string
	model       string // vLLM: the served model's name
	slots       chan struct{}
	outstanding int // requests assigned (waiting for a slot or running)
	failures    int // transient failures in a row
	alive       bool
}

// ServerError is a failed exchange with one inference server: it names the
// server, the request and, for an answer that breaks the protocol, the
// field at fault, so that a run stopped by a bad server says which and
// why. Transient errors (no answer in time, a connection or transfer cut,
// HTTP 408, 429 and 5xx) may succeed on another server; the others may
// not.
type ServerError struct {
	Server    string
	Op        string // e.g. "POST /generate"
	Field     string // e.g. "meta_info.weight_version"; empty when no field is at fault
	Err       error
	Transient bool
}

// Error says which server, which request and which field.
func (e *ServerError) Error() string {
	s := "rollout server " + e.Server + ": " + e.Op
	if e.Field != "" {
		s += ": " + e.Field
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *ServerError) Unwrap() error { return e.Err }

// ErrNoServers is returned when every server of the fleet has been
// dropped.
var ErrNoServers = errors.New("every inference server is down")

// maxBody bounds an answer's size (routes of long sequences of large
// models are tens of MB).
const maxBody = 1 << 30

// New checks the options, chooses the protocol of opt.Kind and asks every
// server who it is (GET /get_model_info, or vLLM's GET /v1/models, whose
// first model names the requests). Servers that do not answer are dropped
// with an event; none answering is an error. The servers hold no known
// weights yet: call UpdateWeights before Generate.
func New(opt Options) (*Client, error) {
	if len(opt.Servers) == 0 {
		return nil, errors.New("remote rollout: no servers")
	}
	if CheckKind(opt.Kind) != nil {
		return nil, fmt.Errorf("remote rollout: unknown server kind %q (want %s)", opt.Kind, kindList())
	}
	if opt.InPlace && opt.Kind != KindKeel {
		return nil, fmt.Errorf("remote rollout: in-place weight pushes (partial rollouts) need servers that report each token's weight version: kind %s, not %s", KindKeel, opt.Kind)
	}
	if err := opt.Config.Validate(); err != nil {
		return nil, fmt.Errorf("remote rollout: %w", err)
	}
	if opt.Config.NumExperts > model.MaxExperts {
		return nil, fmt.Errorf("remote rollout: %d experts, routes hold at most %d", opt.Config.NumExperts, model.MaxExperts)
	}
	if opt.WeightsDir == "" {
		return nil, errors.New("remote rollout: no weights directory")
	}
	dir, err := filepath.Abs(opt.WeightsDir)
	if err != nil {
		return nil, fmt.Errorf("remote rollout: weights directory: %w", err)
	}
	opt.WeightsDir = dir
	if opt.RequestTimeout <= 0 {
		opt.RequestTimeout = 10 * time.Minute
	}
	if opt.MaxConcurrency <= 0 {
		opt.MaxConcurrency = 64
	}
	if opt.MaxFailures <= 0 {
		opt.MaxFailures = 3
	}
	r := &Client{opt: opt, moeLayers: opt.Config.MoELayers()}
	if r.proto, err = newProtocol(r); err != nil {
		return nil, fmt.Errorf("remote rollout: %w", err)
	}
	r.client = opt.Client
	if r.client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = opt.MaxConcurrency
		r.client = &http.Client{Transport: tr}
	}
	seen := map[string]bool{}
	for _, u := range opt.Servers {
		u = strings.TrimRight(u, "/")
		if seen[u] {
			return nil, fmt.Errorf("remote rollout: server %s listed twice", u)
		}
		seen[u] = true
		r.servers = append(r.servers, &server{url: u, slots: make(chan struct{}, opt.MaxConcurrency), alive: true})
	}
	errs := make([]error, len(r.servers))
	var wg sync.WaitGroup
	for i, s := range r.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.proto.probe(context.Background(), s)
		}()
	}
	wg.Wait()
	var events []string
	alive := 0
	for i, s := range r.servers {
		if errs[i] != nil {
			s.alive = false
			r.dropped++
			events = append(events, fmt.Sprintf("rollout server %s dropped: %v", s.url, errs[i]))
			continue
		}
		alive++
	}
	if alive == 0 {
		return nil, fmt.Errorf("remote rollout: %w: %s", ErrNoServers, joinErrs(errs))
	}
	r.emit(events)
	return r, nil
}

// Close releases idle connections.
func (r *Client) Close() { r.client.CloseIdleConnections() }

// Version is the weight version every server that is not dropped holds.
func (r *Client) Version() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// Metrics reports the fleet's state for the step's metrics (the loop
// records them, see rl.SamplerMetrics): rollout/servers_alive, and since the
// last call rollout/retries (requests sent again after a failure) and
// rollout/servers_dropped; time/weight_write and time/weight_load are the
// last weight push's two phases (writing the directory, the servers
// loading it).
func (r *Client) Metrics() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	alive := 0
	for _, s := range r.servers {
		if s.alive {
			alive++
		}
	}
	m := map[string]float64{
		"rollout/servers_alive":   float64(alive),
		"rollout/retries":         float64(r.retries),
		"rollout/servers_dropped": float64(r.dropped),
		"time/weight_write":       r.lastWrite.Seconds(),
		"time/weight_load":        r.lastLoad.Seconds(),
	}
	r.retries, r.dropped = 0, 0
	return m
}

// job is one prompt's request: its G samples.
type job struct {
	i       int // the prompt's index in the Generate call
	ids     []int32
	n       int
	sp      rollout.Sampling
	seed    uint64 // rollout.PromptSeed(sp.Seed, i)
	maxNew  int
	version int64
}

// Generate samples n responses for each prompt on the fleet and returns
// them as rollout.Engine.Generate does: ordered by prompt, then sample,
// Prompt set to the prompt's index in this call.
func (r *Client) Generate(prompts [][]int32, n int, sp rollout.Sampling) ([]rollout.Sample, error) {
	if err := r.check(prompts, n, sp); err != nil {
		return nil, err
	}
	version := r.Version()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	groups := make([][]rollout.Sample, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		maxNew := sp.MaxNewTokens
		if r.opt.MaxLen > 0 {
			maxNew = min(maxNew, r.opt.MaxLen-len(p))
		}
		j := job{i: i, ids: p, n: n, sp: sp, seed: rollout.PromptSeed(sp.Seed, i), maxNew: maxNew, version: version}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := r.runJob(ctx, j)
			if err != nil {
				errs[i] = err
				cancel() // one failure ends the rollout: stop the others
				return
			}
			groups[i] = g
		}()
	}
	wg.Wait()
	// The first failure that is not another's cancellation.
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return nil, err
		}
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	out := make([]rollout.Sample, 0, len(prompts)*n)
	for i, g := range groups {
		for j := range g {
			g[j].Prompt, g[j].Index = i, j
		}
		out = append(out, g...)
	}
	return out, nil
}

// check refuses what the local engine refuses, before any request.
func (r *Client) check(prompts [][]int32, n int, sp rollout.Sampling) error {
	vocab := r.opt.Config.VocabSize
	switch {
	case n < 1:
		return fmt.Errorf("rollout: n = %d samples per prompt, want >= 1", n)
	case sp.MaxNewTokens < 1:
		return fmt.Errorf("rollout: max new tokens = %d, want >= 1", sp.MaxNewTokens)
	case !(sp.Temperature >= 0) || math.IsInf(sp.Temperature, 0):
		return fmt.Errorf("rollout: temperature %g, want a finite value >= 0", sp.Temperature)
	case sp.TopK < 0 || !(sp.TopP >= 0 && sp.TopP <= 1):
		return fmt.Errorf("rollout: top-k %d / top-p %g out of range (top-k >= 0, 0 <= top-p <= 1)", sp.TopK, sp.TopP)
	}
	for i, p := range prompts {
		if len(p) == 0 {
			return fmt.Errorf("rollout: prompt %d is empty", i)
		}
		if r.opt.MaxLen > 0 && len(p) >= r.opt.MaxLen {
			return fmt.Errorf("rollout: prompt %d has %d tokens; sequences hold at most %d (prompt and at least one new token)", i, len(p), r.opt.MaxLen)
		}
		for j, t := range p {
			if t < 0 || int(t) >= vocab {
				return fmt.Errorf("rollout: prompt %d, token %d: id %d outside the vocabulary [0, %d)", i, j, t, vocab)
			}
		}
	}
	for _, t := range sp.Stop {
		if t < 0 || int(t) >= vocab {
			return fmt.Errorf("rollout: stop token %d outside the vocabulary [0, %d)", t, vocab)
		}
	}
	return nil
}

// runJob gets one prompt's samples, retrying transient failures on other
// servers (the same request: the same seed, so the same samples).
func (r *Client) runJob(ctx context.Context, j job) ([]rollout.Sample, error) {
	tried := map[*server]bool{}
	var last error
	// Enough attempts that, unless other requests succeed meanwhile, every
	// server is dropped before they run out: then the error says so.
	attempts := len(r.servers)*r.opt.MaxFailures + 1
	for a := 0; a < attempts; a++ {
		s := r.pick(tried)
		if s == nil {
			break
		}
		if a > 0 {
			r.mu.Lock()
			r.retries++
			r.mu.Unlock()
		}
		out, err := r.generateOn(ctx, s, j)
		r.settle(ctx, s, err)
		if err == nil {
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var se *ServerError
		if !errors.As(err, &se) || !se.Transient {
			return nil, err
		}
		tried[s] = true
		last = err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var down []string
	for _, s := range r.servers {
		if !s.alive {
			down = append(down, s.url)
		}
	}
	if len(down) == len(r.servers) {
		return nil, fmt.Errorf("rollout: prompt %d: %w (dropped: %s); last error: %v", j.i, ErrNoServers, strings.Join(down, ", "), last)
	}
	return nil, fmt.Errorf("rollout: prompt %d failed %d times, on every server tried: %w", j.i, attempts, last)
}

// pick assigns the next attempt of a prompt to the live server with the
// fewest requests outstanding, preferring one it has not failed on; nil
// when none is alive.
func (r *Client) pick(tried map[*server]bool) *server {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best *server
	for pass := 0; pass < 2 && best == nil; pass++ {
		for _, s := range r.servers {
			if !s.alive || (pass == 0 && tried[s]) {
				continue
			}
			if best == nil || s.outstanding < best.outstanding {
				best = s
			}
		}
	}
	if best != nil {
		best.outstanding++
	}
	return best
}

// settle records the outcome of an attempt on s: a transient failure
// counts towards dropping s, unless the rollout was cancelled (not the
// server's doing).
func (r *Client) settle(ctx context.Context, s *server, err error) {
	var events []string
	r.mu.Lock()
	s.outstanding--
	var se *ServerError
	switch {
	case err == nil:
		s.failures = 0
	case ctx.Err() != nil, !errors.As(err, &se), !se.Transient:
	default:
		s.failures++
		if s.alive && s.failures >= r.opt.MaxFailures {
			s.alive = false
			r.dropped++
			events = append(events, fmt.Sprintf("rollout server %s dropped after %d failures in a row: %v", s.url, s.failures, err))
		}
	}
	r.mu.Unlock()
	r.emit(events)
}

func (r *Client) emit(events []string) {
	if r.opt.Events == nil {
		return
	}
	for _, e := range events {
		r.opt.Events(e)
	}
}

// generateOn runs one prompt's request on s within its concurrency bound.
func (r *Client) generateOn(ctx context.Context, s *server, j job) ([]rollout.Sample, error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.slots }()
	r.mu.Lock()
	alive := s.alive
	r.mu.Unlock()
	if !alive { // dropped while this request waited for a slot: go elsewhere
		return nil, &ServerError{Server: s.url, Op: "POST /generate", Err: errors.New("dropped before the request was sent"), Transient: true}
	}
	return r.proto.generate(ctx, s, j)
}

// do sends one request to s (a JSON body unless body is nil) and returns
// the body of a 2xx answer.
func (r *Client) do(ctx context.Context, s *server, method, path string, body any) ([]byte, error) {
	op := method + " " + path
	fail := func(transient bool, format string, a ...any) error {
		return &ServerError{Server: s.url, Op: op, Err: fmt.Errorf(format, a...), Transient: transient}
	}
	ctx, cancel := context.WithTimeout(ctx, r.opt.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fail(false, "encoding the request: %v", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		return nil, fail(false, "%v", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.opt.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.opt.APIKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fail(true, "no answer within rollout.request_timeout (%s)", r.opt.RequestTimeout)
		}
		return nil, fail(true, "%v", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fail(true, "body: the transfer was cut after %d bytes: %v", len(data), err)
	}
	if len(data) > maxBody {
		return nil, fail(false, "body: over %d bytes", maxBody)
	}
	if resp.StatusCode/100 != 2 {
		c := resp.StatusCode
		hint := ""
		switch {
		case c == http.StatusUnauthorized || c == http.StatusForbidden:
			hint = " (is " + APIKeyEnv + " the servers' API key?)"
		case c == http.StatusNotFound:
			hint = " (is rollout.server_kind " + r.opt.Kind + " what the server speaks?)"
		}
		return nil, fail(c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500,
			"HTTP %d%s: %s", c, hint, snippet(data))
	}
	return data, nil
}

// snippet returns the start of an error answer, for messages.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}

// UpdateWeights writes m as a Hugging Face model directory
// WeightsDir/vNNNNNN (written under a temporary name, then renamed, so a
// server never sees half a directory) and has every server load it as
// version: SGLang's pause_generation, update_weights_from_disk (with
// weight_version) and continue_generation, then get_model_info must report
// the version; vLLM's pause, collective_rpc update_config and
// reload_weights, reset_prefix_cache and resume. A server that fails is
// dropped (an event); a dropped server that answers again is given the
// weights and comes back. Older version directories are then deleted. It
// is an error when no server holds the new weights.
//
// ctx bounds the push: once it is done the servers' requests are
// abandoned, and the push fails with ctx's error, dropping no server (an
// interrupted push is not the servers' fault); the fleet's version is then
// unchanged, and the next push gives every server the weights again.
func (r *Client) UpdateWeights(ctx context.Context, m *model.Model, version int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rollout weights: %w", err)
	}
	t := time.Now()
	dir, err := r.writeWeights(m, version)
	if err != nil {
		return fmt.Errorf("rollout weights: %w", err)
	}
	write := time.Since(t)
	t = time.Now()
	r.mu.Lock()
	r.newest = max(r.newest, version)
	servers := slices.Clone(r.servers)
	wasAlive := make([]bool, len(servers))
	for i, s := range servers {
		wasAlive[i] = s.alive
	}
	r.mu.Unlock()
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !wasAlive[i] {
				if err := r.proto.probe(ctx, s); err != nil {
					errs[i] = err
					return
				}
			}
			errs[i] = r.proto.push(ctx, s, dir, version)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		r.mu.Lock()
		r.lastWrite, r.lastLoad = write, time.Since(t)
		r.mu.Unlock()
		return fmt.Errorf("rollout weights: version %d: %w", version, err)
	}
	var events []string
	live := 0
	r.mu.Lock()
	for i, s := range servers {
		switch {
		case errs[i] == nil:
			if !s.alive {
				events = append(events, fmt.Sprintf("rollout server %s is back (weights version %d loaded)", s.url, version))
			}
			s.alive, s.failures = true, 0
			live++
		case s.alive:
			s.alive = false
			r.dropped++
			events = append(events, fmt.Sprintf("rollout server %s dropped: weight push failed: %v", s.url, errs[i]))
		}
	}
	if live > 0 {
		r.version = version
	}
	r.lastWrite, r.lastLoad = write, time.Since(t)
	r.mu.Unlock()
	r.emit(events)
	if live == 0 {
		return fmt.Errorf("rollout: %w: no server loaded weights version %d: %s", ErrNoServers, version, joinErrs(errs))
	}
	return r.removeOld(version)
}

// versionDir names version's directory in WeightsDir.
func versionDir(version int64) string { return fmt.Sprintf("v%06d", version) }

var versionDirRE = regexp.MustCompile(`^v[0-9]+$`)

// writeWeights writes m and WriteFiles' files to a fresh directory and
// renames it to its version's name.
func (r *Client) writeWeights(m *model.Model, version int64) (string, error) {
	root := r.opt.WeightsDir
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, ".tmp-"+versionDir(version)+"-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	// The servers may run as another user: the directory is readable.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := model.Save(tmp, m, "f32"); err != nil {
		return "", err
	}
	if r.opt.WriteFiles != nil {
		if err := r.opt.WriteFiles(tmp); err != nil {
			return "", err
		}
	}
	final := filepath.Join(root, versionDir(version))
	// A version written again (a resumed run) replaces the old copy.
	if err := os.RemoveAll(final); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", err
	}
	return final, nil
}

// removeOld deletes the version directories other than version's, and
// the temporary ones a crash left.
func (r *Client) removeOld(version int64) error {
	entries, err := os.ReadDir(r.opt.WeightsDir)
	if err != nil {
		return fmt.Errorf("rollout weights: %w", err)
	}
	keep := versionDir(version)
	for _, e := range entries {
		n := e.Name()
		if n == keep || !(versionDirRE.MatchString(n) || strings.HasPrefix(n, ".tmp-v")) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(r.opt.WeightsDir, n)); err != nil {
			return fmt.Errorf("rollout weights: %w", err)
		}
	}
	return nil
}

// joinErrs lists the non-nil errors, one per server.
func joinErrs(errs []error) string {
	var parts []string
	for _, e := range errs {
		if e != nil {
			parts = append(parts, e.Error())
		}
	}
	return strings.Join(parts, "; ")
}

// parseLogProb reads a log-probability as float32 directly from its JSON
// number (going through float64 could round twice), refusing what is not
// a finite number.
func parseLogProb(raw []byte) (float32, error) {
	s := strings.TrimSpace(string(raw))
	f, err := strconv.ParseFloat(s, 32)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("%.40q is not a finite number", s)
	}
	return float32(f), nil
}
