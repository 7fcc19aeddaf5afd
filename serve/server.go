// Package serve is keel's inference server: a model directory served by the
// rollout engine (rollout.Scheduler: requests that arrive together are
// decoded together) over the protocols clients and RL frameworks already
// speak: OpenAI's completions and chat completions (with vLLM's extras),
// SGLang's native generation and weight-update API, and Prometheus
// metrics. It is what `keel serve` runs, and what keel's RL loop drives as
// a remote rollout server.
package serve

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
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
	// MaxN bounds the samples of one request, every prompt's n together
	// (default 64): a small body must not queue unbounded work.
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
	allow   map[string][]string // methods of each route's path, for 405s
	started time.Time

	mu        sync.Mutex
	modelPath string                            // the directory last loaded
	inflight  map[int64]context.CancelCauseFunc // generations, for aborts
	nextGen   int64

	// pauseMu is held across every change of paused and the scheduler's
	// Pause or Continue that goes with it, so that the two always agree
	// (a continue_generation cannot slip in between) and a pause returns
	// only once the scheduler is paused, whichever request set the flag.
	// It is not mu: register takes mu, and Pause waits for a forward
	// step.
	pauseMu sync.Mutex
	paused  bool
	inPlace bool // the pause's mode is in_place: an update switches the sequences in flight

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

// Handler returns the server's HTTP handler: every route behind the
// cross-origin check, the API key check and the JSON body check, with
// request counting and latency.
//
// The server often runs without a key on a developer's machine, where any
// web page the developer opens could send it requests. Browsers mark
// cross-origin requests (Sec-Fetch-Site, Origin), which are refused; and
// the bodies a page may POST elsewhere without the browser asking the
// server first (text/plain, forms, no type) are refused by requiring
// application/json, which only a preflighted request can carry.
func (s *Server) Handler() http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(handlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return &apiError{status: http.StatusForbidden, typ: "permission_error", msg: "cross-origin request refused: this server does not serve web pages of other origins"}
	}))
	return cop.Handler(handlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if s.opt.APIKey != "" && !s.authorized(r) {
			return &apiError{status: http.StatusUnauthorized, typ: "authentication_error", msg: "a valid API key is required: send it as 'Authorization: Bearer KEY'"}
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.opt.MaxBodyBytes)
		if err := jsonBody(r); err != nil {
			return err
		}
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		start := time.Now()
		s.mux.ServeHTTP(rec, r)
		s.metrics.observe(r.URL.Path, rec.code, time.Since(start))
		return nil
	}))
}

// jsonBody refuses a POST whose body is not declared application/json
// (see Handler); a POST with no body passes whatever its type, as
// pause_generation and continue_generation are often sent.
func jsonBody(r *http.Request) error {
	if r.Method != http.MethodPost {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return nil
	}
	if r.ContentLength < 0 {
		// Chunked: empty only if it ends before its first byte.
		var one [1]byte
		if n, _ := io.ReadFull(r.Body, one[:]); n == 0 {
			return nil
		}
	} else if r.ContentLength == 0 {
		return nil
	}
	return &apiError{status: http.StatusUnsupportedMediaType, msg: fmt.Sprintf("Content-Type %q: send the request body as JSON, with Content-Type: application/json", ct)}
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
	s.allow = map[string][]string{}
	handle := func(method, path string, h http.Handler) {
		s.mux.Handle(method+" "+path, h)
		s.allow[path] = append(s.allow[path], method)
		if method == http.MethodGet {
			s.allow[path] = append(s.allow[path], http.MethodHead) // the mux serves HEAD with GET
		}
	}
	handle("GET", "/v1/models", handlerFunc(s.listModels))
	handle("POST", "/v1/completions", handlerFunc(s.completions))
	handle("POST", "/v1/chat/completions", handlerFunc(s.chatCompletions))
	handle("POST", "/generate", handlerFunc(s.generate))
	handle("POST", "/update_weights_from_disk", handlerFunc(s.updateWeightsFromDisk))
	handle("POST", "/pause_generation", handlerFunc(s.pauseGeneration))
	handle("POST", "/continue_generation", handlerFunc(s.continueGeneration))
	handle("GET", "/get_model_info", handlerFunc(s.modelInfo))
	handle("GET", "/health", handlerFunc(s.health))
	handle("GET", "/health_generate", handlerFunc(s.health))
	handle("GET", "/metrics", s.metrics.handler())
	s.mux.Handle("/", handlerFunc(s.noRoute))
}

// handlerFunc is a handler that returns its failure instead of writing
// it, so that every route fails the same way, through fail: a handler
// writes only its successful answer (or, for a stream, what it sent
// before failing), and an error return writes nothing else.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// ServeHTTP is the one place a route's error becomes its answer.
func (h handlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h(w, r); err != nil {
		fail(w, err)
	}
}

// noRoute answers a request no route takes, with OpenAI's error body: 405
// with Allow for a known path asked with another method (the mux would
// say so itself, but this catch-all matches every method first), else
// 404.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) error {
	if methods := s.allow[r.URL.Path]; methods != nil {
		w.Header().Set("Allow", strings.Join(methods, ", "))
		return &apiError{status: http.StatusMethodNotAllowed, msg: fmt.Sprintf("%s %s: method not allowed (%s)", r.Method, r.URL.Path, strings.Join(methods, ", "))}
	}
	return &apiError{status: http.StatusNotFound, typ: "not_found_error", msg: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)}
}

// statusRecorder remembers the status code for the metrics, and passes
// Flush through for server-sent events (and, with Unwrap, write deadlines
// through http.ResponseController).
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// apiError is an error a handler returns to be answered with its status,
// OpenAI's error type (errorType(status) when typ is empty) and the field
// it concerns; or, with sglang, with SGLang's {"success": false,
// "message"} body, as SGLang's weight update answers a model it cannot
// load.
type apiError struct {
	status int
	typ    string
	param  string
	msg    string
	sglang bool
}

func (e *apiError) Error() string { return e.msg }

// body is e as OpenAI's error body.
func (e *apiError) body() errorBody {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = e.msg, e.typ, e.status
	if b.Error.Type == "" {
		b.Error.Type = errorType(e.status)
	}
	if e.param != "" {
		b.Error.Param = &e.param
	}
	return b
}

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

// errorType is OpenAI's error type of a status: the client's fault or
// the server's.
func errorType(status int) string {
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

// sglStatus is SGLang's answer to its control routes (weight update,
// pause, continue): success and a message.
type sglStatus struct {
	Message           string `json:"message"`
	NumPausedRequests *int   `json:"num_paused_requests,omitempty"`
	Success           bool   `json:"success"`
}

// fail answers err: its own status and body for an apiError, 413 for an
// oversized body, else 500. (genError turns the engine's errors into
// apiErrors: 400 for a request it refuses, 503 once it is closed.)
func fail(w http.ResponseWriter, err error) {
	var ae *apiError
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &mb):
		ae = &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body larger than %d bytes", mb.Limit)}
	default:
		ae = &apiError{status: http.StatusInternalServerError, msg: err.Error()}
	}
	if ae.sglang {
		writeJSON(w, ae.status, sglStatus{Message: ae.msg})
		return
	}
	writeJSON(w, ae.status, ae.body())
}

// writeJSON answers v as JSON. It encodes v before writing the status, so
// that a value JSON cannot hold (a NaN) answers 500 with an error body,
// not 200 with an empty one.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, encodeError(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// encodeError is the error body for an answer that could not be encoded.
func encodeError(err error) []byte {
	e := &apiError{status: http.StatusInternalServerError, msg: fmt.Sprintf("encoding the answer: %v", err)}
	b, _ := json.Marshal(e.body()) // strings and an int: always encodes
	return b
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

// decodeOptional is decode for a body that may be absent or empty,
// chunked or not (SGLang's pause_generation takes either).
func decodeOptional(r *http.Request, v any) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return decode(r, v)
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
}

// modelList is OpenAI's /v1/models answer. The fields of this and the
// other answers built from maps before stand in the maps' (alphabetical)
// order, so that the bytes answered did not change.
type modelList struct {
	Data   []modelCard `json:"data"`
	Object string      `json:"object"`
}

// modelCard is OpenAI's model object, with vLLM's root and max_model_len.
type modelCard struct {
	Created     int64  `json:"created"`
	ID          string `json:"id"`
	MaxModelLen int    `json:"max_model_len"`
	Object      string `json:"object"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root"`
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: s.opt.Name, Object: "model", Created: s.started.Unix(), OwnedBy: "keel",
		Root: s.currentModelPath(), MaxModelLen: s.maxLen,
	}}})
	return nil
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

// checkN bounds the samples of a prompt.
func (s *Server) checkN(field string, n int) error {
	if n < 1 || n > s.opt.MaxN {
		return badRequest(field, "%s = %d, want 1 to %d", field, n, s.opt.MaxN)
	}
	return nil
}

// checkSamples bounds the samples of a whole request, over all its
// prompts (named by field), by MaxN.
func (s *Server) checkSamples(field string, samples int) error {
	if samples > s.opt.MaxN {
		return badRequest(field, "%s: the request asks for %d samples over its prompts; this server takes at most %d per request", field, samples, s.opt.MaxN)
	}
	return nil
}

// pause pauses the scheduler unless it is already (see pauseMu), in
// mode in_place or not: whether a weight update switches the sequences in
// flight.
func (s *Server) pause(inPlace bool) {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	s.inPlace = inPlace
	if !s.paused {
		s.sched.Pause()
		s.paused = true
	}
}

// resume ends a pause, if any (see pauseMu).
func (s *Server) resume() {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.paused {
		s.sched.Continue()
		s.paused = false
	}
}

// pausedInPlace reports whether pause_generation paused the server with
// mode in_place.
func (s *Server) pausedInPlace() bool {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	return s.paused && s.inPlace
}

// isPaused reports whether pause_generation paused the server.
func (s *Server) isPaused() bool {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	return s.paused
}

// Drain readies the server for a shutdown that waits for the requests in
// flight: a pause would hold them until a continue_generation that will
// not come, so a paused server aborts them (/generate answers
// finish_reason abort, the OpenAI routes 503: clients send them again,
// to another server) and continues generation for any that follow.
func (s *Server) Drain() {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.paused {
		s.abortAll(errAborted)
		s.sched.Continue()
		s.paused = false
	}
}

// Abort cancels every generation in flight, for a shutdown whose drain
// timed out: their handlers return at once, and Close need not wait for
// them to finish. It returns how many it cancelled.
func (s *Server) Abort() int { return s.abortAll(errShutdown) }

// Close ends a paused generation (requests in flight must finish) and
// closes the scheduler once they have.
func (s *Server) Close() {
	s.resume()
	s.sched.Close()
}
