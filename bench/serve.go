package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/serve"
	"github.com/keel-rl/keel/tokenizer"
)

// ServeResult compares keel serve with the in-process engine on the same
// work: Clients sequences of NewTokens tokens after PromptLen-token
// prompts, all at once. Throughputs count generated tokens per second,
// prefill included, best of the rounds; latencies are over every request
// of every round.
type ServeResult struct {
	Preset, Precision        string
	Clients                  int
	PromptLen, NewTokens     int
	EngineTokensPerS         float64 // rollout.Engine.Generate, in process
	GenerateTokensPerS       float64 // POST /generate, one request per client
	StreamTokensPerS         float64 // POST /v1/completions with stream, one per client
	GenerateP50, GenerateP99 float64 // seconds per /generate request
	StreamP50, StreamP99     float64 // seconds per streamed completion
	Requests, Failed         int
	// WeightWrite and WeightLoad are one weight sync's two halves: writing
	// the model as a Hugging Face directory (float32 safetensors and
	// tokenizer, as the RL loop does), and POST /update_weights_from_disk.
	WeightWrite, WeightLoad float64
}

// Serve measures a preset with random weights served on loopback (a real
// TCP listener): rounds of Clients concurrent /generate requests, rounds
// of Clients concurrent streamed completions, and the same batch on an
// in-process engine, alternated for about d so that the machine's drift
// touches all three alike; then one weight sync.
func Serve(preset string, vocab int, prec rollout.Precision, clients, promptLen, newTokens int, d time.Duration) (ServeResult, error) {
	res := ServeResult{Preset: preset, Precision: prec.String(), Clients: clients, PromptLen: promptLen, NewTokens: newTokens}
	cfg, err := model.Preset(preset, vocab)
	if err != nil {
		return res, err
	}
	m := model.New(cfg)
	model.Init(m, 1)
	maxLen := promptLen + newTokens
	opt := rollout.Options{Precision: prec, Slots: clients, MaxLen: maxLen}
	local, err := rollout.New(m, opt)
	if err != nil {
		return res, err
	}
	defer local.Close()
	served, err := rollout.New(m, opt)
	if err != nil {
		return res, err
	}
	defer served.Close()
	tok := tokenizer.NewChar()
	srv := serve.New(rollout.NewScheduler(served), tok, cfg, maxLen, serve.Options{Name: preset, MaxN: clients})
	defer srv.Close()
	base, stop, err := listenLoopback(srv.Handler())
	if err != nil {
		return res, err
	}
	defer stop()
	b := &serveBench{
		res: &res, clients: clients, newTokens: newTokens, m: m, tok: tok, local: local, base: base,
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}},
		prompts: randomPrompts(clients, promptLen, min(vocab, tok.VocabSize())),
	}
	if err := b.measure(d); err != nil {
		return res, err
	}
	if err := b.weightSync(); err != nil {
		return res, err
	}
	return res, nil
}

// listenLoopback serves h on a fresh loopback TCP listener; it returns the
// server's base URL and the function that shuts it down.
func listenLoopback(h http.Handler) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(ln)
	return "http://" + ln.Addr().String(), func() { hs.Shutdown(context.Background()) }, nil
}

// randomPrompts returns n prompts of length tokens below vocab, the same
// for every run.
func randomPrompts(n, length, vocab int) [][]int32 {
	r := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]int32, n)
	for i := range prompts {
		prompts[i] = make([]int32, length)
		for j := range prompts[i] {
			prompts[i][j] = int32(r.IntN(vocab))
		}
	}
	return prompts
}

// serveBench is one Serve measurement under way: the server's address
// and client, the in-process engine, the prompts, and the latencies and
// counts gathered into res.
type serveBench struct {
	res                *ServeResult
	clients, newTokens int
	m                  *model.Model
	tok                *tokenizer.Tokenizer
	local              *rollout.Engine
	base               string
	client             *http.Client
	prompts            [][]int32
	genLat, streamLat  []float64
}

// measure warms up the three paths, then alternates their rounds for
// about d (at least once), keeping each one's best throughput and the
// latencies of every request.
func (b *serveBench) measure(d time.Duration) error {
	res := b.res
	// Warm up all three paths.
	if _, err := b.engineRound(); err != nil {
		return err
	}
	if _, err := b.round(b.generate, &b.genLat); err != nil {
		return err
	}
	if _, err := b.round(b.stream, &b.streamLat); err != nil {
		return err
	}
	b.genLat, b.streamLat = b.genLat[:0], b.streamLat[:0]
	res.Requests, res.Failed = 0, 0
	for start := time.Now(); res.EngineTokensPerS == 0 || time.Since(start) < d; {
		e, err := b.engineRound()
		if err != nil {
			return err
		}
		g, err := b.round(b.generate, &b.genLat)
		if err != nil {
			return err
		}
		s, err := b.round(b.stream, &b.streamLat)
		if err != nil {
			return err
		}
		res.EngineTokensPerS = max(res.EngineTokensPerS, e)
		res.GenerateTokensPerS = max(res.GenerateTokensPerS, g)
		res.StreamTokensPerS = max(res.StreamTokensPerS, s)
	}
	res.GenerateP50, res.GenerateP99 = quantile(b.genLat, 0.5), quantile(b.genLat, 0.99)
	res.StreamP50, res.StreamP99 = quantile(b.streamLat, 0.5), quantile(b.streamLat, 0.99)
	return nil
}

// engineRound generates the whole batch on the in-process engine and
// returns its tokens per second.
func (b *serveBench) engineRound() (float64, error) {
	start := time.Now()
	out, err := b.local.Generate(b.prompts, 1, rollout.Sampling{Temperature: 1, MaxNewTokens: b.newTokens, Seed: 1})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range out {
		n += len(s.Tokens)
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// round sends one request per client at once (one returns a request's
// generated tokens), appends each success's latency to lat, counts the
// requests and failures, and returns the generated tokens per second.
func (b *serveBench) round(one func(i int) (int, error), lat *[]float64) (float64, error) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	var firstErr error
	start := time.Now()
	for i := range b.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			n, err := one(i)
			mu.Lock()
			defer mu.Unlock()
			b.res.Requests++
			if err != nil {
				b.res.Failed++
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			*lat = append(*lat, time.Since(t0).Seconds())
			total += n
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// generate sends client i's prompt to POST /generate and returns the
// tokens it generated.
func (b *serveBench) generate(i int) (int, error) {
	body, _ := json.Marshal(map[string]any{"input_ids": b.prompts[i], "sampling_params": map[string]any{
		"max_new_tokens": b.newTokens, "ignore_eos": true, "sampling_seed": i}})
	resp, err := b.client.Post(b.base+"/generate", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var a struct {
		OutputIDs []int32 `json:"output_ids"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != 200 {
		return 0, fmt.Errorf("/generate: status %d, %v", resp.StatusCode, err)
	}
	return len(a.OutputIDs), nil
}

// stream sends client i's prompt to POST /v1/completions with stream set
// and reads the events up to [DONE].
func (b *serveBench) stream(i int) (int, error) {
	body, _ := json.Marshal(map[string]any{"prompt": b.prompts[i], "max_tokens": b.newTokens, "ignore_eos": true,
		"seed": i, "stream": true})
	resp, err := b.client.Post(b.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("/v1/completions: status %d: %s", resp.StatusCode, msg)
	}
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			return b.newTokens, nil
		}
		if strings.HasPrefix(line, "data: ") {
			chunks++
		}
	}
	return 0, fmt.Errorf("/v1/completions: the stream ended without [DONE] after %d chunks", chunks)
}

// weightSync times one weight sync, as the RL loop's remote rollout does
// it: writing the model and tokenizer, then POST /update_weights_from_disk.
func (b *serveBench) weightSync() error {
	dir, err := os.MkdirTemp("", "keel-bench-weights-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	vdir := filepath.Join(dir, "v1")
	t0 := time.Now()
	if err := model.Save(vdir, b.m, "float32"); err != nil {
		return err
	}
	if err := b.tok.WriteFile(filepath.Join(vdir, tokenizer.FileName)); err != nil {
		return err
	}
	b.res.WeightWrite = time.Since(t0).Seconds()
	t0 = time.Now()
	body, _ := json.Marshal(map[string]any{"model_path": vdir, "weight_version": "1"})
	resp, err := b.client.Post(b.base+"/update_weights_from_disk", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("/update_weights_from_disk: status %d", resp.StatusCode)
	}
	b.res.WeightLoad = time.Since(t0).Seconds()
	return nil
}

// quantile is the q-quantile of v (nearest rank), 0 for none.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
