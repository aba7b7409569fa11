package datalayer

import "github.com/kvroute/kvroute/pkg/events"

// PrefixCacheMatchInfoKey is the key under which a candidate's
// PrefixCacheInfo is published; upstream-style consumers read it by this name.
const PrefixCacheMatchInfoKey = "PrefixCacheMatchInfoKey"

// PrefixCacheInfo is what the index knows about one endpoint's cached prefix
// of one request. MatchBlocks and TotalBlocks keep the upstream meaning
// (leading blocks held, and blocks in the request, both in blocks), so
// match/total is the upstream prefix score.
type PrefixCacheInfo struct {
	// MatchBlocks is the endpoint's longest leading run of the request's
	// blocks that it holds in any tier, speculative holdings included.
	MatchBlocks int `json:"matchBlocks"`
	// TotalBlocks is the number of full blocks in the request.
	TotalBlocks int `json:"totalBlocks"`
	// BlockSizeTokens is the endpoint's block size in tokens.
	BlockSizeTokens int `json:"blockSizeTokens"`
	// MatchTokens is MatchBlocks * BlockSizeTokens.
	MatchTokens int `json:"matchTokens"`
	// BlocksByTier counts the matched blocks by the fastest tier holding each
	// (indexed by events.Tier: GPU, CPU, STORAGE)
	// (a block in GPU and CPU counts as GPU). Blocks held only speculatively
	// are not in it: sum(BlocksByTier) + SpeculativeBlocks == MatchBlocks.
	BlocksByTier [events.NumTiers]int `json:"blocksByTier"`
	// SpeculativeBlocks counts matched blocks that are held only by a
	// speculative holding recorded after an earlier pick.
	SpeculativeBlocks int `json:"speculativeBlocks"`
	// Exact is true when the answer comes from an in-order event stream
	// that knows the engine's whole cache (State is StreamExact), false
	// otherwise. It is State.Exact(), kept for consumers of the upstream
	// shape.
	Exact bool `json:"exact"`
	// State is how far the answer can be trusted, the endpoint's stream
	// state when it was computed:
	//   - exact: MatchBlocks is what the engine holds (up to events in
	//     flight and evictions between pick and prefill);
	//   - partial: the matched blocks are held, but the engine may hold
	//     more of the prefix than the index saw (a late join): a lower
	//     bound, never a false claim;
	//   - recovering: the stream broke moments ago and is being
	//     resynchronised; the answer is what was known before, likely
	//     right, possibly stale either way, for seconds;
	//   - uncertain: the break could not be healed, or the engine's own
	//     cached-token reports disagree with the index: the best guess,
	//     possibly wrong either way;
	//   - none: no event stream; MatchBlocks comes from the routing
	//     history (the approximate fallback), as upstream's approximate
	//     producer would answer, except a prefix this EPP sent the
	//     endpoint and is still prefilling there, which is reported as
	//     held speculatively (SpeculativeBlocks).
	// A latency predictor should take exact and partial matches as
	// cached tokens (partial as a lower bound), and discount recovering
	// and uncertain ones, or widen its estimate, rather than trust them.
	State StreamState `json:"state"`
	// Ranks, for an endpoint with several data-parallel ranks behind its
	// one address, is each rank's own match, in rank order; the fields
	// above then describe the best-matched rank, where a rank pick
	// (PickRank) sends a request that shares the prefix. Nil for an
	// endpoint with one rank. A pointer, so that the info stays
	// comparable (its boxes are shared among equal answers).
	Ranks *[]RankPrefix `json:"ranks,omitempty"`
}

// RankList is p.Ranks' ranks, none when it has none.
func (p *PrefixCacheInfo) RankList() []RankPrefix {
	if p.Ranks == nil {
		return nil
	}
	return *p.Ranks
}

// Ratio is MatchBlocks/TotalBlocks, 0 for a request with no full block.
func (p *PrefixCacheInfo) Ratio() float64 {
	if p.TotalBlocks == 0 {
		return 0
	}
	return float64(p.MatchBlocks) / float64(p.TotalBlocks)
}

// PrefixCacheInfoOf returns the prefix info published on c under
// PrefixCacheMatchInfoKey. It accepts a pointer as well as a value, so that
// a producer publishing either cannot silently zero what every consumer
// reads; the copy it returns keeps its readers free of allocations.
func PrefixCacheInfoOf(c *Candidate) (PrefixCacheInfo, bool) {
	v, ok := c.Get(PrefixCacheMatchInfoKey)
	if !ok {
		return PrefixCacheInfo{}, false
	}
	switch p := v.(type) {
	case PrefixCacheInfo:
		return p, true
	case *PrefixCacheInfo:
		if p != nil {
			return *p, true
		}
	}
	return PrefixCacheInfo{}, false
}

// RoutedPrefixKey is the key under which a candidate's RoutedPrefix is
// published.
const RoutedPrefixKey = "RoutedPrefixKey"

// RoutedPrefix is what the routing history remembers of a request's prefix
// for one endpoint: how many of its leading blocks this EPP's recent picks
// sent there, as upstream's approximate prefix index remembers them (an LRU
// of block hashes per endpoint). It says where a prefix was sent, not what
// the endpoint holds, which PrefixCacheInfo alone says: the engine may have
// evicted those blocks since. An upstream prefix-cache-scorer places by it,
// so that a prefix the cache lost goes back to the endpoint it was sent to
// and is cached there again, rather than to whichever endpoint is least
// loaded at that moment.
type RoutedPrefix struct {
	// Blocks is the leading run of the request's blocks recorded for the
	// endpoint.
	Blocks int `json:"blocks"`
	// TotalBlocks is the number of the request's blocks asked about.
	TotalBlocks int `json:"totalBlocks"`
}

// Ratio is Blocks/TotalBlocks, 0 for a request with no full block.
func (r RoutedPrefix) Ratio() float64 {
	if r.TotalBlocks == 0 {
		return 0
	}
	return min(1, float64(r.Blocks)/float64(r.TotalBlocks))
}

// RoutedPrefixOf returns the routing history's answer published on c under
// RoutedPrefixKey.
func RoutedPrefixOf(c *Candidate) (RoutedPrefix, bool) {
	v, ok := c.Get(RoutedPrefixKey)
	if !ok {
		return RoutedPrefix{}, false
	}
	r, ok := v.(RoutedPrefix)
	return r, ok
}
