package remotetokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/kvroute/kvroute/pkg/jsonscan"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
)

// Defaults of RemoteOptions.
const (
	DefaultRemoteTimeout       = 200 * time.Millisecond
	DefaultCacheEntries        = 4096
	DefaultCacheBytes          = 64 << 20
	DefaultMaxResponseBytes    = 8 << 20
	tokenizePath               = "/tokenize"
	maxErrorBodyBytes          = 512
	defaultMaxIdleConnsPerHost = 64
)

// Errors of the remote tokenizer, for errors.Is. A timeout wraps
// context.DeadlineExceeded.
var (
	ErrNoEndpoint       = errors.New("no model server endpoint to tokenize with")
	ErrRemoteStatus     = errors.New("model server refused to tokenize")
	ErrBadResponse      = errors.New("malformed tokenize response")
	ErrResponseTooLarge = errors.New("tokenize response too large")
	ErrClosed           = errors.New("remote tokenizer closed")
)

// RemoteOptions configure a Remote. The zero value of each field means its
// default.
type Options struct {
	// Endpoint returns the base URL ("http://10.0.0.7:8000") of the model
	// server that tokenizes for model, or false when there is none.
	// Required.
	Endpoint func(model string) (baseURL string, ok bool)
	// HTTPClient sends the requests; nil means a client of its own that
	// keeps enough idle connections for a busy endpoint.
	HTTPClient *http.Client
	// Timeout bounds one round trip (default 200ms), however long the
	// callers are willing to wait.
	Timeout time.Duration
	// CacheEntries bounds the number of cached tokenizations (default 4096;
	// negative disables the cache).
	CacheEntries int
	// CacheBytes bounds the memory of the cached token ids (default 64 MiB).
	CacheBytes int64
	// MaxResponseBytes bounds a response body (default 8 MiB, about a
	// million tokens).
	MaxResponseBytes int64
	// Logger receives failures at debug level; nil means slog.Default().
	Logger *slog.Logger
}

// Remote asks a model server's /tokenize endpoint for a request's token ids,
// so that they match the server's own tokenization exactly (chat template
// included). Repeated inputs are answered from a bounded LRU cache, and
// concurrent identical inputs share one round trip. It is safe for
// concurrent use.
type Remote struct {
	o         Options
	ownClient bool
	cache     *lruCache
	flights   singleflight.Group
	m         remoteMetrics
	// base is the parent of every round trip's context; Close cancels it.
	base   context.Context
	cancel context.CancelFunc
	closed atomic.Bool
	// waiting counts callers waiting on a round trip, so tests can tell
	// when concurrent callers have joined one.
	waiting atomic.Int64

	// contexts is each model's max_model_len as its server last reported
	// it. Only models the pool serves reach a server, and the map is
	// bounded all the same.
	ctxMu    sync.Mutex
	contexts map[string]int
}

var (
	_ tokenize.Tokenizer      = (*Remote)(nil)
	_ tokenize.ContextLengths = (*Remote)(nil)
)

// maxContexts bounds the models whose context length is remembered.
const maxContexts = 1024

// MaxModelLen returns the context length, in tokens, the model server of
// model reported with its last tokenization.
func (r *Remote) MaxModelLen(model string) (int, bool) {
	r.ctxMu.Lock()
	defer r.ctxMu.Unlock()
	n, ok := r.contexts[model]
	return n, ok
}

func (r *Remote) noteContext(model string, n int) {
	if n <= 0 {
		return
	}
	r.ctxMu.Lock()
	defer r.ctxMu.Unlock()
	if _, ok := r.contexts[model]; ok || len(r.contexts) < maxContexts {
		r.contexts[model] = n
	}
}

// NewRemote returns a remote tokenizer; its metrics are registered with reg
// unless reg is nil. Call Close to cancel round trips in flight.
func New(opts Options, reg prometheus.Registerer) *Remote {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultRemoteTimeout
	}
	if opts.CacheEntries == 0 {
		opts.CacheEntries = DefaultCacheEntries
	}
	if opts.CacheBytes <= 0 {
		opts.CacheBytes = DefaultCacheBytes
	}
	if opts.MaxResponseBytes <= 0 {
		opts.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Remote{o: opts, m: newRemoteMetrics(reg), contexts: map[string]int{}}
	if r.o.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = defaultMaxIdleConnsPerHost
		r.o.HTTPClient = &http.Client{Transport: t}
		r.ownClient = true
	}
	r.cache = newLRUCache(opts.CacheEntries, opts.CacheBytes, r.m.cacheEntries, r.m.cacheBytes)
	r.base, r.cancel = context.WithCancel(context.Background())
	return r
}

// Close cancels the round trips in flight; later calls to Tokenize fail
// with ErrClosed.
func (r *Remote) Close() {
	r.closed.Store(true)
	r.cancel()
	if r.ownClient {
		r.o.HTTPClient.CloseIdleConnections()
	}
}

// Tokenize returns req's prompt token ids as the model server of req.Model
// computes them: for completions, Prompt with AddSpecialTokens; for chat,
// the raw messages with the request's template options. The returned slice
// is the caller's own (or req.TokenIDs, when the request already has them).
func (r *Remote) Tokenize(ctx context.Context, req *request.Request) ([]uint32, error) {
	start := time.Now()
	if r.closed.Load() {
		return nil, ErrClosed
	}
	if req != nil && req.TokensKnown() {
		return req.TokenIDs, nil
	}
	key, err := inputKey(req)
	if err != nil {
		r.m.errors.WithLabelValues("unsupported").Inc()
		return nil, err
	}
	if ids, ok := r.cache.get(key); ok {
		r.m.observe("cache", "ok", start)
		return append([]uint32(nil), ids...), nil
	}
	ids, err := r.fetch(ctx, key, req)
	if err != nil {
		reason := errorReason(err)
		r.m.errors.WithLabelValues(reason).Inc()
		r.m.observe("remote", "error", start)
		r.o.Logger.LogAttrs(ctx, slog.LevelDebug, "remote tokenization failed",
			slog.String("model", req.Model), slog.String("reason", reason), slog.Any("error", err))
		return nil, err
	}
	r.m.observe("remote", "ok", start)
	return append([]uint32(nil), ids...), nil
}

// fetch asks the model server, sharing one round trip among concurrent
// callers with the same input. The round trip runs under the remote's own
// timeout rather than the first caller's context, so that one caller giving
// up does not fail the others; its answer still fills the cache.
func (r *Remote) fetch(ctx context.Context, key cacheKey, req *request.Request) ([]uint32, error) {
	base, ok := r.o.Endpoint(req.Model)
	if !ok || base == "" {
		return nil, fmt.Errorf("%w for model %q", ErrNoEndpoint, req.Model)
	}
	url := strings.TrimSuffix(base, "/") + tokenizePath
	flightKey := string(binaryKey(key))
	ch := r.flights.DoChan(flightKey, func() (any, error) {
		ids, err := r.roundTrip(url, req)
		if err == nil {
			r.cache.put(key, ids)
		}
		return ids, err
	})
	r.waiting.Add(1)
	defer r.waiting.Add(-1)
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.([]uint32), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("tokenize at %s: %w", url, context.Cause(ctx))
	}
}

func (r *Remote) roundTrip(url string, req *request.Request) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(r.base, r.o.Timeout)
	defer cancel()
	body, err := requestBody(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", url, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := r.o.HTTPClient.Do(hreq)
	if err != nil {
		if r.closed.Load() {
			return nil, fmt.Errorf("tokenize at %s: %w", url, ErrClosed)
		}
		return nil, fmt.Errorf("tokenize at %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBodyBytes))
		return nil, fmt.Errorf("tokenize at %s: %w: status %d: %s", url, ErrRemoteStatus, resp.StatusCode, bytes.TrimSpace(msg))
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, r.o.MaxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: read response: %w", url, err)
	}
	if int64(len(data)) > r.o.MaxResponseBytes {
		return nil, fmt.Errorf("tokenize at %s: %w: more than %d bytes", url, ErrResponseTooLarge, r.o.MaxResponseBytes)
	}
	ids, maxLen, err := decodeResponse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenize at %s: %w", url, err)
	}
	r.noteContext(req.Model, maxLen)
	return ids, nil
}

// inputKey hashes everything the model server's tokenization depends on.
// The cache salt is left out: it changes which blocks are shared, not the
// token ids.
func inputKey(req *request.Request) (cacheKey, error) {
	if req == nil || req.NoReproduciblePrefix {
		return cacheKey{}, tokenize.ErrUnsupported
	}
	var h keyHasher
	h.reset()
	h.stringField(req.Model)
	switch {
	case req.Chat == nil && (req.API == request.APICompletions || (req.API == request.APIEmbeddings && req.Prompt != "")):
		h.stringField("completions")
		h.flag(req.AddSpecialTokens)
		h.stringField(req.Prompt)
	case req.Chat != nil:
		// Chat, and the APIs the server renders as one (Messages,
		// Responses): their converted messages.
		c := req.Chat
		if len(c.Messages) == 0 {
			return cacheKey{}, tokenize.ErrUnsupported
		}
		h.stringField("chat")
		h.flag(c.AddGenerationPrompt)
		h.flag(c.ContinueFinalMessage)
		h.flag(c.AddSpecialTokens)
		h.field(c.Messages)
		h.field(nonNull(c.Tools))
		h.stringField(c.ChatTemplate)
		h.field(nonNull(c.ChatTemplateKwargs))
	default:
		return cacheKey{}, tokenize.ErrUnsupported
	}
	return h.sum(), nil
}

func binaryKey(k cacheKey) []byte {
	b := make([]byte, 16)
	for i := range 8 {
		b[i] = byte(k[0] >> (8 * i))
		b[8+i] = byte(k[1] >> (8 * i))
	}
	return b
}

// nonNull returns raw, or nil when it is empty or JSON null, which the
// model server treats alike.
func nonNull(raw json.RawMessage) json.RawMessage {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		return nil
	}
	return raw
}

// requestBody builds the /tokenize request. Chat fields are copied as the
// client sent them, so the server renders exactly what it would render for
// the chat request itself.
func requestBody(req *request.Request) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"model":`)
	if err := writeJSONString(&b, req.Model); err != nil {
		return nil, err
	}
	if req.Chat == nil {
		b.WriteString(`,"prompt":`)
		if err := writeJSONString(&b, req.Prompt); err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, `,"add_special_tokens":%t}`, req.AddSpecialTokens)
		return b.Bytes(), nil
	}
	c := req.Chat
	b.WriteString(`,"messages":`)
	b.Write(c.Messages)
	fmt.Fprintf(&b, `,"add_generation_prompt":%t,"continue_final_message":%t,"add_special_tokens":%t`,
		c.AddGenerationPrompt, c.ContinueFinalMessage, c.AddSpecialTokens)
	if tools := nonNull(c.Tools); tools != nil {
		b.WriteString(`,"tools":`)
		b.Write(tools)
	}
	if c.ChatTemplate != "" {
		b.WriteString(`,"chat_template":`)
		if err := writeJSONString(&b, c.ChatTemplate); err != nil {
			return nil, err
		}
	}
	if kw := nonNull(c.ChatTemplateKwargs); kw != nil {
		b.WriteString(`,"chat_template_kwargs":`)
		b.Write(kw)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func writeJSONString(b *bytes.Buffer, s string) error {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("encode tokenize request: %w", err)
	}
	// Encode ends the value with a newline, which JSON allows but the
	// request does not need.
	b.Truncate(b.Len() - 1)
	return nil
}

// decodeResponse reads a /tokenize response: {"count", "max_model_len",
// "tokens": [...]}. Token ids must be integers that fit uint32; encoding/json
// would read null as 0, so the ids are checked here.
func decodeResponse(data []byte) (ids []uint32, maxModelLen int, err error) {
	var resp struct {
		Count       *int            `json:"count"`
		MaxModelLen int             `json:"max_model_len"`
		Tokens      json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrBadResponse, err)
	}
	ids, err = decodeTokenIDs(resp.Tokens)
	if err != nil {
		return nil, 0, err
	}
	if resp.Count != nil && *resp.Count != len(ids) {
		return nil, 0, fmt.Errorf("%w: count %d but %d tokens", ErrBadResponse, *resp.Count, len(ids))
	}
	return ids, max(resp.MaxModelLen, 0), nil
}

// decodeTokenIDs reads a JSON array of token ids that encoding/json has
// already found to be valid JSON.
func decodeTokenIDs(raw json.RawMessage) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return nil, fmt.Errorf("%w: tokens is missing or not an array", ErrBadResponse)
	}
	ids := make([]uint32, 0, bytes.Count(raw, []byte{','})+1)
	i := jsonscan.SkipSpace(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return ids, nil
	}
	for i < len(raw) {
		start := i
		var v uint64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > math.MaxUint32 {
				return nil, fmt.Errorf("%w: tokens[%d] does not fit a token id", ErrBadResponse, len(ids))
			}
			i++
		}
		if i == start || (i < len(raw) && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E')) {
			end := min(start+16, len(raw))
			return nil, fmt.Errorf("%w: tokens[%d] is not a token id: %q", ErrBadResponse, len(ids), raw[start:end])
		}
		ids = append(ids, uint32(v))
		i = jsonscan.SkipSpace(raw, i)
		if i < len(raw) && raw[i] == ']' {
			return ids, nil
		}
		i = jsonscan.SkipSpace(raw, i+1) // past the comma
	}
	return nil, fmt.Errorf("%w: tokens is not a complete array", ErrBadResponse)
}

// errorReason is the reason label of a failure.
func errorReason(err error) string {
	var netErr net.Error
	switch {
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrNoEndpoint):
		return "no_endpoint"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrRemoteStatus):
		return "status"
	case errors.Is(err, ErrResponseTooLarge):
		return "too_large"
	case errors.Is(err, ErrBadResponse):
		return "bad_response"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	}
	return "transport"
}

type remoteMetrics struct {
	duration     *prometheus.HistogramVec
	errors       *prometheus.CounterVec
	cacheEntries prometheus.Gauge
	cacheBytes   prometheus.Gauge
}

func newRemoteMetrics(reg prometheus.Registerer) remoteMetrics {
	m := remoteMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "kvroute_tokenize_duration_seconds",
			Help: "Time to find a request's token ids, by where they came from (remote, cache) and result (ok, error).",
			// From a cache hit (microseconds) to the round-trip timeout.
			Buckets: []float64{1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1},
		}, []string{"source", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenize_errors_total",
			Help: "Tokenizations that failed, by reason.",
		}, []string{"reason"}),
		cacheEntries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_tokenize_cache_entries",
			Help: "Tokenizations held in the remote tokenizer's cache.",
		}),
		cacheBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_tokenize_cache_bytes",
			Help: "Approximate memory of the tokenizations held in the remote tokenizer's cache.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.duration, m.errors, m.cacheEntries, m.cacheBytes)
	}
	return m
}

func (m remoteMetrics) observe(source, result string, start time.Time) {
	m.duration.WithLabelValues(source, result).Observe(time.Since(start).Seconds())
}
