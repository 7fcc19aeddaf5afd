// Package serve is keel's inference server: a model directory served by the
// rollout engine (rollout.Scheduler: requests that arrive together are
// decoded together) over the protocols clients and RL frameworks already
// speak: OpenAI's completions and chat completions (with vLLM's extras),
// SGLang's native generation and weight-update API, and Prometheus
// metrics. It is what `keel serve` runs, and what keel's RL loop drives as
// a remote rollout server.
package serve

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/keel-rl/keel/model"
	"github.com/keel-rl/keel/rollout"
	"github.com/keel-rl/keel/tokenizer"
)

// Options configure a Server.
type Options struct {
	// Name is the model name clients see (/v1/models, "model" fields);
	// requests naming another model are refused.
	Name string
	// ModelPath is the directory served, reported by /get_model_info.
	ModelPath string
	// APIKey, when set, must come with every request as a bearer token.
	APIKey string
	// MaxBodyBytes bounds a request body (default 8 MiB).
	MaxBodyBytes int64
	// MaxN bounds the samples of one request (default 64).
	MaxN int
	// Load reads a model directory for /update_weights_from_disk (default
	// model.Load).
	Load func(dir string) (*model.Model, error)
}

// Server answers HTTP requests with a Scheduler's samples.
type Server struct {
	sched   *rollout.Scheduler
	tok     *tokenizer.Tokenizer
	cfg     model.Config
	maxLen  int // prompt and response tokens of one sequence
	opt     Options
	stops   []int32 // the model's end tokens: <|im_end|>, <|endoftext|>
	metrics *metrics
	mux     *http.ServeMux
	started time.Time

	mu         sync.Mutex
	modelPath  string // the directory last loaded
	paused     bool
	inflight   map[int64]context.CancelCauseFunc // generations, for aborts
	nextGen    int64
	updateLock sync.Mutex // one weight update at a time
}

// New serves sched's engine, whose model has configuration cfg and
// sequences of at most maxLen tokens, with tok's text layer.
func New(sched *rollout.Scheduler, tok *tokenizer.Tokenizer, cfg model.Config, maxLen int, opt Options) *Server {
	if opt.MaxBodyBytes <= 0 {
		opt.MaxBodyBytes = 8 << 20
	}
	if opt.MaxN <= 0 {
		opt.MaxN = 64
	}
	if opt.Load == nil {
		opt.Load = model.Load
	}
	if opt.Name == "" {
		opt.Name = "keel"
	}
	s := &Server{sched: sched, tok: tok, cfg: cfg, maxLen: maxLen, opt: opt, mux: http.NewServeMux(),
		started: time.Now(), modelPath: opt.ModelPath}
	sp := tok.Special()
	for _, id := range []int32{sp.ImEnd, sp.EndOfText} {
		if id >= 0 && int(id) < cfg.VocabSize {
			s.stops = append(s.stops, id)
		}
	}
	s.metrics = newMetrics(sched)
	s.routes()
	return s
}

// Handler returns the server's HTTP handler: every route behind the API
// key check, with request counting and latency.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opt.APIKey != "" && !s.authorized(r) {
			writeError(w, http.StatusUnauthorized, "authentication_error", "", "a valid API key is required: send it as 'Authorization: Bearer KEY'")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.opt.MaxBodyBytes)
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		start := time.Now()
		s.mux.ServeHTTP(rec, r)
		s.metrics.observe(r.URL.Path, rec.code, time.Since(start))
	})
}

// authorized compares the bearer token with the key in constant time.
func (s *Server) authorized(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		key = r.Header.Get("X-API-Key")
	}
	return subtle.ConstantTimeCompare([]byte(key), []byte(s.opt.APIKey)) == 1
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /v1/models", s.listModels)
	s.mux.HandleFunc("POST /v1/completions", s.completions)
	s.mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	s.mux.HandleFunc("POST /generate", s.generate)
	s.mux.HandleFunc("POST /update_weights_from_disk", s.updateWeightsFromDisk)
	s.mux.HandleFunc("POST /pause_generation", s.pauseGeneration)
	s.mux.HandleFunc("POST /continue_generation", s.continueGeneration)
	s.mux.HandleFunc("GET /get_model_info", s.modelInfo)
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.HandleFunc("GET /health_generate", s.health)
	s.mux.Handle("GET /metrics", s.metrics.handler())
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found_error", "", fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	})
}

// statusRecorder remembers the status code for the metrics, and passes
// Flush through for server-sent events.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// apiError is an error answered with a status and the field it concerns.
type apiError struct {
	status int
	param  string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

// badRequest is a 400 naming the field.
func badRequest(param, format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, param: param, msg: fmt.Sprintf(format, args...)}
}

// errorBody is OpenAI's error layout, which SGLang and vLLM answer too.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, param, msg string) {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = msg, typ, status
	if param != "" {
		b.Error.Param = &param
	}
	writeJSON(w, status, b)
}

// fail answers err: its own status and field for an apiError, 413 for an
// oversized body, 503 when the scheduler is closed, else 500.
func fail(w http.ResponseWriter, err error) {
	var ae *apiError
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		typ := "invalid_request_error"
		if ae.status >= 500 {
			typ = "server_error"
		}
		writeError(w, ae.status, typ, ae.param, ae.msg)
	case errors.As(err, &mb):
		writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "", fmt.Sprintf("request body larger than %d bytes", mb.Limit))
	default:
		writeError(w, http.StatusInternalServerError, "server_error", "", err.Error())
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body strictly: unknown fields and trailing data are
// errors naming what is wrong.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return badRequest(te.Field, "field %s: a JSON %s where %s was expected", te.Field, te.Value, te.Type)
		}
		msg := err.Error()
		if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
			f = strings.Trim(f, `"`)
			return badRequest(f, "unknown field %q", f)
		}
		return badRequest("", "malformed JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("", "malformed JSON body: data after the request object")
	}
	return nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": s.opt.Name, "object": "model", "created": s.started.Unix(), "owned_by": "keel",
		"root": s.currentModelPath(), "max_model_len": s.maxLen,
	}}})
}

func (s *Server) currentModelPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modelPath
}

// checkModel refuses a request for a model this server does not serve
// (an empty name means this one).
func (s *Server) checkModel(name string) error {
	if name != "" && name != s.opt.Name {
		return &apiError{status: http.StatusNotFound, param: "model", msg: fmt.Sprintf("model %q is not served here (this server serves %q)", name, s.opt.Name)}
	}
	return nil
}

// checkIDs validates a token-id prompt against the vocabulary and the
// context, naming the field.
func (s *Server) checkIDs(field string, ids []int32) error {
	if len(ids) == 0 {
		return badRequest(field, "%s: the prompt is empty", field)
	}
	for i, id := range ids {
		if id < 0 || int(id) >= s.cfg.VocabSize {
			return badRequest(field, "%s[%d]: token id %d outside the vocabulary [0, %d)", field, i, id, s.cfg.VocabSize)
		}
	}
	if len(ids) >= s.maxLen {
		return badRequest(field, "%s: the prompt has %d tokens; this server holds sequences of at most %d tokens (prompt and at least one new token)", field, len(ids), s.maxLen)
	}
	return nil
}

// maxNew is the new-token budget: the request's, bounded by the context.
func (s *Server) maxNew(field string, want *int, promptLen, dflt int) (int, error) {
	room := s.maxLen - promptLen
	if want == nil {
		return min(dflt, room), nil
	}
	if *want < 1 {
		return 0, badRequest(field, "%s = %d, want >= 1", field, *want)
	}
	if *want > room {
		return 0, badRequest(field, "%s = %d: the prompt's %d tokens leave room for %d in this server's context of %d", field, *want, promptLen, room, s.maxLen)
	}
	return *want, nil
}

// checkN bounds the samples of a request.
func (s *Server) checkN(field string, n int) error {
	if n < 1 || n > s.opt.MaxN {
		return badRequest(field, "%s = %d, want 1 to %d", field, n, s.opt.MaxN)
	}
	return nil
}

// Close ends a paused generation (requests in flight must finish) and
// closes the scheduler once they have.
func (s *Server) Close() {
	s.mu.Lock()
	was := s.paused
	s.paused = false
	s.mu.Unlock()
	if was {
		s.sched.Continue()
	}
	s.sched.Close()
}
