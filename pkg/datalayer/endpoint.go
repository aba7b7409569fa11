package datalayer

import (
	"fmt"
	"sync"
	"time"
)

// Endpoint is one serving endpoint (a pod and one of its target ports) as
// discovery reports it. It is immutable once published: discovery replaces
// it rather than changing it.
type Endpoint struct {
	// Name is unique in the pool: the pod name, with "-rank-N" for the N-th
	// target port when a pod has several.
	Name string
	// Address is the ip:port the gateway routes to; events name it in Kv-Endpoint.
	Address   string
	Pod       string
	Namespace string
	// Model is the base model the endpoint serves.
	Model  string
	Labels map[string]string
}

// StreamState says how far the index can be trusted for an endpoint: what
// its answers claim about the engine's cache. The states are ordered by
// nothing; read them through their methods.
type StreamState uint8

const (
	// StreamNone: no event has ever arrived; prefix answers come from the
	// routing history (approximate).
	StreamNone StreamState = iota
	// StreamExact: every block the engine holds is known, and every block
	// the index says it holds, it holds (up to the events in flight).
	StreamExact
	// StreamUncertain: batches may have been lost and could not be made
	// good (the resync failed or found the relay's mirror inexact), or the
	// engine's own reports disagree with the index: the answers are the
	// best known, and may be wrong either way.
	StreamUncertain
	// StreamPartial: every block the index says the engine holds, it holds,
	// but blocks stored before the index's first sight of the stream may be
	// missing (a late join: the stream's first batch was not its seq 0 and
	// no complete snapshot was to be had). A match is a lower bound.
	StreamPartial
	// StreamRecovering: the stream broke (a gap, a reconnect, a relay
	// restart, a lost tail) and a resync is under way or due; the index
	// keeps what it knew, which is mostly right but may be stale either
	// way, until the resync ends in another state, in seconds.
	StreamRecovering

	// NumStreamStates sizes arrays indexed by StreamState.
	NumStreamStates
)

// AllStreamStates lists every state, in the order metrics and docs show them.
var AllStreamStates = [...]StreamState{StreamNone, StreamExact, StreamPartial, StreamRecovering, StreamUncertain}

func (s StreamState) String() string {
	switch s {
	case StreamNone:
		return "none"
	case StreamExact:
		return "exact"
	case StreamUncertain:
		return "uncertain"
	case StreamPartial:
		return "partial"
	case StreamRecovering:
		return "recovering"
	}
	return "unknown"
}

// Exact reports whether the index knows the engine's cache exactly.
func (s StreamState) Exact() bool { return s == StreamExact }

// HoldsMatched reports whether every block the index credits the endpoint
// with is held (exact and partial streams): a match is then at least what
// the engine will hit, never a false claim.
func (s StreamState) HoldsMatched() bool { return s == StreamExact || s == StreamPartial }

// FromEvents reports whether answers come from the endpoint's events at
// all, rather than from the routing history.
func (s StreamState) FromEvents() bool { return s != StreamNone }

// MarshalText writes the state's name.
func (s StreamState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a state's name.
func (s *StreamState) UnmarshalText(b []byte) error {
	for _, v := range AllStreamStates {
		if string(b) == v.String() {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("unknown stream state %q", b)
}

// Metrics are the endpoint's load as last scraped from its /metrics.
type Metrics struct {
	WaitingQueueSize int
	RunningRequests  int
	// KVCacheUsage is the share of GPU KV blocks in use, 0 to 1.
	KVCacheUsage float64
	// ActiveLoRAs and WaitingLoRAs name the adapters running and waiting;
	// MaxLoRAs is how many the server holds at once (0 when unknown).
	ActiveLoRAs  []string
	WaitingLoRAs []string
	MaxLoRAs     int
	// BlockSize and NumGPUBlocks come from vllm:cache_config_info (0 when unknown).
	BlockSize    int
	NumGPUBlocks int
	// UpdateTime is when these values were scraped; the zero time means never.
	UpdateTime time.Time
}

// Fresh reports whether the metrics were scraped within maxAge of now. Stale
// metrics mean the load is unknown, not zero.
func (m *Metrics) Fresh(now time.Time, maxAge time.Duration) bool {
	return !m.UpdateTime.IsZero() && now.Sub(m.UpdateTime) <= maxAge
}

// Candidate is an endpoint as one request's scheduling cycle sees it: a
// snapshot of its metrics and stream state, and the per-request data that
// producers publish for consumers (scorers, filters, the latency predictor).
// It is owned by one request; producers running in parallel may Put into it
// concurrently.
type Candidate struct {
	*Endpoint
	Metrics Metrics
	Stream  StreamState
	// InFlight is the work this EPP had dispatched to the endpoint and not
	// seen finish when the request arrived.
	InFlight InFlight

	mu sync.RWMutex
	// The published values. A request's candidates each carry one to four
	// keys (the default configuration's: block keys, prefix match, latency
	// prediction and its input), so the first few sit in the candidate
	// itself and are found by a short scan; a map here cost an allocation
	// or two per candidate per producer on every request. Further keys
	// spill into more.
	inline  [4]attr
	ninline int
	more    []attr
	// base, when set, is the candidate this one stages writes for: reads
	// fall through to it, writes stay here until committed (see Graph.Run).
	base *Candidate
}

type attr struct {
	key string
	v   any
}

// NewCandidate makes a candidate from an endpoint snapshot.
func NewCandidate(ep *Endpoint, m Metrics, s StreamState) *Candidate {
	return &Candidate{Endpoint: ep, Metrics: m, Stream: s}
}

// Put publishes a value under key for this request.
func (c *Candidate) Put(key string, v any) {
	c.mu.Lock()
	c.put(key, v)
	c.mu.Unlock()
}

// Get returns the value published under key, if any.
func (c *Candidate) Get(key string) (any, bool) {
	c.mu.RLock()
	v, ok := c.own(key)
	c.mu.RUnlock()
	if !ok && c.base != nil {
		return c.base.Get(key)
	}
	return v, ok
}

// put sets key; c.mu is held for writing.
func (c *Candidate) put(key string, v any) {
	if a := c.find(key); a != nil {
		a.v = v
		return
	}
	if c.ninline < len(c.inline) {
		c.inline[c.ninline] = attr{key: key, v: v}
		c.ninline++
		return
	}
	c.more = append(c.more, attr{key: key, v: v})
}

// own returns what was published in c itself, never in its base; c.mu is
// held.
func (c *Candidate) own(key string) (any, bool) {
	if a := c.find(key); a != nil {
		return a.v, true
	}
	return nil, false
}

func (c *Candidate) find(key string) *attr {
	for i := range c.inline[:c.ninline] {
		if c.inline[i].key == key {
			return &c.inline[i]
		}
	}
	for i := range c.more {
		if c.more[i].key == key {
			return &c.more[i]
		}
	}
	return nil
}

// StageInto makes v, which no one else is using (a view an earlier run
// used may serve again), a staging view of c: reads fall
// through to c, writes stay in v until Commit publishes them. The
// PrepareData graph gives each producer its own views, so that a producer
// that misses its deadline publishes nothing.
func (c *Candidate) StageInto(v *Candidate) {
	// Whole, so that a view used by an earlier run starts empty.
	*v = Candidate{Endpoint: c.Endpoint, Metrics: c.Metrics, Stream: c.Stream, InFlight: c.InFlight, base: c}
}

// Commit publishes into c what staged, a staging view of c, holds under
// keys.
func (c *Candidate) Commit(staged *Candidate, keys []string) {
	staged.mu.RLock()
	defer staged.mu.RUnlock()
	// One write lock for all the keys: commits run for every candidate of
	// every request, and a lock per key was most of their cost.
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		if v, ok := staged.own(k); ok {
			c.put(k, v)
		}
	}
}
