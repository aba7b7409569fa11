package datalayer

import (
	"fmt"
	"slices"
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
	// Topology is where the pod runs: its node's labels in Kubernetes, the
	// endpoints file's topology otherwise.
	Topology Topology
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
	// DataParallelRanks is how many data-parallel ranks serve behind the
	// endpoint's address: the engines vllm:cache_config_info names by its
	// engine label (0 when it names none).
	DataParallelRanks int
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
// It is owned by one request, and used by one goroutine at a time unless
// it is marked shared (MarkShared): the PrepareData graph marks the
// candidates it hands to producers running in parallel, which may then
// Put and Get concurrently.
type Candidate struct {
	*Endpoint
	// Metrics is the endpoint's last scrape as it was when the candidate
	// was made, never nil: the datastore's own snapshot, read in place and
	// never written (a scrape stores a new one), so that making a
	// candidate copies none of it. Unscraped endpoints share the zero
	// Metrics.
	Metrics *Metrics
	Stream  StreamState
	// role is the endpoint's Role with roleKnown, when the datastore made
	// the candidate (0: parse the labels).
	role Role
	// InFlight is the work this EPP had dispatched to the endpoint and not
	// seen finish when the request arrived.
	InFlight InFlight
	// RankLoads, for an endpoint with data-parallel ranks behind its
	// address that this EPP has sent requests to, is InFlight's share of
	// each rank, indexed by rank (nil otherwise).
	RankLoads []RankLoad
	// GPUBlocks is how many blocks the index counted in the endpoint's GPU
	// cache when the candidate was made (StreamInfo.GPUBlocks; 0 when
	// unknown).
	GPUBlocks int
	// Residency is the prefix families this EPP lately sent the endpoint,
	// shared with the datastore (nil for a candidate made without one).
	Residency *Residency

	// mu guards what follows when the candidate is shared. It is a plain
	// mutex: even then, readers rarely meet, and a read lock costs what a
	// lock does. An unshared candidate takes no lock: its every access
	// would otherwise pay for two atomic instructions, tens of them per
	// candidate per request.
	shared bool
	mu     sync.Mutex
	// The published values, n of them: the first few in the candidate
	// itself, the rest in more. A request's candidates each carry one to
	// four keys (the default configuration's: block keys, prefix match,
	// latency prediction and its input), found by a short scan; a map here
	// cost an allocation or two per candidate per producer on every
	// request.
	inline [4]attr
	more   []attr
	n      int
	// staged is where a producer's writes not yet committed begin
	// (Stage); 0 when none are held back.
	staged int
	// base, when set, is the candidate this one stages writes for: reads
	// fall through to it, writes stay here until committed (see Graph.Run).
	base *Candidate
	// set is the memory the candidate was made in, if any (RequestMemory).
	set *CandidateSet

	// The rest of the StreamInfo that Stream was read with, when
	// described: read from describedBy's handle (see StreamInfoFrom).
	described   bool
	bigram      bool
	blockSize   int32
	describedBy StreamStates
}

// StreamInfoFrom returns the candidate's stream info as the datastore read
// it from src when it made the candidate, with Stream; ok is false when it
// was not read from src whole (the candidate was made otherwise, or from
// other stream states), and src must be asked instead. It spares the
// request path a second read of each endpoint's state.
func (c *Candidate) StreamInfoFrom(src any) (info StreamInfo, ok bool) {
	if !c.described || c.describedBy == nil || any(c.describedBy) != src {
		return StreamInfo{}, false
	}
	return StreamInfo{State: c.Stream, Bigram: c.bigram, BlockSize: int(c.blockSize), GPUBlocks: c.GPUBlocks}, true
}

type attr struct {
	key string
	v   any
}

// NewCandidate makes a candidate from an endpoint snapshot.
func NewCandidate(ep *Endpoint, m Metrics, s StreamState) *Candidate {
	return &Candidate{Endpoint: ep, Metrics: &m, Stream: s, role: RoleOf(ep.Labels) | roleKnown}
}

// unscraped is the Metrics of every candidate whose endpoint was never
// scraped. Nothing writes a candidate's Metrics, this one least of all.
var unscraped = new(Metrics)

// MarkShared makes c safe for concurrent Puts and Gets from now on. Call
// it before c is handed to another goroutine that may use it while this
// one does.
func (c *Candidate) MarkShared() { c.shared = true }

func (c *Candidate) lock() {
	if c.shared {
		c.mu.Lock()
	}
}

func (c *Candidate) unlock() {
	if c.shared {
		c.mu.Unlock()
	}
}

// Put publishes a value under key for this request.
func (c *Candidate) Put(key string, v any) {
	if !c.shared {
		c.put(key, v)
		return
	}
	c.mu.Lock()
	c.put(key, v)
	c.mu.Unlock()
}

// Get returns the value published under key, if any.
func (c *Candidate) Get(key string) (any, bool) {
	if !c.shared {
		if i := c.find(key, 0); i >= 0 {
			return c.at(i).v, true
		}
		return nil, false
	}
	c.mu.Lock()
	i := c.find(key, 0)
	var v any
	if i >= 0 {
		v = c.at(i).v
	}
	c.mu.Unlock()
	if i < 0 && c.base != nil {
		return c.base.Get(key)
	}
	return v, i >= 0
}

func (c *Candidate) at(i int) *attr {
	if i < len(c.inline) {
		return &c.inline[i]
	}
	return &c.more[i-len(c.inline)]
}

// find returns the index of key among the entries from `from` on, the
// newest first (a staged write shadows the published value), or -1.
func (c *Candidate) find(key string, from int) int { return c.findIn(key, from, c.n) }

// findIn is find among the entries in [lo, hi).
func (c *Candidate) findIn(key string, lo, hi int) int {
	for i := hi - 1; i >= lo; i-- {
		if c.at(i).key == key {
			return i
		}
	}
	return -1
}

// put sets key; c.mu is held. While writes are staged, a key published
// before is shadowed, not overwritten, so that discarding the stage
// leaves it as it was.
func (c *Candidate) put(key string, v any) {
	if i := c.find(key, c.staged); i >= 0 {
		c.at(i).v = v
		return
	}
	if c.n < len(c.inline) {
		c.inline[c.n] = attr{key: key, v: v}
	} else {
		c.more = append(c.more, attr{key: key, v: v})
	}
	c.n++
}

// truncate drops the entries from m on; c.mu is held.
func (c *Candidate) truncate(m int) {
	for i := m; i < c.n; i++ {
		*c.at(i) = attr{}
	}
	c.more = c.more[:max(m-len(c.inline), 0)]
	c.n = m
}

// StageInto makes v, which no one else is using (a view an earlier run
// used may serve again), a staging view of c: reads fall
// through to c, writes stay in v until Commit publishes them. The
// PrepareData graph gives each producer on a goroutine of its own its own
// views, so that a producer that misses its deadline publishes nothing.
func (c *Candidate) StageInto(v *Candidate) {
	// Whole, so that a view used by an earlier run starts empty. A view
	// is shared, as its candidate must be.
	*v = Candidate{Endpoint: c.Endpoint, Metrics: c.Metrics, Stream: c.Stream, role: c.role, InFlight: c.InFlight, base: c, shared: true,
		described: c.described, bigram: c.bigram, blockSize: c.blockSize, describedBy: c.describedBy}
}

// Commit publishes into c what staged, a staging view of c, holds under
// keys.
func (c *Candidate) Commit(staged *Candidate, keys []string) {
	staged.lock()
	defer staged.unlock()
	// One lock for all the keys: commits run for every candidate of every
	// request, and a lock per key was most of their cost.
	c.lock()
	defer c.unlock()
	for _, k := range keys {
		if i := staged.find(k, 0); i >= 0 {
			c.put(k, staged.at(i).v)
		}
	}
}

// Stage holds back what is Put from now on, until CommitStaged publishes
// it or DiscardStaged drops it: a staging view within the candidate
// itself, for producers that run one after another on one goroutine (the
// PrepareData graph when every producer runs inline), where copying the
// candidate into a view per producer cost more than the producers' work.
// Reads see the staged writes.
func (c *Candidate) Stage() {
	c.lock()
	c.staged = c.n
	c.unlock()
}

// CommitStaged publishes, of the writes held back since Stage, those
// under keys, and drops the rest.
func (c *Candidate) CommitStaged(keys []string) {
	c.lock()
	w := c.staged
	for i := c.staged; i < c.n; i++ {
		a := c.at(i)
		if !slices.Contains(keys, a.key) {
			continue
		}
		if j := c.findIn(a.key, 0, c.staged); j >= 0 {
			// Shadowing a value published before: it replaces it.
			c.at(j).v = a.v
			continue
		}
		if w != i {
			*c.at(w) = *a
		}
		w++
	}
	if w < c.n {
		c.truncate(w)
	}
	c.staged = 0
	c.unlock()
}

// DiscardStaged drops every write held back since Stage.
func (c *Candidate) DiscardStaged() {
	c.lock()
	c.truncate(c.staged)
	c.staged = 0
	c.unlock()
}
