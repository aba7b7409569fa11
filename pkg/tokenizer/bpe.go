package tokenizer

import (
	"container/heap"
	"hash/maphash"
	"sync"
)

// bpe is a byte-level BPE model. Its vocabulary is keyed by the bytes a
// token stands for rather than by their byte-level spelling, so that a
// pre-token never needs to be re-spelled. Its tables hold no pointers
// (tables.go).
type bpe struct {
	// vocab maps a token's bytes to its id.
	vocab *strTable
	// tokens is the inverse, for decoding; known marks the ids the
	// vocabulary uses (a bit per id).
	tokens byteStrings
	known  []uint64
	// pending holds each id's bytes while the tokenizer is loaded; freeze
	// turns it into tokens and known.
	pending [][]byte
	// byteID is the id of each single byte; hasByte says whether the
	// vocabulary has it (a missing byte is dropped, as the reference does
	// without an unknown token).
	byteID  [256]uint32
	hasByte [256]bool
	// merges maps a pair of ids to the merge's rank and result.
	merges *pairTable
	// ignoreMerges emits a pre-token found whole in the vocabulary without
	// merging (Llama 3).
	ignoreMerges bool
	words        *wordCache
}

// token returns the bytes of id, and whether the vocabulary has it.
func (m *bpe) token(id uint32) ([]byte, bool) {
	if int(id) >= m.tokens.len() || m.known[id/64]&(1<<(id%64)) == 0 {
		return nil, false
	}
	return m.tokens.at(id), true
}

// freeze lays the loaded tokens out flat.
func (m *bpe) freeze() {
	total := 0
	for _, b := range m.pending {
		total += len(b)
	}
	m.tokens = newByteStrings(len(m.pending), total)
	m.known = make([]uint64, (len(m.pending)+63)/64)
	for id, b := range m.pending {
		m.tokens.add(b)
		if b != nil {
			m.known[id/64] |= 1 << (id % 64)
		}
	}
	m.pending = nil
}

type merge struct {
	rank uint32
	id   uint32
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

// simpleMergeLimit is the pre-token length up to which a quadratic scan for
// the best pair beats a heap: most pre-tokens are a few bytes long.
const simpleMergeLimit = 48

// symbol is one part of a pre-token during merging, in a linked list.
type symbol struct {
	id         uint32
	prev, next int32
	dead       bool
}

// bpeScratch is reused across pre-tokens to keep merging allocation-free.
type bpeScratch struct {
	syms []symbol
	h    pairHeap
}

var scratchPool = sync.Pool{New: func() any { return new(bpeScratch) }}

// encodeWord appends the ids of one pre-token.
func (m *bpe) encodeWord(dst []uint32, word string) []uint32 {
	if id, ok := m.vocab.get(word); ok && (m.ignoreMerges || len(word) == 1) {
		return append(dst, id)
	}
	if out, ok := m.words.appendIDs(dst, word); ok {
		return out
	}
	start := len(dst)
	sc := scratchPool.Get().(*bpeScratch)
	syms := sc.syms[:0]
	for i := 0; i < len(word); i++ {
		b := word[i]
		if !m.hasByte[b] {
			continue
		}
		syms = append(syms, symbol{id: m.byteID[b], prev: int32(len(syms)) - 1, next: int32(len(syms)) + 1})
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	if len(syms) <= simpleMergeLimit {
		syms = m.mergeSimple(syms)
	} else {
		syms = m.mergeHeap(syms, &sc.h)
	}
	for i := 0; i >= 0 && i < len(syms); i = int(syms[i].next) {
		dst = append(dst, syms[i].id)
	}
	sc.syms = syms
	scratchPool.Put(sc)
	m.words.put(word, dst[start:])
	return dst
}

// mergeSimple repeatedly merges the lowest-ranked adjacent pair, the
// leftmost among equals, exactly as the heap does.
func (m *bpe) mergeSimple(syms []symbol) []symbol {
	// In the simple case the list stays contiguous: compact after each
	// merge instead of linking.
	n := len(syms)
	for n > 1 {
		best, bestRank, bestID := -1, ^uint32(0), uint32(0)
		for i := 0; i+1 < n; i++ {
			if mg, ok := m.merges.get(pairKey(syms[i].id, syms[i+1].id)); ok && mg.rank < bestRank {
				best, bestRank, bestID = i, mg.rank, mg.id
			}
		}
		if best < 0 {
			break
		}
		syms[best].id = bestID
		copy(syms[best+1:n-1], syms[best+2:n])
		n--
	}
	syms = syms[:n]
	for i := range syms {
		syms[i].next = int32(i) + 1
	}
	if n > 0 {
		syms[n-1].next = -1
	}
	return syms
}

// pairCand is a candidate merge of symbols left and right.
type pairCand struct {
	rank, id      uint32
	left, right   int32
	leftID, rghID uint32
}

type pairHeap []pairCand

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].left < h[j].left
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairCand)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// mergeHeap merges long pre-tokens in O(n log n): a queue of candidate
// pairs ordered by rank and then position, skipping candidates that an
// earlier merge made stale.
func (m *bpe) mergeHeap(syms []symbol, h *pairHeap) []symbol {
	*h = (*h)[:0]
	push := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		if mg, ok := m.merges.get(pairKey(syms[l].id, syms[r].id)); ok {
			heap.Push(h, pairCand{rank: mg.rank, id: mg.id, left: l, right: r, leftID: syms[l].id, rghID: syms[r].id})
		}
	}
	for i := 0; i+1 < len(syms); i++ {
		push(int32(i), int32(i+1))
	}
	for h.Len() > 0 {
		c := heap.Pop(h).(pairCand)
		l, r := &syms[c.left], &syms[c.right]
		if l.dead || r.dead || l.next != c.right || l.id != c.leftID || r.id != c.rghID {
			continue
		}
		l.id = c.id
		l.next = r.next
		r.dead = true
		if r.next >= 0 {
			syms[r.next].prev = c.left
		}
		push(l.prev, c.left)
		push(c.left, l.next)
	}
	// Compact into a contiguous list.
	out := syms[:0]
	for i := 0; i >= 0 && i < len(syms); {
		next := syms[i].next
		out = append(out, symbol{id: syms[i].id})
		i = int(next)
	}
	for i := range out {
		out[i].next = int32(i) + 1
	}
	if len(out) > 0 {
		out[len(out)-1].next = -1
	}
	return out
}

// wordCache remembers the ids of short pre-tokens, which repeat constantly
// in natural text. It is sharded to keep lock contention low, and a full
// shard is cleared rather than tracked for recency: clearing is cheap and
// the common words come back at once. A shard is an open-addressing table
// over two arenas, of word bytes and of ids, with no pointers for the
// collector to scan however full it is.
type wordCache struct {
	seed   maphash.Seed
	shards [wordShards]wordShard
	limit  int
}

const (
	wordShards      = 16
	maxCachedWord   = 64
	defaultWordKeys = 1 << 16
)

type wordShard struct {
	mu sync.RWMutex
	// slots hold the top 32 bits of a word's hash and its entry's index
	// plus one (0 is empty).
	slots   []uint64
	entries []wordEntry
	words   []byte
	ids     []uint32
}

// wordEntry places a word and its ids in the shard's arenas; a word has at
// most maxCachedWord bytes and so at most as many ids.
type wordEntry struct {
	wordOff, idsOff uint32
	wordLen, idsLen uint8
}

// newWordCache returns a cache of about entries words; nil (no cache) when
// entries is not positive.
func newWordCache(entries int) *wordCache {
	if entries <= 0 {
		return nil
	}
	c := &wordCache{seed: maphash.MakeSeed(), limit: max(1, entries/wordShards)}
	for i := range c.shards {
		c.shards[i].slots = make([]uint64, tableSize(c.limit))
	}
	return c
}

// find returns the index of w's entry in s, or -1; s is locked.
func (s *wordShard) find(h uint64, w string) int {
	mask := uint64(len(s.slots) - 1)
	for i := (h / wordShards) & mask; ; i = (i + 1) & mask {
		v := s.slots[i]
		if v == 0 {
			return -1
		}
		if v>>32 == h>>32 {
			e := &s.entries[uint32(v)-1]
			if string(s.words[e.wordOff:e.wordOff+uint32(e.wordLen)]) == w {
				return int(uint32(v) - 1)
			}
		}
	}
}

// appendIDs appends the cached ids of w to dst; ok is false when w is not
// cached. The ids are copied under the shard's lock, since a full shard's
// arenas are reused.
func (c *wordCache) appendIDs(dst []uint32, w string) (out []uint32, ok bool) {
	if c == nil || len(w) > maxCachedWord {
		return dst, false
	}
	h := maphash.String(c.seed, w)
	s := &c.shards[h%wordShards]
	s.mu.RLock()
	if e := s.find(h, w); e >= 0 {
		en := s.entries[e]
		dst, ok = append(dst, s.ids[en.idsOff:en.idsOff+uint32(en.idsLen)]...), true
	}
	s.mu.RUnlock()
	return dst, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	if c == nil || len(w) > maxCachedWord || len(ids) > maxCachedWord {
		return
	}
	h := maphash.String(c.seed, w)
	s := &c.shards[h%wordShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.find(h, w) >= 0 {
		return
	}
	if len(s.entries) >= c.limit {
		clear(s.slots)
		s.entries, s.words, s.ids = s.entries[:0], s.words[:0], s.ids[:0]
	}
	s.entries = append(s.entries, wordEntry{
		wordOff: uint32(len(s.words)), idsOff: uint32(len(s.ids)),
		wordLen: uint8(len(w)), idsLen: uint8(len(ids)),
	})
	s.words = append(s.words, w...)
	s.ids = append(s.ids, ids...)
	mask := uint64(len(s.slots) - 1)
	i := (h / wordShards) & mask
	for s.slots[i] != 0 {
		i = (i + 1) & mask
	}
	s.slots[i] = h>>32<<32 | uint64(len(s.entries))
}
