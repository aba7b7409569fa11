// Package prefixmatch is the PrepareData producer that answers, for every
// candidate of a request, how much of the request's prompt the candidate
// already holds in its KV cache, and in which tier: the exact answer from the
// event-fed index where the candidate's event stream is in order, and the
// approximate routing-history answer, marked not exact, where it is not.
package prefixmatch

import (
	"context"
	"slices"
	"sync"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/request"
)

// Type is the producer's registered plugin type.
const Type = "precise-prefix-cache-producer"

// RequestBlockKeysKey is where the producer publishes, per candidate, the
// request's block keys at that candidate's block size (a []uint64 shared by
// candidates of the same block size and model), so that a post-pick hook can
// record speculative holdings for the picked endpoint.
const RequestBlockKeysKey = "RequestBlockKeysKey"

// ApproxHashesKey is where the producer publishes the request's approximate
// (routing-history) hashes, a []uint64, so that a post-pick hook can teach
// the approximate index where the request went.
const ApproxHashesKey = "ApproxPrefixHashesKey"

// Index is what the producer needs of the exact index.
type Index interface {
	// Describe says, for each address, its stream's state, its block size
	// and whether its engine keys blocks by token pairs.
	Describe(addrs []string, out []index.EndpointInfo)
	Lookup(keys []uint64, addrs []string, out []index.Match)
}

// RankIndex is what the producer needs of an index that answers per
// data-parallel rank (the exact index does); without it, an endpoint's
// ranks are answered as one.
type RankIndex interface {
	LookupRanks(keys []uint64, addr string, out []index.RankMatch) []index.RankMatch
}

// Approx is what the producer needs of the approximate fallback.
type Approx interface {
	Match(hashes []uint64, addrs []string, out []int)
}

// Params are the producer's configuration parameters.
type Params struct {
	// DefaultBlockSizeTokens is the block size assumed for an endpoint whose
	// events and metrics have not told it yet (vLLM's default, 16).
	DefaultBlockSizeTokens int `json:"defaultBlockSizeTokens"`
	// MaxPrefixBlocks caps the blocks looked up per request (0: no cap). The
	// walk stops at the longest match anyway, so this only bounds hashing.
	MaxPrefixBlocks int `json:"maxPrefixBlocks"`
	// ApproxBlockSizeTokens and ApproxMaxBlocks tune the approximate
	// fallback, as the upstream approximate producer's blockSizeTokens and
	// maxPrefixBlocksToMatch do.
	ApproxBlockSizeTokens int `json:"approxBlockSizeTokens"`
	ApproxMaxBlocks       int `json:"approxMaxBlocks"`
}

// DefaultParams are the parameters of a producer configured without any.
func DefaultParams() Params {
	return Params{
		DefaultBlockSizeTokens: 16,
		ApproxBlockSizeTokens:  approx.DefaultBlockSizeTokens,
		ApproxMaxBlocks:        approx.DefaultMaxBlocks,
	}
}

// Producer publishes a datalayer.PrefixCacheInfo under
// datalayer.PrefixCacheMatchInfoKey for every candidate.
type Producer struct {
	name   string
	params Params
	index  Index
	ranks  RankIndex
	approx Approx
}

var _ prepare.DataProducer = (*Producer)(nil)

// New returns a producer reading index, with approx (which may be nil) as
// the fallback for endpoints whose event stream is missing or uncertain.
func New(name string, p Params, index Index, approx Approx) *Producer {
	d := DefaultParams()
	if p.DefaultBlockSizeTokens <= 0 {
		p.DefaultBlockSizeTokens = d.DefaultBlockSizeTokens
	}
	if p.ApproxBlockSizeTokens <= 0 {
		p.ApproxBlockSizeTokens = d.ApproxBlockSizeTokens
	}
	if p.ApproxMaxBlocks <= 0 {
		p.ApproxMaxBlocks = d.ApproxMaxBlocks
	}
	if name == "" {
		name = Type
	}
	ranks, _ := index.(RankIndex)
	return &Producer{name: name, params: p, index: index, ranks: ranks, approx: approx}
}

// Params are the producer's parameters, defaults filled in.
func (p *Producer) Params() Params { return p.params }

// TypedName implements plugin.Plugin.
func (p *Producer) TypedName() plugin.TypedName { return plugin.TypedName{Type: Type, Name: p.name} }

// Produces implements plugin.Producer.
func (p *Producer) Produces() map[string]any {
	return map[string]any{
		datalayer.PrefixCacheMatchInfoKey: datalayer.PrefixCacheInfo{},
		RequestBlockKeysKey:               []uint64(nil),
		ApproxHashesKey:                   []uint64(nil),
	}
}

// ProducesInline implements prepare.InlineProducer: the producer reads
// only the index and the routing history, both in memory, so the request's
// own goroutine runs it.
func (p *Producer) ProducesInline() bool { return true }

// Consumes implements plugin.Consumer: the producer reads only the request
// and the index.
func (p *Producer) Consumes() map[string]any { return nil }

// group is the candidates that share a block size, a model and a way of
// keying blocks, and so share the request's block keys.
type group struct {
	blockSize int
	model     string
	// bigram: the engines key blocks by pairs of adjacent tokens (SGLang
	// with EAGLE), so a block's key takes the token after it.
	bigram  bool
	members []int
}

// Produce implements datalayer.DataProducer.
func (p *Producer) Produce(ctx context.Context, req *request.Request, cands []*datalayer.Candidate) error {
	sc := getScratch(len(cands))
	defer scratchPool.Put(sc)
	infos, addrs, matches, eps := sc.infos, sc.addrs, sc.matches, sc.eps
	var textHashes []uint64 // approximate hashes of the text, when tokens are unknown
	keysInMemory := false

	// What the datastore read of each candidate's stream as it made the
	// candidate serves, when it read it from this index: a second read,
	// by address, cost a map probe per candidate on cold memory.
	described := true
	for i, c := range cands {
		if eps[i], described = c.StreamInfoFrom(p.index); !described {
			break
		}
	}
	if !described {
		for _, c := range cands {
			addrs = append(addrs, c.Address)
		}
		p.index.Describe(addrs, eps)
	}
	sc.groups = p.groups(sc.groups, cands, eps)
	for _, g := range sc.groups {
		if err := ctx.Err(); err != nil {
			return err
		}
		if req.NoReproduciblePrefix {
			// Blocks keyed with multimodal extras never match a plain
			// request: nobody holds any of it, and nobody can be said to.
			for _, i := range g.members {
				infos[i] = datalayer.PrefixCacheInfo{BlockSizeTokens: g.blockSize}
			}
			continue
		}
		if !req.TokensKnown() {
			if textHashes == nil {
				textHashes = approx.Hashes(nil, req, p.params.ApproxBlockSizeTokens, p.params.ApproxMaxBlocks)
			}
			p.approximate(textHashes, p.params.ApproxBlockSizeTokens, len(textHashes), g.members, cands, infos)
			continue
		}

		total := len(req.TokenIDs) / g.blockSize
		if p.params.MaxPrefixBlocks > 0 {
			total = min(total, p.params.MaxPrefixBlocks)
		}
		// The first group's keys live in the request's memory (they are
		// published, and read until the pick is recorded): 4 KiB of
		// garbage per 8k-token request otherwise. Every group has one
		// usually.
		var keys []uint64
		if !keysInMemory {
			keys, keysInMemory = datalayer.RequestMemoryOverwritten[uint64](cands, p, total)[:0], true
		} else {
			keys = make([]uint64, 0, total)
		}
		if g.bigram {
			// A block's key takes the token after it: the last block has one
			// only when a token follows it.
			root := index.BigramRootKey(g.model, req.LoRA, req.CacheSalt)
			end := min(len(req.TokenIDs), total*g.blockSize+1)
			keys = index.AppendBigramBlockKeys(keys, root, req.TokenIDs[:end], g.blockSize)
		} else {
			root := index.RootKey(g.model, req.LoRA, req.CacheSalt)
			keys = index.AppendBlockKeys(keys, root, req.TokenIDs[:total*g.blockSize], g.blockSize)
		}
		addrs = addrs[:0]
		for _, i := range g.members {
			addrs = append(addrs, cands[i].Address)
		}
		p.index.Lookup(keys, addrs, matches)

		// Boxed once: converting the slice to an interface for each Put
		// would allocate a copy of its header per candidate.
		var sharedKeys any = keys
		var streamless []int
		for j, i := range g.members {
			state := eps[i].State
			cands[i].Put(RequestBlockKeysKey, sharedKeys)
			if state == datalayer.StreamNone {
				// Before an endpoint's first events, a prefix this EPP
				// sent it and is still prefilling there is known as
				// well as any: the speculative recorder put it in the
				// index. It is taken as such, being computed, rather
				// than as the routing history's guess.
				if m := matches[j]; m.Speculative > 0 && m.Speculative == m.Blocks && cands[i].InFlight.Prefilling > 0 {
					infos[i] = datalayer.PrefixCacheInfo{
						MatchBlocks: m.Blocks, TotalBlocks: total, BlockSizeTokens: g.blockSize,
						MatchTokens: m.Blocks * g.blockSize, SpeculativeBlocks: m.Speculative, State: state,
					}
					continue
				}
				streamless = append(streamless, i)
				continue
			}
			// A stream that is not exact keeps the index's answer, which
			// is still mostly right, and says how far it can be trusted.
			m := matches[j]
			infos[i] = datalayer.PrefixCacheInfo{
				MatchBlocks:       m.Blocks,
				TotalBlocks:       total,
				BlockSizeTokens:   g.blockSize,
				MatchTokens:       m.Blocks * g.blockSize,
				BlocksByTier:      m.ByTier,
				SpeculativeBlocks: m.Speculative,
				Exact:             state.Exact(),
				State:             state,
			}
			if p.ranks != nil {
				sc.rankMatches = p.ranks.LookupRanks(keys[:m.Blocks], cands[i].Address, sc.rankMatches)
				if len(sc.rankMatches) > 0 {
					perRank(&infos[i], sc.rankMatches)
				}
			}
		}
		if len(streamless) > 0 {
			// The routing history remembers picks by these same block keys
			// (the speculative recorder records them), so they are what it
			// is asked about.
			p.approximate(keys[:min(len(keys), p.params.ApproxMaxBlocks)], g.blockSize, total, streamless, cands, infos)
		}
	}
	var boxes infoBoxes
	for i, c := range cands {
		c.Put(datalayer.PrefixCacheMatchInfoKey, boxes.box(infos[i]))
	}
	return nil
}

// perRank sets info's Ranks from the index's per-rank matches, and its
// endpoint-wide match to the best rank's: the request is served by one
// rank, so blocks held only by several ranks together are no hit. The
// tiers of the blocks dropped are taken from the slowest first.
func perRank(info *datalayer.PrefixCacheInfo, ms []index.RankMatch) {
	ranks := make([]datalayer.RankPrefix, len(ms))
	info.Ranks = &ranks
	best, spec := 0, 0
	for j, m := range ms {
		ranks[j] = datalayer.RankPrefix{Rank: m.Rank, MatchBlocks: m.Blocks, SpeculativeBlocks: m.Speculative, State: m.State}
		if m.Blocks > best {
			best, spec = m.Blocks, m.Speculative
		}
	}
	if best >= info.MatchBlocks {
		return
	}
	info.MatchBlocks, info.MatchTokens = best, best*info.BlockSizeTokens
	info.SpeculativeBlocks = min(info.SpeculativeBlocks, spec)
	excess := -best + info.SpeculativeBlocks
	for _, n := range info.BlocksByTier {
		excess += n
	}
	for t := len(info.BlocksByTier) - 1; t >= 0 && excess > 0; t-- {
		cut := min(excess, info.BlocksByTier[t])
		info.BlocksByTier[t] -= cut
		excess -= cut
	}
}

// scratch is one Produce's working memory, pooled: none of it outlives
// the call (the answers are boxed copies).
type scratch struct {
	infos   []datalayer.PrefixCacheInfo
	addrs   []string
	matches []index.Match
	eps     []index.EndpointInfo
	groups  []group
	// rankMatches is one candidate's per-rank answer at a time.
	rankMatches []index.RankMatch
}

var scratchPool sync.Pool

func getScratch(n int) *scratch {
	sc, _ := scratchPool.Get().(*scratch)
	if sc == nil || cap(sc.infos) < n {
		sc = &scratch{
			infos: make([]datalayer.PrefixCacheInfo, n), addrs: make([]string, 0, n),
			matches: make([]index.Match, n), eps: make([]index.EndpointInfo, n),
		}
	}
	sc.infos, sc.addrs, sc.matches, sc.eps = sc.infos[:n], sc.addrs[:0], sc.matches[:n], sc.eps[:n]
	clear(sc.infos)
	clear(sc.matches)
	return sc
}

// infoBoxes shares one boxed PrefixCacheInfo among the candidates whose
// answers are equal. Boxing a struct in an interface allocates a copy, and
// most of a request's candidates give the same answer (nothing held, or
// the same shared prefix), so boxing each was an allocation per candidate
// per request. A boxed value is never written through, so sharing it is safe.
type infoBoxes struct {
	vals  [4]datalayer.PrefixCacheInfo
	boxed [4]any
	n     int
}

func (b *infoBoxes) box(v datalayer.PrefixCacheInfo) any {
	for k := range b.n {
		if b.vals[k] == v {
			return b.boxed[k]
		}
	}
	var boxed any = v
	// The most recent distinct answers are kept: the candidates come in
	// address order, and equal answers tend to sit together.
	k := b.n % len(b.vals)
	if b.n < len(b.vals) {
		b.n++
	} else {
		copy(b.vals[:], b.vals[1:])
		copy(b.boxed[:], b.boxed[1:])
		k = len(b.vals) - 1
	}
	b.vals[k], b.boxed[k] = v, boxed
	return boxed
}

// approximate answers, from the routing-history fallback, for candidates
// that have no event stream (or when the request's tokens are unknown), and
// publishes the hashes a post-pick hook records for the picked one. Such an
// answer is never exact, and it knows no tiers: a remembered block counts as
// GPU, where the engine put it when it computed it.
func (p *Producer) approximate(hashes []uint64, blockSize, total int, members []int, cands []*datalayer.Candidate, infos []datalayer.PrefixCacheInfo) {
	out := make([]int, len(members))
	if p.approx != nil && len(hashes) > 0 {
		addrs := make([]string, len(members))
		for j, i := range members {
			addrs[j] = cands[i].Address
		}
		p.approx.Match(hashes, addrs, out)
	}
	var shared any = hashes // boxed once, as the keys are in Produce
	for j, i := range members {
		info := datalayer.PrefixCacheInfo{
			MatchBlocks:     out[j],
			TotalBlocks:     total,
			BlockSizeTokens: blockSize,
			MatchTokens:     out[j] * blockSize,
		}
		info.BlocksByTier[events.TierGPU] = out[j]
		infos[i] = info
		cands[i].Put(ApproxHashesKey, shared)
	}
}

// groups partitions the candidates by block size and model, in candidate
// order, so that keys are computed once per distinct pair. The groups are
// made in gs's memory (a pooled scratch's), members included.
func (p *Producer) groups(gs []group, cands []*datalayer.Candidate, eps []index.EndpointInfo) []group {
	gs = gs[:0]
	for i, c := range cands {
		bs := p.blockSize(c, eps[i])
		bigram := eps[i].Bigram
		k := 0
		for k < len(gs) && (gs[k].blockSize != bs || gs[k].model != c.Model || gs[k].bigram != bigram) {
			k++
		}
		if k == len(gs) {
			// Room for every candidate left: there is usually one group
			// holding them all, and growing it one append at a time cost
			// several allocations per request.
			var members []int
			if k < cap(gs) {
				members = gs[:k+1][k].members[:0]
			}
			gs = append(gs, group{blockSize: bs, model: c.Model, bigram: bigram, members: slices.Grow(members, len(cands)-i)})
		}
		gs[k].members = append(gs[k].members, i)
	}
	return gs
}

// blockSize is the candidate's block size: what its events say, else what
// its metrics say, else the default.
func (p *Producer) blockSize(c *datalayer.Candidate, ep index.EndpointInfo) int {
	if ep.BlockSize > 0 {
		return ep.BlockSize
	}
	if c.Metrics.BlockSize > 0 {
		return c.Metrics.BlockSize
	}
	return p.params.DefaultBlockSizeTokens
}
