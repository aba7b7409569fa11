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
	runs     map[*framework.Profile]*profileRun
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
		runs:     make(map[*framework.Profile]*profileRun, len(opts.Profiles)),
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
		s.runs[p] = r
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
	for i, a := range s.admit {
		t := time.Now()
		err := a.Admit(ctx, req, cands)
		s.admitT[i].Observe(time.Since(t).Seconds())
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
	// for the same profile cannot loop forever.
	for {
		t := time.Now()
		next := s.handler.Pick(ctx, cs, req, s.profiles, results)
		s.handlerT.Observe(time.Since(t).Seconds())
		ran := false
		for _, p := range next {
			if _, done := results[p.Name]; done {
				continue
			}
			run, ok := s.runs[p]
			if !ok {
				return nil, statusError, fmt.Errorf("schedule request %s: profile handler %s chose unknown profile %q", req.ID, s.handler.TypedName(), p.Name)
			}
			if err := ctx.Err(); err != nil {
				return nil, statusError, fmt.Errorf("schedule request %s: %w", req.ID, err)
			}
			r, err := s.runProfile(ctx, cs, req, run, cands)
			if err != nil {
				return nil, statusError, fmt.Errorf("schedule request %s: %w", req.ID, err)
			}
			results[p.Name] = r
			ran = true
		}
		if !ran {
			break
		}
	}
	t := time.Now()
	res, err := s.handler.ProcessResults(ctx, cs, req, results)
	s.handlerT.Observe(time.Since(t).Seconds())
	if err != nil {
		status := statusError
		if errors.Is(err, ErrNoCandidates) {
			status = statusNoCandidates
		}
		return nil, status, fmt.Errorf("schedule request %s: %w", req.ID, err)
	}
	return res, statusSuccess, nil
}

// runProfile runs one profile's filters, scorers, picker and post-pick
// hooks. An empty result means the filters left nothing.
func (s *Scheduler) runProfile(ctx context.Context, cs *framework.CycleState, req *request.Request, p *profileRun, cands []*datalayer.Candidate) (*framework.ProfileResult, error) {
	filtered := cands
	for i, f := range p.Filters {
		t := time.Now()
		filtered = f.Filter(ctx, cs, req, filtered)
		p.filterT[i].Observe(time.Since(t).Seconds())
		if len(filtered) == 0 {
			return &framework.ProfileResult{}, nil
		}
	}

	// Neither pickers nor scorers keep what they are given (their
	// contracts say so), so the scores' memory is pooled.
	sc := scoresPool.Get().(*scores)
	defer func() {
		clear(sc.scored) // drop the candidates, so the pool keeps no request alive
		scoresPool.Put(sc)
	}()
	scored := slices.Grow(sc.scored[:0], len(filtered))[:len(filtered)]
	sc.scored = scored
	for i, c := range filtered {
		scored[i] = framework.ScoredCandidate{Candidate: c}
	}
	if len(p.Scorers) > 0 {
		buf := slices.Grow(sc.buf[:0], len(filtered))[:len(filtered)]
		sc.buf = buf
		for i, w := range p.Scorers {
			clear(buf)
			t := time.Now()
			w.Score(ctx, cs, req, filtered, buf)
			p.scorerT[i].Observe(time.Since(t).Seconds())
			for j, v := range buf {
				scored[j].Score += clamp01(v) * w.Weight
			}
		}
	}

	t := time.Now()
	res := p.Picker.Pick(ctx, cs, scored)
	p.pickerT.Observe(time.Since(t).Seconds())
	if res == nil {
		res = &framework.ProfileResult{}
	}
	if err := checkPicks(res.Picked, cands); err != nil {
		return nil, fmt.Errorf("profile %q, picker %s: %w", p.Name, p.Picker.TypedName(), err)
	}
	if s.keep {
		// A copy: scored goes back to the pool.
		res.Scored = slices.Clone(scored)
	}
	for i, pp := range p.PostPicks {
		t := time.Now()
		pp.PostPick(ctx, cs, req, res)
		p.postPickT[i].Observe(time.Since(t).Seconds())
	}
	return res, nil
}

// scores is a profile run's scoring memory.
type scores struct {
	scored []framework.ScoredCandidate
	buf    []float64
}

var scoresPool = sync.Pool{New: func() any { return new(scores) }}

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
