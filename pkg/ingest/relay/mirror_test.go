package relay

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/pkg/events"
)

// refBlock is a block as the reference model holds it.
type refBlock struct {
	parent    uint64
	hasParent bool
	tokens    []uint32
	meta      blockMeta
	extra     events.ExtraKey
	refs      [events.NumTiers]uint32
}

// reference is the straightforward model of an engine's held blocks the
// mirror is checked against: a map from hash to a refcount per tier, with
// a block forgotten as soon as no tier holds it.
type reference map[mkey]*refBlock

func (r reference) apply(b *events.Batch, defaultBlockSize int) {
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case events.KindAllBlocksCleared:
			clear(r)
		case events.KindBlockRemoved:
			for _, h := range e.BlockHashes {
				k := mkey{h, e.GroupIdx}
				if rb := r[k]; rb != nil && rb.refs[e.Medium] > 0 {
					rb.refs[e.Medium]--
					if rb.refs == [events.NumTiers]uint32{} {
						delete(r, k)
					}
				}
			}
		case events.KindBlockStored:
			bs := e.BlockSize
			if bs <= 0 {
				bs = defaultBlockSize
			}
			parent, hasParent := e.ParentHash, e.HasParent
			for i, h := range e.BlockHashes {
				var tokens []uint32
				if len(e.TokenIDs) > 0 {
					tokens = blockTokens(e.TokenIDs, bs, i)
				}
				k := mkey{h, e.GroupIdx}
				rb := r[k]
				if rb == nil && len(tokens) > 0 {
					rb = &refBlock{parent: parent, hasParent: hasParent, tokens: append([]uint32(nil), tokens...), meta: blockMeta{
						blockSize: bs, loraName: e.LoRAName, loraID: e.LoRAID, hasLoRAID: e.HasLoRAID,
						groupIdx: e.GroupIdx, specKind: e.KVCacheSpecKind, slidingWindow: e.SlidingWindow,
					}}
					if i < len(e.ExtraKeys) {
						rb.extra = e.ExtraKeys[i]
					}
					r[k] = rb
				}
				if rb != nil {
					rb.refs[e.Medium]++
				}
				parent, hasParent = h, true
			}
		}
	}
}

// heldView is what both models must agree on for each held block.
type heldView struct {
	parent    uint64
	hasParent bool
	tokens    string
	meta      blockMeta
	extra     string
	refs      [events.NumTiers]uint32
}

func (r reference) view() map[mkey]heldView {
	out := make(map[mkey]heldView, len(r))
	for h, b := range r {
		out[h] = heldView{b.parent, b.hasParent, fmt.Sprint(b.tokens), b.meta, fmt.Sprint(b.extra), b.refs}
	}
	return out
}

func (m *Mirror) heldView() map[mkey]heldView {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[mkey]heldView)
	for h, b := range m.blocks {
		if b.held() {
			out[h] = heldView{b.parent, b.hasParent, fmt.Sprint(b.tokens), *b.meta, fmt.Sprint(b.extra), b.refs}
		}
	}
	return out
}

// checkInvariants checks the mirror's bookkeeping: counts, links, and that
// every ghost is an ancestor some held block still needs.
func (m *Mirror) checkInvariants(t *testing.T) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	held, n := 0, 0
	children := map[*mirrorBlock]int32{}
	needed := map[*mirrorBlock]bool{}
	for b := m.oldest; b != nil; b = b.next {
		n++
		if m.blocks[mkey{b.hash, b.meta.groupIdx}] != b {
			t.Fatalf("block %x in the order list but not the map", b.hash)
		}
		if b.up != nil && !b.up.gone {
			children[b.up]++
		}
		if b.held() {
			held++
			for a := b.up; a != nil && !a.gone && !needed[a]; a = a.up {
				needed[a] = true
			}
		}
	}
	if n != len(m.blocks) || held != m.nHeld {
		t.Fatalf("list has %d entries (%d held), map %d, nHeld %d", n, held, len(m.blocks), m.nHeld)
	}
	for b := m.oldest; b != nil; b = b.next {
		if b.children != children[b] {
			t.Fatalf("block %x counts %d children, has %d", b.hash, b.children, children[b])
		}
		if !b.held() && !needed[b] {
			t.Fatalf("ghost %x is no held block's ancestor", b.hash)
		}
	}
}

// universe is a fixed forest of blocks, so that a hash always comes with
// the same parent, tokens and attributes, as vLLM's content hashes do.
type universe struct {
	blocks []uniBlock
}

type uniBlock struct {
	hash   uint64
	parent int // index, -1 for a root
	tokens []uint32
	lora   string
	extra  events.ExtraKey
}

const testBlockSize = 4

func newUniverse(rng *rand.Rand, n int) *universe {
	u := &universe{}
	for i := 0; i < n; i++ {
		b := uniBlock{hash: uint64(i+1)*0x9e3779b97f4a7c15 | 1, parent: -1}
		if i > 0 && rng.IntN(5) != 0 {
			b.parent = rng.IntN(i)
		}
		if b.parent >= 0 {
			b.lora = u.blocks[b.parent].lora
		} else if rng.IntN(3) == 0 {
			b.lora = "adapter-a"
		}
		if rng.IntN(6) == 0 {
			b.extra = events.ExtraKey{"salt", int64(i)}
		}
		for j := 0; j < testBlockSize; j++ {
			b.tokens = append(b.tokens, uint32(i*testBlockSize+j))
		}
		u.blocks = append(u.blocks, b)
	}
	return u
}

// chain returns up to k blocks ending at i, top-down.
func (u *universe) chain(i, k int) []int {
	var c []int
	for ; i >= 0 && len(c) < k; i = u.blocks[i].parent {
		c = append(c, i)
	}
	for a, b := 0, len(c)-1; a < b; a, b = a+1, b-1 {
		c[a], c[b] = c[b], c[a]
	}
	return c
}

// run makes the BlockStored event for a chain, split where the LoRA
// changes, as an engine never mixes adapters in one run.
func (u *universe) stored(c []int, tier events.Tier) events.Event {
	first := u.blocks[c[0]]
	e := events.Event{Kind: events.KindBlockStored, BlockSize: testBlockSize, Medium: tier, LoRAName: first.lora}
	if first.parent >= 0 {
		e.ParentHash, e.HasParent = u.blocks[first.parent].hash, true
	}
	for k, i := range c {
		b := u.blocks[i]
		e.BlockHashes = append(e.BlockHashes, b.hash)
		e.TokenIDs = append(e.TokenIDs, b.tokens...)
		if b.extra != nil {
			if e.ExtraKeys == nil {
				e.ExtraKeys = make([]events.ExtraKey, len(c))
			}
			e.ExtraKeys[k] = b.extra
		}
	}
	return e
}

// randomBatch makes a batch of random stores (whole chains or their
// tails, so parents are sometimes unknown), removals (anywhere in a
// chain, sometimes twice), placeholders and, rarely, a clear.
func (u *universe) randomBatch(rng *rand.Rand) *events.Batch {
	b := &events.Batch{TS: 1.5, HasDPRank: true}
	for n := 1 + rng.IntN(4); n > 0; n-- {
		tier := events.TierGPU
		if rng.IntN(4) == 0 {
			tier = events.Tier(1 + rng.IntN(2))
		}
		switch p := rng.IntN(100); {
		case p < 45:
			c := u.chain(rng.IntN(len(u.blocks)), 1+rng.IntN(6))
			// Split at adapter changes: a chain never changes adapter, so
			// this only guards generator edits.
			b.Events = append(b.Events, u.stored(c, tier))
		case p < 80:
			e := events.Event{Kind: events.KindBlockRemoved, Medium: tier}
			for k := 1 + rng.IntN(4); k > 0; k-- {
				e.BlockHashes = append(e.BlockHashes, u.blocks[rng.IntN(len(u.blocks))].hash)
			}
			b.Events = append(b.Events, e)
		case p < 98:
			e := events.Event{Kind: events.KindBlockStored, Medium: events.Tier(1 + rng.IntN(2))}
			for k := 1 + rng.IntN(4); k > 0; k-- {
				e.BlockHashes = append(e.BlockHashes, u.blocks[rng.IntN(len(u.blocks))].hash)
			}
			b.Events = append(b.Events, e)
		default:
			b.Events = append(b.Events, events.Event{Kind: events.KindAllBlocksCleared})
		}
	}
	return b
}

// wire encodes and decodes b, so the models see what the relay sees.
func wire(t testing.TB, b *events.Batch) (*events.Batch, []byte) {
	t.Helper()
	data, err := events.AppendBatch(nil, b, events.EncodingArray)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	d, err := events.Decode(data)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return d, data
}

func TestMirrorMatchesReferenceOnRandomStreams(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, seed*7))
			u := newUniverse(rng, 60)
			m := NewMirror(0)
			m.Reset("i")
			ref := reference{}
			for seq := uint64(0); seq < 400; seq++ {
				b, _ := wire(t, u.randomBatch(rng))
				m.Apply(seq, b, testBlockSize, 0)
				ref.apply(b, testBlockSize)
				if seq%20 == 0 || seq == 399 {
					m.checkInvariants(t)
					if got, want := m.heldView(), ref.view(); !reflect.DeepEqual(got, want) {
						t.Fatalf("after seq %d the mirror holds %d blocks, the reference %d:\nmirror %v\nreference %v", seq, len(got), len(want), got, want)
					}
					checkSnapshotRoundTrip(t, m, 2048)
				}
			}
		})
	}
}

// checkSnapshotRoundTrip takes a snapshot, applies its chunks in order to
// an empty reference, and checks the result is the mirror's held set; and
// that every stored run names a parent the snapshot has already stored,
// unless the mirror itself had lost that block's parent.
func checkSnapshotRoundTrip(t testing.TB, m *Mirror, chunkBytes int) *Snapshot {
	t.Helper()
	s, err := m.Snapshot(chunkBytes)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	orphans := map[uint64]bool{}
	m.mu.Lock()
	for b := m.oldest; b != nil; b = b.next {
		if b.hasParent && (b.up == nil || b.up.gone) {
			orphans[b.hash] = true
		}
	}
	m.mu.Unlock()
	ref := reference{}
	blocks := 0
	for i, c := range s.Chunks {
		if len(c) > chunkBytes && len(s.Chunks) > 1 {
			t.Fatalf("chunk %d is %d bytes, over the %d asked for", i, len(c), chunkBytes)
		}
		b, err := events.Decode(c)
		if err != nil {
			t.Fatalf("chunk %d does not decode: %v", i, err)
		}
		for k := range b.Events {
			e := &b.Events[k]
			blocks += len(e.BlockHashes)
			if e.Kind == events.KindBlockStored && len(e.TokenIDs) > 0 && e.HasParent && !orphans[e.BlockHashes[0]] {
				if ref[mkey{e.ParentHash, e.GroupIdx}] == nil {
					t.Fatalf("chunk %d stores %x under parent %x, not stored before", i, e.BlockHashes[0], e.ParentHash)
				}
			}
			ref.apply(&events.Batch{Events: b.Events[k : k+1]}, 0)
		}
	}
	if blocks != s.Blocks {
		t.Fatalf("chunks name %d blocks, the snapshot says %d", blocks, s.Blocks)
	}
	if got, want := ref.view(), m.heldView(); !reflect.DeepEqual(got, want) {
		t.Fatalf("snapshot rebuilds %d blocks, the mirror holds %d:\nrebuilt %v\nmirror %v", len(got), len(want), got, want)
	}
	return s
}

func TestMirrorEdgeCases(t *testing.T) {
	t.Parallel()
	stored := func(parent uint64, tier events.Tier, tokens []uint32, bs int, hashes ...uint64) events.Event {
		return events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: parent != 0, TokenIDs: tokens, BlockSize: bs, Medium: tier}
	}
	removed := func(tier events.Tier, hashes ...uint64) events.Event {
		return events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes, Medium: tier}
	}
	toks := func(n int) []uint32 {
		s := make([]uint32, n)
		for i := range s {
			s[i] = uint32(i + 1)
		}
		return s
	}
	tests := []struct {
		name        string
		events      []events.Event
		held, ghost int
	}{
		{"a chain stored in one run is held whole", []events.Event{stored(0, events.TierGPU, toks(12), 4, 1, 2, 3)}, 3, 0},
		{"removing the middle of a chain keeps it as a ghost", []events.Event{stored(0, events.TierGPU, toks(12), 4, 1, 2, 3), removed(events.TierGPU, 2)}, 2, 1},
		{"removing the tail lets its ghost ancestors go", []events.Event{stored(0, events.TierGPU, toks(12), 4, 1, 2, 3), removed(events.TierGPU, 2), removed(events.TierGPU, 3)}, 1, 0},
		{"removing the root keeps it while descendants are held", []events.Event{stored(0, events.TierGPU, toks(12), 4, 1, 2, 3), removed(events.TierGPU, 1, 2)}, 1, 2},
		{"a ghost stored again is held again", []events.Event{stored(0, events.TierGPU, toks(8), 4, 1, 2), removed(events.TierGPU, 1), stored(0, events.TierGPU, toks(4), 4, 1)}, 2, 0},
		{"a block stored twice survives one removal", []events.Event{stored(0, events.TierGPU, toks(4), 4, 1), stored(0, events.TierGPU, toks(4), 4, 1), removed(events.TierGPU, 1)}, 1, 0},
		{"a removal in another tier leaves the block held", []events.Event{stored(0, events.TierGPU, toks(4), 4, 1), removed(events.TierCPU, 1)}, 1, 0},
		{"a placeholder adds a tier to a held block", []events.Event{stored(0, events.TierGPU, toks(4), 4, 1), stored(0, events.TierCPU, nil, 0, 1), removed(events.TierGPU, 1)}, 1, 0},
		{"a placeholder for an unknown block is ignored", []events.Event{stored(0, events.TierCPU, nil, 0, 9)}, 0, 0},
		{"a clear forgets everything", []events.Event{stored(0, events.TierGPU, toks(8), 4, 1, 2), {Kind: events.KindAllBlocksCleared}}, 0, 0},
		{"a run under an unknown parent is still held", []events.Event{stored(77, events.TierGPU, toks(8), 4, 1, 2)}, 2, 0},
		{"hashes past the tokens are not invented", []events.Event{stored(0, events.TierGPU, toks(4), 4, 1, 2)}, 1, 0},
		{"a partial last block is kept with its tokens", []events.Event{stored(0, events.TierGPU, toks(6), 4, 1, 2)}, 2, 0},
		{"a block size of 0 falls back to the relay's", []events.Event{stored(0, events.TierGPU, toks(32), 0, 1, 2)}, 2, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := NewMirror(0)
			m.Reset("i")
			m.Apply(0, &events.Batch{Events: tc.events}, 16, 0)
			m.checkInvariants(t)
			held, ghost, _ := m.Counts()
			if held != tc.held || ghost != tc.ghost {
				t.Fatalf("held %d, ghost %d; want %d, %d", held, ghost, tc.held, tc.ghost)
			}
			checkSnapshotRoundTrip(t, m, 1024)
		})
	}
}

func TestMirrorEvictsTheOldestPastItsBound(t *testing.T) {
	t.Parallel()
	m := NewMirror(10)
	m.Reset("i")
	for i := uint64(0); i < 25; i++ {
		parent := i
		m.Apply(i, &events.Batch{Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: []uint64{i + 1}, ParentHash: parent, HasParent: parent != 0,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4,
		}}}, 4, 0)
		m.checkInvariants(t)
	}
	held, ghost, evicted := m.Counts()
	if held != 10 || ghost != 0 || evicted != 15 {
		t.Fatalf("held %d ghost %d evicted %d, want 10 0 15", held, ghost, evicted)
	}
	if m.Position().Exact {
		t.Fatal("a mirror that evicted still claims to be exact")
	}
	if _, ok := m.heldView()[mkey{25, 0}]; !ok {
		t.Fatal("the newest block was evicted")
	}
	checkSnapshotRoundTrip(t, m, 1024)
}

func TestSnapshotBeforeAnyBatchIsRefused(t *testing.T) {
	t.Parallel()
	m := NewMirror(0)
	if _, err := m.Snapshot(0); err == nil {
		t.Fatal("a mirror that applied nothing gave a snapshot")
	}
	m.Reset("i")
	m.Apply(0, &events.Batch{}, 16, 0)
	s := checkSnapshotRoundTrip(t, m, 0)
	if len(s.Chunks) != 1 || s.Events != 0 {
		t.Fatalf("an empty mirror gave %d chunks, %d events; want one empty chunk", len(s.Chunks), s.Events)
	}
}

func TestSnapshotsTakenDuringIngestMatchTheirSeq(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(99, 1))
	u := newUniverse(rng, 80)
	m := NewMirror(0)
	m.Reset("i")
	batches := make([]*events.Batch, 1500)
	for i := range batches {
		batches[i], _ = wire(t, u.randomBatch(rng))
	}
	// views[seq] is the reference's held set once batch seq is applied.
	views := make([]map[mkey]heldView, len(batches))
	done := make(chan struct{})
	// Ingest waits after its first batch for the first snapshot, so that at
	// least one snapshot races the rest of the ingest however the two
	// goroutines are scheduled.
	first := make(chan struct{})
	go func() {
		defer close(done)
		ref := reference{}
		for seq, b := range batches {
			ref.apply(b, testBlockSize)
			views[seq] = ref.view()
			m.Apply(uint64(seq), b, testBlockSize, 0)
			if seq == 0 {
				<-first
			}
		}
	}()
	var snaps []*Snapshot
	for running := true; running && len(snaps) < 300; {
		select {
		case <-done:
			running = false
		default:
			if s, err := m.Snapshot(1024); err == nil {
				if len(snaps) == 0 {
					close(first)
				}
				snaps = append(snaps, s)
			}
		}
	}
	<-done
	for n, s := range snaps {
		rebuilt := reference{}
		for i, c := range s.Chunks {
			b, err := events.Decode(c)
			if err != nil {
				t.Fatalf("snapshot %d chunk %d: %v", n, i, err)
			}
			rebuilt.apply(b, 0)
		}
		if got, want := rebuilt.view(), views[s.Position.Seq]; !reflect.DeepEqual(got, want) {
			t.Fatalf("snapshot %d at seq %d rebuilds %d blocks, the engine held %d then", n, s.Position.Seq, len(got), len(want))
		}
	}
	t.Logf("%d snapshots checked", len(snaps))
}
