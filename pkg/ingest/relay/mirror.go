package relay

import (
	"sync"

	"github.com/kvroute/kvroute/pkg/events"
)

// Position says where in an engine's stream the mirror stands: the batch it
// applied last and what the relay knows about the engine. A snapshot carries
// the Position of the moment it was taken.
type Position struct {
	// Instance is the Kv-Instance of the engine the mirror describes.
	Instance string
	// Seq is the last batch applied; Valid is false until one is.
	Seq   uint64
	Valid bool
	// Exact is false once the mirror knows it missed part of the stream (a
	// late start, an unfilled gap, an undecodable payload, an eviction).
	Exact bool
	// Partial refines a mirror that is not exact: true when all it missed
	// is what the engine held before the relay's first batch (a late start
	// the replay ring could not make good) or what the bound evicted, so
	// that everything it holds, the engine holds; false when it missed
	// batches after its first (an unfilled gap, an undecodable payload),
	// which may have removed what it still holds.
	Partial bool
	// DPRank and BlockSize are the engine's, as last seen.
	DPRank    int
	BlockSize int
}

// blockMeta holds the attributes a stored run gives all its blocks. It is
// interned, so a block pays one pointer for them, and is never mutated.
type blockMeta struct {
	blockSize     int
	loraName      string
	loraID        int64
	hasLoRAID     bool
	groupIdx      int
	specKind      string
	slidingWindow int
	// bigram: the block's tokens end with the token after it (SGLang with
	// EAGLE keys blocks by token pairs).
	bigram    bool
	cacheSalt string
	locality  events.Locality
	ownership string
}

// mkey names a block in the mirror: a hybrid model's KV-cache groups store
// the same hash each for itself.
type mkey struct {
	hash  uint64
	group int
}

// maxMetas bounds the interned attribute sets; past it (hostile or exotic
// streams) a new set is simply not interned.
const maxMetas = 1024

// mirrorBlock is one engine block the mirror knows: held in at least one
// tier, or a ghost kept because a held descendant's chain passes through it.
type mirrorBlock struct {
	hash      uint64
	parent    uint64
	hasParent bool
	// up is the entry this block was linked to when it was stored, nil when
	// its parent was unknown then. Links are made only from a new entry to
	// an existing one, so they cannot form a cycle whatever the input.
	up *mirrorBlock
	// hash, parent, hasParent, tokens, extra and meta never change once the
	// block is stored, so a snapshot may read them outside the lock.
	tokens []uint32
	extra  events.ExtraKey
	meta   *blockMeta
	// skip is, for a block of a sparse store, how many whole blocks of
	// tokens before its own its tokens carry: those its store named no
	// hash for, which the block's key still chains through.
	skip int32
	// opaque lists positions in tokens that held no token id.
	opaque []int32
	refs   [events.NumTiers]uint32
	// children counts live entries linked to this one.
	children int32
	// gone is set when the entry leaves the mirror, so that children still
	// pointing at it know their link is broken.
	gone bool
	// prev and next keep creation order, which is also the eviction order
	// and an order in which every linked parent precedes its children.
	prev, next *mirrorBlock
}

func (b *mirrorBlock) held() bool {
	for _, r := range b.refs {
		if r > 0 {
			return true
		}
	}
	return false
}

// Mirror is the relay's copy of its engine's cache, rebuilt from the batches
// it relays, from which it answers snapshot requests. It is safe for
// concurrent use; Apply and Snapshot serialise on one lock, so a snapshot
// always falls on a batch boundary.
type Mirror struct {
	mu      sync.Mutex
	max     int
	blocks  map[mkey]*mirrorBlock
	oldest  *mirrorBlock
	newest  *mirrorBlock
	nHeld   int
	metas   map[blockMeta]*blockMeta
	pos     Position
	evicted uint64
}

// NewMirror returns an empty mirror holding at most maxBlocks entries, held
// and ghost together; maxBlocks <= 0 means no bound.
func NewMirror(maxBlocks int) *Mirror {
	m := &Mirror{max: maxBlocks}
	m.clear()
	return m
}

func (m *Mirror) clear() {
	m.blocks = make(map[mkey]*mirrorBlock)
	m.metas = make(map[blockMeta]*blockMeta)
	m.oldest, m.newest, m.nHeld = nil, nil, 0
}

// Reset forgets everything: the engine restarted as instance, whose stream
// the mirror now follows from its start.
func (m *Mirror) Reset(instance string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clear()
	m.pos = Position{Instance: instance, Exact: true}
}

// restore replaces the mirror's state with the one chunks (a snapshot of a
// mirror, as Snapshot encodes it) rebuild, at position pos: a relay
// starting from its checkpoint. The bound applies as it does live.
func (m *Mirror) restore(pos Position, chunks []*events.Batch) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clear()
	m.pos = pos
	for _, b := range chunks {
		m.applyEvents(b, pos.BlockSize)
	}
}

// MarkInexact records that the stream lost batches the mirror never saw.
func (m *Mirror) MarkInexact() {
	m.mu.Lock()
	m.pos.Exact, m.pos.Partial = false, false
	m.mu.Unlock()
}

// MarkPartial records that the engine's history before the mirror's first
// batch is missing, nothing since. A mirror already inexact stays so.
func (m *Mirror) MarkPartial() {
	m.mu.Lock()
	m.partialLocked()
	m.mu.Unlock()
}

func (m *Mirror) partialLocked() {
	if m.pos.Exact {
		m.pos.Exact, m.pos.Partial = false, true
	}
}

// SnapshotState is the Kv-Snapshot-State value of the mirror's position.
func (p Position) SnapshotState() string {
	switch {
	case p.Exact:
		return events.SnapshotExact
	case p.Partial:
		return events.SnapshotPartial
	}
	return events.SnapshotInexact
}

// Apply applies batch seq of the engine. b may be nil for a batch that did
// not decode: the position moves on, and the mirror is no longer exact.
// blockSize splits the tokens of events that carry no block size of their
// own; it and dpRank are what the relay's headers say for this batch.
func (m *Mirror) Apply(seq uint64, b *events.Batch, blockSize, dpRank int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pos.Seq, m.pos.Valid = seq, true
	m.pos.BlockSize, m.pos.DPRank = blockSize, dpRank
	if b == nil {
		m.pos.Exact, m.pos.Partial = false, false
		return
	}
	m.applyEvents(b, blockSize)
}

// applyEvents applies a batch's events; the position is the caller's.
// Called with mu held.
func (m *Mirror) applyEvents(b *events.Batch, defaultBlockSize int) {
	for i := range b.Events {
		e := &b.Events[i]
		if e.Medium >= events.NumTiers {
			continue
		}
		switch e.Kind {
		case events.KindBlockStored:
			m.stored(e, defaultBlockSize)
		case events.KindBlockRemoved:
			m.removed(e)
		case events.KindAllBlocksCleared:
			// An empty cache is known exactly, whatever was missed before.
			m.clear()
			m.pos.Exact, m.pos.Partial = true, false
		}
	}
}

// Position returns where the mirror stands.
func (m *Mirror) Position() Position {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pos
}

// Counts returns the number of held and ghost entries, and how many entries
// the bound has evicted since the mirror was made.
func (m *Mirror) Counts() (held, ghost int, evicted uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nHeld, len(m.blocks) - m.nHeld, m.evicted
}

// blockTokens returns block i's share of an event's tokens: blockSize tokens
// each, the last block taking a partial remainder (hybrid models), and the
// whole list for block 0 when the block size is unknown.
func blockTokens(tokens []uint32, blockSize, i int) []uint32 {
	if blockSize <= 0 {
		if i == 0 {
			return tokens
		}
		return nil
	}
	start := i * blockSize
	if start >= len(tokens) || start < 0 {
		return nil
	}
	return tokens[start:min(start+blockSize, len(tokens))]
}

func (m *Mirror) intern(e *events.Event, blockSize int) *blockMeta {
	k := blockMeta{
		blockSize: blockSize, loraName: e.LoRAName, loraID: e.LoRAID, hasLoRAID: e.HasLoRAID,
		groupIdx: e.GroupIdx, specKind: e.KVCacheSpecKind, slidingWindow: e.SlidingWindow,
		bigram: e.Bigram, cacheSalt: e.CacheSalt, locality: e.Locality, ownership: e.Ownership,
	}
	if p, ok := m.metas[k]; ok {
		return p
	}
	p := &k
	if len(m.metas) < maxMetas {
		m.metas[k] = p
	}
	return p
}

func (m *Mirror) stored(e *events.Event, defaultBlockSize int) {
	if len(e.BlockHashes) == 0 {
		return
	}
	t, g := e.Medium, e.GroupIdx
	if len(e.TokenIDs) == 0 {
		// A placeholder adds a tier to blocks the engine already holds; the
		// index ignores it for blocks it does not hold, and so does the
		// mirror, so that both agree on what it means.
		for _, h := range e.BlockHashes {
			if b := m.blocks[mkey{h, g}]; b != nil && b.held() {
				b.refs[t]++
			}
		}
		return
	}
	bs := e.BlockSize
	if bs <= 0 {
		bs = defaultBlockSize
	}
	var meta *blockMeta
	parent, hasParent := e.ParentHash, e.HasParent
	var up *mirrorBlock
	if hasParent {
		up = m.blocks[mkey{parent, g}]
	}
	prevChunk := -1
	for i, h := range e.BlockHashes {
		tokens, skip, opaque := storedTokens(e, bs, i, prevChunk)
		if len(e.BlockOffsets) > 0 {
			prevChunk = int(e.BlockOffsets[i])
		} else {
			prevChunk = i
		}
		b := m.blocks[mkey{h, g}]
		switch {
		case b != nil:
			// A known block stored again (a copy, or a ghost coming back):
			// it keeps the chain it was first stored in.
		case len(tokens) == 0:
			// Past the event's tokens there is nothing to describe the
			// block by; only a tier for a held block can be learnt.
		default:
			if m.max > 0 {
				for len(m.blocks) >= m.max {
					m.evictOldest()
				}
			}
			if up != nil && up.gone {
				up = nil
			}
			if meta == nil {
				meta = m.intern(e, bs)
			}
			b = &mirrorBlock{hash: h, parent: parent, hasParent: hasParent, up: up, tokens: tokens, meta: meta, skip: skip, opaque: opaque}
			if i < len(e.ExtraKeys) {
				b.extra = e.ExtraKeys[i]
			}
			if up != nil {
				up.children++
			}
			m.push(b)
		}
		if b != nil && (b.held() || len(tokens) > 0) {
			if !b.held() {
				m.nHeld++
			}
			b.refs[t]++
		}
		parent, hasParent, up = h, true, b
	}
}

// storedTokens returns block i's share of a store's tokens, copied: its own
// block (a partial remainder for the last), after the blocks of a sparse
// store that named no hash since the previous one (skip of them), and, for
// token pairs, the token after it. opaque are the positions in it that held
// no token id.
func storedTokens(e *events.Event, bs, i, prevChunk int) (tokens []uint32, skip int32, opaque []int32) {
	chunk := i
	if len(e.BlockOffsets) > 0 {
		chunk = int(e.BlockOffsets[i])
	}
	from := prevChunk + 1
	if bs <= 0 {
		from, chunk = 0, 0
	}
	lo := from * bs
	own := blockTokens(e.TokenIDs, bs, chunk)
	if len(own) == 0 || lo > len(e.TokenIDs) {
		return nil, 0, nil
	}
	hi := lo + (chunk-from)*bs + len(own)
	if bs <= 0 {
		lo, hi = 0, len(own)
	}
	tokens = append(make([]uint32, 0, hi-lo+1), e.TokenIDs[lo:hi]...)
	if e.Bigram {
		next := e.BigramNext
		if hi < len(e.TokenIDs) {
			next = e.TokenIDs[hi]
		}
		tokens = append(tokens, next)
	}
	for _, p := range e.OpaqueTokens {
		if int(p) >= lo && int(p) < hi {
			opaque = append(opaque, p-int32(lo))
		}
	}
	return tokens, int32(chunk - from), opaque
}

func (m *Mirror) removed(e *events.Event) {
	t := e.Medium
	for i, h := range e.BlockHashes {
		b := m.blocks[mkey{h, e.GroupIdx}]
		if b == nil || b.refs[t] == 0 {
			continue
		}
		if i < len(e.RemainingCopies) {
			// The engine says how many copies are left: that count stands.
			b.refs[t] = uint32(max(0, e.RemainingCopies[i]))
		} else {
			b.refs[t]--
		}
		if !b.held() {
			m.nHeld--
			m.release(b)
		}
	}
}

// release drops b, no longer held, unless a live descendant still needs it
// as a ghost; and then the ghost ancestors that only b needed.
func (m *Mirror) release(b *mirrorBlock) {
	for b != nil && !b.gone && !b.held() && b.children == 0 {
		up := b.up
		m.drop(b)
		b = up
	}
}

func (m *Mirror) evictOldest() {
	b := m.oldest
	if b == nil {
		return
	}
	if b.held() {
		m.nHeld--
	}
	up := b.up
	m.drop(b)
	m.evicted++
	// What the bound forgets is missing, never false: the engine's later
	// removal of it is ignored, its children are named with a parent the
	// index will not know.
	m.partialLocked()
	m.release(up)
}

func (m *Mirror) push(b *mirrorBlock) {
	m.blocks[mkey{b.hash, b.meta.groupIdx}] = b
	b.prev = m.newest
	if m.newest != nil {
		m.newest.next = b
	} else {
		m.oldest = b
	}
	m.newest = b
}

func (m *Mirror) drop(b *mirrorBlock) {
	delete(m.blocks, mkey{b.hash, b.meta.groupIdx})
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		m.oldest = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		m.newest = b.prev
	}
	if b.up != nil && !b.up.gone {
		b.up.children--
	}
	b.gone = true
	b.prev, b.next, b.up = nil, nil, nil
}
