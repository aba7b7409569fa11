package index

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// ixStream is one engine's view in the index: vLLM's opaque block hashes
// (handles) mapped to kvroute keys, with the tiers each is held in.
type ixStream struct {
	// handles maps a vLLM hash to its key, with the low keyLowBits bits set
	// for each tier the engine holds the block in at least once.
	handles map[uint64]uint64
	// dups counts references beyond the first per (hash, tier): vLLM stores
	// the same hash again without de-duplicating, then removes per copy.
	dups map[dupKey]uint32

	state    datalayer.StreamState
	instance string
	seq      uint64
	hasSeq   bool

	aged [events.NumTiers]*ageQueue

	// gidx is the KV-cache group this stream holds: 0 for an engine's
	// stream itself, whose groups holds its other groups' sub-streams,
	// each with root naming that stream.
	gidx   int
	groups map[int]*ixStream
	root   *ixStream
	// coarse counts, for the hash of a store whose block spans several of
	// the engine's (LMCache's chunks), the blocks before its last, which
	// are held under synthHandle names.
	coarse map[uint64]uint8

	// rank is the stream's data-parallel rank; pubState its state, for
	// readers without ep.mu. rankKeys counts the (handle, tier) references
	// of the stream and of its groups' sub-streams on each key they hold
	// (a group's keys carry its mask, as in the shards) and rankSpec holds
	// the keys a pick
	// of this rank expects it to store, with their deadlines (ms since the
	// index's epoch): both nil until the endpoint has several ranks
	// (ranks.go), guarded by its rankSets' mu.
	rank     int
	pubState atomic.Uint32
	rankKeys map[uint64]uint32
	rankSpec map[uint64]uint64
}

type dupKey struct {
	hash uint64
	tier events.Tier
}

// ageQueue remembers when each block of a tier with a maximum age was last
// stored; records are appended in time order and checked from the front.
type ageQueue struct {
	last map[uint64]int64
	q    []ageRecord
	head int
}

type ageRecord struct {
	hash uint64
	at   int64
}

func (ep *ixEndpoint) stream(rank int) *ixStream {
	st := ep.streams[rank]
	if st == nil {
		st = &ixStream{handles: make(map[uint64]uint64), rank: rank}
		ep.streams[rank] = st
		if rs := ep.rankSets.Load(); rs != nil {
			rs.add(st)
		} else if rank != 0 || len(ep.streams) > 1 {
			ep.startRanks()
		}
	}
	return st
}

// Apply applies one batch of one engine's events. Events from an endpoint
// that is not a member are ignored, as is a batch already applied (same
// instance, sequence not after the last).
func (ix *Index) Apply(o events.Origin, b *events.Batch) {
	ep := ix.member(o.Endpoint)
	if ep == nil {
		ix.stats.dropped[dropUnknownEndpoint].Add(int64(len(b.Events)))
		return
	}
	now := ix.now()
	var d delta
	var unknownParent bool
	ep.mu.Lock()
	if ep.gone {
		ep.mu.Unlock()
		ix.stats.dropped[dropUnknownEndpoint].Add(int64(len(b.Events)))
		return
	}
	st := ep.stream(o.DPRank)
	if st.instance != "" && o.Instance != "" && st.instance != o.Instance {
		// A new engine behind the stream, and nobody said so: what the old
		// one held is gone.
		ix.clearStream(ep, st, &d)
		st.state = datalayer.StreamExact
		ix.stats.restarts.Add(1)
	} else if st.hasSeq && o.Seq <= st.seq {
		ep.mu.Unlock()
		ix.stats.dropped[dropDuplicateBatch].Add(int64(len(b.Events)))
		return
	}
	if o.Instance != "" {
		st.instance = o.Instance
	}
	st.seq, st.hasSeq = o.Seq, true
	ep.noteBlockSize(o, b)
	if st.state == datalayer.StreamNone {
		st.state = datalayer.StreamExact
	}
	unknownParent = ix.applyEvents(ep, st, o, b, now, &d)
	if unknownParent && st.state == datalayer.StreamPartial {
		// A late joiner meets the parents it never saw: the run is
		// dropped, which is missing knowledge, not false knowledge, and
		// no resync can be asked for again and again because of it.
		unknownParent = false
	}
	if unknownParent {
		st.state = datalayer.StreamUncertain
	}
	ix.expireAged(ep, st, now, &d)
	ep.addHeld(&d)
	ep.refreshState()
	ep.last.Store(now.UnixNano())
	ep.mu.Unlock()
	ix.stats.add(&d)
	if unknownParent {
		ix.stats.uncertain[events.ReasonUnknownParent].Add(1)
		if ix.opts.OnUncertain != nil {
			ix.opts.OnUncertain(o.Stream, events.ReasonUnknownParent)
		}
	}
}

// applyEvents applies a batch's events to a stream; it reports whether a
// stored run named a parent the stream never saw. Called with ep.mu held.
func (ix *Index) applyEvents(ep *ixEndpoint, st *ixStream, o events.Origin, b *events.Batch, now time.Time, d *delta) (unknownParent bool) {
	for i, n := range b.Ignored {
		if n > 0 {
			ix.stats.ignored[i].Add(int64(n))
		}
	}
	for i := range b.Events {
		e := &b.Events[i]
		// Hybrid models publish each KV-cache group apart, under the same
		// hashes; each group's holdings are kept apart (see hybrid.go).
		class := ep.groupClassOf(e.GroupIdx)
		if e.Kind == events.KindBlockStored {
			class = ep.noteGroup(e)
		}
		if class == classNone && e.Kind != events.KindAllBlocksCleared {
			ix.stats.dropped[dropOtherGroup].Add(int64(max(1, len(e.BlockHashes))))
			continue
		}
		sub := st.group(e.GroupIdx)
		switch e.Kind {
		case events.KindBlockStored:
			if !ix.applyStored(ep, st, sub, o, e, now, d) {
				unknownParent = true
			}
		case events.KindBlockRemoved:
			for j, h := range e.BlockHashes {
				remaining := int32(-1)
				if j < len(e.RemainingCopies) {
					remaining = e.RemainingCopies[j]
				}
				if !ix.unrefCopies(ep, sub, h, e.Medium, remaining, d) {
					ix.stats.dropped[dropUnknownHandle].Add(1)
				}
			}
		case events.KindAllBlocksCleared:
			ix.clearStream(ep, st, d)
			// An empty cache is known exactly.
			st.state = datalayer.StreamExact
		default:
			ix.stats.dropped[dropUnknownKind].Add(1)
			continue
		}
		ix.stats.applied[e.Kind].Add(1)
	}
	return unknownParent
}

// noteBlockSize records the engine's block size: the header's when it has
// one, else that of the batch's first full store.
func (ep *ixEndpoint) noteBlockSize(o events.Origin, b *events.Batch) {
	bs := o.BlockSize
	for i := 0; bs <= 0 && i < len(b.Events); i++ {
		if e := &b.Events[i]; e.Kind == events.KindBlockStored && len(e.TokenIDs) > 0 {
			bs = e.BlockSize
		}
	}
	if bs > 0 && int(ep.blockSize.Load()) != bs {
		ep.blockSize.Store(int32(bs))
	}
}

// applyStored applies a BlockStored event to sub, the sub-stream of st that
// holds the event's KV-cache group. It returns false when the event names a
// parent no group of the stream ever stored: the run is dropped, since
// assuming it starts at the root would file its blocks under the wrong
// prefix.
func (ix *Index) applyStored(ep *ixEndpoint, st, sub *ixStream, o events.Origin, e *events.Event, now time.Time, d *delta) bool {
	if len(e.BlockHashes) == 0 {
		return true
	}
	gm := groupMask(sub.gidx)
	if len(e.TokenIDs) == 0 {
		// A placeholder (CPU offload): the blocks are known by their hash on
		// this stream, and now held in one more tier.
		for _, h := range e.BlockHashes {
			hv, ok := sub.handles[h]
			if !ok {
				ix.stats.dropped[dropUnknownHandle].Add(1)
				continue
			}
			for j := 0; j < int(sub.coarse[h]); j++ {
				if cv, ok := sub.handles[synthHandle(h, j)]; ok {
					ix.ref(ep, sub, synthHandle(h, j), cv&keyMask, e.Medium, now, d)
				}
			}
			ix.ref(ep, sub, h, hv&keyMask, e.Medium, now, d)
		}
		return true
	}
	bs := e.BlockSize
	if bs <= 0 {
		bs = o.BlockSize
	}
	if bs <= 0 {
		ix.stats.dropped[dropMalformed].Add(int64(len(e.BlockHashes)))
		return true
	}
	// A store whose block spans several of the engine's (an LMCache chunk,
	// a coarser group of a hybrid model) is keyed at the engine's block
	// size, each of its blocks held; one smaller than the engine's, or not
	// a multiple of it, is a partial block, which has no key.
	span := 1
	if ebs := int(ep.blockSize.Load()); ebs > 0 && bs != ebs {
		if bs < ebs || bs%ebs != 0 {
			ix.stats.dropped[dropPartialBlock].Add(int64(len(e.BlockHashes)))
			return true
		}
		span, bs = bs/ebs, ebs
	}
	var parent uint64
	if e.HasParent {
		k, ok := st.keyOf(sub, e.ParentHash)
		if !ok {
			ix.stats.dropped[dropUnknownParent].Add(int64(len(e.BlockHashes)))
			return false
		}
		parent = k
	}

	// The chunk (of the event's own block size) each hash names: its
	// offset for a sparse store, its position otherwise.
	sparse := len(e.BlockOffsets) > 0
	chunkOf := func(i int) int {
		if sparse {
			return int(e.BlockOffsets[i])
		}
		return i
	}
	tokens := e.TokenIDs
	avail := len(tokens) / (bs * span) // whole chunks the tokens cover
	n := len(e.BlockHashes)
	for n > 0 && chunkOf(n-1) >= avail {
		n--
	}
	if n < len(e.BlockHashes) {
		// Partial blocks (hybrid models) have no key; children that name
		// them as parent will find them unknown.
		ix.stats.dropped[dropPartialBlock].Add(int64(len(e.BlockHashes) - n))
	}
	if n == 0 {
		return true
	}
	nb := (chunkOf(n-1) + 1) * span // engine blocks to key
	if e.Bigram {
		tokens = append(ep.tokenScratch(len(tokens)+1), tokens...)
		tokens = append(tokens, e.BigramNext)
		ep.bigram.Store(true)
	}

	// An adapter known only by its deprecated integer id cannot be named by
	// a request, so its blocks must never match one.
	anonLoRA := e.LoRAName == "" && e.HasLoRAID && e.LoRAID != 0
	// Extras are known only for the chunks a sparse store names; if any of
	// them marks a block, every block of the run is taken as marked.
	markAll := anonLoRA
	extraOf := func(chunk int) (events.ExtraKey, bool) {
		if !sparse {
			if chunk < len(e.ExtraKeys) {
				return e.ExtraKeys[chunk], true
			}
			return nil, true
		}
		i, ok := slices.BinarySearch(e.BlockOffsets[:n], int32(chunk))
		if !ok {
			return nil, false
		}
		if i < len(e.ExtraKeys) {
			return e.ExtraKeys[i], true
		}
		return nil, true
	}
	if sparse {
		for i := 0; i < n && i < len(e.ExtraKeys); i++ {
			if len(e.ExtraKeys[i]) == 0 {
				continue
			}
			if _, plain := plainExtras(e.ExtraKeys[i], e, !e.HasParent && chunkOf(i) == 0); !plain {
				markAll = true
			}
		}
	}
	opaque := e.OpaqueTokens
	keys := ep.keyScratch(nb)
	for b := 0; b < nb; b++ {
		chunk := b / span
		extra, _ := extraOf(chunk)
		salt, plain := "", true
		if len(extra) > 0 && b%span == 0 {
			salt, plain = plainExtras(extra, e, b == 0 && !e.HasParent)
		}
		if b == 0 && !e.HasParent {
			if !plain || salt == "" {
				salt = e.CacheSalt
			}
			if e.Bigram {
				parent = BigramRootKey(o.Model, e.LoRAName, salt)
			} else {
				parent = RootKey(o.Model, e.LoRAName, salt)
			}
		}
		end := (b + 1) * bs
		if e.Bigram {
			end++
		}
		k := blockKey(parent, tokens[b*bs:end])
		for len(opaque) > 0 && int(opaque[0]) < b*bs {
			opaque = opaque[1:]
		}
		if len(opaque) > 0 && int(opaque[0]) < (b+1)*bs {
			plain = false
		}
		if !plain || markAll {
			k = markedKey(k, extra)
		}
		keys[b] = k
		parent = k
	}

	for i := 0; i < n; i++ {
		if reason, full := ix.full(ep, d); full {
			ix.stats.dropped[reason].Add(int64(n - i))
			st.state = datalayer.StreamUncertain
			return true
		}
		h := e.BlockHashes[i]
		last := (chunkOf(i)+1)*span - 1
		k := keys[last]
		if sparse {
			// A hash names one prefix in every group: where another group
			// already knows it, its key stands (a sparse store leaves out
			// chunks, and with them what their extras said).
			if known, ok := st.keyOf(sub, h); ok {
				k = known
			}
		}
		if span > 1 && ep.groupClassOf(sub.gidx) != classMamba {
			if sub.coarse == nil {
				sub.coarse = make(map[uint64]uint8)
			}
			sub.coarse[h] = uint8(min(span-1, 255))
			for j := 0; j < span-1 && j < 255; j++ {
				ix.ref(ep, sub, synthHandle(h, j), keys[last-span+1+j]^gm, e.Medium, now, d)
			}
		}
		ix.ref(ep, sub, h, k^gm, e.Medium, now, d)
	}
	return true
}

// keyScratch returns ep's scratch of n keys for keying one store; it is
// reused from store to store under ep.mu.
func (ep *ixEndpoint) keyScratch(n int) []uint64 {
	if cap(ep.scratchKeys) < n {
		ep.scratchKeys = make([]uint64, n)
	}
	return ep.scratchKeys[:n]
}

// tokenScratch returns ep's empty token scratch with room for n tokens.
func (ep *ixEndpoint) tokenScratch(n int) []uint32 {
	if cap(ep.scratchTokens) < n {
		ep.scratchTokens = make([]uint32, 0, n)
	}
	return ep.scratchTokens[:0]
}

// full reports whether a holding bound is reached, the endpoint's or the
// index's, counting the changes of the batch under way (d holds only ep's),
// and which: the drop reason.
func (ix *Index) full(ep *ixEndpoint, d *delta) (reason int, full bool) {
	if per := ix.opts.MaxHoldingsPerEndpoint; per > 0 && ep.held+d.held() >= int64(per) {
		return dropEndpointCapacity, true
	}
	if ix.opts.MaxHoldings <= 0 {
		return 0, false
	}
	n := d.held()
	for t := range ix.stats.holdings {
		n += ix.stats.holdings[t].Load()
	}
	return dropCapacity, n >= int64(ix.opts.MaxHoldings)
}

// ref adds a reference to (stream, hash, tier) for the block with key k.
// Only the first reference per (stream, hash, tier) is a reference on the
// key's holder, so duplicate stores and their removals balance.
func (ix *Index) ref(ep *ixEndpoint, st *ixStream, h, k uint64, t events.Tier, now time.Time, d *delta) {
	hv, ok := st.handles[h]
	if ok && hv&keyMask != k {
		// The engine reused the handle for other content: the old block is
		// gone from every tier.
		ix.forget(ep, st, h, d)
		ok = false
	}
	bit := uint64(1) << t
	switch {
	case ok && hv&bit != 0:
		if st.dups == nil {
			st.dups = make(map[dupKey]uint32)
		}
		st.dups[dupKey{h, t}]++
	case ix.shard(k).addRef(k, ep.id, t, d):
		if !ok {
			hv = k
		}
		st.handles[h] = hv | bit
		if r := st.rankRoot(); r.rankKeys != nil {
			ep.rankRef(r, k)
		}
	default:
		ix.stats.dropped[dropRefOverflow].Add(1)
		return
	}
	if ix.opts.TierMaxAge[t] > 0 {
		q := st.aged[t]
		if q == nil {
			q = &ageQueue{last: make(map[uint64]int64)}
			st.aged[t] = q
		}
		at := now.UnixNano()
		q.last[h] = at
		q.q = append(q.q, ageRecord{hash: h, at: at})
	}
}

// unref drops a reference to (stream, hash, tier); it reports false if the
// stream holds no such reference.
func (ix *Index) unref(ep *ixEndpoint, st *ixStream, h uint64, t events.Tier, d *delta) bool {
	hv, ok := st.handles[h]
	bit := uint64(1) << t
	if !ok || hv&bit == 0 {
		return false
	}
	dk := dupKey{h, t}
	if n := st.dups[dk]; n > 0 {
		if n == 1 {
			delete(st.dups, dk)
		} else {
			st.dups[dk] = n - 1
		}
		return true
	}
	ix.dropTier(ep, st, h, hv, t, d)
	return true
}

// unrefCopies applies a removal of h from tier t. When the engine says how
// many copies remain (remaining >= 0), that count stands, whatever the
// index had counted: none left forgets the holding, some left keeps it
// with that many references. Otherwise one reference is dropped.
func (ix *Index) unrefCopies(ep *ixEndpoint, st *ixStream, h uint64, t events.Tier, remaining int32, d *delta) bool {
	if remaining < 0 {
		return ix.unref(ep, st, h, t, d)
	}
	hv, ok := st.handles[h]
	if !ok || hv&(1<<t) == 0 {
		return false
	}
	dk := dupKey{h, t}
	if remaining == 0 {
		delete(st.dups, dk)
		ix.dropTier(ep, st, h, hv, t, d)
		return true
	}
	if remaining == 1 {
		delete(st.dups, dk)
		return true
	}
	if st.dups == nil {
		st.dups = make(map[dupKey]uint32)
	}
	st.dups[dk] = uint32(remaining - 1)
	return true
}

// dropTier drops the stream's last reference to h in tier t, and those of
// a coarse store's other blocks.
func (ix *Index) dropTier(ep *ixEndpoint, st *ixStream, h, hv uint64, t events.Tier, d *delta) {
	bit := uint64(1) << t
	ix.shard(hv&keyMask).delRef(hv&keyMask, ep.id, t, d)
	if r := st.rankRoot(); r.rankKeys != nil {
		ep.rankUnref(r, hv&keyMask)
	}
	if hv &^= bit; hv&^keyMask == 0 {
		delete(st.handles, h)
	} else {
		st.handles[h] = hv
	}
	if q := st.aged[t]; q != nil {
		delete(q.last, h)
	}
	if n, ok := st.coarse[h]; ok {
		for j := 0; j < int(n); j++ {
			sh := synthHandle(h, j)
			if cv, ok := st.handles[sh]; ok && cv&bit != 0 {
				delete(st.dups, dupKey{sh, t})
				ix.dropTier(ep, st, sh, cv, t, d)
			}
		}
		if _, held := st.handles[h]; !held {
			delete(st.coarse, h)
		}
	}
}

// forget drops every reference the stream has on a handle, in every tier.
func (ix *Index) forget(ep *ixEndpoint, st *ixStream, h uint64, d *delta) {
	for t := events.Tier(0); t < events.NumTiers; t++ {
		cur, ok := st.handles[h]
		if !ok {
			break
		}
		if cur&(1<<t) == 0 {
			continue
		}
		delete(st.dups, dupKey{h, t})
		ix.dropTier(ep, st, h, cur, t, d)
	}
	delete(st.handles, h)
}

// clearStream forgets everything a stream holds (AllBlocksCleared, a
// restart, the endpoint leaving), keeping its sequence position. Called with
// ep.mu held.
func (ix *Index) clearStream(ep *ixEndpoint, st *ixStream, d *delta) {
	for _, hv := range st.handles {
		for t := events.Tier(0); t < events.NumTiers; t++ {
			if hv&(1<<t) != 0 {
				ix.shard(hv&keyMask).delRef(hv&keyMask, ep.id, t, d)
			}
		}
	}
	// A fresh map rather than clear: Go maps never shrink, and a restarted
	// engine may never refill what the old one held.
	st.handles = make(map[uint64]uint64)
	if st.rankKeys != nil {
		// The rank's set holds its groups' keys too, which go below.
		ep.rankClear(st)
	}
	st.dups = nil
	st.coarse = nil
	st.aged = [events.NumTiers]*ageQueue{}
	// The engine's other KV-cache groups go with it.
	for _, sub := range st.groups {
		ix.clearStream(ep, sub, d)
	}
	st.groups = nil
}

// expireAged evicts the stream's holdings in tiers with a maximum age whose
// last store is older than that age, in each of its KV-cache groups. Called
// with ep.mu held.
func (ix *Index) expireAged(ep *ixEndpoint, st *ixStream, now time.Time, d *delta) {
	for _, sub := range st.groups {
		ix.expireAged(ep, sub, now, d)
	}
	for t, q := range st.aged {
		if q == nil {
			continue
		}
		cutoff := now.Add(-ix.opts.TierMaxAge[t]).UnixNano()
		for q.head < len(q.q) && q.q[q.head].at <= cutoff {
			r := q.q[q.head]
			q.head++
			if last, ok := q.last[r.hash]; !ok || last != r.at {
				continue // removed since, or stored again later
			}
			tier := events.Tier(t)
			delete(st.dups, dupKey{r.hash, tier})
			ix.unref(ep, st, r.hash, tier, d)
			ix.stats.evictions[evictMaxAge].Add(1)
		}
		if q.head > 1024 && q.head*2 > len(q.q) {
			n := copy(q.q, q.q[q.head:])
			q.q = q.q[:n]
			q.head = 0
		}
	}
}

// Uncertain marks the stream's endpoint uncertain; it keeps what it holds.
// A late join (events.ReasonLateJoin) marks it partial instead: nothing it
// holds from then on can be false.
func (ix *Index) Uncertain(s events.Stream, r events.Reason) {
	ep := ix.member(s.Endpoint)
	if ep == nil {
		return
	}
	ep.mu.Lock()
	if !ep.gone {
		st := ep.stream(s.DPRank)
		if r == events.ReasonLateJoin {
			st.state = lateJoin(st.state)
		} else {
			st.state = datalayer.StreamUncertain
		}
		ep.refreshState()
	}
	ep.mu.Unlock()
	if int(r) < len(ix.stats.uncertain) {
		ix.stats.uncertain[r].Add(1)
	}
}

// Restart forgets everything the stream's engine held: a new engine starts
// with an empty cache, which the index then knows exactly.
func (ix *Index) Restart(s events.Stream) {
	ep := ix.member(s.Endpoint)
	if ep == nil {
		return
	}
	var d delta
	ep.mu.Lock()
	if !ep.gone {
		st := ep.stream(s.DPRank)
		ix.clearStream(ep, st, &d)
		ep.addHeld(&d)
		st.hasSeq, st.instance = false, ""
		st.state = datalayer.StreamExact
		ep.refreshState()
	}
	ep.mu.Unlock()
	ix.stats.add(&d)
	ix.stats.restarts.Add(1)
}
