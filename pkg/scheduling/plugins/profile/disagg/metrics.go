package disagg

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer/readmostly"
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

// decisionCounter resolves the series of a handler's decision; the
// handler binds it to the model's labels (modelSeries.count).
func (m *Metrics) decisionCounter(tn plugin.TypedName, model string, d framework.Decision, reason string) prometheus.Counter {
	vec := m.decisions
	if tn.Type == PDType {
		vec = m.pdDecisions
	}
	return vec.WithLabelValues(tn.Name, tn.Type, model, string(d), reason)
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
// as upstream, as "unknown". Each value has its series, to which the
// decision counters are bound once.
type modelLabels struct {
	// seen is read without a lock; a new model is added to a copy, at
	// most maxModelLabels times.
	seen atomic.Pointer[map[string]*modelSeries]
	// last is the series last found in seen: a pool mostly serves one
	// model, whose name is then compared rather than hashed.
	last atomic.Pointer[modelSeries]
	mu   sync.Mutex
	// unknown and other are the series of the two values that stand for
	// many names.
	unknown, other *modelSeries
}

func newModelLabels() *modelLabels {
	l := &modelLabels{unknown: &modelSeries{label: "unknown"}, other: &modelSeries{label: "other"}}
	l.seen.Store(&map[string]*modelSeries{})
	return l
}

func (l *modelLabels) series(model string) *modelSeries {
	if model == "" {
		return l.unknown
	}
	if s := l.last.Load(); s != nil && s.label == model {
		return s
	}
	seen := *l.seen.Load()
	if s, ok := seen[model]; ok {
		l.last.Store(s)
		return s
	}
	if len(seen) >= maxModelLabels {
		return l.other
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	seen = *l.seen.Load()
	if s, ok := seen[model]; ok {
		return s
	}
	if len(seen) >= maxModelLabels {
		return l.other
	}
	s := &modelSeries{label: model}
	next := maps.Clone(seen)
	next[model] = s
	l.seen.Store(&next)
	return s
}

// modelSeries is one model_name value and the decision counters bound to
// it: counting a decision then compares a decision and a reason (constants
// as a rule, equal by pointer) instead of hashing five label values.
type modelSeries struct {
	label string
	bound readmostly.List[boundKey, prometheus.Counter]
}

type boundKey struct {
	decision framework.Decision
	reason   string
}

// count counts a decision of the handler tn under this model label.
func (s *modelSeries) count(m *Metrics, tn plugin.TypedName, d framework.Decision, reason string) {
	if m == nil {
		return
	}
	s.bound.GetOrAdd(boundKey{decision: d, reason: reason}, 0, func() prometheus.Counter {
		return m.decisionCounter(tn, s.label, d, reason)
	}).Inc()
}
