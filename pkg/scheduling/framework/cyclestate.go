package framework

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// CycleState is what the plugins of one scheduling cycle share: the cycle's
// clock reading, its random source, and values plugins pass to each other
// under string keys. A cycle's plugins run one after another, but the
// key-value store is locked so that a plugin may hand work to a goroutine.
type CycleState struct {
	now time.Time
	// The source and generator live inside the state so that a cycle costs
	// one allocation for both.
	pcg rand.PCG
	rng rand.Rand

	// mu is a plain mutex: a cycle's plugins run one after another, so
	// readers rarely meet, and a read-write lock's write costs twice a
	// plain lock's.
	mu sync.Mutex
	// inline holds the first values written, so that a cycle whose
	// plugins pass one or two values makes no map.
	inline [2]struct {
		key string
		v   any
	}
	n    int
	vals map[string]any

	cands []*datalayer.Candidate
}

// NewCycleState makes the state for one cycle. now is read once per cycle so
// that every plugin judges metric freshness against the same instant; the
// seeds make the cycle's random choices reproducible.
func NewCycleState(now time.Time, seed1, seed2 uint64) *CycleState {
	s := &CycleState{now: now, pcg: *rand.NewPCG(seed1, seed2)}
	s.rng = *rand.New(&s.pcg)
	return s
}

// SetCandidates records the cycle's candidates, before the filters of any
// profile narrowed them, for plugins that weigh one stage's pods against
// another's (a decider comparing the decode pod with the prefill pool).
func (s *CycleState) SetCandidates(cands []*datalayer.Candidate) { s.cands = cands }

// Candidates are the cycle's candidates as SetCandidates recorded them.
func (s *CycleState) Candidates() []*datalayer.Candidate { return s.cands }

// Now is the instant the cycle started.
func (s *CycleState) Now() time.Time { return s.now }

// Rand is the cycle's random source. It is not safe for concurrent use:
// only the cycle's own goroutine may draw from it.
func (s *CycleState) Rand() *rand.Rand { return &s.rng }

// Write stores v under key.
func (s *CycleState) Write(key string, v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.n {
		if s.inline[i].key == key {
			s.inline[i].v = v
			return
		}
	}
	if s.vals == nil && s.n < len(s.inline) {
		s.inline[s.n].key, s.inline[s.n].v = key, v
		s.n++
		return
	}
	if s.vals == nil {
		s.vals = make(map[string]any, 4)
	}
	s.vals[key] = v
}

// Read returns the value stored under key.
func (s *CycleState) Read(key string) (any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.n {
		if s.inline[i].key == key {
			return s.inline[i].v, true
		}
	}
	v, ok := s.vals[key]
	return v, ok
}

// PeerEndpointKey is the cycle-state key under which a profile handler
// that runs stages one after another (disaggregated serving) stores the
// *datalayer.Candidate the earlier stage picked, before it runs the later
// one: the decode pick before the prefill profile, or the prefill pick
// before the decode profile when prefill runs first. The topology plugins
// place the later pick near it.
const PeerEndpointKey = "peer-endpoint"

// Peer is the earlier stage's pick as PeerEndpointKey holds it.
func (s *CycleState) Peer() (*datalayer.Candidate, bool) {
	v, ok := s.Read(PeerEndpointKey)
	if !ok {
		return nil, false
	}
	c, ok := v.(*datalayer.Candidate)
	return c, ok && c != nil
}
