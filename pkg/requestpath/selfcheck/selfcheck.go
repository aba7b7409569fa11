// Package selfcheck checks the prefix index against what the engines
// themselves report: every response's usage.prompt_tokens_details.
// cached_tokens is compared with what the index predicted, at pick time,
// for the endpoint that served it. It keeps per-endpoint agreement metrics,
// distrusts (marks uncertain and resynchronises) an endpoint that disagrees
// sustainedly, and raises a fleet-wide alarm, with a log line saying what
// to check, when the engines' reports and the index part ways across the
// pool: the signature of a tokenizer, chat-template or model-name mismatch
// between the EPP and the engines, which no resync can mend. A response
// whose usage cannot be (Impossible) marks its endpoint a liar: it is
// counted, raises the liar alarm, and is ejected from picking.
package selfcheck

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
)

// Options tune a Checker. Zero values mean the documented defaults.
type Options struct {
	// ToleranceBlocks and ToleranceShare bound what legitimately differs
	// between a prediction and the engine's count: a response agrees when
	// the engine's cached tokens are within max(ToleranceBlocks blocks,
	// ToleranceShare of the prediction) of it (defaults 1 block and 0.25),
	// which covers blocks evicted between pick and prefill and blocks the
	// engine computed for concurrent requests meanwhile. The engine's
	// rule that a prompt's last token is always computed is applied first.
	ToleranceBlocks int
	ToleranceShare  float64
	// Window is how many of an endpoint's last checked responses are
	// judged together (default 32); when at least MinSamples (default 16)
	// of them are in and more than DisagreeShare (default 0.5) disagree,
	// the endpoint is distrusted: Distrust is called, at most once per
	// Cooldown (default 1m).
	Window, MinSamples int
	DisagreeShare      float64
	Cooldown           time.Duration
	// FleetWindow is how many of the fleet's last checked responses the
	// alarm looks at (default 256). It is raised when, over them and on at
	// least FleetMinEndpoints endpoints (default 2, or 1 when the pool has
	// one), the engines report less than AlarmRatio (default 0.5) of the
	// tokens the scheduler was told they held, speculative holdings
	// included ("overclaim"), or the index predicted less than AlarmRatio
	// of the cached tokens the engines report on exact streams ("blind"),
	// and at least FleetMinTokens tokens (default 2048) are at stake.
	FleetWindow       int
	FleetMinEndpoints int
	AlarmRatio        float64
	FleetMinTokens    int
	// AlarmLogEvery repeats the alarm's log line while it lasts (default 5m).
	AlarmLogEvery time.Duration
	// Distrust is told of an endpoint that disagrees sustainedly; the EPP
	// marks its streams uncertain and resynchronises them. Nil: only counted.
	Distrust func(addr string)
	// Eject is told of an endpoint whose response's usage cannot be; the
	// EPP ejects it from picking (datalayer.OutcomeLiar). Nil: only
	// counted and alarmed.
	Eject func(addr string)
	// InPool says whether addr is an endpoint of the pool (nil: every
	// address is). A response that ends after its endpoint left, and
	// Forget dropped it, then counts nowhere: no window or series of an
	// endpoint outlives it.
	InPool func(addr string) bool
	// Now is the clock (default time.Now); Logger defaults to slog.Default().
	Now    func() time.Time
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.ToleranceBlocks <= 0 {
		o.ToleranceBlocks = 1
	}
	if o.ToleranceShare <= 0 {
		o.ToleranceShare = 0.25
	}
	if o.Window <= 0 {
		o.Window = 32
	}
	if o.MinSamples <= 0 {
		o.MinSamples = 16
	}
	o.MinSamples = min(o.MinSamples, o.Window)
	if o.DisagreeShare <= 0 {
		o.DisagreeShare = 0.5
	}
	if o.Cooldown <= 0 {
		o.Cooldown = time.Minute
	}
	if o.FleetWindow <= 0 {
		o.FleetWindow = 256
	}
	if o.FleetMinEndpoints <= 0 {
		o.FleetMinEndpoints = 2
	}
	if o.AlarmRatio <= 0 {
		o.AlarmRatio = 0.5
	}
	if o.FleetMinTokens <= 0 {
		o.FleetMinTokens = 2048
	}
	if o.AlarmLogEvery <= 0 {
		o.AlarmLogEvery = 5 * time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Results of one response's check, the values of
// kvroute_selfcheck_responses_total{result}.
const (
	// ResultAgree: the engine's count is within tolerance of the prediction.
	ResultAgree = "agree"
	// ResultOver: the engine found fewer cached tokens than the index said
	// it held: the index claims blocks the engine does not have.
	ResultOver = "over"
	// ResultUnder: the engine found more than the index knew of. On an
	// exact stream that is knowledge missing; on a partial one, expected.
	ResultUnder = "under"
	// ResultUnchecked: nothing to compare (no usage, cached tokens not
	// reported, token ids unknown, an error status, or a stream the index
	// does not claim to know: none, recovering or uncertain).
	ResultUnchecked = "unchecked"
	// ResultImpossible: the response's usage cannot be (Impossible); its
	// endpoint is a liar.
	ResultImpossible = "impossible"
)

// Reasons a response's usage cannot be, the values of
// kvroute_selfcheck_impossible_total{reason}.
const (
	// ImpossibleCachedAbovePrompt: more cached prompt tokens than the
	// prompt has.
	ImpossibleCachedAbovePrompt = "cached-above-prompt"
	// ImpossibleNoOutput: a successful generation of no tokens, though
	// the request asked for some.
	ImpossibleNoOutput = "no-output"
)

// Alarm kinds, the values of kvroute_selfcheck_alarm{kind}.
const (
	AlarmOverclaim = "overclaim"
	AlarmBlind     = "blind"
	// AlarmLiar is raised while an endpoint answered with usage that
	// cannot be within the last Cooldown.
	AlarmLiar = "liar"
)

// Checker compares engines' cached-token reports with the index's
// predictions. It is a director.ResponseObserver, safe for concurrent use.
type Checker struct {
	o Options
	m *metrics

	mu        sync.Mutex
	endpoints map[string]*endpoint
	fleet     []sample
	fleetNext int
	alarms    map[string]*alarm
	// lie is when an endpoint last answered with usage that cannot be, and
	// liar which one.
	lie  time.Time
	liar string
}

var _ director.ResponseObserver = (*Checker)(nil)

// endpoint is one endpoint's recent verdicts.
type endpoint struct {
	ring      []bool // true: disagreed
	next, n   int
	disagree  int
	distrusts time.Time
}

// sample is one checked response, as the fleet-wide alarm weighs it.
type sample struct {
	addr string
	// predicted is the whole match the scheduler acted on (speculative
	// holdings included) and cached the engine's count; unseen is what the
	// engine found beyond that match, on an exact stream.
	predicted, cached, unseen, cachedExact int
	valid                                  bool
}

type alarm struct {
	on     bool
	logged time.Time
}

// New returns a Checker; its metrics are registered with reg unless nil.
func New(o Options, reg prometheus.Registerer) (*Checker, error) {
	o.defaults()
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Checker{
		o: o, m: m,
		endpoints: make(map[string]*endpoint),
		fleet:     make([]sample, o.FleetWindow),
		alarms:    map[string]*alarm{AlarmOverclaim: {}, AlarmBlind: {}, AlarmLiar: {}},
	}, nil
}

// Verdict is one response's check.
type Verdict struct {
	Result string
	// Predicted is the prompt tokens the index said the endpoint held and
	// the engine would hit (its confirmed match, capped by the engine's
	// last-token rule); Speculative what speculative holdings added to it;
	// Cached the engine's count.
	Predicted, Speculative, Cached int
	State                          datalayer.StreamState
}

// Judge checks one response against its pick's prediction for the
// endpoint that served it. It has no side effects.
func (c *Checker) Judge(p *director.Pick, s director.Served) Verdict {
	v := Verdict{Result: ResultUnchecked, Cached: s.Usage.CachedTokens}
	if p == nil || p.Request == nil || s.Status >= 400 || s.Usage.PromptTokens <= 0 || !s.Usage.CachedTokensKnown {
		return v
	}
	if p.Prefill != "" {
		// The decode pod's cached tokens count the blocks it pulled from
		// the prefill pod, which the index could not know at the pick.
		return v
	}
	cand := served(p, s.Endpoint)
	if cand == nil || !p.Request.TokensKnown() {
		return v
	}
	info, ok := datalayer.PrefixCacheInfoOf(cand)
	if !ok || info.BlockSizeTokens <= 0 || !info.State.HoldsMatched() {
		return v
	}
	bs := info.BlockSizeTokens
	held := 0
	for _, n := range info.BlocksByTier {
		held += n
	}
	// An engine always computes a prompt's last token, so a prompt that
	// ends on a block boundary can hit all its blocks but the last.
	maxHit := (len(p.Request.TokenIDs) - 1) / bs
	lo := min(held, maxHit) * bs
	hi := min(held+info.SpeculativeBlocks, maxHit) * bs
	tol := max(c.o.ToleranceBlocks*bs, int(c.o.ToleranceShare*float64(lo)))
	v.Predicted, v.Speculative, v.State = lo, hi-lo, info.State
	switch {
	case v.Cached < lo-tol:
		v.Result = ResultOver
	case v.Cached > hi+tol:
		v.Result = ResultUnder
	default:
		v.Result = ResultAgree
	}
	return v
}

// served is the candidate that served the response: the endpoint the
// gateway says served it, else the pick's primary.
func served(p *director.Pick, addr string) *datalayer.Candidate {
	for _, c := range p.Candidates {
		if c.Address == addr {
			return c
		}
	}
	if p.Result != nil {
		if t := p.Result.Targets(); len(t) > 0 && (addr == "" || t[0].Address == addr) {
			return t[0]
		}
	}
	return nil
}

// Impossible is why the response's usage cannot be, for an engine that
// served the request as asked (vLLM's rules), or "" when it can: a
// successful answer to a completion or chat request whose usage reports
// more cached prompt tokens than prompt tokens, or no output tokens though
// the request set max_tokens (an engine generates at least one). More
// output than max_tokens is not judged: with n > 1 choices it is
// legitimate. A response without usage is not judged.
func Impossible(p *director.Pick, s director.Served) string {
	u := s.Usage
	if p == nil || p.Request == nil || s.Status < 200 || s.Status >= 300 || (u.PromptTokens <= 0 && u.CompletionTokens <= 0) {
		return ""
	}
	if api := p.Request.API; api != request.APICompletions && api != request.APIChatCompletions {
		return ""
	}
	limit := p.Request.MaxTokens
	switch {
	case u.CachedTokens > u.PromptTokens:
		return ImpossibleCachedAbovePrompt
	case u.CompletionTokens <= 0 && limit > 0:
		return ImpossibleNoOutput
	}
	return ""
}

// ObserveResponse implements director.ResponseObserver.
func (c *Checker) ObserveResponse(p *director.Pick, s director.Served) {
	addr := s.Endpoint
	if addr == "" && len(p.Targets) > 0 {
		addr = p.Targets[0]
	}
	if why := Impossible(p, s); why != "" {
		c.lied(addr, why)
		return
	}
	v := c.Judge(p, s)
	// Counted under mu, as Forget deletes, so that a response racing its
	// endpoint's departure makes no series after Forget.
	c.mu.Lock()
	if !c.inPool(addr) {
		c.mu.Unlock()
		return
	}
	c.m.responses.WithLabelValues(addr, v.Result).Inc()
	if v.Result == ResultUnchecked {
		c.mu.Unlock()
		c.clearLiar()
		return
	}
	c.m.predicted.WithLabelValues(addr).Add(float64(v.Predicted))
	c.m.cached.WithLabelValues(addr).Add(float64(v.Cached))
	// Finding more than the index knew of is a disagreement only where the
	// index claims to know everything.
	disagree := v.Result == ResultOver || (v.Result == ResultUnder && v.State.Exact())
	now := c.o.Now()

	ep := c.endpoints[addr]
	if ep == nil {
		ep = &endpoint{ring: make([]bool, c.o.Window)}
		c.endpoints[addr] = ep
	}
	if ep.n == len(ep.ring) && ep.ring[ep.next] {
		ep.disagree--
	}
	ep.ring[ep.next] = disagree
	if disagree {
		ep.disagree++
	}
	ep.next = (ep.next + 1) % len(ep.ring)
	ep.n = min(ep.n+1, len(ep.ring))
	distrust := ep.n >= c.o.MinSamples && float64(ep.disagree) > c.o.DisagreeShare*float64(ep.n) &&
		now.Sub(ep.distrusts) >= c.o.Cooldown
	var seen, bad int
	if distrust {
		seen, bad = ep.n, ep.disagree
		ep.distrusts = now
		clear(ep.ring)
		ep.n, ep.next, ep.disagree = 0, 0, 0
	}
	smp := sample{addr: addr, predicted: v.Predicted + v.Speculative, cached: v.Cached, valid: true}
	if v.State.Exact() {
		smp.cachedExact = v.Cached
		smp.unseen = max(0, v.Cached-v.Predicted-v.Speculative)
	}
	c.fleet[c.fleetNext] = smp
	c.fleetNext = (c.fleetNext + 1) % len(c.fleet)
	logs := c.alarmsLocked(now)
	c.mu.Unlock()

	if distrust {
		c.m.distrusts.Inc()
		c.o.Logger.Warn("the engine's cached-token reports disagree with the prefix index; marking its streams uncertain and resynchronising them",
			"endpoint", addr, "disagreeing", bad, "of", seen)
		if c.o.Distrust != nil {
			c.o.Distrust(addr)
		}
	}
	for _, l := range logs {
		l()
	}
}

// lied counts an endpoint's impossible answer, raises the liar alarm and
// has the endpoint ejected.
func (c *Checker) lied(addr, why string) {
	c.mu.Lock()
	if !c.inPool(addr) {
		c.mu.Unlock()
		return
	}
	c.m.responses.WithLabelValues(addr, ResultImpossible).Inc()
	c.m.impossible.WithLabelValues(addr, why).Inc()
	c.lie, c.liar = c.o.Now(), addr
	logs := c.alarmsLocked(c.lie)
	c.mu.Unlock()
	for _, l := range logs {
		l()
	}
	if c.o.Eject != nil {
		c.o.Eject(addr)
	}
}

// clearLiar lowers the liar alarm once its cooldown has passed with no
// lie, on a response the checks below do not weigh.
func (c *Checker) clearLiar() {
	c.mu.Lock()
	var logs []func()
	if c.alarms[AlarmLiar].on {
		logs = c.alarmsLocked(c.o.Now())
	}
	c.mu.Unlock()
	for _, l := range logs {
		l()
	}
}

// alarmsLocked re-evaluates the fleet-wide alarms; it returns the log
// lines to write once c.mu is released. Called with c.mu held.
func (c *Checker) alarmsLocked(now time.Time) []func() {
	var predicted, cachedOfPredicted, cachedExact, unseen int
	over, blind := map[string]bool{}, map[string]bool{}
	all := map[string]bool{}
	n := 0
	for _, s := range c.fleet {
		if !s.valid {
			continue
		}
		n++
		all[s.addr] = true
		if s.predicted > 0 {
			predicted += s.predicted
			cachedOfPredicted += min(s.cached, s.predicted)
			if s.cached < s.predicted {
				over[s.addr] = true
			}
		}
		cachedExact += s.cachedExact
		unseen += s.unseen
		if s.unseen > 0 {
			blind[s.addr] = true
		}
	}
	need := min(c.o.FleetMinEndpoints, max(len(all), 1))
	r := c.o.AlarmRatio
	overclaim := predicted >= c.o.FleetMinTokens && float64(cachedOfPredicted) < r*float64(predicted) && len(over) >= need
	isBlind := cachedExact >= c.o.FleetMinTokens && float64(cachedExact-unseen) < r*float64(cachedExact) && len(blind) >= need
	var logs []func()
	set := func(kind string, on bool, msg string, args ...any) {
		a := c.alarms[kind]
		switch {
		case on && (!a.on || now.Sub(a.logged) >= c.o.AlarmLogEvery):
			a.on, a.logged = true, now
			logs = append(logs, func() { c.o.Logger.Error(msg, args...) })
		case !on && a.on:
			a.on = false
			logs = append(logs, func() { c.o.Logger.Info("prefix index self-check alarm cleared", "alarm", kind) })
		}
		v := 0.0
		if a.on {
			v = 1
		}
		c.m.alarm.WithLabelValues(kind).Set(v)
	}
	set(AlarmOverclaim, overclaim,
		"engines report far fewer cached prompt tokens than the prefix index predicted for them: check that the EPP tokenizes requests as the engines do "+
			"(the same tokenizer and chat template, the model name the engines serve, LoRA adapters named alike), that the engines' block size is the one their events carry, "+
			"and that their cached-token counts include every tier the index credits (CPU offload)",
		"alarm", AlarmOverclaim, "predicted_tokens", predicted, "cached_of_predicted", cachedOfPredicted,
		"share", fmt.Sprintf("%.2f", ratio(cachedOfPredicted, predicted)), "endpoints", len(over), "responses", n)
	set(AlarmBlind, isBlind,
		"engines report many cached prompt tokens the prefix index never predicted, on streams it calls exact: check that the EPP tokenizes requests as the engines do "+
			"(the same tokenizer and chat template, the model name the engines serve, LoRA adapters named alike), and that every engine's events reach the EPP",
		"alarm", AlarmBlind, "cached_tokens", cachedExact, "unpredicted_tokens", unseen,
		"share", fmt.Sprintf("%.2f", ratio(unseen, cachedExact)), "endpoints", len(blind), "responses", n)
	set(AlarmLiar, !c.lie.IsZero() && now.Sub(c.lie) < c.o.Cooldown,
		"an engine answered with usage that cannot be (more cached tokens than the prompt has, or no output): it is ejected from picking; "+
			"check what answers on that endpoint's port, and its engine's version (kvroute_selfcheck_impossible_total says which endpoint and why)",
		"alarm", AlarmLiar, "endpoint", c.liar)
	return logs
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Alarm reports whether an alarm (AlarmOverclaim, AlarmBlind) is raised.
func (c *Checker) Alarm(kind string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.alarms[kind]
	return a != nil && a.on
}

// inPool is Options.InPool; called with mu held.
func (c *Checker) inPool(addr string) bool {
	return c.o.InPool == nil || c.o.InPool(addr)
}

// Forget drops an endpoint that left the pool: its window and its series.
// Call it once InPool no longer holds addr.
func (c *Checker) Forget(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.endpoints, addr)
	for i := range c.fleet {
		if c.fleet[i].addr == addr {
			c.fleet[i] = sample{}
		}
	}
	for _, r := range []string{ResultAgree, ResultOver, ResultUnder, ResultUnchecked, ResultImpossible} {
		c.m.responses.DeleteLabelValues(addr, r)
	}
	for _, r := range []string{ImpossibleCachedAbovePrompt, ImpossibleNoOutput} {
		c.m.impossible.DeleteLabelValues(addr, r)
	}
	c.m.predicted.DeleteLabelValues(addr)
	c.m.cached.DeleteLabelValues(addr)
}
