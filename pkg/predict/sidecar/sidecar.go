// Package sidecar is a client of upstream's latency predictor sidecar (the
// llm-d latency predictor's HTTP API): predictions from its
// /predict/bulk/strict, training samples batched to its
// /add_training_data_bulk, with its feature names. It lets a user who runs
// that sidecar keep it as kvroute's latency backend. The sidecar sees the
// prefix as one ratio (prefix_cache_score), not per tier: that is its
// model, not this client's choice.
package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/predict"
)

// Paths of the sidecar's API.
const (
	PathPredictBulkStrict = "/predict/bulk/strict"
	PathAddTrainingBulk   = "/add_training_data_bulk"
)

// MaxBulk is the most requests the sidecar accepts in one bulk call.
const MaxBulk = 10000

// maxResponseBytes bounds a prediction response: MaxBulk predictions of a
// few hundred bytes each.
const maxResponseBytes = 16 << 20

// ErrBadResponse is a sidecar answer that is not what its API promises.
var ErrBadResponse = errors.New("sidecar: bad response")

// Options configure a Client.
type Options struct {
	// PredictionURL and TrainingURL are the prediction and training
	// servers' base URLs (upstream's defaults: http://localhost:8001 and
	// http://localhost:8000).
	PredictionURL, TrainingURL string
	// Timeout bounds one prediction call (default 50ms); the caller's
	// context may end it sooner.
	Timeout time.Duration
	// Quantile is what the sidecar predicts, until its answers say
	// (default 0.9, upstream's).
	Quantile float64
	// FlushInterval and FlushBatch say when buffered training samples are
	// sent: every interval, or as soon as a batch is full (defaults 1s
	// and 1000, as upstream's client). At most MaxBuffered wait; beyond,
	// new ones are dropped and counted (default 10000).
	FlushInterval time.Duration
	FlushBatch    int
	MaxBuffered   int
	// HTTPClient is the client used (default a fresh one).
	HTTPClient *http.Client
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Client is the sidecar backend. Its methods are safe for concurrent use.
type Client struct {
	o       Options
	predict string
	train   string

	mu       sync.Mutex
	pending  []trainingEntry
	quantile float64
	flush    chan struct{}

	m *metrics
}

// New returns a client. Nothing is sent before the first prediction.
func New(o Options) (*Client, error) {
	if o.PredictionURL == "" || o.TrainingURL == "" {
		return nil, errors.New("sidecar: a prediction URL and a training URL are required")
	}
	for _, u := range []string{o.PredictionURL, o.TrainingURL} {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("sidecar: URL %q is not http(s)", u)
		}
	}
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.Quantile == 0 {
		o.Quantile = 0.9
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = time.Second
	}
	if o.FlushBatch <= 0 {
		o.FlushBatch = 1000
	}
	if o.MaxBuffered <= 0 {
		o.MaxBuffered = 10000
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	return &Client{
		o: o, m: m, quantile: o.Quantile, flush: make(chan struct{}, 1),
		predict: strings.TrimSuffix(o.PredictionURL, "/") + PathPredictBulkStrict,
		train:   strings.TrimSuffix(o.TrainingURL, "/") + PathAddTrainingBulk,
	}, nil
}

// predictionRequest is one request's features, as the sidecar names them.
type predictionRequest struct {
	KVCachePercentage     float64 `json:"kv_cache_percentage"`
	InputTokenLength      int     `json:"input_token_length"`
	NumRequestWaiting     int     `json:"num_request_waiting"`
	NumRequestRunning     int     `json:"num_request_running"`
	NumTokensGenerated    int     `json:"num_tokens_generated"`
	PrefixCacheScore      float64 `json:"prefix_cache_score"`
	PodType               string  `json:"pod_type"`
	PrefillTokensInFlight int     `json:"prefill_tokens_in_flight"`
	DecodeTokensInFlight  int     `json:"decode_tokens_in_flight"`
}

type bulkRequest struct {
	Requests []predictionRequest `json:"requests"`
}

type predictionResponse struct {
	TTFTMs   *float64 `json:"ttft_ms"`
	TPOTMs   *float64 `json:"tpot_ms"`
	Quantile *float64 `json:"quantile"`
}

type bulkResponse struct {
	Predictions []predictionResponse `json:"predictions"`
}

// trainingEntry is one observation, as the sidecar names it.
type trainingEntry struct {
	predictionRequest
	ActualTTFTMs float64   `json:"actual_ttft_ms"`
	ActualTPOTMs float64   `json:"actual_tpot_ms"`
	Timestamp    time.Time `json:"timestamp"`
}

func features(in *predict.Input) predictionRequest {
	n := max(in.InputTokens, 0)
	score := 0.0
	if n > 0 {
		score = float64(in.InputTokens-in.Uncached()) / float64(n)
	}
	nonneg := func(v int) int { return max(v, 0) }
	kv := in.KVUsage
	if in.MetricsStale || !(kv >= 0) {
		kv = 0
	}
	r := predictionRequest{
		KVCachePercentage: math.Min(kv, 1), InputTokenLength: n,
		PrefixCacheScore:      math.Min(math.Max(score, 0), 1),
		PrefillTokensInFlight: nonneg(in.PrefillTokens), DecodeTokensInFlight: nonneg(in.DecodeTokens),
	}
	if !in.MetricsStale {
		r.NumRequestWaiting, r.NumRequestRunning = nonneg(in.Waiting), nonneg(in.Running)
	}
	return r
}

// PredictAll implements the latency producer's Backend: one bulk call for
// every candidate (split at MaxBulk). The sidecar predicts one figure per
// target (its quantile, or its mean if so configured); it is given as both
// the mean and the quantile.
func (c *Client) PredictAll(ctx context.Context, _ []string, ins []predict.Input, out []predict.Prediction) error {
	for lo := 0; lo < len(ins); lo += MaxBulk {
		hi := min(lo+MaxBulk, len(ins))
		if err := c.predictChunk(ctx, ins[lo:hi], out[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

func (c *Client) predictChunk(ctx context.Context, ins []predict.Input, out []predict.Prediction) error {
	start := time.Now()
	err := c.doPredict(ctx, ins, out)
	c.m.duration.WithLabelValues("predict").Observe(time.Since(start).Seconds())
	c.m.calls.WithLabelValues("predict", result(err)).Inc()
	return err
}

func (c *Client) doPredict(ctx context.Context, ins []predict.Input, out []predict.Prediction) error {
	body := bulkRequest{Requests: make([]predictionRequest, len(ins))}
	for i := range ins {
		body.Requests[i] = features(&ins[i])
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("sidecar: encode predictions: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.predict, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.o.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("sidecar: predict: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("sidecar: read predictions: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s answered %d: %s", ErrBadResponse, c.predict, resp.StatusCode, snippet(raw))
	}
	q, err := decodePredictions(raw, out)
	if err != nil {
		return err
	}
	if q > 0 {
		c.mu.Lock()
		c.quantile = q
		c.mu.Unlock()
	}
	return nil
}

// decodePredictions reads a /predict/bulk/strict answer into out, which
// must have one entry per request sent, and returns the quantile it says
// it predicts (0 when it does not say).
func decodePredictions(raw []byte, out []predict.Prediction) (float64, error) {
	if len(raw) > maxResponseBytes {
		return 0, fmt.Errorf("%w: more than %d bytes", ErrBadResponse, maxResponseBytes)
	}
	var br bulkResponse
	if err := json.Unmarshal(raw, &br); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrBadResponse, err)
	}
	if len(br.Predictions) != len(out) {
		return 0, fmt.Errorf("%w: %d predictions for %d requests", ErrBadResponse, len(br.Predictions), len(out))
	}
	q := 0.0
	for i, p := range br.Predictions {
		if p.TTFTMs == nil || p.TPOTMs == nil {
			return 0, fmt.Errorf("%w: prediction %d lacks ttft_ms or tpot_ms", ErrBadResponse, i)
		}
		ttft, tpot := *p.TTFTMs, *p.TPOTMs
		if !(ttft >= 0) || !(tpot >= 0) || math.IsInf(ttft, 0) || math.IsInf(tpot, 0) {
			return 0, fmt.Errorf("%w: prediction %d is ttft_ms %v, tpot_ms %v", ErrBadResponse, i, ttft, tpot)
		}
		out[i] = predict.Prediction{TTFT: ttft, TTFTQuantile: ttft, TPOT: tpot, TPOTQuantile: tpot}
		if p.Quantile != nil && *p.Quantile > 0 && *p.Quantile < 1 {
			q = *p.Quantile
		}
	}
	return q, nil
}

// Quantile implements Backend: what the sidecar last said it predicts.
func (c *Client) Quantile() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.quantile
}

// Observe implements Backend: the sample is buffered for the next flush.
func (c *Client) Observe(s predict.Sample) {
	e := trainingEntry{predictionRequest: features(&s.Input), Timestamp: time.Now().UTC()}
	e.NumTokensGenerated = max(s.OutputTokens, 0)
	if s.HasTTFT {
		e.ActualTTFTMs = s.TTFTMs
	}
	if s.HasTPOT {
		e.ActualTPOTMs = s.TPOTMs
	}
	c.mu.Lock()
	if len(c.pending) >= c.o.MaxBuffered {
		c.mu.Unlock()
		c.m.dropped.Inc()
		return
	}
	c.pending = append(c.pending, e)
	full := len(c.pending) >= c.o.FlushBatch
	c.mu.Unlock()
	if full {
		select {
		case c.flush <- struct{}{}:
		default:
		}
	}
}

// Run sends buffered training samples until ctx is done, then sends what
// is left once.
func (c *Client) Run(ctx context.Context) error {
	tick := time.NewTicker(c.o.FlushInterval)
	defer tick.Stop()
	// A flush is not cut short by ctx: samples taken before a shutdown
	// are still sent (each send has its own bound), and the last flush,
	// bounded by a second, sends what the shutdown left.
	detached := context.WithoutCancel(ctx)
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(detached, time.Second)
			c.Flush(fctx)
			cancel()
			return nil
		case <-tick.C:
		case <-c.flush:
		}
		c.Flush(detached)
	}
}

// Flush sends the buffered training samples, in batches; a batch the
// sidecar refuses is dropped (and counted), not retried forever.
func (c *Client) Flush(ctx context.Context) {
	for {
		c.mu.Lock()
		n := min(len(c.pending), c.o.FlushBatch)
		batch := c.pending[:n:n]
		c.pending = c.pending[n:]
		c.mu.Unlock()
		if n == 0 {
			return
		}
		start := time.Now()
		err := c.sendTraining(ctx, batch)
		c.m.duration.WithLabelValues("train").Observe(time.Since(start).Seconds())
		c.m.calls.WithLabelValues("train", result(err)).Inc()
		if err != nil {
			c.m.dropped.Add(float64(n))
			c.o.Logger.Warn("latency predictor sidecar refused training samples", "samples", n, "error", err)
			return
		}
	}
}

func (c *Client) sendTraining(ctx context.Context, entries []trainingEntry) error {
	b, err := json.Marshal(map[string]any{"entries": entries})
	if err != nil {
		return fmt.Errorf("sidecar: encode training samples: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.train, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.o.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("sidecar: train: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s answered %d: %s", ErrBadResponse, c.train, resp.StatusCode, snippet(raw))
	}
	return nil
}

// Pending is the training samples waiting to be sent.
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

type metrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	dropped  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_predictor_sidecar_calls_total",
			Help: "Calls to the latency predictor sidecar, by call (predict, train) and result (ok, error).",
		}, []string{"call", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_predictor_sidecar_call_duration_seconds",
			Help:    "Time of each call to the latency predictor sidecar.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 3, 12),
		}, []string{"call"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_predictor_sidecar_samples_dropped_total",
			Help: "Training samples not delivered to the sidecar (buffer full, or refused).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.calls, m.duration, m.dropped} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("sidecar: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
