package extproc

import "github.com/prometheus/client_golang/prometheus"

// Results of a stream, the label of kvroute_extproc_streams_total.
const (
	resultRouted    = "routed"    // a pick was sent to Envoy
	resultRefused   = "refused"   // an ImmediateResponse answered the request
	resultCancelled = "cancelled" // Envoy or the client went away first
	resultError     = "error"     // a protocol error ended the stream
)

type metrics struct {
	streams *prometheus.CounterVec
	// byResult are streams' series, resolved once: a stream ends with one
	// of four results, and a label lookup per stream cost more than the
	// count.
	byResult   map[string]prometheus.Counter
	active     prometheus.Gauge
	conns      prometheus.Gauge
	bodyBytes  prometheus.Histogram
	respBytes  prometheus.Counter
	tlsReloads *prometheus.CounterVec
	// bytesInFlight is the budget's charge now; refusals count by reason.
	bytesInFlight prometheus.Gauge
	refusals      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_extproc_streams_total",
			Help: "ext_proc streams ended, by result: routed, refused (immediate response), cancelled, error.",
		}, []string{"result"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_extproc_active_streams",
			Help: "ext_proc streams open now.",
		}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_extproc_connections",
			Help: "ext_proc connections open now.",
		}),
		bodyBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_extproc_request_body_bytes",
			Help:    "Size of request bodies received over ext_proc.",
			Buckets: prometheus.ExponentialBuckets(256, 4, 10), // 256 B .. 64 MiB
		}),
		respBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_extproc_response_body_bytes_total",
			Help: "Response body bytes passed through ext_proc.",
		}),
		tlsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_extproc_tls_reloads_total",
			Help: "Times the ext_proc TLS files (key pair, client CA) changed and were read again, by result (ok, error: the previous ones stay in use).",
		}, []string{"result"}),
		bytesInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_extproc_request_bytes_in_flight",
			Help: "Bytes of the ext_proc body budget taken now: request bodies at their decoded size while routed, and response bodies kept to read their usage.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_extproc_refused_total",
			Help: "Streams and requests ext_proc refused for a limit, by reason: conns (closed once accepted), streams (ResourceExhausted), body_bytes (503), body_size (413), body_timeout (408, DeadlineExceeded).",
		}, []string{"reason"}),
	}
	for _, r := range []string{refusedConns, refusedStreams, refusedBodyBytes, refusedBodySize, refusedBodyTimout} {
		m.refusals.WithLabelValues(r)
	}
	m.byResult = map[string]prometheus.Counter{}
	for _, r := range []string{resultRouted, resultRefused, resultCancelled, resultError} {
		m.byResult[r] = m.streams.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.active, m.conns, m.bodyBytes, m.respBytes, m.tlsReloads, m.bytesInFlight, m.refusals)
	}
	return m
}

// ended counts a stream that ended with result.
func (m *metrics) ended(result string) {
	if c, ok := m.byResult[result]; ok {
		c.Inc()
		return
	}
	m.streams.WithLabelValues(result).Inc()
}

// refused counts a refusal for a limit.
func (m *metrics) refused(reason string) { m.refusals.WithLabelValues(reason).Inc() }
