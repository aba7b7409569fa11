package index

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// IndexOptions tunes an Index. The zero value is usable: no capacity bound,
// no tier ages, a 2s speculative TTL and the wall clock.
type Options struct {
	// MaxHoldings bounds the number of (block, endpoint, tier) holdings; a
	// store beyond it is dropped and its stream marked uncertain, since the
	// index then no longer mirrors that engine. Zero means no bound.
	MaxHoldings int
	// MaxHoldingsPerEndpoint bounds one endpoint's holdings the same way,
	// so that no one stream, however many blocks it names, can take the
	// room of the others. Zero means MaxHoldings/8 when MaxHoldings is
	// set, else no bound; negative means no bound.
	MaxHoldingsPerEndpoint int
	// TierMaxAge evicts a tier's holdings that long after their last store;
	// zero keeps them until removed. It is for tiers whose publishers never
	// send removals (LMCache's CPU tier).
	TierMaxAge [events.NumTiers]time.Duration
	// SpeculativeTTL is how long a Speculate holding lasts; zero means 2s.
	SpeculativeTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnUncertain, if set, is called (outside the index's locks) when the
	// index itself finds a stream inconsistent: a stored run whose parent it
	// never saw. The stream is already marked uncertain when it is called.
	OnUncertain func(s events.Stream, r events.Reason)
}

// DefaultSpeculativeTTL is the SpeculativeTTL of a zero IndexOptions.
const DefaultSpeculativeTTL = 2 * time.Second

// DefaultEndpointShare is the share of MaxHoldings one endpoint may hold
// when MaxHoldingsPerEndpoint is left zero: one eighth.
const DefaultEndpointShare = 8

// Index is the exact prefix index: which endpoint holds which block key, in
// which cache tier, built from the endpoints' KV events. It is an
// events.Sink. Apply for one endpoint is serialised by that endpoint's lock;
// lookups take only the per-shard read locks of the keys they visit, so they
// never wait for a whole batch to be applied.
type Index struct {
	opts   Options
	now    func() time.Time
	epoch  time.Time
	shards [numShards]keyShard

	// memberMu serialises membership changes; readers use the snapshot.
	memberMu sync.Mutex
	members  atomic.Pointer[map[string]*ixEndpoint]
	freeIDs  []uint16
	nextID   int
	// idLimit is one more than the largest endpoint id ever handed out, the
	// size a lookup's candidate table needs.
	idLimit atomic.Int32

	// specMu guards specQ; it is taken after an endpoint's mu and before
	// a shard's.
	specMu sync.Mutex
	specQ  []specRecord
	// specHead is the first live record of specQ; deadlines are monotonic
	// because the TTL is fixed, so expiry only ever pops the front.
	specHead int

	scratch sync.Pool

	stats indexStats
}

var (
	_ events.Sink             = (*Index)(nil)
	_ datalayer.StreamHandles = (*Index)(nil)
)

type specRecord struct {
	key        uint64
	ep         uint16
	deadlineMs uint64
}

func recordKey(r *specRecord) uint64 { return r.key }

type ixEndpoint struct {
	addr string
	id   uint16

	// mu serialises Apply into the endpoint's streams with its removal and
	// with speculation, so nothing is added for an endpoint that has left.
	mu      sync.Mutex
	gone    bool
	streams map[int]*ixStream
	// left is set, without mu, as the endpoint leaves the membership, so
	// that its handle (StreamHandle) goes stale.
	left atomic.Bool

	// state and last are read without mu by State.
	state atomic.Uint32
	last  atomic.Int64
	// blockSize is the engine's block size in tokens, from the
	// Kv-Block-Size header or its stores; read without mu by BlockSize.
	blockSize atomic.Int32
	// held counts the endpoint's holdings, all streams and tiers, for
	// MaxHoldingsPerEndpoint. Guarded by mu.
	held int64
	// gpuHeld counts the endpoint's GPU-tier holdings, all streams: what
	// its GPU cache holds, against the capacity its metrics give, for the
	// placement that weighs what a pick would evict (StreamInfo.GPUBlocks).
	// Written under mu, read without it.
	gpuHeld atomic.Int64

	// layout is the engine's KV-cache groups (nil until a store names
	// one); bigram is set once its stores key blocks by token pairs.
	// Both are read without mu by lookups.
	layout atomic.Pointer[layout]
	bigram atomic.Bool

	// rankSets, once the endpoint shows a second data-parallel rank, are
	// its ranks' own key sets (ranks.go); nil before.
	rankSets atomic.Pointer[rankSets]

	// Scratch for keying stores, used under mu.
	scratchKeys   []uint64
	scratchTokens []uint32
}

// NewIndex returns an empty index. Its metrics are registered with reg unless
// reg is nil.
func New(opts Options, reg prometheus.Registerer) *Index {
	if opts.SpeculativeTTL <= 0 {
		opts.SpeculativeTTL = DefaultSpeculativeTTL
	}
	if opts.MaxHoldingsPerEndpoint == 0 && opts.MaxHoldings > 0 {
		opts.MaxHoldingsPerEndpoint = max(1, opts.MaxHoldings/DefaultEndpointShare)
	}
	ix := &Index{opts: opts, now: opts.Now}
	if ix.now == nil {
		ix.now = time.Now
	}
	ix.epoch = ix.now()
	for i := range ix.shards {
		ix.shards[i].m = newKeyTable()
	}
	empty := map[string]*ixEndpoint{}
	ix.members.Store(&empty)
	ix.scratch.New = func() any { return new(lookupScratch) }
	if reg != nil {
		reg.MustRegister(&indexCollector{ix: ix})
	}
	return ix
}

func (ix *Index) shard(key uint64) *keyShard { return &ix.shards[key>>shardShift] }

// ms is t as milliseconds since the index's epoch, the unit of speculative
// deadlines; times before the epoch count as the epoch.
func (ix *Index) ms(t time.Time) uint64 {
	d := t.Sub(ix.epoch)
	if d < 0 {
		return 0
	}
	return uint64(d / time.Millisecond)
}

func (ix *Index) member(addr string) *ixEndpoint { return (*ix.members.Load())[addr] }

// AddEndpoint admits addr: its events are applied from now on. Adding an
// address already present does nothing.
func (ix *Index) AddEndpoint(addr string) {
	ix.memberMu.Lock()
	defer ix.memberMu.Unlock()
	old := *ix.members.Load()
	if old[addr] != nil {
		return
	}
	var id uint16
	if n := len(ix.freeIDs); n > 0 {
		id = ix.freeIDs[n-1]
		ix.freeIDs = ix.freeIDs[:n-1]
	} else {
		if ix.nextID > epMask {
			// Out of ids: the endpoint's events will be counted as unknown.
			ix.stats.dropped[dropNoEndpointID].Add(1)
			return
		}
		id = uint16(ix.nextID)
		ix.nextID++
		ix.idLimit.Store(int32(ix.nextID))
	}
	next := make(map[string]*ixEndpoint, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[addr] = &ixEndpoint{addr: addr, id: id, streams: map[int]*ixStream{}}
	ix.members.Store(&next)
}

// RemoveEndpoint forgets addr and everything it held; its events that are
// still in flight are ignored. A later AddEndpoint of the same address
// starts clean.
func (ix *Index) RemoveEndpoint(addr string) {
	ix.memberMu.Lock()
	defer ix.memberMu.Unlock()
	old := *ix.members.Load()
	ep := old[addr]
	if ep == nil {
		return
	}
	next := make(map[string]*ixEndpoint, len(old))
	for k, v := range old {
		if k != addr {
			next[k] = v
		}
	}
	ix.members.Store(&next)
	ep.left.Store(true)

	var d delta
	ep.mu.Lock()
	ep.gone = true
	for _, st := range ep.streams {
		ix.clearStream(ep, st, &d)
	}
	ep.mu.Unlock()
	ix.dropSpeculation(ep.id, &d)
	ix.stats.add(&d)
	ix.freeIDs = append(ix.freeIDs, ep.id)
}

// State says how far the index can be trusted for addr, and when it last
// applied a batch from it (the zero time if never).
func (ix *Index) State(addr string) (datalayer.StreamState, time.Time) {
	ep := ix.member(addr)
	if ep == nil {
		return datalayer.StreamNone, time.Time{}
	}
	var last time.Time
	if ns := ep.last.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	return datalayer.StreamState(ep.state.Load()), last
}

// Bigram reports whether addr's engine keys blocks by pairs of adjacent
// tokens (SGLang with EAGLE), so that a request's keys for it must be made
// with BigramRootKey and AppendBigramBlockKeys.
func (ix *Index) Bigram(addr string) bool {
	if ep := ix.member(addr); ep != nil {
		return ep.bigram.Load()
	}
	return false
}

// EndpointInfo is what the index knows of one endpoint that a request's
// lookup needs first (see Describe).
type EndpointInfo = datalayer.StreamInfo

// Describe fills out[i] with what the index knows of addrs[i], reading its
// membership once for all of them. out must be at least as long as addrs.
func (ix *Index) Describe(addrs []string, out []EndpointInfo) {
	members := *ix.members.Load()
	for i, a := range addrs {
		ep := members[a]
		if ep == nil {
			out[i] = EndpointInfo{State: datalayer.StreamNone}
			continue
		}
		out[i] = ep.info()
	}
}

func (ep *ixEndpoint) info() EndpointInfo {
	return EndpointInfo{
		State:     datalayer.StreamState(ep.state.Load()),
		BlockSize: int(ep.blockSize.Load()),
		Bigram:    ep.bigram.Load(),
		GPUBlocks: int(max(ep.gpuHeld.Load(), 0)),
	}
}

// addHeld adds d's changes to the endpoint's holdings counts. Called with
// mu held.
func (ep *ixEndpoint) addHeld(d *delta) {
	ep.held += d.held()
	ep.gpuHeld.Add(d.holdings[events.TierGPU])
}

// subHeld takes back changes added by addHeld: Expire shares one delta
// across endpoints, so each endpoint adds only what its own pass added.
func (ep *ixEndpoint) subHeld(d *delta) {
	ep.held -= d.held()
	ep.gpuHeld.Add(-d.holdings[events.TierGPU])
}

// StreamHandle returns addr's handle (nil when addr is not a member), which
// reads what Describe would say of addr until addr leaves the index.
func (ix *Index) StreamHandle(addr string) datalayer.StreamHandle {
	if ep := ix.member(addr); ep != nil {
		return ep
	}
	return nil
}

// StreamInfo implements datalayer.StreamHandle: ok is false once the
// endpoint has left (RemoveEndpoint), even if its address was added again.
func (ep *ixEndpoint) StreamInfo() (EndpointInfo, bool) {
	if ep.left.Load() {
		return EndpointInfo{}, false
	}
	return ep.info(), true
}

// MarkExact declares addr's streams in step again, after a resynchronisation
// has rebuilt what they hold.
func (ix *Index) MarkExact(addr string) {
	ep := ix.member(addr)
	if ep == nil {
		return
	}
	ep.mu.Lock()
	for _, st := range ep.streams {
		st.state = datalayer.StreamExact
	}
	ep.refreshState()
	ep.mu.Unlock()
}

// refreshState publishes the endpoint's state: the least trustworthy of
// its streams' (see worse), none when no stream has seen events. Called
// with mu held.
func (ep *ixEndpoint) refreshState() {
	s := datalayer.StreamNone
	for _, st := range ep.streams {
		s = worse(s, st.state)
		st.pubState.Store(uint32(st.state))
	}
	ep.state.Store(uint32(s))
}

// Speculate records that addr will soon hold keys (it was just picked for a
// request with these blocks). The holdings last SpeculativeTTL unless real
// events replace them, and lookups report them apart.
func (ix *Index) Speculate(addr string, keys []uint64) {
	ep := ix.member(addr)
	if ep == nil || len(keys) == 0 {
		return
	}
	now := ix.now()
	deadline := ix.ms(now.Add(ix.opts.SpeculativeTTL))
	var d delta
	ep.mu.Lock()
	if !ep.gone {
		// The records are queued before ep.mu is released, so that an
		// endpoint leaving meanwhile finds them all when it drops its
		// speculation and frees its id.
		ix.specMu.Lock()
		// One shard is held at a time, as the lock order (ep.mu, specMu,
		// a shard) wants; with many keys each shard is locked once for
		// all of its keys. The records' order in specQ does not matter:
		// they share one deadline.
		writeByShard(ix, keys, keyOf, func(sc *lookupScratch) *[]uint64 { return &sc.grouped },
			func(sh *keyShard, k *uint64) { ix.speculateLocked(sh, *k, ep.id, deadline, &d) })
		ix.specMu.Unlock()
	}
	ep.mu.Unlock()
	ix.expireSpeculation(ix.ms(now), &d)
	ix.stats.add(&d)
}

// speculateLocked records on sh, whose lock is held as is specMu, that
// ep will hold k until deadline, and queues the record for expiry.
func (ix *Index) speculateLocked(sh *keyShard, k uint64, ep uint16, deadline uint64, d *delta) {
	if sh.speculate(k, ep, deadline, d) {
		ix.specQ = append(ix.specQ, specRecord{key: k, ep: ep, deadlineMs: deadline})
	}
}

// expireSpeculation removes speculative holdings whose deadline has passed.
func (ix *Index) expireSpeculation(nowMs uint64, d *delta) {
	ix.specMu.Lock()
	defer ix.specMu.Unlock()
	end := ix.specHead
	for end < len(ix.specQ) && ix.specQ[end].deadlineMs <= nowMs {
		end++
	}
	due := ix.specQ[ix.specHead:end]
	var evicted int64
	writeByShard(ix, due, recordKey, func(sc *lookupScratch) *[]specRecord { return &sc.due },
		func(sh *keyShard, r *specRecord) {
			if sh.unspeculateLocked(r.key, r.ep, nowMs, false, d) {
				evicted++
			}
		})
	if evicted > 0 {
		ix.stats.evictions[evictSpeculative].Add(evicted)
	}
	ix.specHead = end
	// Compact once the dead front outweighs the live rest.
	if ix.specHead > 1024 && ix.specHead*2 > len(ix.specQ) {
		n := copy(ix.specQ, ix.specQ[ix.specHead:])
		ix.specQ = ix.specQ[:n]
		ix.specHead = 0
	}
}

// dropSpeculation removes every speculative holding of an endpoint that
// leaves, so that its id can be handed to another.
func (ix *Index) dropSpeculation(ep uint16, d *delta) {
	ix.specMu.Lock()
	defer ix.specMu.Unlock()
	for _, r := range ix.specQ[ix.specHead:] {
		if r.ep == ep {
			ix.shard(r.key).unspeculate(r.key, ep, 0, true, d)
		}
	}
}

// Expire evicts what has outlived its time: speculative holdings past their
// TTL and holdings older than their tier's TierMaxAge. Apply and Speculate
// do this as they go for what they touch; Expire (or Run) covers endpoints
// that have gone quiet.
func (ix *Index) Expire() {
	now := ix.now()
	var d delta
	ix.expireSpeculation(ix.ms(now), &d)
	for _, ep := range *ix.members.Load() {
		ep.mu.Lock()
		if !ep.gone {
			before := d
			for _, st := range ep.streams {
				ix.expireAged(ep, st, now, &d)
			}
			ep.addHeld(&d)
			ep.subHeld(&before)
		}
		ep.mu.Unlock()
	}
	ix.stats.add(&d)
}

// Run calls Expire every interval (1s if interval is not positive) until ctx
// is done.
func (ix *Index) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			ix.Expire()
		}
	}
}
