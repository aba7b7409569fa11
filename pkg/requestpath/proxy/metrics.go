package proxy

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests  *prometheus.CounterVec
	active    prometheus.Gauge
	fallbacks prometheus.Counter
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
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.active, m.fallbacks)
	}
	return m
}
