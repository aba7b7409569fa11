package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
)

// Snapshot limits. A run is cut at maxRunBlocks so that no single event
// comes near the chunk size; placeholder and removal lists likewise.
const (
	// DefaultSnapshotChunkBytes bounds each snapshot reply message.
	DefaultSnapshotChunkBytes = 512 << 10
	maxRunBlocks              = 256
	maxListHashes             = 4096
	// envelopeBound is an upper bound on a batch's envelope: the array
	// header, the float timestamp, the events array header and the rank.
	envelopeBound = 1 + 9 + 5 + 9
)

// ErrNoSnapshot is returned when the mirror has applied no batch yet, so
// there is no position a snapshot could be taken at.
var ErrNoSnapshot = errors.New("no batch relayed yet")

// snapBlock is a block as the snapshot saw it under the lock: what can
// change is copied, the rest read through the pointer (see mirrorBlock).
type snapBlock struct {
	*mirrorBlock
	refs [events.NumTiers]uint32
	// linked: the parent is an earlier block of the same snapshot.
	linked bool
}

func (b *snapBlock) held() bool { return b.refs != [events.NumTiers]uint32{} }

// primary is the tier a block is first stored in: its first tier held, or
// GPU for a ghost, which is stored and then removed.
func (b *snapBlock) primary() events.Tier {
	for t, r := range b.refs {
		if r > 0 {
			return events.Tier(t)
		}
	}
	return events.TierGPU
}

// Snapshot is the mirror's state at one batch boundary, as the events that
// rebuild it from an empty stream.
type Snapshot struct {
	Position Position
	// Chunks are vLLM-format batches (array form), each at most the chunk
	// size asked for unless a single event is larger; there is always at
	// least one, empty when the engine holds nothing.
	Chunks [][]byte
	// Events and Blocks count what the chunks carry, for metrics and tests.
	Events, Blocks int
}

// capture copies what a snapshot needs under the lock: a slice of small
// structs, in creation order, so every linked parent precedes its children.
func (m *Mirror) capture() (Position, []snapBlock, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.pos.Valid {
		return m.pos, nil, ErrNoSnapshot
	}
	return m.pos, m.captureLocked(), nil
}

func (m *Mirror) captureLocked() []snapBlock {
	out := make([]snapBlock, 0, len(m.blocks))
	for b := m.oldest; b != nil; b = b.next {
		out = append(out, snapBlock{mirrorBlock: b, refs: b.refs, linked: b.up != nil && !b.up.gone})
	}
	return out
}

// Snapshot takes a snapshot and encodes it into chunks of at most
// chunkBytes (DefaultSnapshotChunkBytes when <= 0). Only the copy is made
// under the lock; the encoding runs while the relay goes on.
func (m *Mirror) Snapshot(chunkBytes int) (*Snapshot, error) {
	pos, blocks, err := m.capture()
	if err != nil {
		return nil, err
	}
	evs := snapshotEvents(blocks)
	s := &Snapshot{Position: pos, Events: len(evs)}
	for i := range evs {
		s.Blocks += len(evs[i].BlockHashes)
	}
	s.Chunks, err = encodeChunks(pos, evs, chunkBytes)
	return s, err
}

// encodeSnapshot encodes captured blocks as snapshot chunks.
func encodeSnapshot(pos Position, blocks []snapBlock, chunkBytes int) ([][]byte, error) {
	return encodeChunks(pos, snapshotEvents(blocks), chunkBytes)
}

// encodeChunks cuts a snapshot's events into vLLM batches of at most
// chunkBytes each (DefaultSnapshotChunkBytes when <= 0); there is always
// at least one.
func encodeChunks(pos Position, evs []events.Event, chunkBytes int) ([][]byte, error) {
	if chunkBytes <= 0 {
		chunkBytes = DefaultSnapshotChunkBytes
	}
	var chunks [][]byte
	ts := float64(time.Now().UnixNano()) / 1e9
	for start := 0; start < len(evs) || len(chunks) == 0; {
		end, size := start, envelopeBound
		for end < len(evs) {
			n := eventBound(&evs[end])
			if end > start && size+n > chunkBytes {
				break
			}
			size += n
			end++
		}
		b := events.Batch{TS: ts, DPRank: pos.DPRank, HasDPRank: true, Events: evs[start:end]}
		chunk, err := events.AppendBatch(make([]byte, 0, size), &b, events.EncodingArray)
		if err != nil {
			return nil, fmt.Errorf("snapshot chunk %d: %w", len(chunks), err)
		}
		chunks = append(chunks, chunk)
		start = end
	}
	return chunks, nil
}

// snapshotEvents turns the captured blocks into the events that rebuild
// them: every block stored, parents first, in runs as vLLM would send
// them; then placeholders for each further tier and copy; then removals
// for the ghosts, which leaves exactly the held blocks, each still
// describable from its chain's root.
func snapshotEvents(blocks []snapBlock) []events.Event {
	var evs []events.Event
	type tierGroup struct {
		tier  events.Tier
		group int
	}
	extraRefs := map[tierGroup][]uint64{}
	ghosts := map[int][]uint64{}
	var order []tierGroup // first use, so that output is deterministic
	var ghostOrder []int
	for i := 0; i < len(blocks); {
		first := &blocks[i]
		tier := first.primary()
		j := i + 1
		if full(first) {
			for j < len(blocks) && j-i < maxRunBlocks {
				b := &blocks[j]
				if !b.linked || b.parent != blocks[j-1].hash || b.meta != first.meta || b.primary() != tier || !full(b) {
					break
				}
				j++
			}
		}
		run := blocks[i:j]
		e := events.Event{
			Kind:            events.KindBlockStored,
			BlockHashes:     make([]uint64, 0, len(run)),
			ParentHash:      first.parent,
			HasParent:       first.hasParent,
			BlockSize:       first.meta.blockSize,
			LoRAID:          first.meta.loraID,
			HasLoRAID:       first.meta.hasLoRAID,
			LoRAName:        first.meta.loraName,
			Medium:          tier,
			GroupIdx:        first.meta.groupIdx,
			KVCacheSpecKind: first.meta.specKind,
			SlidingWindow:   first.meta.slidingWindow,
			CacheSalt:       first.meta.cacheSalt,
			Locality:        first.meta.locality,
			Ownership:       first.meta.ownership,
			Bigram:          first.meta.bigram,
		}
		if first.skip > 0 {
			e.BlockOffsets = []int32{first.skip}
		}
		e.TokenIDs = make([]uint32, 0, len(run)*(first.meta.blockSize+1))
		for k := range run {
			b := &run[k]
			e.BlockHashes = append(e.BlockHashes, b.hash)
			for _, p := range b.opaque {
				e.OpaqueTokens = append(e.OpaqueTokens, int32(len(e.TokenIDs))+p)
			}
			tokens := b.tokens
			if b.meta.bigram && len(tokens) > 0 {
				// Each block ends with the token after it, the next
				// block's first; the last one's is the run's next token.
				tokens, e.BigramNext = tokens[:len(tokens)-1], tokens[len(tokens)-1]
			}
			e.TokenIDs = append(e.TokenIDs, tokens...)
			if b.extra != nil {
				if e.ExtraKeys == nil {
					e.ExtraKeys = make([]events.ExtraKey, len(run))
				}
				e.ExtraKeys[k] = b.extra
			}
			g := b.meta.groupIdx
			if !b.held() {
				if _, ok := ghosts[g]; !ok {
					ghostOrder = append(ghostOrder, g)
				}
				ghosts[g] = append(ghosts[g], b.hash)
				continue
			}
			for t, r := range b.refs {
				if events.Tier(t) == tier {
					r--
				}
				tg := tierGroup{events.Tier(t), g}
				if _, ok := extraRefs[tg]; !ok && r > 0 {
					order = append(order, tg)
				}
				for ; r > 0; r-- {
					extraRefs[tg] = append(extraRefs[tg], b.hash)
				}
			}
		}
		evs = append(evs, e)
		i = j
	}
	for _, tg := range order {
		evs = appendLists(evs, extraRefs[tg], func(h []uint64) events.Event {
			return events.Event{Kind: events.KindBlockStored, BlockHashes: h, Medium: tg.tier, GroupIdx: tg.group}
		})
	}
	for _, g := range ghostOrder {
		evs = appendLists(evs, ghosts[g], func(h []uint64) events.Event {
			return events.Event{Kind: events.KindBlockRemoved, BlockHashes: h, Medium: events.TierGPU, GroupIdx: g}
		})
	}
	return evs
}

// full says whether b holds exactly one block of tokens (and, for token
// pairs, the one after it), the only kind a run can carry without changing
// how its tokens split.
func full(b *snapBlock) bool {
	n := b.meta.blockSize
	if b.meta.bigram {
		n++
	}
	return b.meta.blockSize > 0 && len(b.tokens) == n && b.skip == 0
}

func appendLists(evs []events.Event, hashes []uint64, mk func([]uint64) events.Event) []events.Event {
	for len(hashes) > 0 {
		n := min(len(hashes), maxListHashes)
		evs = append(evs, mk(hashes[:n:n]))
		hashes = hashes[n:]
	}
	return evs
}

// eventBound is an upper bound on an event's encoded size, so that chunks
// are cut without encoding every event twice.
func eventBound(e *events.Event) int {
	tokenBound := 5
	if e.Bigram {
		tokenBound = 11 // a pair: its header and two ints
	}
	n := 1 + 5 + 17 + // array header, tag, and the tag's length
		5 + 9*len(e.BlockHashes) + // hashes
		9 + // parent
		5 + tokenBound*len(e.TokenIDs) + 11 + // tokens, and a bigram's next one
		9 + 9 + 9 + 9 + 9 + // block size, lora id, medium, group, window
		5 + len(e.LoRAName) + 5 + len(e.KVCacheSpecKind) +
		5 + len(e.CacheSalt) + 20 + 10 + 5 + len(e.Ownership) + // salt in its map, locality, ownership
		24 + 30 + 6*len(e.BlockOffsets) + // offsets, with the field names map form adds
		8*18 // field names of the other fields in map form
	if e.ExtraKeys != nil {
		n += 5
		for _, k := range e.ExtraKeys {
			n += valueBound([]any(k))
		}
	}
	return n
}

func valueBound(v any) int {
	switch v := v.(type) {
	case nil, bool:
		return 1
	case string:
		return 5 + len(v)
	case []byte:
		return 5 + len(v)
	case []any:
		n := 5
		for _, x := range v {
			n += valueBound(x)
		}
		return n
	case events.ExtraKey:
		return valueBound([]any(v))
	case map[string]any:
		n := 5
		for k, x := range v {
			n += 5 + len(k) + valueBound(x)
		}
		return n
	}
	return 9 // ints and floats
}
