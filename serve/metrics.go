package serve

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/keel-rl/keel/rollout"
)

// metrics are the server's Prometheus measures, named as vLLM and SGLang
// name theirs (prefix keel:): requests by route and status, prompt and
// generated tokens, queue length, running sequences, batch size, request
// latency and weight-update time.
type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	updates  prometheus.Histogram
}

func newMetrics(sched *rollout.Scheduler) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keel:requests_total", Help: "HTTP requests answered, by route and status code."}, []string{"route", "code"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "keel:request_latency_seconds", Help: "Time from a request's arrival to its answer's end, by route.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}, []string{"route"})
	m.updates = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "keel:weight_update_seconds", Help: "Time to load a model directory and swap it in (update_weights_from_disk).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})
	stat := func(f func(rollout.SchedulerStats) float64) func() float64 {
		return func() float64 { return f(sched.Stats()) }
	}
	m.reg.MustRegister(m.requests, m.latency, m.updates,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "keel:prompt_tokens_total", Help: "Prompt tokens computed (those shared between the samples of a prompt once)."},
			stat(func(s rollout.SchedulerStats) float64 { return float64(s.PromptTokens) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "keel:generation_tokens_total", Help: "Tokens sampled."},
			stat(func(s rollout.SchedulerStats) float64 { return float64(s.SampledTokens) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "keel:forward_steps_total", Help: "Forward steps of the engine."},
			stat(func(s rollout.SchedulerStats) float64 { return float64(s.Steps) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "keel:num_requests_waiting", Help: "Requests queued, none of their samples started."},
			stat(func(s rollout.SchedulerStats) float64 { return float64(s.Waiting) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "keel:num_sequences_running", Help: "Sequences decoding in the engine's slots (a request of n samples is n)."},
			stat(func(s rollout.SchedulerStats) float64 { return float64(s.Running) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "keel:batch_rows", Help: "Token rows of the last forward step (decode rows plus prefill rows)."},
			stat(func(s rollout.SchedulerStats) float64 { return float64(s.LastStepRows) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "keel:weight_version", Help: "The weight version being served."},
			func() float64 { return float64(sched.Version()) }),
	)
	return m
}

// observe counts an answered request. Unknown paths count as one route,
// so that scanning clients cannot grow the label set.
func (m *metrics) observe(path string, code int, d time.Duration) {
	switch path {
	case "/v1/models", "/v1/completions", "/v1/chat/completions", "/generate", "/update_weights_from_disk",
		"/pause_generation", "/continue_generation", "/get_model_info", "/health", "/health_generate", "/metrics":
	default:
		path = "other"
	}
	m.requests.WithLabelValues(path, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(path).Observe(d.Seconds())
}

func (m *metrics) weightUpdate(d time.Duration) { m.updates.Observe(d.Seconds()) }

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
