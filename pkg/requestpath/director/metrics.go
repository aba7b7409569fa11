package director

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/requestpath/internal/memo"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// Metrics are the request path's Prometheus metrics: the upstream EPP's
// names where they mean the same, kvroute_* for what only kvroute knows.
type Metrics struct {
	requests         *prometheus.CounterVec
	errors           *prometheus.CounterVec
	duration         *prometheus.HistogramVec
	ttft             *prometheus.HistogramVec
	tpot             *prometheus.HistogramVec
	inputTokens      *prometheus.HistogramVec
	outputTokens     *prometheus.HistogramVec
	cachedTokens     *prometheus.HistogramVec
	hitRatio         prometheus.Histogram
	picks            *prometheus.CounterVec
	pickStates       *prometheus.CounterVec
	matchedTokens    *prometheus.CounterVec
	tokenizeFailures prometheus.Counter
	prepareFailures  prometheus.Counter
	inexact          *prometheus.CounterVec

	// What every routed request counts, resolved once: a label lookup
	// (hashing and checking the values) cost more than the count.
	pickExact, pickApprox, pickNone prometheus.Counter
	byState                         [datalayer.NumStreamStates]prometheus.Counter
	byTier                          [events.NumTiers]prometheus.Counter
	speculative                     prometheus.Counter
	byModel                         *memo.Map[[2]string, *modelSeries]
	// pd measures split picks' legs (pd.go).
	pd pdMetrics
	// byPriority resolves inference_objective_request_total, whose series
	// also carry the request's priority, as upstream's do.
	byPriority *memo.Map[[3]string, prometheus.Counter]
}

// modelSeries are the series of one pair of requested and target model
// label values.
type modelSeries struct {
	duration, ttft, tpot, inputTokens, outputTokens, cachedTokens prometheus.Observer
}

// maxModelSeries bounds the model pairs whose series are kept resolved.
// Label values are the pool's models or "other", so there are few.
const maxModelSeries = 1024

// series returns the series of the model label values labels.
func (m *Metrics) series(labels [2]string) *modelSeries { return m.byModel.Get(labels) }

// makeSeries resolves the series of the model label values labels.
func (m *Metrics) makeSeries(labels [2]string) *modelSeries {
	l := labels[:]
	return &modelSeries{
		duration: m.duration.WithLabelValues(l...),
		ttft:     m.ttft.WithLabelValues(l...), tpot: m.tpot.WithLabelValues(l...),
		inputTokens: m.inputTokens.WithLabelValues(l...), outputTokens: m.outputTokens.WithLabelValues(l...),
		cachedTokens: m.cachedTokens.WithLabelValues(l...),
	}
}

// NewMetrics makes the metrics and registers them with reg unless it is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	model := []string{"model_name", "target_model_name"}
	// Upstream's token buckets, so that its dashboards' quantiles read
	// the same: prompts up to a million tokens, outputs up to 8192.
	promptBuckets := []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288, 1048576}
	outputBuckets := []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_total",
			Help: "Requests routed, by requested and target model and the request's priority.",
		}, append(model, "priority")),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_error_total",
			Help: "Requests refused by the request path, by HTTP status.",
		}, append(model, "error_code")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_duration_seconds",
			Help:    "Time from the request's arrival at the EPP to the end of its response.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}, model),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_ttft_seconds",
			Help:    "Time from the request's arrival at the EPP to the response's first body bytes.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, model),
		tpot: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_tpot_seconds",
			Help:    "Mean time per output token after the first, of streamed responses.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, model),
		inputTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_input_tokens", Help: "Prompt tokens per request, from the response's usage.", Buckets: promptBuckets,
		}, model),
		outputTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_output_tokens", Help: "Completion tokens per request, from the response's usage.", Buckets: outputBuckets,
		}, model),
		cachedTokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_prompt_cached_tokens", Help: "Prompt tokens the model server found cached, from the response's usage.", Buckets: promptBuckets,
		}, model),
		hitRatio: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "inference_extension_prefix_indexer_hit_ratio",
			Help:    "Share of the request's blocks the picked endpoint held, per the prefix index.",
			Buckets: prometheus.LinearBuckets(0, 0.1, 11),
		}),
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_picks_total",
			Help: "Picks, by whether the picked endpoint's prefix answer was exact (event-fed) or approximate.",
		}, []string{"prefix"}),
		pickStates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_picks_by_state_total",
			Help: "Picks, by the trust state of the picked endpoint's prefix answer (exact, partial, recovering, uncertain, none).",
		}, []string{"state"}),
		matchedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_picked_matched_tokens_total",
			Help: "Prompt tokens the picked endpoint held according to the index, by cache tier (speculative: recorded after an earlier pick, not yet confirmed by events).",
		}, []string{"tier"}),
		tokenizeFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_tokenize_failures_total",
			Help: "Requests whose tokenization failed or timed out; they were routed with approximate prefix answers.",
		}),
		prepareFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_prepare_data_failed_requests_total",
			Help: "Requests for which at least one PrepareData producer failed or timed out.",
		}),
		inexact: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_inexact_prefix_requests_total",
			Help: "Requests whose prompt the model server completes from state the EPP cannot see (a Responses request's previous_response_id), by API and reason; they were routed with approximate prefix answers.",
		}, []string{"api", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.errors, m.duration, m.ttft, m.tpot, m.inputTokens, m.outputTokens, m.cachedTokens,
			m.hitRatio, m.picks, m.pickStates, m.matchedTokens, m.tokenizeFailures, m.prepareFailures, m.inexact)
	}
	m.pd = newPDMetrics(reg)
	for _, s := range datalayer.AllStreamStates {
		m.byState[s] = m.pickStates.WithLabelValues(s.String())
	}
	m.pickExact, m.pickApprox, m.pickNone = m.picks.WithLabelValues("exact"), m.picks.WithLabelValues("approximate"), m.picks.WithLabelValues("none")
	for t := range events.NumTiers {
		m.byTier[t] = m.matchedTokens.WithLabelValues(events.Tier(t).String())
	}
	m.speculative = m.matchedTokens.WithLabelValues("speculative")
	m.byModel = memo.New(maxModelSeries, m.makeSeries)
	m.byPriority = memo.New(maxModelSeries, func(l [3]string) prometheus.Counter { return m.requests.WithLabelValues(l[:]...) })
	return m
}

func (m *Metrics) observePick(p *Pick) {
	p.series = m.series(p.labels)
	prio := 0
	if p.Request != nil {
		prio = p.Request.Priority
	}
	m.byPriority.Get([3]string{p.labels[0], p.labels[1], strconv.Itoa(prio)}).Inc()
	picked := p.Result.Targets()
	if len(picked) == 0 {
		return
	}
	info, ok := datalayer.PrefixCacheInfoOf(picked[0])
	if !ok {
		m.pickNone.Inc()
		return
	}
	if info.Exact {
		m.pickExact.Inc()
	} else {
		m.pickApprox.Inc()
	}
	if info.State < datalayer.NumStreamStates {
		m.byState[info.State].Inc()
	} else {
		m.pickStates.WithLabelValues(info.State.String()).Inc()
	}
	m.hitRatio.Observe(info.Ratio())
	for t := range events.NumTiers {
		if n := info.BlocksByTier[t]; n > 0 {
			m.byTier[t].Add(float64(n * info.BlockSizeTokens))
		}
	}
	if info.SpeculativeBlocks > 0 {
		m.speculative.Add(float64(info.SpeculativeBlocks * info.BlockSizeTokens))
	}
}

func (m *Metrics) observeResponse(p *Pick, s Served) {
	model := p.labels[:]
	if s.Status >= 400 {
		m.errors.WithLabelValues(model[0], model[1], fmt.Sprint(s.Status)).Inc()
	}
	series := p.series
	if series == nil {
		series = m.series(p.labels)
	}
	end := s.End
	if end.IsZero() {
		end = time.Now()
	}
	series.duration.Observe(end.Sub(p.Start).Seconds())
	if !s.FirstByte.IsZero() && s.Status < 400 {
		series.ttft.Observe(s.FirstByte.Sub(p.Start).Seconds())
	}
	if s.Streamed && !s.FirstByte.IsZero() && s.Usage.CompletionTokens > 1 && !end.Before(s.FirstByte) {
		series.tpot.Observe(end.Sub(s.FirstByte).Seconds() / float64(s.Usage.CompletionTokens-1))
	}
	if s.Usage.PromptTokens > 0 {
		series.inputTokens.Observe(float64(s.Usage.PromptTokens))
		series.cachedTokens.Observe(float64(s.Usage.CachedTokens))
	}
	if s.Usage.CompletionTokens > 0 {
		series.outputTokens.Observe(float64(s.Usage.CompletionTokens))
	}
}
