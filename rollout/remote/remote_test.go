package remote

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
	"github.com/keel-rl/keel/rollout/remote/remotetest"
)

// Remote rollout is tested against fake servers that speak SGLang's native
// API (what keel serve speaks; remotetest.Server) and vLLM's (fakeVLLM)
// over keel's own rollout engine: one Generate call per request,
// serialised, with the request's seed as the one-prompt call's seed.
// Faults are injected into their answers.

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

func newRemote(t testing.TB, opt Options) *Client {
	t.Helper()
	if opt.Kind == "" {
		opt.Kind = KindKeel
	}
	if opt.WeightsDir == "" {
		opt.WeightsDir = t.TempDir()
	}
	r, err := New(opt)
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
			remotetest.SameSamples(t, fmt.Sprintf("prompt %d alone", i), all[i*3:(i+1)*3], got)
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
			if err := eng.UpdateWeights(context.Background(), m, 1); err != nil {
				t.Fatal(err)
			}
			want, err := eng.Generate(prompts, 4, sp)
			if err != nil {
				t.Fatal(err)
			}

			a, b := remotetest.NewServer(t, m), remotetest.NewServer(t, m)
			var ev remotetest.Events
			rs := newRemote(t, Options{Servers: remotetest.URLs(a, b), Config: c, MaxConcurrency: 2, MaxFailures: 2, Events: ev.Add})
			if err := rs.UpdateWeights(context.Background(), m, 1); err != nil {
				t.Fatal(err)
			}
			a.Do(func(f *remotetest.Server) { f.DieAfter, f.DieMode = 2, mode })
			got, err := rs.Generate(prompts, 4, sp)
			if err != nil {
				t.Fatal(err)
			}
			remotetest.SameSamples(t, "after a server died", want, got)
			met := rs.Metrics()
			if met["rollout/retries"] < 1 || met["rollout/servers_dropped"] != 1 || met["rollout/servers_alive"] != 1 {
				t.Fatalf("metrics %v: want a retry, one server dropped, one alive", met)
			}
			if e := ev.All(); !strings.Contains(e, a.URL) || !strings.Contains(e, "dropped") {
				t.Fatalf("events %q do not report %s dropped", e, a.URL)
			}
			if b.Count() < len(prompts)/2+1 {
				t.Fatalf("server b answered %d requests", b.Count())
			}

			b.Do(func(f *remotetest.Server) { f.DieAfter, f.DieMode = f.Generates, mode })
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
		fault       func(f *remotetest.Server)
	}{
		{"stale weight version", "meta_info.weight_version", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { meta(outs[1])["weight_version"] = "0" }
		}},
		{"weight version missing", "meta_info.weight_version", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { delete(meta(outs[0]), "weight_version") }
		}},
		{"weights changed mid-request", "meta_info.weight_versions", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) {
				meta(outs[0])["weight_versions"] = []any{map[string]any{"version": "0"}, map[string]any{"version": "1"}}
			}
		}},
		{"truncated body", "body", func(f *remotetest.Server) { f.RawBody = func(b []byte) []byte { return b[:len(b)/2] } }},
		{"not JSON", "body", func(f *remotetest.Server) { f.RawBody = func([]byte) []byte { return []byte("<html>502</html>") } }},
		{"a number for the weight version", "meta_info.weight_version", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { meta(outs[0])["weight_version"] = 1 }
		}},
		{"log-probs of the wrong length", "meta_info.output_token_logprobs", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) {
				lp := meta(outs[0])["output_token_logprobs"].([]any)
				meta(outs[0])["output_token_logprobs"] = lp[:len(lp)-1]
			}
		}},
		{"a log-prob for another token", "meta_info.output_token_logprobs", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) {
				lp := meta(outs[0])["output_token_logprobs"].([]any)
				e := lp[0].([]any)
				lp[0] = []any{e[0], e[1].(int32) + 1, nil}
			}
		}},
		{"a log-prob that is not a number", "meta_info.output_token_logprobs", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) {
				meta(outs[0])["output_token_logprobs"].([]any)[0] = []any{"-inf", 3, nil}
			}
		}},
		{"id outside the vocabulary", "output_ids", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { outs[0]["output_ids"].([]int32)[0] = 41 }
		}},
		{"no output", "output_ids", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { outs[2]["output_ids"] = []int32{} }
		}},
		{"too few outputs", "body", func(f *remotetest.Server) {
			f.RawBody = func(b []byte) []byte {
				var outs []json.RawMessage
				json.Unmarshal(b, &outs)
				b, _ = json.Marshal(outs[:2])
				return b
			}
		}},
		{"routes of the wrong shape", "meta_info.routed_experts", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) {
				s := meta(outs[0])["routed_experts"].(string)
				b, _ := base64.StdEncoding.DecodeString(s)
				meta(outs[0])["routed_experts"] = base64.StdEncoding.EncodeToString(b[:len(b)-4])
			}
		}},
		{"routes of too few positions", "meta_info.routed_experts", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) {
				s := meta(outs[0])["routed_experts"].(string)
				b, _ := base64.StdEncoding.DecodeString(s)
				meta(outs[0])["routed_experts"] = base64.StdEncoding.EncodeToString(b[:len(b)-2*3*2*4])
			}
		}},
		{"an expert out of range", "meta_info.routed_experts", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) {
				s := meta(outs[0])["routed_experts"].(string)
				b, _ := base64.StdEncoding.DecodeString(s)
				binary.LittleEndian.PutUint32(b, 6)
				meta(outs[0])["routed_experts"] = base64.StdEncoding.EncodeToString(b)
			}
		}},
		{"routes missing", "meta_info.routed_experts", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { delete(meta(outs[0]), "routed_experts") }
		}},
		{"unfinished", "meta_info.finish_reason", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { meta(outs[0])["finish_reason"] = nil }
		}},
		{"another prompt", "meta_info.prompt_tokens", func(f *remotetest.Server) {
			f.Tamper = func(outs []map[string]any) { meta(outs[0])["prompt_tokens"] = 99 }
		}},
		{"a bad request", "", func(f *remotetest.Server) { f.Status = 400 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := remotetest.NewServer(t, m)
			rs := newRemote(t, Options{Servers: remotetest.URLs(f), Config: c})
			if err := rs.UpdateWeights(context.Background(), m, 1); err != nil {
				t.Fatal(err)
			}
			f.Do(tc.fault)
			got, err := rs.Generate(prompts, 3, sp)
			var se *ServerError
			if !errors.As(err, &se) {
				t.Fatalf("error %v (%d samples), want a ServerError", err, len(got))
			}
			if se.Server != f.URL || !strings.HasSuffix(se.Field, tc.field) || se.Transient {
				t.Fatalf("error names server %q field %q (transient %v), want %s and %q: %v", se.Server, se.Field, se.Transient, f.URL, tc.field, err)
			}
			if msg := err.Error(); !strings.Contains(msg, f.URL) || !strings.Contains(msg, tc.field) {
				t.Fatalf("message %q does not name the server and the field", msg)
			}
			if tc.field == "" && !strings.Contains(err.Error(), "HTTP 400") {
				t.Fatalf("message %q does not give the status", err)
			}
			if f.Count() != 1 {
				t.Fatalf("%d requests: a bad answer was retried", f.Count())
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
	full, short := remotetest.NewServer(t, m), remotetest.NewServer(t, m)
	short.Do(func(f *remotetest.Server) { f.SGLangRoutes = true })
	var got [2][]rollout.Sample
	for i, f := range []*remotetest.Server{full, short} {
		rs := newRemote(t, Options{Servers: remotetest.URLs(f), Config: c})
		if err := rs.UpdateWeights(context.Background(), m, 2); err != nil {
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
	a, b := remotetest.NewServer(t, start), remotetest.NewServer(t, start)
	var ev remotetest.Events
	wd := t.TempDir()
	rs := newRemote(t, Options{Servers: remotetest.URLs(a, b), Config: c, WeightsDir: wd, Events: ev.Add,
		WriteFiles: func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"fake": true}`), 0o644)
		}})
	if err := rs.UpdateWeights(context.Background(), m, 5); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(wd, "v000005")
	for _, f := range []*remotetest.Server{a, b} {
		f.Do(func(f *remotetest.Server) {
			if len(f.Loaded) != 1 || f.Loaded[0] != dir || f.Version != "5" || !slices.Equal(f.Calls, []string{"pause", "update", "continue"}) {
				t.Fatalf("server loaded %v as %q with calls %v, want %s as 5 between pause and continue", f.Loaded, f.Version, f.Calls, dir)
			}
			for i, v := range f.Weights.Arena {
				if math.Float32bits(v) != math.Float32bits(m.Arena[i]) {
					t.Fatalf("server weight %d: %v, pushed %v", i, v, m.Arena[i])
				}
			}
		})
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
	if err := eng.UpdateWeights(context.Background(), m, 5); err != nil {
		t.Fatal(err)
	}
	want, _ := eng.Generate(prompts, 2, sp)
	got, err := rs.Generate(prompts, 2, sp)
	if err != nil {
		t.Fatal(err)
	}
	remotetest.SameSamples(t, "after the push", want, got)

	if err := rs.UpdateWeights(context.Background(), m, 6); err != nil {
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

	b.Do(func(f *remotetest.Server) { f.FailPush = true })
	if err := rs.UpdateWeights(context.Background(), m, 7); err != nil {
		t.Fatal(err)
	}
	if met := rs.Metrics(); met["rollout/servers_alive"] != 1 || met["rollout/servers_dropped"] != 1 {
		t.Fatalf("after a failed push: %v", met)
	}
	if e := ev.All(); !strings.Contains(e, b.URL+" dropped: weight push failed") || !strings.Contains(e, "success") {
		t.Fatalf("events %q", e)
	}
	if _, err := rs.Generate(prompts, 2, sp); err != nil { // on a alone
		t.Fatal(err)
	}
	b.Do(func(f *remotetest.Server) { f.FailPush = false })
	if err := rs.UpdateWeights(context.Background(), m, 8); err != nil {
		t.Fatal(err)
	}
	if met := rs.Metrics(); met["rollout/servers_alive"] != 2 || !strings.Contains(ev.All(), b.URL+" is back") {
		t.Fatalf("after b recovered: %v, events %q", met, ev.All())
	}
	a.Do(func(f *remotetest.Server) { f.FailPush = true })
	b.Do(func(f *remotetest.Server) { f.FailPush = true })
	if err := rs.UpdateWeights(context.Background(), m, 9); !errors.Is(err, ErrNoServers) {
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
	var fs []*remotetest.Server
	for i, n := range []int{1, 3} {
		var fleet []*remotetest.Server
		for range n {
			fleet = append(fleet, remotetest.NewServer(t, m))
		}
		fs = fleet
		rs := newRemote(t, Options{Servers: remotetest.URLs(fleet...), Kind: KindSGLang, Config: c, MaxConcurrency: 1})
		if err := rs.UpdateWeights(context.Background(), m, 1); err != nil {
			t.Fatal(err)
		}
		var err error
		if got[i], err = rs.Generate(prompts, 4, sp); err != nil {
			t.Fatal(err)
		}
	}
	remotetest.SameSamples(t, "1 server vs 3", got[0], got[1])
	for _, f := range fs {
		f.Do(func(f *remotetest.Server) {
			for _, n := range f.Batches {
				if n != 4 {
					t.Fatalf("a request held %d samples, want one prompt's 4", n)
				}
			}
		})
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

// testClient is a client of no server, for the decoders: its protocol is
// kind's, chosen as New chooses it.
func testClient(t testing.TB, kind string, c model.Config) *Client {
	t.Helper()
	r := &Client{opt: Options{Kind: kind, Config: c}, moeLayers: c.MoELayers()}
	var err error
	if r.proto, err = newProtocol(r); err != nil {
		t.Fatal(err)
	}
	return r
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
	r := testClient(t, KindSGLang, c)
	p := r.proto.(*sglang)
	j := fixtureJob()

	// What keel sends for it.
	f := &captureServer{}
	ts := httptest.NewServer(f)
	defer ts.Close()
	r.client, r.opt.RequestTimeout = ts.Client(), 10e9
	p.generate(context.Background(), &server{url: ts.URL}, j)
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
	got, err := p.decode("fixture", body, j)
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
	if _, err := p.decode("fixture", body, j); err == nil || !strings.Contains(err.Error(), "[0].meta_info.weight_version") {
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
	p := testClient(t, KindVLLM, c).proto.(*vllm)
	body, err := os.ReadFile("testdata/vllm_completions_response.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.decode("fixture", body, fixtureJob())
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
	sgl := testClient(f, KindSGLang, c).proto.(*sglang)
	// vllm's decoder on an MoE policy, which New refuses: its checks must
	// still not panic.
	vl := &vllm{c: sgl.c}
	f.Fuzz(func(t *testing.T, b []byte) {
		j := fixtureJob()
		sgl.decode("fuzz", b, j)
		j.n = 1
		sgl.decode("fuzz", b, j)
		vl.decode("fuzz", b, j)
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
		remotetest.WriteJSON(w, 200, map[string]any{"object": "list", "data": []any{map[string]any{"id": "keel-policy", "object": "model"}}})
	case "POST /pause", "POST /resume", "POST /reset_prefix_cache":
		f.calls = append(f.calls, req.URL.Path)
		remotetest.WriteJSON(w, 200, map[string]any{"status": "ok"})
	case "POST /collective_rpc":
		var rpc struct {
			Method string `json:"method"`
			Args   []struct {
				ModelConfig struct {
					Model string `json:"model"`
				} `json:"model_config"`
			} `json:"args"`
		}
		if err := remotetest.StrictJSON(buf.Bytes(), &rpc); err != nil {
			remotetest.WriteJSON(w, 400, map[string]any{"error": err.Error()})
			return
		}
		f.calls = append(f.calls, rpc.Method)
		switch rpc.Method {
		case "update_config":
			f.model = rpc.Args[0].ModelConfig.Model
		case "reload_weights":
			m, err := model.Load(f.model)
			if err == nil {
				err = f.eng.UpdateWeights(context.Background(), m, 0)
			}
			if err != nil {
				remotetest.WriteJSON(w, 500, map[string]any{"error": err.Error()})
				return
			}
			f.weights = m
		}
		remotetest.WriteJSON(w, 200, map[string]any{"results": []any{nil}})
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
		if err := remotetest.StrictJSON(buf.Bytes(), &r); err != nil || r.Model != "keel-policy" || !r.ReturnTokensAsTokenIDs {
			remotetest.WriteJSON(w, 400, map[string]any{"error": fmt.Sprint("bad request ", err)})
			return
		}
		var choices []any
		for k := r.N - 1; k >= 0; k-- { // out of order, as a server may
			sp := rollout.Sampling{Temperature: r.Temperature, TopK: max(r.TopK, 0), TopP: r.TopP, MaxNewTokens: r.MaxTokens,
				Stop: r.StopTokenIDs, Seed: r.Seed + uint64(k)}
			res, err := f.eng.Generate([][]int32{r.Prompt}, 1, sp)
			if err != nil {
				remotetest.WriteJSON(w, 400, map[string]any{"error": err.Error()})
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
		remotetest.WriteJSON(w, 200, map[string]any{"id": "cmpl-1", "object": "text_completion", "model": r.Model, "choices": choices})
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
	if _, err := New(Options{Servers: []string{"http://127.0.0.1:1"}, Kind: KindVLLM, Config: c, WeightsDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "MoE") {
		t.Fatalf("MoE policy with vLLM: %v", err)
	}
	c = model.Config{Architecture: model.ArchQwen3, VocabSize: 37, HiddenSize: 32, IntermediateSize: 48,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 16,
		RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 128}
	start, m := testmodel.Random(c, 1), testmodel.Random(c, 2)
	f := newFakeVLLM(t, start)
	wd := t.TempDir()
	rs := newRemote(t, Options{Servers: []string{f.url}, Kind: KindVLLM, Config: c, WeightsDir: wd})
	if err := rs.UpdateWeights(context.Background(), m, 3); err != nil {
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
		remotetest.SameSamples(t, "vllm", want, got)
	}
}

// kind sglang's per-sample seeds are what they were before the seed
// functions moved to package rollout (values of the old copy of
// splitmix64 and its stream constant).
func TestRemoteSGLangSampleSeed(t *testing.T) {
	for _, tc := range []struct {
		seed uint64
		k    int
		want uint64
	}{
		{0, 0, 645291004},
		{0, 1, 125060078},
		{12345, 0, 1496096159},
		{12345, 3, 1868234587},
		{1 << 63, 2, 369401209},
		{0xdeadbeefcafebabe, 7, 297380914},
	} {
		if got := sampleSeed(tc.seed, tc.k); got != tc.want {
			t.Errorf("sampleSeed(%#x, %d) = %d, want %d", tc.seed, tc.k, got, tc.want)
		}
	}
}

// Every kind has a protocol (keel and sglang the same one, with their own
// inputs); an unknown kind is refused with the list of kinds.
func TestRemoteKinds(t *testing.T) {
	c := fixtureConfig()
	c.Architecture, c.NumExperts, c.NumExpertsPerTok, c.MoeIntermediateSize, c.DecoderSparseStep = model.ArchQwen3, 0, 0, 0, 0
	for _, kind := range Kinds() {
		if err := CheckKind(kind); err != nil {
			t.Errorf("%s: %v", kind, err)
		}
		r := testClient(t, kind, c)
		switch p := r.proto.(type) {
		case *sglang:
			if p.c != r || p.inputs == nil || kind == KindVLLM {
				t.Errorf("%s: protocol %+v", kind, p)
			}
		case *vllm:
			if p.c != r || kind != KindVLLM {
				t.Errorf("%s: protocol %+v", kind, p)
			}
		default:
			t.Errorf("%s: protocol %T", kind, p)
		}
	}
	err := CheckKind("triton")
	if err == nil || err.Error() != `unknown "triton" (want keel, sglang or vllm)` {
		t.Fatalf("CheckKind(triton): %v", err)
	}
	_, err = New(Options{Servers: []string{"http://127.0.0.1:1"}, Kind: "triton", Config: c, WeightsDir: t.TempDir()})
	if err == nil || err.Error() != `remote rollout: unknown server kind "triton" (want keel, sglang or vllm)` {
		t.Fatalf("New with kind triton: %v", err)
	}
}

// cancelOn cancels a context when a request for path is sent.
type cancelOn struct {
	path   string
	cancel context.CancelFunc
}

func (c *cancelOn) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == c.path {
		c.cancel()
	}
	return http.DefaultTransport.RoundTrip(req)
}

// A push whose context is done, before it starts or while the servers
// load, fails with the context's error and drops no server, none left
// paused; the next push loads the weights everywhere.
func TestRemoteUpdateWeightsCancelled(t *testing.T) {
	c := remoteMoEConfig()
	m := testmodel.Random(c, 2)
	a, b := remotetest.NewServer(t, m), remotetest.NewServer(t, m)
	var ev remotetest.Events
	tr := &cancelOn{path: "/update_weights_from_disk"}
	rs := newRemote(t, Options{Servers: remotetest.URLs(a, b), Config: c, Events: ev.Add, Client: &http.Client{Transport: tr}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := rs.UpdateWeights(ctx, m, 4); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled push: %v", err)
	}
	ctx, tr.cancel = context.WithCancel(context.Background())
	if err := rs.UpdateWeights(ctx, m, 4); !errors.Is(err, context.Canceled) {
		t.Fatalf("push cancelled mid-way: %v", err)
	}
	if met := rs.Metrics(); met["rollout/servers_alive"] != 2 || met["rollout/servers_dropped"] != 0 || rs.Version() != 0 || ev.All() != "" {
		t.Fatalf("after cancelled pushes: %v, version %d, events %q", met, rs.Version(), ev.All())
	}
	paused := 0
	for _, f := range []*remotetest.Server{a, b} {
		f.Do(func(f *remotetest.Server) {
			// The server whose update cancelled the push was paused; the
			// other may have been, or not yet (then continuing it is
			// harmless): either way it is not left paused.
			if slices.Contains(f.Calls, "pause") {
				paused++
			}
			if (len(f.Calls) > 0 && f.Calls[len(f.Calls)-1] != "continue") || len(f.Loaded) != 0 {
				t.Errorf("server calls %v, loaded %v: want it continued, nothing loaded", f.Calls, f.Loaded)
			}
		})
	}
	if paused == 0 {
		t.Error("no server was paused: the push was not cancelled mid-way")
	}
	tr.path = ""
	if err := rs.UpdateWeights(context.Background(), m, 5); err != nil || rs.Version() != 5 {
		t.Fatalf("push after cancelled ones: %v, version %d", err, rs.Version())
	}
	for _, f := range []*remotetest.Server{a, b} {
		f.Do(func(f *remotetest.Server) {
			if f.Version != "5" || len(f.Loaded) != 1 {
				t.Errorf("server loaded %v, reports %q", f.Loaded, f.Version)
			}
		})
	}
}
