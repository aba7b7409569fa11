package tokenizer

import (
	"sync"

	"github.com/zeebo/xxh3"
)

// segmentCache holds the ids of recently seen segments (text between added
// tokens) within a memory bound, least recently used first out. It is
// sharded by key so that concurrent requests rarely share a lock.
type segmentCache struct {
	shards [segmentShards]segmentShard
	name   string
}

const (
	segmentShards = 16
	// entryOverhead approximates the bytes an entry costs besides its ids:
	// its slot in the entries and in the index.
	entryOverhead = 128
)

// segKey identifies a segment by a 128-bit hash and its length, so that a
// collision (which would silently give wrong ids) needs both to agree. One
// 128-bit pass over a long system prompt costs less than two 64-bit ones.
type segKey struct {
	h1, h2 uint64
	n      int
}

func segmentKey(s string) segKey {
	h := xxh3.HashString128(s)
	return segKey{h1: h.Lo, h2: h.Hi, n: len(s)}
}

// segmentShard is an LRU list threaded through a slice by index, found by
// a map whose keys and values hold no pointers: the collector scans one
// slice header per cached segment, not a list element, a map slot and an
// entry.
type segmentShard struct {
	mu      sync.Mutex
	index   map[segKey]int32
	entries []segmentEntry
	free    []int32 // entries whose ids are nil, for reuse
	// head is the most recently used entry, tail the least; -1 when empty.
	head, tail int32
	bytes      int64
	maxBytes   int64
}

type segmentEntry struct {
	key        segKey
	ids        []uint32
	prev, next int32
}

func newSegmentCache(maxBytes int64, name string) *segmentCache {
	c := &segmentCache{name: name}
	for i := range c.shards {
		c.shards[i].index = make(map[segKey]int32)
		c.shards[i].head, c.shards[i].tail = -1, -1
		c.shards[i].maxBytes = max(maxBytes/segmentShards, 1)
	}
	return c
}

func entryBytes(ids []uint32) int64 { return int64(4*cap(ids)) + entryOverhead }

func (s *segmentShard) unlink(e int32) {
	en := &s.entries[e]
	if en.prev >= 0 {
		s.entries[en.prev].next = en.next
	} else {
		s.head = en.next
	}
	if en.next >= 0 {
		s.entries[en.next].prev = en.prev
	} else {
		s.tail = en.prev
	}
}

func (s *segmentShard) pushFront(e int32) {
	en := &s.entries[e]
	en.prev, en.next = -1, s.head
	if s.head >= 0 {
		s.entries[s.head].prev = e
	}
	s.head = e
	if s.tail < 0 {
		s.tail = e
	}
}

func (c *segmentCache) get(k segKey) ([]uint32, bool) {
	s := &c.shards[k.h1%segmentShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.index[k]
	if !ok {
		return nil, false
	}
	if s.head != e {
		s.unlink(e)
		s.pushFront(e)
	}
	// The ids are never changed after insertion, so the caller may read
	// them after the lock is released.
	return s.entries[e].ids, true
}

func (c *segmentCache) put(k segKey, ids []uint32, m *modelMetrics) {
	own := append(make([]uint32, 0, len(ids)), ids...)
	size := entryBytes(own)
	s := &c.shards[k.h1%segmentShards]
	if size > s.maxBytes {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.index[k]; ok {
		return
	}
	var e int32
	if n := len(s.free); n > 0 {
		e, s.free = s.free[n-1], s.free[:n-1]
	} else {
		s.entries = append(s.entries, segmentEntry{})
		e = int32(len(s.entries) - 1)
	}
	s.entries[e] = segmentEntry{key: k, ids: own}
	s.pushFront(e)
	s.index[k] = e
	s.bytes += size
	added, evicted := int64(1), 0
	for s.bytes > s.maxBytes {
		old := s.tail
		s.unlink(old)
		en := &s.entries[old]
		delete(s.index, en.key)
		s.bytes -= entryBytes(en.ids)
		size -= entryBytes(en.ids)
		en.ids = nil
		s.free = append(s.free, old)
		evicted++
	}
	m.segmentBytes.WithLabelValues(c.name).Add(float64(size))
	m.segmentEntries.WithLabelValues(c.name).Add(float64(added - int64(evicted)))
	if evicted > 0 {
		m.segmentEvicted.WithLabelValues(c.name).Add(float64(evicted))
	}
}
