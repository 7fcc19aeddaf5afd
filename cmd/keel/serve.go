package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	rolldevice "github.com/keel-rl/keel/rollout/device"
	"github.com/keel-rl/keel/serve"
	"github.com/keel-rl/keel/tokenizer"
)

func init() {
	register(command{name: "serve", summary: "serve a model over OpenAI's and SGLang's HTTP APIs (a rollout server)", run: runServe})
}

const serveUsage = `usage: keel serve --model DIR [--precision exact|fp32|bf16|fp8|fp4] [--addr HOST:PORT]
                  [--api-key KEY] [--served-model-name NAME] [--slots N] [--max-len N]

Serves a Hugging Face model directory with keel's rollout engine: requests
that arrive together are decoded together. Protocols:
  OpenAI:  GET /v1/models, POST /v1/completions, POST /v1/chat/completions
  SGLang:  POST /generate, /update_weights_from_disk, /pause_generation,
           /continue_generation; GET /get_model_info, /health
  Prometheus: GET /metrics
It binds 127.0.0.1 unless --addr says otherwise. With an API key (--api-key,
or KEEL_API_KEY so that it does not show in a process list) every request
needs it as "Authorization: Bearer KEY". SIGTERM or Ctrl-C stops accepting
requests, lets those in flight finish (a server paused by pause_generation
aborts them instead: they would wait for a continue that will not come),
then exits; requests still running after --drain-timeout are cancelled.
`

func runServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), serveUsage); fs.PrintDefaults() }
	dir := fs.String("model", "", "Hugging Face model directory (config.json, safetensors, tokenizer.json)")
	prec := fs.String("precision", "exact", "rollout precision: exact, fp32, bf16, fp8 or fp4")
	device := fs.String("device", "cpu", "where the engine decodes: cpu, cuda or cuda:N (the GPU runs exact, bf16, fp8 and fp4; not the CPU's fp32)")
	addr := fs.String("addr", "127.0.0.1:30000", "address to listen on")
	key := fs.String("api-key", "", "require this key (default: $KEEL_API_KEY, else none)")
	name := fs.String("served-model-name", "", "the model's name for clients (default: the directory's name)")
	slots := fs.Int("slots", 64, "sequences decoded at once (on a GPU: as many of them as fit in 90% of its free memory; the banner says how many)")
	maxLen := fs.Int("max-len", 0, "tokens of prompt and response per sequence (default: the model's max_position_embeddings)")
	maxN := fs.Int("max-n", 64, "samples one request may ask for, over all its prompts")
	drain := fs.Duration("drain-timeout", 2*time.Minute, "how long SIGTERM waits for requests in flight")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case *dir == "":
		return errors.New("--model is required")
	case *slots < 1:
		return fmt.Errorf("--slots %d, want >= 1", *slots)
	case *maxN < 1:
		return fmt.Errorf("--max-n %d, want >= 1", *maxN)
	}
	p, err := rollout.ParsePrecision(*prec)
	if err != nil {
		return fmt.Errorf("--precision: %w", err)
	}
	if err := rolldevice.Check(*device, p); err != nil {
		return fmt.Errorf("--device: %w", err)
	}
	if *key == "" {
		*key = os.Getenv("KEEL_API_KEY")
	}
	m, err := model.Load(*dir)
	if err != nil {
		return err
	}
	tok, err := tokenizer.Load(*dir)
	if err != nil {
		return fmt.Errorf("%s: keel serve needs the model's tokenizer.json: %w", *dir, err)
	}
	L := *maxLen
	if L == 0 {
		L = m.Config.MaxPositionEmbeddings
	}
	if L < 2 || L > m.Config.MaxPositionEmbeddings {
		return fmt.Errorf("--max-len %d, want 2 to the model's %d positions", L, m.Config.MaxPositionEmbeddings)
	}
	e, err := rolldevice.Engine(*device, m, rollout.Options{Precision: p, Slots: *slots, MaxLen: L})
	if err != nil {
		return err
	}
	defer e.Close()
	sched := rollout.NewScheduler(e)
	if *name == "" {
		*name = filepath.Base(filepath.Clean(*dir))
	}
	srv := serve.New(sched, tok, m.Config, L, serve.Options{Name: *name, ModelPath: *dir, APIKey: *key, MaxN: *maxN})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// A client that stalls while sending a request, or keeps an idle
	// connection, cannot hold it for long (the server clears the read
	// deadline once a body is read: a long generation is not cut).
	// Streams bound each write themselves; an answer that is not
	// streamed may take as long as its generation does, so there is no
	// WriteTimeout.
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second, ReadTimeout: 2 * time.Minute,
		IdleTimeout: 2 * time.Minute}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fmt.Printf("keel serve: %s (%s, %s on %s, %d slots x %d tokens) on http://%s\n", *name, m.Config.Architecture, p, *device, e.Options().Slots, L, ln.Addr())
	select {
	case err := <-errc:
		srv.Close()
		return err
	case <-ctx.Done():
	}
	stop()
	fmt.Println("keel serve: draining requests in flight")
	if err := shutdown(hs, srv, *drain); err != nil {
		return err
	}
	fmt.Println("keel serve: stopped")
	return nil
}

// shutdown stops hs and srv within about drain: it ends a pause (aborting
// the requests it holds), lets the requests in flight finish for up to
// drain, then closes the connections left and cancels their generations,
// so that closing the scheduler does not wait for them to run to their
// end.
func shutdown(hs *http.Server, srv *serve.Server, drain time.Duration) error {
	srv.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	err := hs.Shutdown(ctx)
	if err != nil {
		hs.Close()
		n := srv.Abort()
		err = fmt.Errorf("drain: requests still running after %s (%d generations cancelled): %w", drain, n, err)
	}
	srv.Close()
	return err
}
