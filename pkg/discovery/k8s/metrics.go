package k8s

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	synced     prometheus.Gauge
	leader     prometheus.Gauge
	reconciles *prometheus.CounterVec
	changes    *prometheus.CounterVec
	poolInfo   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		synced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_k8s_synced",
			Help: "1 once discovery has read the pool and its pods from the API server.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_k8s_leader",
			Help: "1 while this replica holds the leader lease (always 0 without leader election).",
		}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_k8s_reconciles_total",
			Help: "Reconciles by object kind (pool, pod, node, objective) and result (ok, error).",
		}, []string{"kind", "result"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_k8s_endpoint_changes_total",
			Help: "Endpoints discovery upserted into or removed from the datastore.",
		}, []string{"change"}),
		poolInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_k8s_pool_info",
			Help: "The pool as discovery reads it; the value is the number of target ports.",
		}, []string{"pool", "selector", "app_protocol", "endpoint_picker", "failure_mode"}),
	}
	for _, kind := range []string{"pool", "pod"} {
		for _, result := range []string{"ok", "error"} {
			m.reconciles.WithLabelValues(kind, result)
		}
	}
	if reg != nil {
		reg.MustRegister(m.synced, m.leader, m.reconciles, m.changes, m.poolInfo)
	}
	return m
}

func (m *metrics) setPoolInfo(p *PoolInfo) {
	m.poolInfo.Reset()
	if p == nil {
		return
	}
	m.poolInfo.WithLabelValues(p.Name, p.Selector.String(), p.AppProtocol, p.EndpointPicker, p.FailureMode).
		Set(float64(len(p.TargetPorts)))
}

func (m *metrics) reconciled(kind string, err error) {
	if err != nil {
		m.reconciles.WithLabelValues(kind, "error").Inc()
		return
	}
	m.reconciles.WithLabelValues(kind, "ok").Inc()
}
