package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a client's request, as kvroute_gateway_requests_total counts them.
const (
	// OutcomeServed: the upstream's answer reached the client.
	OutcomeServed = "served"
	// OutcomeRefused: the EPP answered with an immediate response.
	OutcomeRefused = "refused"
	// OutcomeUpstreamFailure: no upstream could be reached; Envoy's 503.
	OutcomeUpstreamFailure = "upstream_failure"
	// OutcomeExtProcError: the ext_proc stream failed before the response
	// began (failure_mode_allow false: Envoy's 500).
	OutcomeExtProcError = "extproc_error"
	// OutcomeCut: the response had begun and was cut (the ext_proc stream
	// or the upstream failed mid-body).
	OutcomeCut = "cut"
	// OutcomeBadRequest: the client's request was refused by the gateway
	// itself (its body too large or unreadable).
	OutcomeBadRequest = "bad_request"
	// OutcomeCancelled: the client went away.
	OutcomeCancelled = "cancelled"
)

// Kinds of ext_proc stream error, as kvroute_gateway_extproc_stream_errors_total counts them.
const (
	StreamErrOpen     = "open"
	StreamErrBroken   = "broken"
	StreamErrProtocol = "protocol"
)

type metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec
	streamErrors *prometheus.CounterVec
	upstream     *prometheus.CounterVec
	streams      *prometheus.CounterVec
	active       *prometheus.GaugeVec
	healthy      *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_gateway_requests_total", Help: "Client requests by outcome.",
		}, []string{"outcome"}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_gateway_extproc_stream_errors_total",
			Help: "ext_proc streams that failed, by host and kind (open: never opened; broken: the stream ended in error; protocol: an answer Envoy would reject).",
		}, []string{"host", "kind"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_gateway_upstream_failures_total", Help: "Upstream endpoints that could not be reached, by kind.",
		}, []string{"kind"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_gateway_extproc_streams_total", Help: "ext_proc streams opened, by host.",
		}, []string{"host"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_gateway_extproc_streams_active", Help: "ext_proc streams open now, by host.",
		}, []string{"host"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_gateway_extproc_host_healthy", Help: "1 while the ext_proc host passes its health checks.",
		}, []string{"host"}),
	}
	m.reg.MustRegister(m.requests, m.streamErrors, m.upstream, m.streams, m.active, m.healthy)
	return m
}

func (m *metrics) hostHealthy(name string, ok bool) {
	v := 0.0
	if ok {
		v = 1
	}
	m.healthy.WithLabelValues(name).Set(v)
}

func (m *metrics) forgetHost(name string) {
	m.healthy.DeleteLabelValues(name)
	m.active.DeleteLabelValues(name)
}
