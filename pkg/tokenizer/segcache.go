package tokenizer

import (
	"container/list"
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
	// the list element, the map slot and the slice header.
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

type segmentShard struct {
	mu       sync.Mutex
	entries  map[segKey]*list.Element
	order    list.List // front is most recent
	bytes    int64
	maxBytes int64
}

type segmentEntry struct {
	key segKey
	ids []uint32
}

func newSegmentCache(maxBytes int64, name string) *segmentCache {
	c := &segmentCache{name: name}
	for i := range c.shards {
		c.shards[i].entries = make(map[segKey]*list.Element)
		c.shards[i].maxBytes = max(maxBytes/segmentShards, 1)
	}
	return c
}

func entryBytes(ids []uint32) int64 { return int64(4*cap(ids)) + entryOverhead }

func (c *segmentCache) get(k segKey) ([]uint32, bool) {
	s := &c.shards[k.h1%segmentShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	if !ok {
		return nil, false
	}
	s.order.MoveToFront(e)
	// The ids are never changed after insertion, so the caller may read
	// them after the lock is released.
	return e.Value.(*segmentEntry).ids, true
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
	if _, ok := s.entries[k]; ok {
		return
	}
	s.entries[k] = s.order.PushFront(&segmentEntry{key: k, ids: own})
	s.bytes += size
	added, evicted := int64(1), 0
	for s.bytes > s.maxBytes {
		back := s.order.Back()
		e := back.Value.(*segmentEntry)
		s.order.Remove(back)
		delete(s.entries, e.key)
		s.bytes -= entryBytes(e.ids)
		size -= entryBytes(e.ids)
		evicted++
	}
	m.segmentBytes.WithLabelValues(c.name).Add(float64(size))
	m.segmentEntries.WithLabelValues(c.name).Add(float64(added - int64(evicted)))
	if evicted > 0 {
		m.segmentEvicted.WithLabelValues(c.name).Add(float64(evicted))
	}
}
