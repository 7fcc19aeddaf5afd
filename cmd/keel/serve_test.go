//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-rl/keel/internal/testmodel"
	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/models"
	"github.com/keel-rl/keel/rl"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/rollout/remote"
	"github.com/keel-rl/keel/run"
	"github.com/keel-rl/keel/serve"
	"github.com/keel-rl/keel/tokenizer"
)

// RL over real `keel serve` processes on loopback: the test binary runs
// itself as the keel command (asKeelEnv), so the servers are the CLI's own
// code in processes of their own, killed with SIGKILL where a test wants
// a crash.

// asKeelEnv makes the test binary behave as the keel command.
const asKeelEnv = "KEEL_TEST_AS_KEEL"

var keelExe = os.Args[0] // this test binary

func TestMain(m *testing.M) {
	if os.Getenv(asKeelEnv) == "1" {
		// The test holds our stdin open: EOF means it is gone (a test
		// binary killed by go test's timeout, say), and so are we.
		go func() {
			io.Copy(io.Discard, os.Stdin)
			os.Exit(3)
		}()
		main() // exits 1 or 2 itself on an error
		os.Exit(0)
	}
	// Absolute paths: some tests change the working directory.
	if exe, err := os.Executable(); err == nil {
		keelExe = exe
	}
	code := m.Run()
	if localRunDir != "" {
		os.RemoveAll(filepath.Dir(localRunDir))
	}
	os.Exit(code)
}

// keelServer is one `keel serve` process.
type keelServer struct {
	url   string
	cmd   *exec.Cmd
	stdin io.WriteCloser // held open while the test runs (see TestMain)
	done  chan struct{}  // closed once the process has exited
	out   *lockedBuffer  // its stdout and stderr
}

// lockedBuffer collects a process's output; ready receives the "on
// http://HOST:PORT" line keel serve prints once listening.
type lockedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	line  []byte
	ready chan string
}

var listeningRE = regexp.MustCompile(` on (http://[0-9.]+:[0-9]+)\s*$`)

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	for _, c := range p {
		if c != '\n' {
			b.line = append(b.line, c)
			continue
		}
		if m := listeningRE.FindSubmatch(b.line); m != nil && b.ready != nil {
			b.ready <- string(m[1])
			b.ready = nil
		}
		b.line = b.line[:0]
	}
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startServe starts `keel serve --precision exact` (with extra flags) on a
// free loopback port and waits until it listens; the process is killed
// when the test ends.
func startServe(t *testing.T, modelDir string, extra ...string) *keelServer {
	t.Helper()
	args := append([]string{"serve", "--model", modelDir, "--precision", "exact", "--addr", "127.0.0.1:0", "--slots", "32"}, extra...)
	cmd := exec.Command(keelExe, args...)
	cmd.Env = append(os.Environ(), asKeelEnv+"=1")
	ready := make(chan string, 1)
	out := &lockedBuffer{ready: ready}
	cmd.Stdout, cmd.Stderr = out, out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &keelServer{cmd: cmd, stdin: stdin, done: make(chan struct{}), out: out}
	go func() {
		cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-s.done
	})
	select {
	case s.url = <-ready:
	case <-s.done:
		t.Fatalf("keel serve exited before listening: %v\n%s", cmd.ProcessState, out)
	case <-time.After(2 * time.Minute):
		t.Fatalf("keel serve printed no address in 2 minutes:\n%s", out)
	}
	return s
}

// kill sends SIGKILL and waits for the process to be gone.
func (s *keelServer) kill(t *testing.T) {
	if err := s.cmd.Process.Kill(); err != nil {
		t.Errorf("kill %s: %v", s.url, err)
	}
	<-s.done
}

// serveTestModel writes a small random MoE model (a dense layer, then an
// MoE layer) with the built-in model's tokenizer to a directory.
func serveTestModel(dir string) error {
	cfg := model.Config{Architecture: model.ArchQwen3MoE, VocabSize: 128, HiddenSize: 32, IntermediateSize: 48,
		NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 8, RMSNormEps: 1e-6,
		RopeTheta: 10000, MaxPositionEmbeddings: 256, NumExperts: 6, NumExpertsPerTok: 2,
		MoeIntermediateSize: 16, NormTopKProb: true, DecoderSparseStep: 1, MlpOnlyLayers: []int{0},
		TieWordEmbeddings: true}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := model.Save(dir, testmodel.Random(cfg, 11), "f32"); err != nil {
		return err
	}
	// The embedded copy: the test binary also runs away from its source
	// tree (tools/gpu/check.sh on the device machine).
	tok, err := models.FS.ReadFile("tiny-moe-base/tokenizer.json")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644)
}

// serveRecipe is the runs' recipe: generated prompts, R3 so that the
// rollout's routes are trained on, two mini-batches, a checkpoint and a
// samples file every step.
const serveRecipe = `
name: serve-test
seed: 5
model: {path: MODEL}
data: {tasks: [arithmetic, countdown], n: 64, difficulty: 1-2}
rollout: {precision: exact, temperature: 1.0, max_new_tokens: 16}
algorithm: {objective: minirl, replay: r3, entropy_coef: 0.01, overlong_buffer: 8}
train: {steps: 3, prompts_per_step: 8, group_size: 4, mini_batches: 2, lr: 3.0e-3, micro_batch_tokens: 100000}
eval: {skip: true}
log: {samples_every: 1, checkpoint_every: 1, keep: 2}
`

var (
	localOnce   sync.Once
	localRunDir string
	localErr    error
)

// localRun returns the model directory and the run with the in-process
// engine that every remote run must equal, made once for all the tests.
func localRun(t *testing.T) (modelDir, runDir string) {
	t.Helper()
	localOnce.Do(func() {
		root, err := os.MkdirTemp("", "keel-serve-test-")
		if err != nil {
			localErr = err
			return
		}
		localRunDir = filepath.Join(root, "local")
		md := filepath.Join(root, "model")
		if localErr = serveTestModel(md); localErr != nil {
			return
		}
		r, err := rl.ParseRecipe([]byte(strings.Replace(serveRecipe, "MODEL", md, 1)), []string{"out=" + localRunDir})
		if err != nil {
			localErr = err
			return
		}
		_, localErr = rl.Run(context.Background(), r, false, rl.Progress{})
	})
	if localErr != nil {
		t.Fatalf("local run: %v", localErr)
	}
	return filepath.Join(filepath.Dir(localRunDir), "model"), localRunDir
}

func parseServeRecipe(t testing.TB, modelDir, out string, sets ...string) *rl.Recipe {
	t.Helper()
	r, err := rl.ParseRecipe([]byte(strings.Replace(serveRecipe, "MODEL", modelDir, 1)), append([]string{"out=" + out}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// remoteSets turns the recipe's rollout to servers.
func remoteSets(dir string, urls ...string) []string {
	q := make([]string, len(urls))
	for i, u := range urls {
		q[i] = fmt.Sprintf("%q", u)
	}
	return []string{"rollout.precision=", "rollout.server_kind=keel", "rollout.servers=[" + strings.Join(q, ", ") + "]",
		"rollout.weights_dir=" + filepath.Join(dir, "weights"), "rollout.request_timeout=120"}
}

// fleetOnly are the metrics only a remote run has, or whose values are
// timings.
func fleetOnly(k string) bool {
	return strings.HasPrefix(k, "rollout/servers_") || k == "rollout/retries" || strings.HasPrefix(k, "time/") ||
		strings.HasPrefix(k, "tokens_per_s/") || k == "elapsed_s"
}

// readMetrics returns a run's metrics records, and the same without the
// fleet's keys and the timings.
func readMetrics(t *testing.T, dir string) (all, comparable []map[string]any) {
	t.Helper()
	recs, err := run.ReadMetrics(filepath.Join(dir, rl.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		c := map[string]any{}
		for k, v := range r {
			if !fleetOnly(k) {
				c[k] = v
			}
		}
		comparable = append(comparable, c)
	}
	return recs, comparable
}

// sameRun checks that run dir equals the local run: the final
// model.safetensors byte for byte, every samples file, and the metrics
// log but for the fleet's keys and timings.
func sameRun(t *testing.T, what, local, dir string) {
	t.Helper()
	a, err1 := os.ReadFile(filepath.Join(local, "model", "model.safetensors"))
	b, err2 := os.ReadFile(filepath.Join(dir, "model", "model.safetensors"))
	if err1 != nil || err2 != nil {
		t.Fatalf("%s: final weights: %v, %v", what, err1, err2)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("%s: final model.safetensors differs from the local run's", what)
	}
	ls, _ := filepath.Glob(filepath.Join(local, "samples", "*.jsonl"))
	rs, _ := filepath.Glob(filepath.Join(dir, "samples", "*.jsonl"))
	if len(ls) == 0 || len(ls) != len(rs) {
		t.Fatalf("%s: %d samples files, the local run %d", what, len(rs), len(ls))
	}
	for _, f := range ls {
		x, _ := os.ReadFile(f)
		y, err := os.ReadFile(filepath.Join(dir, "samples", filepath.Base(f)))
		if err != nil || !bytes.Equal(x, y) {
			t.Errorf("%s: samples/%s differs from the local run's (%v)", what, filepath.Base(f), err)
			xl, yl := strings.Split(string(x), "\n"), strings.Split(string(y), "\n")
			for i := range min(len(xl), len(yl)) {
				if xl[i] != yl[i] {
					t.Logf("first difference, line %d:\nlocal:  %s\nremote: %s", i+1, xl[i], yl[i])
					break
				}
			}
		}
	}
	_, m1 := readMetrics(t, local)
	_, m2 := readMetrics(t, dir)
	if len(m1) != len(m2) {
		t.Fatalf("%s: %d metrics records, the local run %d", what, len(m2), len(m1))
	}
	for i := range m1 {
		if !reflect.DeepEqual(m1[i], m2[i]) {
			var diff []string
			for k := range m1[i] {
				if !reflect.DeepEqual(m1[i][k], m2[i][k]) {
					diff = append(diff, fmt.Sprintf("%s: %v vs %v", k, m1[i][k], m2[i][k]))
				}
			}
			for k := range m2[i] {
				if _, ok := m1[i][k]; !ok {
					diff = append(diff, fmt.Sprintf("%s: only remote, %v", k, m2[i][k]))
				}
			}
			sort.Strings(diff)
			t.Errorf("%s: metrics record %d (step %v) differs from the local run's: %s", what, i, m1[i]["step"], strings.Join(diff, "; "))
		}
	}
}

// A 3-step R3 run whose rollout is two `keel serve --precision exact`
// processes is the run of the local engine bit for bit: final weights,
// samples and metrics (the fleet's keys and timings aside).
func TestServeRLBitForBit(t *testing.T) {
	md, local := localRun(t)
	a, b := startServe(t, md), startServe(t, md)
	dir := filepath.Join(t.TempDir(), "remote")
	var warns []string
	var mu sync.Mutex
	r := parseServeRecipe(t, md, dir, remoteSets(dir, a.url, b.url)...)
	if _, err := rl.Run(context.Background(), r, false, rl.Progress{Warn: func(m string) { mu.Lock(); warns = append(warns, m); mu.Unlock() }}); err != nil {
		t.Fatalf("%v\nserver A:\n%s\nserver B:\n%s", err, a.out, b.out)
	}
	sameRun(t, "two keel serve processes", local, dir)
	all, _ := readMetrics(t, dir)
	for _, rec := range all {
		if rec["step"] == 0.0 {
			continue
		}
		if rec["rollout/servers_alive"] != 2.0 || rec["rollout/retries"] != 0.0 || rec["rollout/servers_dropped"] != 0.0 {
			t.Errorf("step %v: servers alive %v, retries %v, dropped %v in a healthy run", rec["step"],
				rec["rollout/servers_alive"], rec["rollout/retries"], rec["rollout/servers_dropped"])
		}
	}
	if len(warns) > 0 {
		t.Errorf("warnings in a healthy run: %q", warns)
	}
	// Both servers served the last version, and the weights directory
	// keeps it alone.
	for _, s := range []*keelServer{a, b} {
		info := modelInfo(t, s.url)
		if info["weight_version"] != "3" || !strings.HasSuffix(fmt.Sprint(info["model_path"]), filepath.Join("weights", "v000003")) {
			t.Errorf("%s: get_model_info %v", s.url, info)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "weights")); len(entries) != 1 || entries[0].Name() != "v000003" {
		t.Errorf("weights directory holds %v", entries)
	}
}

func modelInfo(t *testing.T, url string) map[string]any {
	t.Helper()
	resp, err := http.Get(url + "/get_model_info")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	return info
}

// killProxy forwards HTTP requests to a keel serve process. Armed, it
// sends the process SIGKILL as soon as the nth /generate request of
// weight version `at` (the rollout of step at+1) has been written to
// it, so that this request, and any other not yet answered, is cut
// mid-way. A request that gets no answer is cut towards the client too
// (the connection is dropped), as a dead server's would be.
type killProxy struct {
	t      *testing.T
	url    string
	client *http.Client

	mu       sync.Mutex
	target   *keelServer
	version  string // the weight version pushed last through the proxy
	at       string // kill during this version's rollout ("": disarmed)
	n        int
	gens     int // /generate requests of version at so far
	killed   chan struct{}
	inflight int            // requests forwarded and not yet answered
	inKill   int            // of them, at the kill
	cut      int            // requests that got no answer
	answered map[string]int // /generate requests answered, by weight version
}

func newKillProxy(t *testing.T, target *keelServer) *killProxy {
	p := &killProxy{t: t, target: target, killed: make(chan struct{}), answered: map[string]int{},
		client: &http.Client{Transport: &http.Transport{DisableCompression: true}}}
	ts := httptest.NewServer(p)
	t.Cleanup(ts.Close)
	t.Cleanup(p.client.CloseIdleConnections)
	p.url = ts.URL
	return p
}

func (p *killProxy) arm(version string, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at, p.n, p.gens = version, n, 0
}

func (p *killProxy) ServeHTTP(w http.ResponseWriter, in *http.Request) {
	body, err := io.ReadAll(in.Body)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	ctx := in.Context()
	p.mu.Lock()
	target, version := p.target, p.version
	if in.URL.Path == "/update_weights_from_disk" {
		var u struct {
			WeightVersion string `json:"weight_version"`
		}
		json.Unmarshal(body, &u)
		p.version = u.WeightVersion
	}
	if in.URL.Path == "/generate" && p.at != "" && p.version == p.at {
		p.gens++
		if p.gens == p.n {
			// Kill once this request is on the wire: the server has it,
			// and has not answered.
			// (The transport may write a request twice, retrying on a
			// fresh connection: the kill happens once.)
			p.at = ""
			var once sync.Once
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
				once.Do(func() {
					p.mu.Lock()
					p.inKill = p.inflight
					p.mu.Unlock()
					target.kill(p.t)
					close(p.killed)
				})
			}})
		}
	}
	p.inflight++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inflight--
		p.mu.Unlock()
	}()
	out, err := http.NewRequestWithContext(ctx, in.Method, target.url+in.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	out.Header = in.Header.Clone()
	resp, err := p.client.Do(out)
	var data []byte
	if err == nil {
		data, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err != nil {
		p.mu.Lock()
		p.cut++
		p.mu.Unlock()
		panic(http.ErrAbortHandler) // drop the client's connection
	}
	if in.URL.Path == "/generate" && resp.StatusCode == http.StatusOK {
		p.mu.Lock()
		p.answered[version]++
		p.mu.Unlock()
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(data)
}

// stats returns the proxy's counters.
func (p *killProxy) stats() (inKill, cut int, answered map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inKill, p.cut, maps.Clone(p.answered)
}

// retarget points the proxy at another server (the same address, a new
// process behind it).
func (p *killProxy) retarget(s *keelServer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = s
}

// kill -9 of one server in the middle of step 2's rollout: the step
// completes on the other, no sample lost or duplicated, and metrics.jsonl
// records the retries and the dropped server. Then the other is killed
// during step 3: the run stops with an error saying every server is down,
// its checkpoint of step 2 intact, and resumes once servers are back,
// ending as the local run ends, bit for bit.
func TestServeRLKill(t *testing.T) {
	md, local := localRun(t)
	a, b := startServe(t, md), startServe(t, md)
	pa, pb := newKillProxy(t, a), newKillProxy(t, b)
	pa.arm("1", 2) // step 2: A dies on its second request
	pb.arm("2", 1) // step 3: B dies on its first
	dir := filepath.Join(t.TempDir(), "killed")
	var warns []string
	var mu sync.Mutex
	warn := func(m string) { mu.Lock(); warns = append(warns, m); mu.Unlock() }
	r := parseServeRecipe(t, md, dir, remoteSets(dir, pa.url, pb.url)...)
	_, err := rl.Run(context.Background(), r, false, rl.Progress{Warn: warn})
	// The kills are over once the processes are reaped, which may come
	// after the run has seen their connections drop.
	for _, p := range []*killProxy{pa, pb} {
		select {
		case <-p.killed:
		case <-time.After(time.Minute):
			t.Fatalf("server behind %s was never killed (run error: %v)", p.url, err)
		}
	}
	aIn, aCut, aAns := pa.stats()
	bIn, bCut, bAns := pb.stats()
	t.Logf("A killed with %d request(s) in flight, %d cut in all; B killed with %d in flight, %d cut; /generate answered by version: A %v, B %v",
		aIn, aCut, bIn, bCut, aAns, bAns)
	// Every prompt of step 2 answered once: A answered some before it was
	// killed (requests written before the killed one may have been), B the
	// rest, the cut ones included.
	if aAns["1"] > 3 || aAns["1"]+bAns["1"] != 8 {
		t.Errorf("/generate answers of step 2: A %d, B %d; want 8 in all, A at most 3", aAns["1"], bAns["1"])
	}
	t.Logf("run error: %v", err)
	if err == nil || !errors.Is(err, remote.ErrNoServers) || !strings.Contains(err.Error(), "every inference server is down") ||
		!strings.Contains(err.Error(), "step 3") || !strings.Contains(err.Error(), "checkpoint of step 2") ||
		!strings.Contains(err.Error(), pa.url) || !strings.Contains(err.Error(), pb.url) {
		t.Fatalf("every server down: error %v", err)
	}
	mu.Lock()
	w := strings.Join(warns, "\n")
	mu.Unlock()
	if !strings.Contains(w, pa.url+" dropped") || !strings.Contains(w, pb.url+" dropped") {
		t.Errorf("warnings do not tell of both servers dropped:\n%s", w)
	}
	// Step 2 completed on B; metrics.jsonl tells of the kill.
	all, _ := readMetrics(t, dir)
	if len(all) != 2 || all[1]["step"] != 2.0 {
		t.Fatalf("metrics after the failed step 3: %v", all)
	}
	s1, s2 := all[0], all[1]
	if s1["rollout/servers_alive"] != 2.0 || s1["rollout/retries"] != 0.0 {
		t.Errorf("step 1: %v alive, %v retries", s1["rollout/servers_alive"], s1["rollout/retries"])
	}
	if r, _ := s2["rollout/retries"].(float64); r < 1 || s2["rollout/servers_alive"] != 1.0 || s2["rollout/servers_dropped"] != 1.0 {
		t.Errorf("step 2 (A killed): %v retries, %v alive, %v dropped; want retries > 0, 1 alive, 1 dropped",
			s2["rollout/retries"], s2["rollout/servers_alive"], s2["rollout/servers_dropped"])
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoints", run.StepDir(2))); err != nil {
		t.Fatalf("checkpoint of step 2: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "checkpoints", run.StepDir(3))); err == nil {
		t.Fatal("a checkpoint of the failed step 3")
	}

	// Servers back, at new addresses: keel rl --resume --servers moves the
	// run to them (a copy of the run directory here)...
	a2, b2 := startServe(t, md), startServe(t, md)
	copyDir := filepath.Join(t.TempDir(), "resumed-new-urls")
	if err := os.CopyFS(copyDir, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := runRL([]string{"--resume", copyDir, "--quiet", "--servers", a2.url + "," + b2.url}); err != nil {
		t.Fatalf("resume with new server URLs: %v", err)
	}
	if saved, err := rl.ReadRecipe(filepath.Join(copyDir, rl.RecipeFile), nil); err != nil || !slices.Equal(saved.Rollout.Servers, []string{a2.url, b2.url}) {
		t.Fatalf("the resumed run's recipe: %v, %v", saved, err)
	}
	sameRun(t, "killed, resumed on new URLs", local, copyDir)

	// ... while servers back at the recipe's addresses (the proxies now
	// forward to the new processes) resume with plain keel rl --resume.
	pa.retarget(a2)
	pb.retarget(b2)
	if err := runRL([]string{"--resume", dir, "--quiet"}); err != nil {
		t.Fatalf("keel rl --resume: %v", err)
	}
	sameRun(t, "killed, resumed with keel rl --resume", local, dir)
	all, _ = readMetrics(t, dir)
	if s := all[len(all)-1]; s["step"] != 3.0 || s["rollout/servers_alive"] != 2.0 {
		t.Errorf("the resumed step 3: %v", s)
	}
}

// --max-n below 1 is refused before anything is loaded.
func TestServeMaxNFlag(t *testing.T) {
	for _, v := range []string{"0", "-3"} {
		if err := runServe([]string{"--model", "/nonexistent", "--max-n", v}); err == nil || !strings.Contains(err.Error(), "--max-n") {
			t.Errorf("--max-n %s: %v", v, err)
		}
	}
}

// SIGTERM while paused in place, a request waiting in flight: the server
// aborts it (the client gets finish_reason abort, to send it again
// elsewhere) and exits 0 at once, rather than waiting out the drain
// timeout for a continue_generation that will not come and exiting 1.
func TestServeShutdownPausedInPlace(t *testing.T) {
	md := filepath.Join(t.TempDir(), "model")
	if err := serveTestModel(md); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, md, "--drain-timeout", "60s")
	post := func(path, body string) (int, []byte) {
		resp, err := http.Post(s.url+path, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, b := post("/pause_generation", `{"mode": "in_place"}`); code != 200 {
		t.Fatalf("pause: %d %s", code, b)
	}
	type answer struct {
		code int
		body []byte
	}
	answers := make(chan answer, 1)
	go func() {
		code, b := post("/generate", `{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}}`)
		answers <- answer{code, b}
	}()
	// The request is in flight once the server counts it waiting.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(s.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "keel:num_requests_waiting 1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the request never queued:\n%s", b)
		}
	}
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("keel serve still running 20 s after SIGTERM (paused in place, a request in flight):\n%s", s.out)
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(s.out.String(), "keel serve: stopped") {
		t.Errorf("exit status %d after %s:\n%s", code, time.Since(start), s.out)
	}
	a := <-answers
	if a.code != 200 || !strings.Contains(string(a.body), `"abort"`) {
		t.Errorf("the request in flight: %d %s, want finish_reason abort", a.code, a.body)
	}
}

// A request still running when the drain times out does not hold the
// shutdown: its connection is closed, generations are cancelled, and
// shutdown returns the drain's error at once.
func TestServeShutdownTimeout(t *testing.T) {
	md := filepath.Join(t.TempDir(), "model")
	if err := serveTestModel(md); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(md)
	if err != nil {
		t.Fatal(err)
	}
	e, err := rollout.New(m, rollout.Options{Precision: rollout.Exact, Slots: 4, MaxLen: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	srv := serve.New(rollout.NewScheduler(e), tokenizer.NewChar(), m.Config, 64, serve.Options{})
	mux := http.NewServeMux()
	mux.Handle("/", srv.Handler())
	started := make(chan struct{})
	mux.HandleFunc("/stuck", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done() // until its connection is closed
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go hs.Serve(ln)
	go http.Get("http://" + ln.Addr().String() + "/stuck")
	<-started
	start := time.Now()
	err = shutdown(hs, srv, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "drain") || time.Since(start) > 10*time.Second {
		t.Errorf("shutdown with a request stuck: %v after %s", err, time.Since(start))
	}
}
