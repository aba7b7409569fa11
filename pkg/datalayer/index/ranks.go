package index

import (
	"slices"
	"sync"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// An endpoint with several data-parallel ranks (vLLM's --data-parallel-size
// behind one API server) has one cache per rank, and a request is served
// by one rank: the key shards hold the endpoint's blocks merged over its
// ranks, which answers "does the pod hold it", and each rank's stream keeps
// the set of keys it holds, which answers "which rank". The sets are kept
// only once an endpoint shows a second rank, so a single-rank engine pays
// nothing for them.

// rankSets is an endpoint's per-rank key sets.
type rankSets struct {
	// mu guards every rank stream's keys and spec, and ranks; it is taken
	// after ep.mu, and alone by lookups, which so never wait for a batch.
	mu sync.RWMutex
	// ranks are the endpoint's streams, rank order.
	ranks []*ixStream
}

// RankMatch is what the index knows about one data-parallel rank's cached
// prefix of one request.
type RankMatch struct {
	// Rank is the data-parallel rank (Kv-DP-Rank).
	Rank int
	// Blocks is the rank's longest leading run of the request's blocks,
	// held in any tier or speculatively.
	Blocks int
	// Speculative counts the run's blocks that only a recent pick of this
	// rank says it holds.
	Speculative int
	// State is the rank's stream state.
	State datalayer.StreamState
}

// MaxRankSpec bounds one rank's speculative keys: beyond it, expired ones
// are swept, and if none has expired no more are recorded.
const MaxRankSpec = 1 << 16

// startRanks begins keeping per-rank key sets: every stream's set is built
// from what it holds now. Called with ep.mu held.
func (ep *ixEndpoint) startRanks() {
	rs := &rankSets{}
	for rank, st := range ep.streams {
		st.rank = rank
		st.rankKeys = make(map[uint64]uint32, len(st.handles))
		st.countRankKeys(st)
		for _, sub := range st.groups {
			st.countRankKeys(sub)
		}
		rs.ranks = append(rs.ranks, st)
	}
	slices.SortFunc(rs.ranks, func(a, b *ixStream) int { return a.rank - b.rank })
	ep.rankSets.Store(rs)
}

// countRankKeys counts, in st's rank set, the references of sub (st or one
// of its groups' sub-streams).
func (st *ixStream) countRankKeys(sub *ixStream) {
	for _, hv := range sub.handles {
		for t := uint64(0); t < uint64(len(sub.aged)); t++ {
			if hv&(1<<t) != 0 {
				st.rankKeys[hv&keyMask]++
			}
		}
	}
}

// rankRoot is the stream whose rank set counts st's references: st's
// rank's own stream.
func (st *ixStream) rankRoot() *ixStream {
	if st.root != nil {
		return st.root
	}
	return st
}

// add adds a new stream to the endpoint's rank sets. Called with
// ep.mu held, once the sets are kept.
func (rs *rankSets) add(st *ixStream) {
	rs.mu.Lock()
	st.rankKeys = make(map[uint64]uint32)
	i, _ := slices.BinarySearchFunc(rs.ranks, st.rank, func(s *ixStream, r int) int { return s.rank - r })
	rs.ranks = slices.Insert(rs.ranks, i, st)
	rs.mu.Unlock()
}

// rankRef and rankUnref count a (handle, tier) reference of a rank's
// stream on key k. Called with ep.mu held.
func (ep *ixEndpoint) rankRef(st *ixStream, k uint64) {
	rs := ep.rankSets.Load()
	if rs == nil || st.rankKeys == nil {
		return
	}
	rs.mu.Lock()
	st.rankKeys[k]++
	delete(st.rankSpec, k)
	rs.mu.Unlock()
}

func (ep *ixEndpoint) rankUnref(st *ixStream, k uint64) {
	rs := ep.rankSets.Load()
	if rs == nil || st.rankKeys == nil {
		return
	}
	rs.mu.Lock()
	if n := st.rankKeys[k]; n <= 1 {
		delete(st.rankKeys, k)
	} else {
		st.rankKeys[k] = n - 1
	}
	rs.mu.Unlock()
}

// rankClear empties a rank's set. Called with ep.mu held.
func (ep *ixEndpoint) rankClear(st *ixStream) {
	rs := ep.rankSets.Load()
	if rs == nil || st.rankKeys == nil {
		return
	}
	rs.mu.Lock()
	// Fresh maps: a restarted rank may never refill what the old one held.
	st.rankKeys = make(map[uint64]uint32)
	st.rankSpec = nil
	rs.mu.Unlock()
}

// LookupRanks returns, in out (reused), each data-parallel rank's match
// for keys at addr, in rank order; none when addr has a single rank (there
// is nothing to choose) or is not a member. It costs one map read per rank
// per block matched, and waits for no batch being applied.
func (ix *Index) LookupRanks(keys []uint64, addr string, out []RankMatch) []RankMatch {
	out = out[:0]
	ep := ix.member(addr)
	if ep == nil {
		return out
	}
	rs := ep.rankSets.Load()
	if rs == nil {
		return out
	}
	nowMs := ix.ms(ix.now())
	l := ep.layout.Load()
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	var tiers []int8
	for _, st := range rs.ranks {
		m := RankMatch{Rank: st.rank, State: datalayer.StreamState(st.pubState.Load())}
		if l != nil && l.hybrid {
			// Each rank's groups decide its hit as the endpoint's do.
			var hm Match
			hm, tiers = hybridMatch(keys, rankHoldings{st: st, nowMs: nowMs}, l, int(ep.blockSize.Load()), tiers)
			m.Blocks, m.Speculative = hm.Blocks, hm.Speculative
			out = append(out, m)
			continue
		}
		for _, k := range keys {
			if st.rankKeys[k] > 0 {
				m.Blocks++
				continue
			}
			if d, ok := st.rankSpec[k]; ok && d > nowMs {
				m.Blocks++
				m.Speculative++
				continue
			}
			break
		}
		out = append(out, m)
	}
	return out
}

// rankHoldings are one rank's blocks, read under its rankSets' mu.
type rankHoldings struct {
	st    *ixStream
	nowMs uint64
}

func (r rankHoldings) heldIn(k uint64, g int) (bool, int32) {
	if r.st.rankKeys[k^groupMask(g)] > 0 {
		// The rank set counts references, not tiers: a rank's blocks are
		// reported as held, in the fastest tier.
		return true, int32(events.TierGPU)
	}
	if d, ok := r.st.rankSpec[k]; ok && d > r.nowMs {
		return true, events.NumTiers
	}
	return false, 0
}

// SpeculateRank records that rank of addr will soon hold keys (it was just
// picked for a request with these blocks), for SpeculativeTTL or until the
// rank's events say so. It does nothing for an endpoint with a single rank:
// Speculate covers it.
func (ix *Index) SpeculateRank(addr string, rank int, keys []uint64) {
	ep := ix.member(addr)
	if ep == nil || len(keys) == 0 {
		return
	}
	rs := ep.rankSets.Load()
	if rs == nil {
		return
	}
	now := ix.ms(ix.now())
	deadline := ix.ms(ix.now().Add(ix.opts.SpeculativeTTL))
	rs.mu.Lock()
	defer rs.mu.Unlock()
	i, found := slices.BinarySearchFunc(rs.ranks, rank, func(s *ixStream, r int) int { return s.rank - r })
	if !found {
		return
	}
	st := rs.ranks[i]
	if st.rankSpec == nil {
		st.rankSpec = make(map[uint64]uint64, len(keys))
	}
	if len(st.rankSpec)+len(keys) > MaxRankSpec {
		for k, d := range st.rankSpec {
			if d <= now {
				delete(st.rankSpec, k)
			}
		}
	}
	for _, k := range keys {
		if len(st.rankSpec) >= MaxRankSpec {
			return
		}
		if st.rankKeys[k] == 0 {
			st.rankSpec[k] = deadline
		}
	}
}
