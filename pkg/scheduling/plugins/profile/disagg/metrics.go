package disagg

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Metrics count a handler's decisions and fallbacks. A nil *Metrics counts
// nothing.
type Metrics struct {
	decisions *prometheus.CounterVec
	// pdDecisions are pd-profile-handler's, under upstream's older name.
	pdDecisions *prometheus.CounterVec
	fallbacks   *prometheus.CounterVec
	// counters caches the decision counters by their labels: resolving
	// labels costs more than the rest of counting a decision.
	counters sync.Map // decisionKey → prometheus.Counter
}

type decisionKey struct {
	name, typ, model, reason string
	decision                 framework.Decision
}

// DecisionMetric is upstream's name of the decision counter; its labels are
// upstream's (plugin_name, plugin_type, model_name, decision_type) and
// kvroute's reason.
const DecisionMetric = "llm_d_epp_disagg_decision_total"

// PDDecisionMetric is the name upstream's pd-profile-handler counts its
// decisions under, with the same labels.
const PDDecisionMetric = "llm_d_epp_pd_decision_total"

// FallbackMetric counts the splits whose stage found no pod, by the
// fallback taken.
const FallbackMetric = "kvroute_disagg_fallbacks_total"

// NewMetrics makes the counters and registers them with reg (none when reg
// is nil). Handlers of one process share them: a counter reg already has
// is used, not registered again, so reloading a configuration keeps
// counting in the same series.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: DecisionMetric,
			Help: "Disaggregation decisions: decision_type is which stages ran on pods of their own (decode-only, prefill-decode, encode-decode, encode-prefill-decode); reason says why.",
		}, []string{"plugin_name", "plugin_type", "model_name", "decision_type", "reason"}),
		pdDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: PDDecisionMetric,
			Help: "pd-profile-handler's disaggregation decisions: decision_type is decode-only or prefill-decode; reason says why.",
		}, []string{"plugin_name", "plugin_type", "model_name", "decision_type", "reason"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: FallbackMetric,
			Help: "Requests a decider split whose prefill or encode stage found no ready pod, by stage and the fallback taken (decode-only, or refuse with 503).",
		}, []string{"plugin_name", "model_name", "stage", "fallback"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.decisions, err = register(reg, m.decisions); err != nil {
		return nil, err
	}
	if m.pdDecisions, err = register(reg, m.pdDecisions); err != nil {
		return nil, err
	}
	if m.fallbacks, err = register(reg, m.fallbacks); err != nil {
		return nil, err
	}
	return m, nil
}

func register(reg prometheus.Registerer, c *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, fmt.Errorf("register disaggregation metrics: %w", err)
	}
	return c, nil
}

func (m *Metrics) decision(tn plugin.TypedName, model string, d framework.Decision, reason string) {
	if m == nil {
		return
	}
	k := decisionKey{name: tn.Name, typ: tn.Type, model: model, reason: reason, decision: d}
	if c, ok := m.counters.Load(k); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	vec := m.decisions
	if tn.Type == PDType {
		vec = m.pdDecisions
	}
	c := vec.WithLabelValues(tn.Name, tn.Type, model, string(d), reason)
	m.counters.Store(k, c)
	c.Inc()
}

func (m *Metrics) fallback(tn plugin.TypedName, model, stage string, fb Fallback) {
	if m == nil {
		return
	}
	m.fallbacks.WithLabelValues(tn.Name, model, stage, string(fb)).Inc()
}

func registererOf(h framework.Handle) prometheus.Registerer {
	if h == nil {
		return nil
	}
	return h.Registerer()
}

// maxModelLabels bounds the model_name values a handler emits: the model
// is the client's text, and each value is a series for good.
const maxModelLabels = 64

// modelLabels turns model names into label values: the first
// maxModelLabels names as themselves, the rest as "other"; an empty name,
// as upstream, as "unknown".
type modelLabels struct {
	mu   sync.RWMutex
	seen map[string]bool
}

func newModelLabels() *modelLabels { return &modelLabels{seen: map[string]bool{}} }

func (l *modelLabels) label(model string) string {
	if model == "" {
		return "unknown"
	}
	l.mu.RLock()
	ok := l.seen[model]
	n := len(l.seen)
	l.mu.RUnlock()
	if ok {
		return model
	}
	if n >= maxModelLabels {
		return "other"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.seen) >= maxModelLabels {
		return "other"
	}
	l.seen[model] = true
	return model
}
