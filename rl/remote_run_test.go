package rl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/rollout/remote"
	"github.com/keel-rl/keel/rollout/remote/remotetest"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/serve"
	"github.com/keel-rl/keel/tokenizer"
)

// The RL loop and a run with rollout.servers, over fake servers that speak
// keel serve's protocol on keel's own engine (remotetest.Server): the
// remote client itself is tested in package remote.

// stepSamples runs n steps and returns the weights, each step's metrics
// (timings and the fleet's own measures aside) and samples.
func stepSamples(t *testing.T, l *Loop, n int) ([]float32, []map[string]float64, [][]*Sample) {
	t.Helper()
	var ms []map[string]float64
	var ss [][]*Sample
	for range n {
		res, err := l.RunStep(context.Background())
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
	return slices.Clone(cpu(l).Model.Arena), ms, ss
}

// An RL run whose rollout runs on two servers is the run with the local
// engine, bit for bit: samples (tokens, log mu, routes), weights and
// metrics; with R3, top-k truncation and two mini-batches too.
func TestRemoteExactMatchesLocal(t *testing.T) {
	for _, sets := range [][]string{nil, {"algorithm.replay=r3", "rollout.top_k=8", "train.mini_batches=2"}} {
		t.Run(strings.Join(append([]string{"default"}, sets...), ","), func(t *testing.T) {
			r := testRecipe(t, sets...)
			w1, m1, s1 := stepSamples(t, testLoop(t, r, true), 3)

			fleet := testLoop(t, r, true)
			// The servers start from other weights: only the pushed ones
			// can give the local run's samples.
			other := testmodel.Random(tinyConfig(true), 99)
			a, b := remotetest.NewServer(t, other), remotetest.NewServer(t, other)
			policy := cpu(fleet).Model
			rs, err := remote.New(remote.Options{Servers: remotetest.URLs(a, b), Kind: remote.KindKeel, WeightsDir: t.TempDir(),
				Config: policy.Config, MaxLen: 32, MaxConcurrency: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			if err := rs.UpdateWeights(context.Background(), policy, 0); err != nil {
				t.Fatal(err)
			}
			fleet.Sampler = rs
			w2, m2, s2 := stepSamples(t, fleet, 3)
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
					remotetest.SameSamples(t, fmt.Sprintf("step %d sample %d", s+1, i), []rollout.Sample{a}, []rollout.Sample{b})
				}
			}
			sameRun(t, "remote vs local", w1, w2, m1, m2)
			if a.Count() == 0 || b.Count() == 0 {
				t.Fatalf("requests per server %d, %d: the fleet was not used", a.Count(), b.Count())
			}
		})
	}
}

// Multi-turn episodes on two servers are the local engine's, bit for bit:
// each later turn goes out with its whole prefix and its turn's seed.
func TestRemoteEpisodesMatchLocal(t *testing.T) {
	r := testRecipe(t, "env.name=tools", "env.max_turns=3", "env.max_tokens=150", "rollout.max_new_tokens=12", "algorithm.replay=r3", "rollout.top_k=20")
	w1, m1, s1 := stepSamples(t, envLoop(t, r), 2)
	fleet := envLoop(t, r)
	policy := cpu(fleet).Model
	other := testmodel.Random(policy.Config, 99)
	a, b := remotetest.NewServer(t, other), remotetest.NewServer(t, other)
	rs, err := remote.New(remote.Options{Servers: remotetest.URLs(a, b), Kind: remote.KindKeel, WeightsDir: t.TempDir(),
		Config: policy.Config, MaxLen: 200, MaxConcurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	if err := rs.UpdateWeights(context.Background(), policy, 0); err != nil {
		t.Fatal(err)
	}
	fleet.Sampler = rs
	w2, m2, s2 := stepSamples(t, fleet, 2)
	multi := 0
	for s := range s1 {
		for i, x := range s1[s] {
			y := s2[s][i]
			if !slices.Equal(x.Obs, y.Obs) || x.Reward != y.Reward {
				t.Fatalf("step %d sample %d: observations %v vs %v, rewards %g vs %g", s+1, i, x.Obs, y.Obs, x.Reward, y.Reward)
			}
			if len(x.Obs) > 0 {
				multi++
			}
			a, b := rollout.Sample{Tokens: x.Response, LogProbs: x.LogMu, Routes: x.Routes, Finish: x.Finish, Version: x.Version},
				rollout.Sample{Tokens: y.Response, LogProbs: y.LogMu, Routes: y.Routes, Finish: y.Finish, Version: y.Version}
			remotetest.SameSamples(t, fmt.Sprintf("step %d sample %d", s+1, i), []rollout.Sample{a}, []rollout.Sample{b})
		}
	}
	if multi == 0 {
		t.Fatal("no multi-turn sample")
	}
	sameRun(t, "remote vs local episodes", w1, w2, m1, m2)
}

// The recipe keys of remote rollout: defaults, normalised URLs, and an
// error naming the key for each bad setting; the resolved local recipe is
// unchanged.
func TestRemoteRecipe(t *testing.T) {
	remoteSets := []string{"rollout.precision=", `rollout.servers=["http://10.0.0.5:30000/", "https://b.example:8443"]`}
	r := testRecipe(t, remoteSets...)
	ro := r.Rollout
	if !slices.Equal(ro.Servers, []string{"http://10.0.0.5:30000", "https://b.example:8443"}) || ro.ServerKind != remote.KindKeel ||
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
		{append(slices.Clone(remoteSets), `rollout.servers=["ftp://a:1"]`), "rollout.servers"},
		{append(slices.Clone(remoteSets), `rollout.servers=["a:1"]`), "rollout.servers"},
		{append(slices.Clone(remoteSets), `rollout.servers=["http://u:p@a:1"]`), "rollout.servers"},
		{append(slices.Clone(remoteSets), `rollout.servers=["http://a:1", "http://a:1/"]`), "rollout.servers"},
		{append(slices.Clone(remoteSets), "rollout.server_kind=triton"), "rollout.server_kind"},
		{append(slices.Clone(remoteSets), "rollout.request_timeout=-1"), "rollout.request_timeout"},
		{append(slices.Clone(remoteSets), "rollout.max_concurrency=-2"), "rollout.max_concurrency"},
		{[]string{"rollout.server_kind=sglang"}, "rollout: server_kind"},
		{[]string{"rollout.weights_dir=/tmp/w"}, "rollout: server_kind"},
		{append(slices.Clone(remoteSets), "rollout.api_key=secret"), "api_key"},
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
	a, b := remotetest.NewServer(t, base), remotetest.NewServer(t, base)
	servers := fmt.Sprintf(`rollout.servers=[%q, %q]`, a.URL, b.URL)
	remoteDir := filepath.Join(tmp, "remote")
	var ev remotetest.Events
	if _, err := Run(context.Background(), runRecipe(t, remoteDir, "train.steps=3", "rollout.precision=", servers), false, Progress{Warn: ev.Add}); err != nil {
		t.Fatal(err)
	}
	w1, m1 := readRun(t, local)
	w2, m2 := readRun(t, remoteDir)
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
		y, err2 := os.ReadFile(filepath.Join(remoteDir, f))
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s differs (%v, %v)", f, err1, err2)
		}
	}
	wd := filepath.Join(remoteDir, "rollout-weights")
	entries, _ := os.ReadDir(wd)
	if len(entries) != 1 || entries[0].Name() != "v000003" {
		t.Fatalf("weights directory: %v", entries)
	}
	for _, f := range []*remotetest.Server{a, b} {
		f.Do(func(f *remotetest.Server) {
			if last := f.Loaded[len(f.Loaded)-1]; f.Version != "3" || !strings.HasSuffix(last, filepath.Join("rollout-weights", "v000003")) || len(f.Loaded) != 4 {
				t.Fatalf("server loaded %v, reports %q", f.Loaded, f.Version)
			}
		})
	}
	if ev.All() != "" {
		t.Fatalf("events in a healthy run: %s", ev.All())
	}

	// Both servers die at step 3 (two requests each per step): the run
	// stops with the checkpoint of step 2.
	dying := filepath.Join(tmp, "dying")
	for _, f := range []*remotetest.Server{a, b} {
		f.Do(func(f *remotetest.Server) { f.DieAfter, f.DieMode = f.Generates+4, "500" })
	}
	_, err = Run(context.Background(), runRecipe(t, dying, "train.steps=3", "rollout.precision=", servers), false, Progress{Warn: ev.Add})
	if err == nil || !errors.Is(err, remote.ErrNoServers) || !strings.Contains(err.Error(), "step 3") || !strings.Contains(err.Error(), "checkpoint of step 2") {
		t.Fatalf("servers down: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dying, "checkpoints", run.StepDir(2))); err != nil {
		entries, _ := os.ReadDir(filepath.Join(dying, "checkpoints"))
		t.Fatalf("checkpoint of step 2: %v (%v)", err, entries)
	}
	if e := ev.All(); !strings.Contains(e, a.URL) || !strings.Contains(e, b.URL) {
		t.Fatalf("events %q", e)
	}
}

// switchCounting is the remote client counting the weights its
// generations took in flight: at the first poll of each generation after
// the first it waits until the trainer has published newer weights, so
// that a push happens during the generation whatever the machine's speed.
type switchCounting struct {
	*remote.Client
	l        *Loop
	calls    int
	switches int
}

func (c *switchCounting) GenerateSwitching(p [][]int32, n int, sp rollout.Sampling, next func() *rollout.Switch) ([]rollout.Sample, error) {
	c.calls++
	polls := 0
	return c.Client.GenerateSwitching(p, n, sp, func() *rollout.Switch {
		if polls++; polls == 1 && c.calls > 1 {
			waitFresh(c.l)
		}
		sw := next()
		if sw != nil {
			c.switches++
		}
		return sw
	})
}

// Partial rollouts on keel servers, in the loop: with rollout.partial:
// switch the trainer's newer weights are pushed in place during a
// generation (package remote tests that sequences in flight take them,
// bit for bit), the loop's books stay right (every token's lag within [0,
// k], the shares adding up to 1) and training goes on.
func TestRemotePartialRollouts(t *testing.T) {
	const k, steps = 2, 6
	r := testRecipe(t, "train.steps=6", "rollout.max_staleness=2", "rollout.partial=switch")
	l := testLoop(t, r, true)
	t.Cleanup(l.Close)
	policy := cpu(l).Model
	var urls []string
	for range 2 {
		eng, err := rollout.New(policy, rollout.Options{Precision: rollout.Exact, Slots: 8, MaxLen: 32})
		if err != nil {
			t.Fatal(err)
		}
		sched := rollout.NewScheduler(eng)
		srv := serve.New(sched, tokenizer.NewChar(), policy.Config, 32, serve.Options{})
		ts := httptest.NewServer(srv.Handler())
		t.Cleanup(func() { ts.Close(); srv.Close(); eng.Close() })
		urls = append(urls, ts.URL)
	}
	rs, err := remote.New(remote.Options{Servers: urls, Kind: remote.KindKeel, WeightsDir: t.TempDir(), Config: policy.Config, MaxLen: 32, InPlace: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rs.Close)
	if err := rs.UpdateWeights(context.Background(), policy, 0); err != nil {
		t.Fatal(err)
	}
	c := &switchCounting{Client: rs, l: l}
	l.Sampler = c
	_, ms := runSteps(t, l, steps)
	for s, m := range ms {
		var share float64
		for d := 0; d <= k; d++ {
			share += m["rollout/tokens_lag"+itoa(d)]
		}
		if math.Abs(share-1) > 1e-9 || m["rollout/lag_max"] > float64(min(k, s)) {
			t.Fatalf("step %d: token shares by lag add up to %v, lag max %v", s+1, share, m["rollout/lag_max"])
		}
	}
	if c.switches == 0 || rs.Version() < int64(steps-1-k) {
		t.Fatalf("%d weight pushes during generations; the servers hold version %d", c.switches, rs.Version())
	}
}
