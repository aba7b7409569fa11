package selfcheck

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the kvroute_selfcheck_* series.
type metrics struct {
	// responses_total{endpoint,result}: responses by how the engine's
	// cached tokens compared with the index's prediction.
	responses *prometheus.CounterVec
	// predicted_tokens_total{endpoint} and cached_tokens_total{endpoint}:
	// over checked responses, what the index predicted the endpoint would
	// hit and what its engine reported; their ratio is the endpoint's
	// agreement.
	predicted, cached *prometheus.CounterVec
	// distrusts_total: endpoints marked uncertain and resynchronised for
	// sustained disagreement.
	distrusts prometheus.Counter
	// alarm{kind}: 1 while a fleet-wide alarm is raised.
	alarm *prometheus.GaugeVec
	// impossible_total{endpoint,reason}: responses whose usage cannot be.
	impossible *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_selfcheck_responses_total",
			Help: "Responses by how the engine's reported cached prompt tokens compared with the prefix index's prediction for it at pick time (agree, over, under, unchecked).",
		}, []string{"endpoint", "result"}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_selfcheck_predicted_tokens_total",
			Help: "Prompt tokens the prefix index predicted the endpoint would find cached, over checked responses.",
		}, []string{"endpoint"}),
		cached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_selfcheck_cached_tokens_total",
			Help: "Prompt tokens the endpoint's engine reported cached (usage.prompt_tokens_details.cached_tokens), over checked responses.",
		}, []string{"endpoint"}),
		distrusts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_selfcheck_distrusts_total",
			Help: "Endpoints marked uncertain and resynchronised because their engine's reports disagreed with the index sustainedly.",
		}),
		alarm: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_selfcheck_alarm",
			Help: "1 while a self-check alarm is raised: overclaim (engines find far fewer cached tokens than predicted), blind (far more than predicted, on exact streams), or liar (an engine answered with usage that cannot be, lately).",
		}, []string{"kind"}),
		impossible: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_selfcheck_impossible_total",
			Help: "Responses whose usage cannot be (cached-above-prompt, no-output), by endpoint; each ejects its endpoint from picking.",
		}, []string{"endpoint", "reason"}),
	}
	m.alarm.WithLabelValues(AlarmOverclaim)
	m.alarm.WithLabelValues(AlarmBlind)
	m.alarm.WithLabelValues(AlarmLiar)
	if reg != nil {
		for _, c := range []prometheus.Collector{m.responses, m.predicted, m.cached, m.distrusts, m.alarm, m.impossible} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register self-check metrics: %w", err)
			}
		}
	}
	return m, nil
}
