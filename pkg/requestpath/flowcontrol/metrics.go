package flowcontrol

import (
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxFlowLabels is how many flows have a fairness_id label value
// of their own when Config leaves MaxFlowLabels zero.
const DefaultMaxFlowLabels = 16

// labelOther is the fairness_id of every flow past the cap.
const labelOther = "other"

// Metrics are the flow controller's, by upstream's names where upstream
// has them (without its pool and model labels: an EPP serves one pool).
type Metrics struct {
	size     *prometheus.GaugeVec
	bytes    *prometheus.GaugeVec
	duration *prometheus.HistogramVec

	maxFlows int
	mu       sync.Mutex
	flows    map[string]string
}

// NewMetrics makes the metrics, registered with reg unless it is nil;
// maxFlows caps the fairness_id label's values (zero: DefaultMaxFlowLabels).
func NewMetrics(reg prometheus.Registerer, maxFlows int) *Metrics {
	if maxFlows <= 0 {
		maxFlows = DefaultMaxFlowLabels
	}
	labels := []string{"fairness_id", "priority"}
	m := &Metrics{
		size: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_extension_flow_control_queue_size",
			Help: "Requests waiting in flow control, by flow (capped; the rest are \"other\") and priority.",
		}, labels),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_extension_flow_control_queue_bytes",
			Help: "Bytes of the requests waiting in flow control, by flow and priority.",
		}, labels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_extension_flow_control_request_queue_duration_seconds",
			Help:    "Time from a request's arrival in flow control to its outcome (Dispatched, RejectedCapacity, RejectedSLO, EvictedTTL, EvictedDisplaced, EvictedContextCancelled, EvictedOther).",
			Buckets: []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, append(labels, "outcome")),
		maxFlows: maxFlows,
		flows:    map[string]string{},
	}
	if reg != nil {
		reg.MustRegister(m.size, m.bytes, m.duration)
	}
	return m
}

// flowLabel is id as a label value: the first maxFlows ids seen keep
// theirs, later ones are "other", so a client inventing ids makes no
// series.
func (m *Metrics) flowLabel(id string) string {
	if !utf8.ValidString(id) {
		// A label value must be UTF-8; a header need not be.
		return labelOther
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.flows[id]; ok {
		return l
	}
	if len(m.flows) >= m.maxFlows {
		return labelOther
	}
	m.flows[id] = id
	return id
}

func (m *Metrics) queued(flow, priority string, n int, bytes int64) {
	m.size.WithLabelValues(flow, priority).Add(float64(n))
	m.bytes.WithLabelValues(flow, priority).Add(float64(bytes))
}

func (m *Metrics) observe(flowID string, priority int, err error, waited time.Duration) {
	m.duration.WithLabelValues(m.flowLabel(flowID), priorityLabel(priority), OutcomeOf(err)).Observe(waited.Seconds())
}

func priorityLabel(p int) string { return strconv.Itoa(p) }
