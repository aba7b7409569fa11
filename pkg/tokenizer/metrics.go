package tokenizer

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// modelMetrics are the tokenizers' series, labelled by model so that the
// tokenizers of several models share one set of collectors.
type modelMetrics struct {
	tokens         *prometheus.CounterVec
	rejected       *prometheus.CounterVec
	invalidUTF8    *prometheus.CounterVec
	segmentLookups *prometheus.CounterVec
	segmentBytes   *prometheus.GaugeVec
	segmentEntries *prometheus.GaugeVec
	segmentEvicted *prometheus.CounterVec
}

func metricsFor(reg prometheus.Registerer) *modelMetrics {
	m := &modelMetrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_tokens_total",
			Help: "Token ids produced by local tokenization.",
		}, []string{"model"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_rejected_total",
			Help: "Inputs the local tokenizer refused, by reason (too_large, template).",
		}, []string{"model", "reason"}),
		invalidUTF8: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_invalid_utf8_total",
			Help: "Inputs with invalid UTF-8, tokenized with U+FFFD in place of the bad bytes.",
		}, []string{"model"}),
		segmentLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_segment_cache_lookups_total",
			Help: "Lookups of text segments between special tokens in the segment cache, by result (hit, miss).",
		}, []string{"model", "result"}),
		segmentBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_tokenizer_segment_cache_bytes",
			Help: "Memory held by cached segment ids.",
		}, []string{"model"}),
		segmentEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_tokenizer_segment_cache_entries",
			Help: "Segments in the segment cache.",
		}, []string{"model"}),
		segmentEvicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_segment_cache_evictions_total",
			Help: "Segments evicted from the segment cache to stay within its memory bound.",
		}, []string{"model"}),
	}
	m.tokens = registerOrReuse(reg, m.tokens)
	m.rejected = registerOrReuse(reg, m.rejected)
	m.invalidUTF8 = registerOrReuse(reg, m.invalidUTF8)
	m.segmentLookups = registerOrReuse(reg, m.segmentLookups)
	m.segmentBytes = registerOrReuse(reg, m.segmentBytes)
	m.segmentEntries = registerOrReuse(reg, m.segmentEntries)
	m.segmentEvicted = registerOrReuse(reg, m.segmentEvicted)
	return m
}

// registerOrReuse registers c, or returns the collector of the same name
// registered before (by the tokenizer of another model), so that every
// model's series land in one family.
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
		// A clash with a foreign collector of the same name is a
		// programming error the caller's registry would report anyway;
		// keep counting into an unregistered collector.
	}
	return c
}
