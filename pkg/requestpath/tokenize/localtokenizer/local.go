// Package localtokenizer tokenizes requests in process with each model's
// own tokenizer (pkg/tokenizer), falling back to a model server's /tokenize
// for models without one and for requests the tokenizer cannot render, and
// comparing a sample of its answers with the server's to count drift.
package localtokenizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

// Defaults of Options.
const (
	DefaultDriftEvery   = 100
	DefaultDriftTimeout = 2 * time.Second
	// maxDriftChecks bounds the checks in flight; a sample that finds them
	// all busy is skipped rather than queued.
	maxDriftChecks = 4
)

// Options configure a Local. The zero value of each field means its
// default.
type Options struct {
	// Tokenizers by model name, as the request names the model.
	Tokenizers map[string]*tokenizer.Tokenizer
	// Fallback tokenizes requests for other models and those the local
	// tokenizer cannot handle (a request's own chat template, a feature it
	// lacks); it is also the reference of drift checks. Nil means none.
	Fallback tokenize.Tokenizer
	// DriftEvery compares one locally tokenized request in this many
	// against Fallback (default 100; negative disables the check).
	DriftEvery int
	// DriftTimeout bounds one drift check (default 2s).
	DriftTimeout time.Duration
	// Logger receives drift reports; nil means slog.Default().
	Logger *slog.Logger
}

// Local tokenizes requests in process with each model's own tokenizer. It
// implements tokenize.Tokenizer and is safe for concurrent use; Close stops
// the drift checks in flight.
type Local struct {
	o      Options
	m      localMetrics
	n      atomic.Uint64
	sem    chan struct{}
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// driftLog bounds the drift lines, which requests trigger.
	driftLog *rate.Limiter
}

var (
	_ tokenize.Tokenizer      = (*Local)(nil)
	_ tokenize.ContextLengths = (*Local)(nil)
)

// MaxModelLen is the fallback's, when it learns context lengths.
func (l *Local) MaxModelLen(model string) (int, bool) {
	if cl, ok := l.o.Fallback.(tokenize.ContextLengths); ok {
		return cl.MaxModelLen(model)
	}
	return 0, false
}

type localMetrics struct {
	requests *prometheus.CounterVec
	drift    *prometheus.CounterVec
	checks   *prometheus.CounterVec
}

// New returns a local tokenizer; its metrics, and those of its
// tokenizers, are registered with reg unless reg is nil.
func New(opts Options, reg prometheus.Registerer) *Local {
	if opts.DriftEvery == 0 {
		opts.DriftEvery = DefaultDriftEvery
	}
	if opts.DriftTimeout <= 0 {
		opts.DriftTimeout = DefaultDriftTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &Local{o: opts, sem: make(chan struct{}, maxDriftChecks), driftLog: rate.NewLimiter(rate.Every(time.Second), 1)}
	l.m = localMetrics{
		requests: registerOrReuse(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_requests_total",
			Help: "Requests tokenized, by model (\"other\" for models without a local tokenizer), where (local, fallback) and result (ok, error).",
		}, []string{"model", "source", "result"})),
		drift: registerOrReuse(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_drift_total",
			Help: "Sampled requests whose local token ids differ from the model server's.",
		}, []string{"model"})),
		checks: registerOrReuse(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_drift_checks_total",
			Help: "Sampled comparisons of local against model-server token ids, by result (match, mismatch, error, skipped).",
		}, []string{"model", "result"})),
	}
	if reg != nil {
		// The tokenizers were loaded before the registry was known (the
		// EPP makes its own); their series move to it now.
		for _, t := range opts.Tokenizers {
			t.Register(reg)
		}
	}
	l.base, l.cancel = context.WithCancel(context.Background())
	return l
}

// Models lists the models tokenized locally.
func (l *Local) Models() []string { return slices.Sorted(maps.Keys(l.o.Tokenizers)) }

// Close cancels the drift checks in flight and waits for them.
func (l *Local) Close() {
	l.cancel()
	l.wg.Wait()
}

// Tokenize returns req's prompt ids: locally when the model has a tokenizer
// and the request needs nothing it lacks, else from Fallback.
func (l *Local) Tokenize(ctx context.Context, req *request.Request) ([]uint32, error) {
	if req == nil || req.NoReproduciblePrefix {
		return nil, tokenize.ErrUnsupported
	}
	if req.TokensKnown() {
		return req.TokenIDs, nil
	}
	tok, ok := l.o.Tokenizers[req.Model]
	if !ok || req.LoRA != "" {
		// An adapter's base model is not known here; the server is.
		return l.fallback(ctx, req, "other")
	}
	ids, err := encodeRequest(tok, req)
	if err != nil {
		if errors.Is(err, tokenizer.ErrUnsupported) || errors.Is(err, tokenizer.ErrTemplate) || errors.Is(err, tokenizer.ErrInputTooLarge) {
			return l.fallback(ctx, req, req.Model)
		}
		l.m.requests.WithLabelValues(req.Model, "local", "error").Inc()
		return nil, err
	}
	l.m.requests.WithLabelValues(req.Model, "local", "ok").Inc()
	if l.o.Fallback != nil && l.o.DriftEvery > 0 && l.n.Add(1)%uint64(l.o.DriftEvery) == 0 {
		l.checkDrift(req, ids)
	}
	return ids, nil
}

func encodeRequest(tok *tokenizer.Tokenizer, req *request.Request) ([]uint32, error) {
	switch {
	case req.Chat != nil:
		// Chat, and the APIs the server renders as a chat (Messages,
		// Responses): the request's messages as the server converts them.
		return tok.EncodeChat(req.Chat)
	case req.API == request.APICompletions || (req.API == request.APIEmbeddings && req.Prompt != ""):
		return tok.Encode(req.Prompt, req.AddSpecialTokens)
	}
	return nil, fmt.Errorf("%w: API %s", tokenizer.ErrUnsupported, req.API)
}

func (l *Local) fallback(ctx context.Context, req *request.Request, label string) ([]uint32, error) {
	if l.o.Fallback == nil {
		l.m.requests.WithLabelValues(label, "local", "error").Inc()
		return nil, fmt.Errorf("%w: no local tokenizer for model %q and no fallback", tokenize.ErrUnsupported, req.Model)
	}
	ids, err := l.o.Fallback.Tokenize(ctx, req)
	result := "ok"
	if err != nil {
		result = "error"
	}
	l.m.requests.WithLabelValues(label, "fallback", result).Inc()
	return ids, err
}

// checkDrift compares, in the background, the local ids of a copy of req
// with the fallback's. The copy keeps the check independent of the caller,
// who may set req.TokenIDs as soon as Tokenize returns, and of the body's
// memory, which the chat's raw fields are in and which is reused once the
// response is handled, perhaps before the check is done.
func (l *Local) checkDrift(req *request.Request, local []uint32) {
	select {
	case l.sem <- struct{}{}:
	default:
		l.m.checks.WithLabelValues(req.Model, "skipped").Inc()
		return
	}
	probe := &request.Request{
		ID: req.ID, API: req.API, Model: req.Model, Chat: req.Chat.Clone(),
		AddSpecialTokens: req.AddSpecialTokens, Prompt: req.Prompt,
	}
	want := slices.Clone(local)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer func() { <-l.sem }()
		ctx, cancel := context.WithTimeout(l.base, l.o.DriftTimeout)
		defer cancel()
		remote, err := l.o.Fallback.Tokenize(ctx, probe)
		switch {
		case err != nil:
			l.m.checks.WithLabelValues(probe.Model, "error").Inc()
			l.o.Logger.LogAttrs(ctx, slog.LevelDebug, "drift check failed",
				slog.String("model", probe.Model), slog.Any("error", err))
		case slices.Equal(remote, want):
			l.m.checks.WithLabelValues(probe.Model, "match").Inc()
		default:
			l.m.checks.WithLabelValues(probe.Model, "mismatch").Inc()
			l.m.drift.WithLabelValues(probe.Model).Inc()
			if !l.driftLog.Allow() {
				return
			}
			at := firstDifference(want, remote)
			l.o.Logger.LogAttrs(ctx, slog.LevelWarn, "local tokenization differs from the model server's",
				slog.String("model", probe.Model), slog.String("request_id", probe.ID),
				slog.Int("local_tokens", len(want)), slog.Int("server_tokens", len(remote)), slog.Int("first_difference", at))
		}
	}()
}

func firstDifference(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// registerOrReuse registers c, or returns the collector of the same name
// registered before (by another Local on the same registry).
func registerOrReuse[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}
