package scheduling

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names follow the upstream EPP's, so existing dashboards work.
const metricsSubsystem = "inference_extension"

// Attempt outcomes, the status label of scheduler_attempts_total.
const (
	statusSuccess      = "success"
	statusNoCandidates = "no_candidates"
	statusShed         = "shed"
	statusError        = "error"
)

type metrics struct {
	e2e      prometheus.Histogram
	attempts *prometheus.CounterVec
	// byStatus are attempts' series, resolved once: every cycle counts
	// one, and a label lookup cost more than the count.
	byStatus map[string]prometheus.Counter
	plugin   *prometheus.HistogramVec
}

// attempt counts a cycle that ended with status.
func (m *metrics) attempt(status string) {
	if c, ok := m.byStatus[status]; ok {
		c.Inc()
		return
	}
	m.attempts.WithLabelValues(status).Inc()
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: metricsSubsystem,
			Name:      "scheduler_e2e_duration_seconds",
			Help:      "Time of one scheduling cycle, admission included.",
			Buckets:   []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2},
		}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: metricsSubsystem,
			Name:      "scheduler_attempts_total",
			Help:      "Scheduling cycles by outcome: success, no_candidates, shed, error.",
		}, []string{"status"}),
		plugin: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: metricsSubsystem,
			Name:      "plugin_duration_seconds",
			Help:      "Time spent in one scheduling plugin call.",
			Buckets:   []float64{1e-7, 5e-7, 1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3},
		}, []string{"extension_point", "plugin_type", "plugin_name"}),
	}
	// Pre-create the outcome series so a dashboard sees zeros, not gaps.
	m.byStatus = map[string]prometheus.Counter{}
	for _, s := range []string{statusSuccess, statusNoCandidates, statusShed, statusError} {
		m.byStatus[s] = m.attempts.WithLabelValues(s)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.e2e, m.attempts, m.plugin} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
