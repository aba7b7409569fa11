// Package scheduling is the scheduler: for each request it admits or sheds,
// then runs the profiles its profile handler chooses (filters, weighted
// scorers, a picker, post-pick hooks) over the request's candidates and
// returns the picks. The extension points are in package framework, the
// plugins under plugins/, and configuration in config.
package scheduling

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/single"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

// Sentinel errors of Schedule; the request path maps ErrNoCandidates to 503
// and ErrShed to 429.
var (
	ErrNoCandidates = framework.ErrNoCandidates
	ErrShed         = framework.ErrShed
	// ErrBadPick means a plugin broke its contract: a picker chose an
	// endpoint that was not a candidate. It is a bug, never routed around.
	ErrBadPick = errors.New("picker chose an endpoint outside the candidate set")
)

// Options configure a Scheduler. Only Profiles is required.
type Options struct {
	// Profiles in configuration order; names must be unique.
	Profiles []*framework.Profile
	// Handler chooses which profiles run; nil means single-profile-handler,
	// allowed only with one profile.
	Handler framework.ProfileHandler
	// Detector decides admission of sheddable requests; nil means upstream's
	// thresholds (queue 5, KV 0.8) with the default metrics staleness.
	Detector *saturationdetector.Detector
	// Admitters run after the detector, in order; the first refusal sheds
	// the request.
	Admitters []framework.Admitter
	// Rand seeds every cycle's random source; a fixed seed makes a sequence
	// of cycles reproducible. nil means a seed from crypto/rand.
	Rand *rand.Rand
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Registerer takes the scheduler's metrics; nil means don't register.
	Registerer prometheus.Registerer
	// KeepScores keeps every scored candidate's weighted score in its
	// profile's result (ProfileResult.Scored), at an allocation a profile
	// run: for --emit-endpoint-scores.
	KeepScores bool
}

// Scheduler runs scheduling cycles. It is safe for concurrent use.
type Scheduler struct {
	handler  framework.ProfileHandler
	profiles []*framework.Profile
	// runs are the profiles' runs, in the profiles' order.
	runs     []*profileRun
	detector *saturationdetector.Detector
	admit    []framework.Admitter
	admitT   []prometheus.Observer
	// now is Options.Now, nil for time.Now: a cycle then reads the clock
	// it times itself by.
	now      func() time.Time
	keep     bool
	metrics  *metrics
	handlerT prometheus.Observer

	rngMu sync.Mutex
	rng   *rand.Rand
}

// profileRun is a profile with its plugins' duration observers resolved
// once, so a cycle does no label lookups.
type profileRun struct {
	*framework.Profile
	filterT   []prometheus.Observer
	scorerT   []prometheus.Observer
	pickerT   prometheus.Observer
	postPickT []prometheus.Observer
}

// New makes a scheduler.
func New(opts Options) (*Scheduler, error) {
	if len(opts.Profiles) == 0 {
		return nil, errors.New("scheduler needs at least one profile")
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register scheduler metrics: %w", err)
	}
	s := &Scheduler{
		handler:  opts.Handler,
		profiles: opts.Profiles,
		runs:     make([]*profileRun, 0, len(opts.Profiles)),
		detector: opts.Detector,
		admit:    opts.Admitters,
		now:      opts.Now,
		keep:     opts.KeepScores,
		metrics:  m,
		rng:      opts.Rand,
	}
	if s.handler == nil {
		if len(opts.Profiles) != 1 {
			return nil, fmt.Errorf("%d profiles need a profile handler", len(opts.Profiles))
		}
		s.handler = single.New(single.Type)
	}
	if s.detector == nil {
		s.detector = saturationdetector.NewDetector(saturationdetector.Type, saturationdetector.DefaultThresholds(), framework.DefaultMetricsStaleness)
	}
	if s.rng == nil {
		var b [16]byte
		_, _ = crand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
		s.rng = rand.New(rand.NewPCG(binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])))
	}
	s.handlerT = s.observer("profile_handler", s.handler)
	for _, a := range s.admit {
		if a == nil {
			return nil, errors.New("scheduler admitter is nil")
		}
		s.admitT = append(s.admitT, s.observer("admitter", a))
	}
	seen := make(map[string]bool, len(opts.Profiles))
	for _, p := range opts.Profiles {
		if p == nil || p.Name == "" {
			return nil, errors.New("scheduler profile without a name")
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("duplicate scheduler profile %q", p.Name)
		}
		seen[p.Name] = true
		if p.Picker == nil {
			return nil, fmt.Errorf("scheduler profile %q has no picker", p.Name)
		}
		r := &profileRun{Profile: p, pickerT: s.observer("picker", p.Picker)}
		for _, f := range p.Filters {
			r.filterT = append(r.filterT, s.observer("filter", f))
		}
		for _, w := range p.Scorers {
			if !(w.Weight >= 0) || math.IsInf(w.Weight, 0) {
				return nil, fmt.Errorf("scheduler profile %q: scorer %s has weight %v, want a finite value ≥ 0", p.Name, w.TypedName(), w.Weight)
			}
			r.scorerT = append(r.scorerT, s.observer("scorer", w.Scorer))
		}
		for _, pp := range p.PostPicks {
			r.postPickT = append(r.postPickT, s.observer("post_pick", pp))
		}
		s.runs = append(s.runs, r)
	}
	return s, nil
}

func (s *Scheduler) observer(point string, p plugin.Plugin) prometheus.Observer {
	tn := p.TypedName()
	return s.metrics.plugin.WithLabelValues(point, tn.Type, tn.Name)
}

// Schedule picks endpoints for req among cands. It returns ErrNoCandidates
// when there is nothing to pick from, ErrShed when req is sheddable and every
// candidate is saturated, and the context's error if ctx ends first. Every
// pick is one of cands.
func (s *Scheduler) Schedule(ctx context.Context, req *request.Request, cands []*datalayer.Candidate) (*framework.Result, error) {
	start := time.Now()
	res, status, err := s.schedule(ctx, req, cands, start)
	s.metrics.e2e.Observe(time.Since(start).Seconds())
	s.metrics.attempt(status)
	return res, err
}

func (s *Scheduler) schedule(ctx context.Context, req *request.Request, cands []*datalayer.Candidate, start time.Time) (*framework.Result, string, error) {
	if len(cands) == 0 {
		return nil, statusNoCandidates, fmt.Errorf("schedule request %s: %w", req.ID, ErrNoCandidates)
	}
	if err := ctx.Err(); err != nil {
		return nil, statusError, fmt.Errorf("schedule request %s: %w", req.ID, err)
	}
	now := start
	if s.now != nil {
		now = s.now()
	}
	if req.Sheddable() && s.detector.AllSaturated(cands, now) {
		return nil, statusShed, fmt.Errorf("schedule request %s: %w", req.ID, ErrShed)
	}
	// The cycle's memory: its plugin timings, observed when it ends, and
	// the scores its profiles, which run one after another, share.
	sc := scoresPool.Get().(*scores)
	defer sc.release()
	tm := &sc.timer
	if len(s.admit) > 0 {
		tm.restart()
	}
	for i, a := range s.admit {
		err := a.Admit(ctx, req, cands)
		tm.lap(s.admitT[i])
		if err != nil {
			status := statusError
			if errors.Is(err, ErrShed) {
				status = statusShed
			}
			return nil, status, fmt.Errorf("schedule request %s: %w", req.ID, err)
		}
	}
	s.rngMu.Lock()
	seed1, seed2 := s.rng.Uint64(), s.rng.Uint64()
	s.rngMu.Unlock()
	cs := framework.NewCycleState(now, seed1, seed2)
	cs.SetCandidates(cands)

	results := make(map[string]*framework.ProfileResult, len(s.profiles))
	// A profile runs at most once per cycle, so a handler that keeps asking
	// for the same profile cannot loop forever. The runs are told apart by
	// their place among the profiles: the handler's answer is then checked
	// with a few comparisons, and the profile it names is timed from the
	// handler's end.
	done := sc.runsDone(len(s.runs))
	tm.restart()
	for {
		next := s.handler.Pick(ctx, cs, req, s.profiles, results)
		tm.lap(s.handlerT)
		ran := false
		for _, p := range next {
			i := s.runIndex(p)
			if i < 0 {
				if _, ok := results[p.Name]; ok {
					continue
				}
				return nil, statusError, fmt.Errorf("schedule request %s: profile handler %s chose unknown profile %q", req.ID, s.handler.TypedName(), p.Name)
			}
			if done[i] {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, statusError, fmt.Errorf("schedule request %s: %w", req.ID, err)
			}
			done[i] = true
			if err := s.runProfile(ctx, cs, req, s.runs[i], cands, sc, results); err != nil {
				return nil, statusError, fmt.Errorf("schedule request %s: %w", req.ID, err)
			}
			ran = true
		}
		if !ran {
			break
		}
	}
	res, err := s.handler.ProcessResults(ctx, cs, req, results)
	tm.lap(s.handlerT)
	if err != nil {
		status := statusError
		if errors.Is(err, ErrNoCandidates) {
			status = statusNoCandidates
		}
		return nil, status, fmt.Errorf("schedule request %s: %w", req.ID, err)
	}
	return res, statusSuccess, nil
}

// runIndex is p's place among the scheduler's profiles, -1 when it is
// none of them: a scan of a few pointers, cheaper than a map's hash.
func (s *Scheduler) runIndex(p *framework.Profile) int {
	for i, r := range s.runs {
		if r.Profile == p {
			return i
		}
	}
	return -1
}

// runProfile runs one profile's filters, scorers, picker and post-pick
// hooks, and records its result in results before the post-picks run (the
// handler reads it after them). An empty result means the filters left
// nothing. The first filter is timed from the latest reading: the caller
// has done no more than compare since.
func (s *Scheduler) runProfile(ctx context.Context, cs *framework.CycleState, req *request.Request, p *profileRun, cands []*datalayer.Candidate, sc *scores, results map[string]*framework.ProfileResult) error {
	tm := &sc.timer
	filtered := cands
	for i, f := range p.Filters {
		filtered = f.Filter(ctx, cs, req, filtered)
		tm.lap(p.filterT[i])
		if len(filtered) == 0 {
			results[p.Name] = &framework.ProfileResult{}
			tm.restart()
			return nil
		}
	}

	// Neither pickers nor scorers keep what they are given (their
	// contracts say so), so the scores' memory is the cycle's. buf is all
	// zeros between uses, so a scorer finds it cleared with no work
	// between the last filter's timing and its own.
	n := len(filtered)
	scored := slices.Grow(sc.scored[:0], n)[:n]
	sc.scored = scored
	if len(p.Scorers) == 0 {
		for i, c := range filtered {
			scored[i] = framework.ScoredCandidate{Candidate: c}
		}
		tm.restart()
	}
	if cap(sc.buf) < n {
		sc.buf = make([]float64, n)
	}
	buf := sc.buf[:n]
	for i, w := range p.Scorers {
		sc.dirty = true
		w.Score(ctx, cs, req, filtered, buf)
		tm.lap(p.scorerT[i])
		if i == 0 {
			for j, v := range buf {
				scored[j] = framework.ScoredCandidate{Candidate: filtered[j], Score: clamp01(v) * w.Weight}
			}
		} else {
			for j, v := range buf {
				scored[j].Score += clamp01(v) * w.Weight
			}
		}
		clear(buf)
		sc.dirty = false
		tm.restart()
	}

	res := p.Picker.Pick(ctx, cs, scored)
	tm.lap(p.pickerT)
	if res == nil {
		res = &framework.ProfileResult{}
	}
	if err := checkPicks(res.Picked, cands); err != nil {
		return fmt.Errorf("profile %q, picker %s: %w", p.Name, p.Picker.TypedName(), err)
	}
	if s.keep {
		// A copy: scored is the cycle's memory.
		res.Scored = slices.Clone(scored)
	}
	results[p.Name] = res
	// The handler's next call is timed from here, or from the last
	// post-pick's end.
	tm.restart()
	for i, pp := range p.PostPicks {
		pp.PostPick(ctx, cs, req, res)
		tm.lap(p.postPickT[i])
	}
	return nil
}

// scores is a cycle's memory: its scores, shared by its profiles, and
// its plugin timings.
type scores struct {
	scored []framework.ScoredCandidate
	// buf is a scorer's output, all zeros between uses; dirty while a
	// scorer's output is in it (a scorer that panicked leaves it so).
	buf   []float64
	dirty bool
	timer timer
	// done is which profiles ran (runsDone).
	done []bool
}

var scoresPool = sync.Pool{New: func() any { return new(scores) }}

// runsDone is the cycle's record of which of n profiles ran, all false.
func (sc *scores) runsDone(n int) []bool {
	if cap(sc.done) < n {
		sc.done = make([]bool, n)
	}
	sc.done = sc.done[:n]
	clear(sc.done)
	return sc.done
}

// release observes the cycle's plugin timings and returns sc to the
// pool, holding no candidate, so that the pool keeps no request alive.
func (sc *scores) release() {
	sc.timer.observe()
	clear(sc.scored)
	if sc.dirty {
		clear(sc.buf)
		sc.dirty = false
	}
	scoresPool.Put(sc)
}

// timer times a cycle's plugin calls off one clock reading each: a call
// ends at a reading, and starts at the one before, which is the previous
// call's end where no more than a few comparisons lie between the two
// (consecutive filters or post-picks, the handler's answer and the first
// filter of the profile it names), and otherwise a reading of its own
// (restart). The times are observed when the cycle ends, so that no
// call's time counts the observation of another's.
type timer struct {
	// last is the latest reading.
	last time.Duration
	laps []lap
}

type lap struct {
	obs prometheus.Observer
	d   time.Duration
}

// restart takes the reading the next call is timed from.
func (t *timer) restart() { t.last = mono() }

// lap ends a call's timing, to be observed by obs.
func (t *timer) lap(obs prometheus.Observer) {
	now := mono()
	t.laps = append(t.laps, lap{obs: obs, d: now - t.last})
	t.last = now
}

// observe records the laps taken.
func (t *timer) observe() {
	for i, l := range t.laps {
		l.obs.Observe(l.d.Seconds())
		t.laps[i] = lap{}
	}
	t.laps = t.laps[:0]
}

// epoch is the reading plugin timings count from. time.Since of a reading
// with a monotonic part reads only the monotonic clock, where time.Now
// reads the wall clock too; a cycle times a dozen calls or more.
var epoch = time.Now()

// mono is the monotonic clock's time since epoch.
func mono() time.Duration { return time.Since(epoch) }

// clamp01 bounds a score to [0,1]; NaN, the mark of a scorer's arithmetic
// gone wrong, counts as 0 rather than poisoning the sum.
func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return min(v, 1)
}

// checkPicks enforces that every pick is a distinct member of cands: the
// guarantee the request path relies on, whatever a plugin does.
func checkPicks(picked, cands []*datalayer.Candidate) error {
	for i, p := range picked {
		found := false
		for _, c := range cands {
			if c == p {
				found = true
				break
			}
		}
		if !found || p == nil {
			return ErrBadPick
		}
		for _, q := range picked[:i] {
			if q == p {
				return fmt.Errorf("%w: endpoint picked twice", ErrBadPick)
			}
		}
	}
	return nil
}
