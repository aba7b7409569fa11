package predict

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Predictor. The zero value is usable: p90, the EWLS
// method, the default prior.
type Options struct {
	// Quantile is the quantile predicted besides the mean, in (0,1)
	// (default 0.9).
	Quantile float64
	// Method is the learning method (MethodEWLS by default).
	Method string
	// Prior is the cold start (DefaultPrior when zero).
	Prior *Prior
	// Memory is how many recent observations of an endpoint weigh most:
	// older ones fade with weight exp(-age/Memory), so a model follows an
	// endpoint that slowed down or sped up (default 200).
	Memory int
	// ClassMinObservations is how many observations a class (model and
	// hardware) needs before a new endpoint of it starts from what the
	// class has learned rather than from the prior (default 100).
	ClassMinObservations int
	// OwnMinObservations is how many observations an endpoint's own model
	// needs before its predictions are its own; until then the endpoint
	// is predicted by its class's model, which learns from every endpoint
	// of the class (default 8). One or two observations of an endpoint
	// say little about it, and an endpoint predicted from them against
	// others still at the prior would be judged by how it was observed
	// rather than by its cache and queue.
	OwnMinObservations int
	// Synchronous learns inside Observe rather than on Run's goroutine:
	// for runs in virtual time, which must repeat exactly.
	Synchronous bool
	// Queue bounds the observations waiting to be learned; beyond it they
	// are dropped and counted (default 4096).
	Queue int
	// Record, when set, is given every observation learned, in order (to
	// record traces for offline evaluation).
	Record func(Sample)
	// Registerer takes the predictor's metrics; nil means none.
	Registerer prometheus.Registerer
}

// Sample is one observation: what was known at pick time and what the
// response then took, in milliseconds.
type Sample struct {
	Endpoint string  `json:"endpoint"`
	Class    string  `json:"class,omitempty"`
	Input    Input   `json:"input"`
	TTFTMs   float64 `json:"ttftMs,omitempty"`
	TPOTMs   float64 `json:"tpotMs,omitempty"`
	HasTTFT  bool    `json:"hasTtft,omitempty"`
	HasTPOT  bool    `json:"hasTpot,omitempty"`
	// OutputTokens is how many tokens the response generated.
	OutputTokens int `json:"outputTokens,omitempty"`
	// Start is when the request reached the EPP, which predicted it then;
	// End is when its response ended and was learned from. An evaluation
	// replays a trace in that order, so that each prediction learns only
	// from the responses that had ended before it (EvaluatePairs).
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
}

// Prediction is one request's predicted latency on one endpoint, in
// milliseconds: the mean and the quantile of each.
type Prediction struct {
	TTFT, TTFTQuantile float64
	TPOT, TPOTQuantile float64
	// TTFTAlone is the mean TTFT with nothing ahead of the request: the
	// engine time its own prefill takes there, which every request queued
	// after it on that endpoint will wait for.
	TTFTAlone float64
}

// Predictor predicts per endpoint and learns from observations. Predict is
// safe for concurrent use and allocation-free; learning is serialised.
type Predictor struct {
	o       Options
	p       params
	priorTT Vector
	priorTP Vector
	prior   *snapshot

	models atomic.Pointer[map[string]*model]
	obs    chan Sample

	// trainMu guards the learners (every model's, every class's) and
	// membership changes.
	trainMu sync.Mutex
	classes map[string]*classModel

	m *metrics
}

// model is one endpoint's: its learners, owned by whoever holds trainMu,
// and the snapshot predictions read (nil until the model has learned
// OwnMinObservations: its class's is read instead).
type model struct {
	class      string
	cls        *classModel
	ttft, tpot learner
	// seats is the most requests the endpoint has been seen running: its
	// batch limit, as far as the observations show it.
	seats int
	// tpotErr is the recent mean absolute relative error, over this
	// endpoint's observations, of its own TPOT model ([0]) and of its
	// class's ([1]); tpotScored counts the observations scored.
	tpotErr    [2]float64
	tpotScored int
	snap       atomic.Pointer[snapshot]
}

// classModel learns from every endpoint of a class (model and hardware).
type classModel struct {
	ttft, tpot learner
	seats      int
	snap       atomic.Pointer[snapshot]
}

type snapshot struct {
	ttft, tpot *coefs
	seats      int
	// tpotFromClass says the endpoint's TPOT is predicted by its class's
	// model, which has lately predicted its observations better than its
	// own (see scoreTPOT).
	tpotFromClass bool
}

// New returns a predictor that starts from the prior everywhere.
func New(o Options) (*Predictor, error) {
	if o.Quantile == 0 {
		o.Quantile = 0.9
	}
	if !(o.Quantile > 0 && o.Quantile < 1) {
		return nil, fmt.Errorf("predict: quantile %v, want a value in (0,1)", o.Quantile)
	}
	if o.Prior == nil {
		p := DefaultPrior()
		o.Prior = &p
	}
	if err := o.Prior.Validate(); err != nil {
		return nil, fmt.Errorf("predict: %w", err)
	}
	if o.Memory <= 0 {
		o.Memory = 200
	}
	if o.ClassMinObservations <= 0 {
		o.ClassMinObservations = 100
	}
	if o.OwnMinObservations <= 0 {
		o.OwnMinObservations = 8
	}
	if o.Queue <= 0 {
		o.Queue = 4096
	}
	if o.Method == "" {
		o.Method = MethodEWLS
	}
	p := &Predictor{
		o:       o,
		p:       params{tau: o.Quantile, lambda: math.Exp(-1 / float64(o.Memory)), ridge: 1, window: 64, relative: true},
		priorTT: o.Prior.ttft(), priorTP: o.Prior.tpot(),
		obs:     make(chan Sample, o.Queue),
		classes: map[string]*classModel{},
	}
	tt, tp, err := p.newLearners()
	if err != nil {
		return nil, fmt.Errorf("predict: %w", err)
	}
	p.prior = &snapshot{ttft: tt.coefs(), tpot: tp.coefs()}
	p.models.Store(&map[string]*model{})
	if p.m, err = newMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("predict: %w", err)
	}
	return p, nil
}

// newLearners makes the two targets' learners, both fitted for relative
// error (params.relative): the error that matters, and the one accuracy
// is judged by, is a share of the latency.
func (p *Predictor) newLearners() (ttft, tpot learner, err error) {
	if ttft, err = newLearner(p.o.Method, p.priorTT, ttftMonotone, p.p); err != nil {
		return nil, nil, err
	}
	tpot, err = newLearner(p.o.Method, p.priorTP, tpotMonotone, p.p)
	return ttft, tpot, err
}

// Quantile is the quantile predicted besides the mean.
func (p *Predictor) Quantile() float64 { return p.o.Quantile }

// Method is the learning method in use.
func (p *Predictor) Method() string { return p.o.Method }

// Predict is the latency predicted for in on the endpoint at addr. An
// endpoint the predictor does not know is predicted by the prior.
func (p *Predictor) Predict(addr string, in *Input) Prediction {
	s := p.prior
	tpot := (*coefs)(nil)
	if m := (*p.models.Load())[addr]; m != nil {
		if s = m.snap.Load(); s == nil {
			s = m.cls.snap.Load()
		} else if s.tpotFromClass {
			tpot = m.cls.snap.Load().tpot
		}
	}
	if tpot == nil {
		tpot = s.tpot
	}
	r := in.Regime(s.seats)
	var x Vector
	var out Prediction
	in.TTFTFeatures(&x, s.seats)
	in.cachedAfterWait(&x)
	out.TTFT, out.TTFTQuantile = s.ttft.predict(&x, r, p.o.Quantile, ttftFeatures)
	alone(&x)
	out.TTFTAlone = s.ttft.predictMean(&x, RegimeIdle, p.o.Quantile, aloneFeatures)
	out.TTFTAlone = min(out.TTFTAlone, out.TTFT)
	in.TPOTFeatures(&x, s.seats)
	out.TPOT, out.TPOTQuantile = tpot.predict(&x, r, p.o.Quantile, tpotFeatures)
	return out
}

// AddEndpoint gives the endpoint at addr a model of its own, starting from
// what its class (model and hardware; "" for none) has learned when the
// class has seen enough, else from the prior. An endpoint already known
// keeps its model.
func (p *Predictor) AddEndpoint(addr, class string) {
	p.trainMu.Lock()
	defer p.trainMu.Unlock()
	cur := *p.models.Load()
	if _, ok := cur[addr]; ok {
		return
	}
	c := p.class(class)
	m := &model{class: class, cls: c}
	if total(c.ttft) >= p.o.ClassMinObservations {
		m.ttft, m.tpot = c.ttft.clone(), c.tpot.clone()
		m.seats = c.seats
	} else {
		m.ttft, m.tpot, _ = p.newLearners() // the method was checked in New
	}
	p.publish(m)
	next := maps.Clone(cur)
	next[addr] = m
	p.models.Store(&next)
	p.m.endpoints.Set(float64(len(next)))
}

// RemoveEndpoint forgets the endpoint at addr; its late observations are
// dropped.
func (p *Predictor) RemoveEndpoint(addr string) {
	p.trainMu.Lock()
	defer p.trainMu.Unlock()
	cur := *p.models.Load()
	if _, ok := cur[addr]; !ok {
		return
	}
	next := maps.Clone(cur)
	delete(next, addr)
	p.models.Store(&next)
	p.m.endpoints.Set(float64(len(next)))
}

// Observe hands the predictor one observation to learn from. It never
// blocks: with Synchronous it learns at once, otherwise Run's goroutine
// learns it, and an observation that finds the queue full is dropped.
func (p *Predictor) Observe(s Sample) {
	if p.o.Synchronous {
		p.learn(s)
		return
	}
	select {
	case p.obs <- s:
	default:
		p.m.dropped.Inc()
	}
}

// Run learns the observations Observe queues until ctx is done.
func (p *Predictor) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-p.obs:
			p.learn(s)
		}
	}
}

// ErrUnknownEndpoint is an observation of an endpoint the predictor has no
// model for (never added, or removed since).
var ErrUnknownEndpoint = errors.New("predict: unknown endpoint")

func (p *Predictor) learn(s Sample) {
	start := time.Now()
	p.trainMu.Lock()
	defer p.trainMu.Unlock()
	m := (*p.models.Load())[s.Endpoint]
	if m == nil {
		p.m.learned.WithLabelValues("unknown_endpoint").Inc()
		return
	}
	if !(s.HasTTFT && s.TTFTMs >= 0 && !math.IsInf(s.TTFTMs, 0)) && !(s.HasTPOT && s.TPOTMs >= 0 && !math.IsInf(s.TPOTMs, 0)) {
		p.m.learned.WithLabelValues("invalid").Inc()
		return
	}
	c := m.cls
	if !s.Input.MetricsStale {
		m.seats = max(m.seats, s.Input.Running)
		c.seats = max(c.seats, m.seats)
	}
	r := s.Input.Regime(m.seats)
	var x Vector
	if s.HasTTFT {
		s.Input.TTFTFeatures(&x, m.seats)
		m.ttft.observe(&x, r, s.TTFTMs)
		c.ttft.observe(&x, r, s.TTFTMs)
	}
	if s.HasTPOT {
		s.Input.TPOTFeatures(&x, m.seats)
		m.scoreTPOT(&x, r, p.o.Quantile, s.TPOTMs)
		m.tpot.observe(&x, r, s.TPOTMs)
		c.tpot.observe(&x, r, s.TPOTMs)
	}
	c.snap.Store(&snapshot{ttft: c.ttft.coefs(), tpot: c.tpot.coefs(), seats: c.seats})
	p.publish(m)
	if p.o.Record != nil {
		s.Class = m.class
		p.o.Record(s)
	}
	p.m.learned.WithLabelValues("learned").Inc()
	p.m.learnTime.Observe(time.Since(start).Seconds())
}

// class is the class model called name, made from the prior if new; the
// caller holds trainMu.
func (p *Predictor) class(name string) *classModel {
	c := p.classes[name]
	if c == nil {
		c = &classModel{}
		c.ttft, c.tpot, _ = p.newLearners() // the method was checked in New
		c.snap.Store(&snapshot{ttft: c.ttft.coefs(), tpot: c.tpot.coefs()})
		p.classes[name] = c
	}
	return c
}

// publish makes m's own model what its predictions read, once it has
// learned enough to stand on its own; the caller holds trainMu.
func (p *Predictor) publish(m *model) {
	if total(m.ttft) >= p.o.OwnMinObservations {
		m.snap.Store(&snapshot{ttft: m.ttft.coefs(), tpot: m.tpot.coefs(), seats: m.seats,
			tpotFromClass: m.tpotScored >= selectMinScored && m.tpotErr[1] < m.tpotErr[0]})
	}
}

// scoreTPOT scores the endpoint's own TPOT model and its class's on one
// observation (features x in regime r, TPOT y), before either learns it.
// TPOT is set by what arrives while a request decodes, so one endpoint's
// observations are noisy and few; where the endpoints of a class are
// alike, the class's model, which learns from all of them, predicts each
// better than its own, and where one differs (a slower engine, one
// drifting) its own does. Each TPOT is predicted by whichever has lately
// erred less on the endpoint's observations (publish).
func (m *model) scoreTPOT(x *Vector, r int, tau, y float64) {
	y = math.Max(y, floorMs)
	var e [2]float64
	for i, c := range [2]*coefs{m.tpot.coefs(), m.cls.tpot.coefs()} {
		e[i] = math.Abs(c.predictMean(x, r, tau, tpotFeatures)-y) / y
	}
	if m.tpotScored == 0 {
		m.tpotErr = e
	}
	for i := range e {
		m.tpotErr[i] += (e[i] - m.tpotErr[i]) / selectMemory
	}
	m.tpotScored++
}

// selectMemory is the observations the errors scoreTPOT keeps fade over;
// selectMinScored the observations scored before the class's model may be
// chosen.
const (
	selectMemory    = 64
	selectMinScored = 16
)

func total(l learner) int {
	n := 0
	for r := range NumRegimes {
		n += l.count(r)
	}
	return n
}

// Observations is how many observations each endpoint's model has learned.
func (p *Predictor) Observations(addr string) int {
	p.trainMu.Lock()
	defer p.trainMu.Unlock()
	m := (*p.models.Load())[addr]
	if m == nil {
		return 0
	}
	return total(m.ttft)
}

type metrics struct {
	learned   *prometheus.CounterVec
	dropped   prometheus.Counter
	endpoints prometheus.Gauge
	learnTime prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		learned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_predictor_observations_total",
			Help: "Response observations the latency predictor processed, by outcome (learned, unknown_endpoint, invalid).",
		}, []string{"result"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_predictor_observations_dropped_total",
			Help: "Response observations dropped because the predictor's learning queue was full.",
		}),
		endpoints: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_predictor_endpoints",
			Help: "Endpoints with a latency model of their own.",
		}),
		learnTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_predictor_learn_duration_seconds",
			Help:    "Time to learn one observation, off the request path.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10),
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.learned, m.dropped, m.endpoints, m.learnTime} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register predictor metrics: %w", err)
			}
		}
	}
	return m, nil
}
