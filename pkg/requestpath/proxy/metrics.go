package proxy

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests  *prometheus.CounterVec
	active    prometheus.Gauge
	fallbacks prometheus.Counter
	refused   *prometheus.CounterVec
	// bytesInFlight is the body budget's charge now.
	bytesInFlight prometheus.Gauge
	// pd counts split requests' legs (pd.go).
	pd pdMetrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_proxy_requests_total",
			Help: "Requests answered by the proxy, by HTTP status (499: the client left before any answer).",
		}, []string{"code"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_proxy_active_requests",
			Help: "Requests in flight through the proxy.",
		}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_proxy_fallbacks_total",
			Help: "Forwarding attempts to a fallback endpoint after a connection to the previous pick failed.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_proxy_refused_total",
			Help: "Requests the proxy refused before routing them, by reason: concurrency (429), body_bytes (503), method (405), content_type (415).",
		}, []string{"reason"}),
		bytesInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_proxy_request_bytes_in_flight",
			Help: "Bytes of the proxy's body budget taken now: request bodies (at ten times their size while routed) and response bodies kept to read their usage.",
		}),
	}
	for _, r := range []string{refusedConcurrency, refusedBodyBytes, refusedMethod, refusedContentType} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.active, m.fallbacks, m.refused, m.bytesInFlight)
	}
	m.pd = newPDMetrics(reg)
	return m
}
