package share

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	messages, bytes *prometheus.CounterVec
	// The per-message counters, bound to their labels once.
	published, publishedBytes, received, receivedBytes prometheus.Counter
	dropped                                            *prometheus.CounterVec
	remote                                             prometheus.Gauge
	faded, gaps                                        prometheus.Counter
	rejected                                           prometheus.Counter
	publishErrors                                      prometheus.Counter
	state                                              *prometheus.GaugeVec
	s                                                  *Sharer
}

func newMetrics(s *Sharer) *metrics {
	const ns, sub = "kvroute", "dispatch_share"
	m := &metrics{
		s: s,
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "messages_total",
			Help: "Dispatch-share messages published and received (direction)."}, []string{"direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bytes_total",
			Help: "Dispatch-share payload bytes published and received (direction)."}, []string{"direction"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dropped_total",
			Help: "Dispatch steps not shared or not applied, by reason: cap (the peers' entries are at their cap), unknown-endpoint, peers (too many peers), queue-full (this replica's steps waiting to be sent)."}, []string{"reason"}),
		remote: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "remote_inflight",
			Help: "Peer replicas' dispatches counted in this replica's in-flight accounting."}),
		faded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "faded_total",
			Help: "Peer dispatches dropped at their expected end plus the fade margin, no message having ended them."}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "missed_messages_total",
			Help: "Peer messages missed, from gaps in their sequence."}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rejected_total",
			Help: "Dispatch-share messages that did not decode."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "publish_errors_total",
			Help: "Dispatch-share messages the NATS client refused to publish."}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "state",
			Help: "1 for the replica's dispatch-sharing state: off, local-only (no NATS: its own view), catching-up, sharing."}, []string{"state"}),
	}
	m.published, m.publishedBytes = m.messages.WithLabelValues("published"), m.bytes.WithLabelValues("published")
	m.received, m.receivedBytes = m.messages.WithLabelValues("received"), m.bytes.WithLabelValues("received")
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	return errors.Join(reg.Register(m.messages), reg.Register(m.bytes), reg.Register(m.dropped), reg.Register(m.remote),
		reg.Register(m.faded), reg.Register(m.gaps), reg.Register(m.rejected), reg.Register(m.publishErrors),
		reg.Register(stateCollector{m}))
}

// stateCollector reads the state when scraped.
type stateCollector struct{ m *metrics }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) { c.m.state.Describe(ch) }

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.m.s.State()
	for i, name := range stateNames {
		v := 0.0
		if State(i) == st {
			v = 1
		}
		c.m.state.WithLabelValues(name).Set(v)
	}
	c.m.state.Collect(ch)
}
