package datalayer

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// OutlierDetection is passive health checking, as Envoy's outlier
// detection does it for ordinary load balancing: the request path reports
// each response's Outcome (ReportOutcome), and an endpoint whose responses
// keep failing is ejected, that is, left out of every request's candidates
// (CandidatesInto) as a pod that is not ready is. A fast failure looks to
// the scorers and the latency predictor like a fast, idle endpoint, and
// would otherwise draw most of the traffic.
//
// Zero fields mean the defaults (DefaultOutlierDetection).
type OutlierDetection struct {
	// Disabled turns outlier detection off: every outcome is ignored.
	Disabled bool
	// Consecutive5xx is how many failures in a row (5xx answers,
	// connection failures and resets, implausible answers) eject an
	// endpoint (Envoy's consecutive_5xx; default 5).
	Consecutive5xx int
	// BaseEjectionTime is the first ejection's length; each further one is
	// BaseEjectionTime times the endpoint's ejection count, up to
	// MaxEjectionTime (defaults 30s and 300s, as Envoy's).
	BaseEjectionTime, MaxEjectionTime time.Duration
	// MaxEjectionPercent bounds the share of the pool ejected at once
	// (default 50): an ejection beyond it is not enforced, so that a
	// fleet-wide incident does not empty the pool. A pool of two or more
	// may always have one endpoint ejected; a pool of one, none.
	MaxEjectionPercent int
	// Interval is how long an endpoint must stay healthy for its ejection
	// count to fall by one (default 10s, Envoy's interval), so that an
	// endpoint that failed once long ago starts again from the base time.
	Interval time.Duration
	// ProbationShare is the share of requests an endpoint back from an
	// ejection is a candidate for (default 0.1), until ProbationSuccesses
	// (default 5) of its responses in a row succeed; one failure in
	// probation ejects it again at once, for longer.
	ProbationShare     float64
	ProbationSuccesses int
	// PeakPrefillRate is a prefill rate, in uncached prompt tokens a
	// second, that no engine of the pool reaches (default 1,000,000): a
	// first token that comes sooner than the request's uncached tokens at
	// that rate after the request arrived is implausible (the director's
	// test; docs/reliability.md).
	PeakPrefillRate float64
	// Now is the clock (default time.Now); Logger takes one line per
	// ejection, rate-limited (default slog.Default()).
	Now    func() time.Time
	Logger *slog.Logger
}

// DefaultOutlierDetection is what zero fields of OutlierDetection mean.
var DefaultOutlierDetection = OutlierDetection{
	Consecutive5xx:     5,
	BaseEjectionTime:   30 * time.Second,
	MaxEjectionTime:    300 * time.Second,
	MaxEjectionPercent: 50,
	Interval:           10 * time.Second,
	ProbationShare:     0.1,
	ProbationSuccesses: 5,
	PeakPrefillRate:    1e6,
}

func (o OutlierDetection) withDefaults() OutlierDetection {
	d := DefaultOutlierDetection
	if o.Consecutive5xx <= 0 {
		o.Consecutive5xx = d.Consecutive5xx
	}
	if o.BaseEjectionTime <= 0 {
		o.BaseEjectionTime = d.BaseEjectionTime
	}
	if o.MaxEjectionTime <= 0 {
		o.MaxEjectionTime = d.MaxEjectionTime
	}
	o.MaxEjectionTime = max(o.MaxEjectionTime, o.BaseEjectionTime)
	if o.MaxEjectionPercent <= 0 {
		o.MaxEjectionPercent = d.MaxEjectionPercent
	}
	o.MaxEjectionPercent = min(o.MaxEjectionPercent, 100)
	if o.Interval <= 0 {
		o.Interval = d.Interval
	}
	if !(o.ProbationShare > 0) {
		o.ProbationShare = d.ProbationShare
	}
	o.ProbationShare = min(o.ProbationShare, 1)
	if o.ProbationSuccesses <= 0 {
		o.ProbationSuccesses = d.ProbationSuccesses
	}
	if !(o.PeakPrefillRate > 0) {
		o.PeakPrefillRate = d.PeakPrefillRate
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Outcome is how a response went, as outlier detection weighs it.
type Outcome uint8

const (
	// OutcomeNone says nothing of the endpoint: the client left before an
	// answer, or the request was at fault (4xx).
	OutcomeNone Outcome = iota
	// OutcomeSuccess: a plausible answer.
	OutcomeSuccess
	// Outcome5xx: the endpoint answered with a server error.
	Outcome5xx
	// OutcomeConnect: no answer came: the connection was refused, reset
	// or broken.
	OutcomeConnect
	// OutcomeImplausible: an answer too fast for the request's prompt to
	// have been computed.
	OutcomeImplausible
	// OutcomeLiar: an answer whose usage cannot be (more cached tokens
	// than the prompt has, output without tokens). It ejects at once.
	OutcomeLiar
)

// Failure reports whether the outcome counts against the endpoint.
func (o Outcome) Failure() bool { return o >= Outcome5xx }

// String is the outcome's metric label value.
func (o Outcome) String() string {
	switch o {
	case OutcomeSuccess:
		return "success"
	case Outcome5xx:
		return "5xx"
	case OutcomeConnect:
		return "connect"
	case OutcomeImplausible:
		return "implausible"
	case OutcomeLiar:
		return "liar"
	}
	return "none"
}

// failureOutcomes are the outcomes with a failure series per endpoint.
var failureOutcomes = [...]Outcome{Outcome5xx, OutcomeConnect, OutcomeImplausible, OutcomeLiar}

// Health states of an endpoint.
const (
	healthOK uint32 = iota
	healthEjected
	healthProbation
)

// health is one endpoint's outlier state, kept across its replacement at
// the same address as its in-flight accounting is. The request path reads
// state, until and turn without a lock; everything else is under mu.
type health struct {
	state atomic.Uint32
	// until is when an ejection ends, in nanoseconds since the
	// datastore's epoch (Datastore.since).
	until atomic.Int64
	// turn counts the requests that met the endpoint in probation.
	turn atomic.Uint64

	mu          sync.Mutex
	consecutive int
	ejections   int
	probationOK int
	// healthySince is when the endpoint last came back to full health.
	healthySince time.Time
	// gone is set when the endpoint left the pool: an outcome that looked
	// it up before then must not eject it or count against it, or its
	// gauges and series would outlive it.
	gone bool
}

// outlierState is the datastore's outlier detection: its configuration
// and what it counts.
type outlierState struct {
	o         OutlierDetection
	probation uint64 // a probation endpoint is a candidate once in this many requests
	log       *rate.Limiter
}

type outlierMetrics struct {
	ejections *prometheus.CounterVec
	overflow  prometheus.Counter
	states    *outlierStates
	failures  *prometheus.CounterVec
}

// outlierStates is kvroute_outlier_endpoints, counted from the endpoints'
// states when it is collected: an ejection that ran out while no request
// met its endpoint is over, and is not reported as one for as long as the
// pool stays idle.
type outlierStates struct {
	ds   *Datastore
	desc *prometheus.Desc
}

func (c *outlierStates) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *outlierStates) Collect(ch chan<- prometheus.Metric) {
	var ejected, probation int
	if s := c.ds.outlier.Load(); s != nil && c.ds.unhealthy.Load() > 0 {
		now := c.ds.since(s.o.Now())
		for _, e := range c.ds.snap.Load().sorted {
			switch e.health.state.Load() {
			case healthEjected:
				if now < e.health.until.Load() {
					ejected++
				} else {
					probation++ // the next request that meets it finds it so
				}
			case healthProbation:
				probation++
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(ejected), "ejected")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(probation), "probation")
}

func newOutlierMetrics(ds *Datastore) *outlierMetrics {
	m := &outlierMetrics{
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_outlier_ejections_total",
			Help: "Endpoints ejected from picking by outlier detection, by the failure that ejected them (5xx, connect, implausible, liar).",
		}, []string{"reason"}),
		overflow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_outlier_ejections_overflow_total",
			Help: "Ejections outlier detection did not enforce because the pool's maximum ejected share was reached.",
		}),
		states: &outlierStates{ds: ds, desc: prometheus.NewDesc("kvroute_outlier_endpoints",
			"Endpoints of the pool currently ejected, or back on probation (an ejection that has run out counts as probation).",
			[]string{"state"}, nil)},
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_outlier_failures_total",
			Help: "Responses that counted against their endpoint, by endpoint and kind (5xx, connect, implausible, liar); an endpoint's series go when it leaves the pool.",
		}, []string{"endpoint", "reason"}),
	}
	for _, o := range failureOutcomes {
		m.ejections.WithLabelValues(o.String())
	}
	return m
}

func (m *outlierMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.ejections, m.overflow, m.states, m.failures}
}

func (m *outlierMetrics) forget(addr string) {
	for _, o := range failureOutcomes {
		m.failures.DeleteLabelValues(addr, o.String())
	}
}

// SetOutlierDetection configures outlier detection (its zero value turns
// it on with the defaults). Until it is called, outcomes are ignored and
// every endpoint is a candidate.
func (ds *Datastore) SetOutlierDetection(o OutlierDetection) {
	if o.Disabled {
		ds.outlier.Store(nil)
		return
	}
	o = o.withDefaults()
	ds.outlier.Store(&outlierState{
		o:         o,
		probation: uint64(max(1, int(1/o.ProbationShare+0.5))),
		log:       rate.NewLimiter(rate.Every(time.Second), 5),
	})
}

// OutlierDetection returns the outlier detection in force, with its
// defaults filled in; ok is false when it is off.
func (ds *Datastore) OutlierDetection() (o OutlierDetection, ok bool) {
	s := ds.outlier.Load()
	if s == nil {
		return OutlierDetection{}, false
	}
	return s.o, true
}

// ReportOutcome counts one response's outcome against the endpoint at
// addr: a success resets its consecutive failures, and ends its probation
// once enough came in a row; a failure may eject it. Outcomes for an
// address not in the pool are ignored.
func (ds *Datastore) ReportOutcome(addr string, o Outcome) {
	s := ds.outlier.Load()
	if s == nil || o == OutcomeNone {
		return
	}
	e, ok := ds.snap.Load().byAddr[addr]
	if !ok {
		return
	}
	now := s.o.Now()
	h := e.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone {
		return
	}
	if o.Failure() {
		ds.om.failures.WithLabelValues(addr, o.String()).Inc()
	}
	state := h.state.Load()
	if state == healthEjected && ds.since(now) >= h.until.Load() {
		// Its ejection is over though no request has met it since.
		ds.toProbation(h)
		state = healthProbation
	}
	if !o.Failure() {
		h.consecutive = 0
		if state == healthProbation {
			h.probationOK++
			if h.probationOK >= s.o.ProbationSuccesses && h.state.CompareAndSwap(healthProbation, healthOK) {
				h.healthySince = now
				ds.unhealthy.Add(-1)
			}
		}
		return
	}
	h.consecutive++
	switch {
	case state == healthEjected:
		// A response to a request sent before the ejection.
	case o == OutcomeLiar, state == healthProbation, h.consecutive >= s.o.Consecutive5xx:
		ds.eject(s, e, o, now)
	}
}

// eject takes e out of picking, unless the pool's share of ejected
// endpoints is reached. Called with e.health.mu held.
func (ds *Datastore) eject(s *outlierState, e *dsEntry, why Outcome, now time.Time) {
	ds.ejectMu.Lock()
	snap := ds.snap.Load()
	ejected := 0
	for _, x := range snap.sorted {
		if x != e && x.health.state.Load() == healthEjected && ds.since(now) < x.health.until.Load() {
			ejected++
		}
	}
	n := len(snap.sorted)
	allowed := 0
	if n >= 2 {
		allowed = max(n*s.o.MaxEjectionPercent/100, 1)
	}
	if ejected >= allowed {
		ds.ejectMu.Unlock()
		ds.om.overflow.Inc()
		return
	}
	h := e.health
	if h.state.Load() == healthOK && !h.healthySince.IsZero() {
		// Every interval spent healthy since the last probation ended
		// forgives one ejection.
		h.ejections = max(0, h.ejections-int(now.Sub(h.healthySince)/s.o.Interval))
	}
	h.ejections++
	d := min(s.o.BaseEjectionTime*time.Duration(h.ejections), s.o.MaxEjectionTime)
	h.until.Store(ds.since(now.Add(d)))
	prev := h.state.Swap(healthEjected)
	ds.ejectMu.Unlock()

	h.consecutive, h.probationOK = 0, 0
	if prev == healthOK {
		ds.unhealthy.Add(1)
	}
	ds.om.ejections.WithLabelValues(why.String()).Inc()
	if s.log.Allow() {
		s.o.Logger.Warn("endpoint ejected from picking", "endpoint", e.ep.Address, "pod", e.ep.Pod,
			"reason", why.String(), "ejections", h.ejections, "for", d)
	}
}

// toProbation moves an ejected endpoint whose time is up to probation.
func (ds *Datastore) toProbation(h *health) {
	if h.state.CompareAndSwap(healthEjected, healthProbation) {
		h.turn.Store(0)
	}
}

// admit reports whether the endpoint may be a request's candidate at now
// (nanoseconds since the datastore's epoch): healthy, or on probation and this request's turn.
func (ds *Datastore) admit(s *outlierState, h *health, now int64) bool {
	switch h.state.Load() {
	case healthOK:
		return true
	case healthEjected:
		if now < h.until.Load() {
			return false
		}
		ds.toProbation(h)
	}
	// The first request after the ejection is a candidate; then one in
	// every s.probation.
	return (h.turn.Add(1)-1)%s.probation == 0
}

// forgetHealth drops the outlier state of an endpoint that left.
func (ds *Datastore) forgetHealth(e *dsEntry) {
	h := e.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone = true
	if h.state.Swap(healthOK) != healthOK {
		ds.unhealthy.Add(-1)
	}
	ds.om.forget(e.ep.Address)
}

// Ejected reports whether the endpoint at addr is ejected from picking now.
func (ds *Datastore) Ejected(addr string) bool {
	e, ok := ds.snap.Load().byAddr[addr]
	if !ok {
		return false
	}
	s := ds.outlier.Load()
	return s != nil && e.health.state.Load() == healthEjected && ds.since(s.o.Now()) < e.health.until.Load()
}

// since is t as nanoseconds since the datastore's epoch, by the monotonic
// clock when t has its reading (time.Now's does).
func (ds *Datastore) since(t time.Time) int64 { return int64(t.Sub(ds.epoch)) }
