package index

import (
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
		st = &ixStream{handles: make(map[uint64]uint64)}
		ep.streams[rank] = st
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
	ep.held += d.held()
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
	for i := range b.Events {
		e := &b.Events[i]
		if e.GroupIdx != 0 {
			// Hybrid models publish each KV-cache group apart; the index
			// follows group 0, the full-attention layers.
			ix.stats.dropped[dropOtherGroup].Add(int64(max(1, len(e.BlockHashes))))
			continue
		}
		switch e.Kind {
		case events.KindBlockStored:
			if !ix.applyStored(ep, st, o, e, now, d) {
				unknownParent = true
			}
		case events.KindBlockRemoved:
			for _, h := range e.BlockHashes {
				if !ix.unref(ep, st, h, e.Medium, d) {
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

// applyStored applies a BlockStored event. It returns false when the event
// names a parent the stream never stored: the run is dropped, since assuming
// it starts at the root would file its blocks under the wrong prefix.
func (ix *Index) applyStored(ep *ixEndpoint, st *ixStream, o events.Origin, e *events.Event, now time.Time, d *delta) bool {
	if len(e.BlockHashes) == 0 {
		return true
	}
	if len(e.TokenIDs) == 0 {
		// A placeholder (CPU offload): the blocks are known by their hash on
		// this stream, and now held in one more tier.
		for _, h := range e.BlockHashes {
			hv, ok := st.handles[h]
			if !ok {
				ix.stats.dropped[dropUnknownHandle].Add(1)
				continue
			}
			ix.ref(ep, st, h, hv&keyMask, e.Medium, now, d)
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
	var parent uint64
	if e.HasParent {
		hv, ok := st.handles[e.ParentHash]
		if !ok {
			ix.stats.dropped[dropUnknownParent].Add(int64(len(e.BlockHashes)))
			return false
		}
		parent = hv & keyMask
	}
	n := min(len(e.BlockHashes), len(e.TokenIDs)/bs)
	if n < len(e.BlockHashes) {
		// Partial blocks (hybrid models) have no key; children that name
		// them as parent will find them unknown.
		ix.stats.dropped[dropPartialBlock].Add(int64(len(e.BlockHashes) - n))
	}
	// An adapter known only by its deprecated integer id cannot be named by
	// a request, so its blocks must never match one.
	anonLoRA := e.LoRAName == "" && e.HasLoRAID && e.LoRAID != 0
	for i := 0; i < n; i++ {
		if reason, full := ix.full(ep, d); full {
			ix.stats.dropped[reason].Add(int64(n - i))
			st.state = datalayer.StreamUncertain
			return true
		}
		var extra events.ExtraKey
		if i < len(e.ExtraKeys) {
			extra = e.ExtraKeys[i]
		}
		first := i == 0 && !e.HasParent
		salt, plain := "", true
		if len(extra) > 0 {
			salt, plain = plainExtras(extra, e, first)
		}
		if first {
			if !plain {
				salt = ""
			}
			parent = RootKey(o.Model, e.LoRAName, salt)
		}
		k := blockKey(parent, e.TokenIDs[i*bs:(i+1)*bs])
		if !plain || anonLoRA {
			k = markedKey(k, extra)
		}
		ix.ref(ep, st, e.BlockHashes[i], k, e.Medium, now, d)
		parent = k
	}
	return true
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
		ix.forget(ep, st, h, hv, d)
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
	ix.shard(hv&keyMask).delRef(hv&keyMask, ep.id, t, d)
	if hv &^= bit; hv&^keyMask == 0 {
		delete(st.handles, h)
	} else {
		st.handles[h] = hv
	}
	if q := st.aged[t]; q != nil {
		delete(q.last, h)
	}
	return true
}

// forget drops every reference the stream has on a handle, in every tier.
func (ix *Index) forget(ep *ixEndpoint, st *ixStream, h, hv uint64, d *delta) {
	for t := events.Tier(0); t < events.NumTiers; t++ {
		if hv&(1<<t) == 0 {
			continue
		}
		delete(st.dups, dupKey{h, t})
		ix.shard(hv&keyMask).delRef(hv&keyMask, ep.id, t, d)
		if q := st.aged[t]; q != nil {
			delete(q.last, h)
		}
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
	st.dups = nil
	st.aged = [events.NumTiers]*ageQueue{}
}

// expireAged evicts the stream's holdings in tiers with a maximum age whose
// last store is older than that age. Called with ep.mu held.
func (ix *Index) expireAged(ep *ixEndpoint, st *ixStream, now time.Time, d *delta) {
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
		ep.held += d.held()
		st.hasSeq, st.instance = false, ""
		st.state = datalayer.StreamExact
		ep.refreshState()
	}
	ep.mu.Unlock()
	ix.stats.add(&d)
	ix.stats.restarts.Add(1)
}
