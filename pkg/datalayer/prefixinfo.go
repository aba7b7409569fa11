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
	// Exact is true when the answer comes from an in-order event stream, false
	// when it is the approximate fallback (no stream, or an uncertain one, or
	// a request whose token ids are unknown).
	Exact bool `json:"exact"`
}

// Ratio is MatchBlocks/TotalBlocks, 0 for a request with no full block.
func (p *PrefixCacheInfo) Ratio() float64 {
	if p.TotalBlocks == 0 {
		return 0
	}
	return float64(p.MatchBlocks) / float64(p.TotalBlocks)
}
