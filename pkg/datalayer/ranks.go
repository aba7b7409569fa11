package datalayer

import (
	"sync"
	"sync/atomic"
)

// A pod running vLLM with --data-parallel-size N behind one API server has
// N ranks, each an engine with its own KV cache and scheduler, at one
// address. vLLM serves a request on the rank its X-data-parallel-rank
// header names, and otherwise on the rank its own balancing picks by
// queue lengths, blind to the caches. The index answers per rank
// (RankPrefix), the in-flight accounting counts per rank (RankLoad), and
// PickRank weighs the two.

// HeaderDataParallelRank is the request header vLLM's API server reads to
// pin a request to a data-parallel rank (vLLM's _get_data_parallel_rank;
// HTTP header names are case-insensitive). vLLM ignores a value that is
// not an integer and refuses one outside [0, data-parallel-size) with 400.
const HeaderDataParallelRank = "x-data-parallel-rank"

// MaxRanks bounds the ranks counted per endpoint, as the consumer bounds
// the rank streams it admits (DefaultMaxRanksPerEndpoint).
const MaxRanks = 32

// RankPrefix is one data-parallel rank's cached prefix of a request.
type RankPrefix struct {
	// Rank is the data-parallel rank (Kv-DP-Rank of its events).
	Rank int `json:"rank"`
	// MatchBlocks is the rank's longest leading run of the request's
	// blocks, speculative holdings included.
	MatchBlocks int `json:"matchBlocks"`
	// SpeculativeBlocks counts matched blocks held only because a recent
	// pick sent a request with them to this rank.
	SpeculativeBlocks int `json:"speculativeBlocks"`
	// State is the rank's own stream state.
	State StreamState `json:"state"`
}

// Trusted is the blocks a rank pick may take as cached: the match of a
// rank whose stream is exact or partial (a lower bound); none for a rank
// whose stream is recovering or uncertain, whose word is not taken.
func (r RankPrefix) Trusted() int {
	switch r.State {
	case StreamExact, StreamPartial:
		return r.MatchBlocks
	}
	return 0
}

// RankLoad is the work this EPP has sent one rank and not yet seen finish.
type RankLoad struct {
	// Prefilling counts requests without their first token, PrefillTokens
	// their uncached prompt tokens; Decoding counts those past it.
	Prefilling, PrefillTokens, Decoding int
}

// rankCounters are one rank's live counters.
type rankCounters struct {
	prefilling, prefillTokens, decoding atomic.Int64
}

// rankLoads are an endpoint's per-rank counters, made as ranks are first
// dispatched to.
type rankLoads struct {
	mu sync.Mutex
	by atomic.Pointer[[]*rankCounters]
}

func (r *rankLoads) of(rank int) *rankCounters {
	if rank < 0 || rank >= MaxRanks {
		return nil
	}
	if p := r.by.Load(); p != nil && rank < len(*p) && (*p)[rank] != nil {
		return (*p)[rank]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var cur []*rankCounters
	if p := r.by.Load(); p != nil {
		cur = *p
	}
	if rank < len(cur) && cur[rank] != nil {
		return cur[rank]
	}
	next := make([]*rankCounters, max(len(cur), rank+1))
	copy(next, cur)
	next[rank] = new(rankCounters)
	r.by.Store(&next)
	return next[rank]
}

// OnRank says the request was sent to data-parallel rank rank of its
// endpoint (the rank header names it); call it right after the dispatch.
// A rank outside [0, MaxRanks) is not counted.
func (d *Dispatch) OnRank(rank int) {
	if d == nil || d.rank != nil || d.state.Load() != 0 {
		return
	}
	rc := d.c.ranks.of(rank)
	if rc == nil {
		return
	}
	d.rank = rc
	rc.prefilling.Add(1)
	rc.prefillTokens.Add(d.prefill)
}

// rankFirstToken and rankFinish move the request's rank counters as its
// endpoint's move.
func (d *Dispatch) rankFirstToken() {
	if rc := d.rank; rc != nil {
		rc.prefilling.Add(-1)
		rc.prefillTokens.Add(-d.prefill)
		rc.decoding.Add(1)
	}
}

func (d *Dispatch) rankFinish(state uint32) {
	rc := d.rank
	if rc == nil {
		return
	}
	switch state {
	case 0:
		rc.prefilling.Add(-1)
		rc.prefillTokens.Add(-d.prefill)
	case 1:
		rc.decoding.Add(-1)
	}
}

// RankLoads returns, in out (reused), the in-flight work of each rank of
// the endpoint named name that this EPP has sent a request to, indexed by
// rank (ranks never sent one read zero).
func (ds *Datastore) RankLoads(name string, out []RankLoad) []RankLoad {
	out = out[:0]
	e, ok := ds.snap.Load().byName[name]
	if !ok {
		return out
	}
	return e.load.ranks.loads(out)
}

// loads appends each rank's load to out, indexed by rank.
func (r *rankLoads) loads(out []RankLoad) []RankLoad {
	p := r.by.Load()
	if p == nil {
		return out
	}
	for _, rc := range *p {
		var l RankLoad
		if rc != nil {
			l = RankLoad{Prefilling: int(rc.prefilling.Load()), PrefillTokens: int(rc.prefillTokens.Load()), Decoding: int(rc.decoding.Load())}
		}
		out = append(out, l)
	}
	return out
}

// RankDecodeCost is what PickRank counts a decoding request on a rank as,
// in prompt tokens still to prefill there: each shares the steps a new
// prefill runs in. vLLM's own balancing counts a waiting request as four
// running ones; here the waiting work is counted by its tokens.
const RankDecodeCost = 32

// PickRank returns the rank a request of promptTokens tokens should be
// sent to, and false when there is no choice to make: the endpoint is not
// known to have several ranks behind its address. Its ranks are 0 up to
// the larger of size (the count its metrics give, 0 when unknown) and the
// highest rank the index knows of info.Ranks; a rank the index has no
// stream for holds nothing. Each rank costs the prompt tokens it would
// have to compute (those past its trusted match: a rank whose stream is
// in doubt is not taken at its word) plus the prefill tokens this EPP has
// queued there, plus RankDecodeCost for each request decoding there; the
// cheapest wins, ties going to the rank with the fewest requests in
// flight, then the lowest.
func PickRank(info *PrefixCacheInfo, loads []RankLoad, promptTokens, size int) (int, bool) {
	known := info.RankList()
	n := size
	if len(known) > 0 {
		n = max(n, known[len(known)-1].Rank+1)
	}
	n = min(n, MaxRanks)
	if n < 2 {
		return 0, false
	}
	bs := max(info.BlockSizeTokens, 1)
	best, bestCost, bestReqs := -1, 0, 0
	for rank := range n {
		trusted := 0
		for len(known) > 0 && known[0].Rank < rank {
			known = known[1:]
		}
		if len(known) > 0 && known[0].Rank == rank {
			trusted = known[0].Trusted()
		}
		var l RankLoad
		if rank < len(loads) {
			l = loads[rank]
		}
		cost := max(promptTokens-trusted*bs, 0) + l.PrefillTokens + RankDecodeCost*l.Decoding
		reqs := l.Prefilling + l.Decoding
		if best < 0 || cost < bestCost || (cost == bestCost && reqs < bestReqs) {
			best, bestCost, bestReqs = rank, cost, reqs
		}
	}
	return best, true
}
