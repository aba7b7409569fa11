package remotetokenizer

import (
	"container/list"
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// cacheKey is a 128-bit hash of everything that decides a tokenization. Two
// independent 64-bit hashes keep accidental collisions out of reach even
// over millions of distinct prompts, so the prompt itself need not be kept.
type cacheKey [2]uint64

// keyHasher feeds the same bytes to two differently seeded digests. It is
// used by pointer and lives on the caller's stack.
type keyHasher struct{ a, b xxhash.Digest }

// keySeed is an arbitrary odd constant that makes the second digest
// independent of the first.
const keySeed = 0x9e3779b97f4a7c15

func (h *keyHasher) reset() {
	h.a.Reset()
	h.b.ResetWithSeed(keySeed)
}

// field writes one length-prefixed field, so that ("ab","c") and ("a","bc")
// hash differently.
func (h *keyHasher) field(s []byte) {
	h.length(len(s))
	_, _ = h.a.Write(s)
	_, _ = h.b.Write(s)
}

func (h *keyHasher) stringField(s string) {
	h.length(len(s))
	_, _ = h.a.WriteString(s)
	_, _ = h.b.WriteString(s)
}

func (h *keyHasher) length(l int) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(l))
	_, _ = h.a.Write(n[:])
	_, _ = h.b.Write(n[:])
}

func (h *keyHasher) flag(v bool) {
	b := []byte{0}
	if v {
		b[0] = 1
	}
	h.field(b)
}

func (h *keyHasher) sum() cacheKey { return cacheKey{h.a.Sum64(), h.b.Sum64()} }

// entryOverhead approximates the bytes an entry costs beyond its token ids:
// the list element, the map slot and the slice header.
const entryOverhead = 128

type cacheEntry struct {
	key    cacheKey
	tokens []uint32
}

func entryCost(tokens []uint32) int64 { return int64(len(tokens))*4 + entryOverhead }

// lruCache keeps the most recently used tokenizations within an entry and a
// byte bound. Its gauges are set under the same lock as the map, so they
// never disagree with it.
type lruCache struct {
	maxEntries int
	maxBytes   int64

	mu      sync.Mutex
	order   *list.List // front is most recently used; values are *cacheEntry
	entries map[cacheKey]*list.Element
	bytes   int64

	entriesGauge prometheus.Gauge
	bytesGauge   prometheus.Gauge
}

func newLRUCache(maxEntries int, maxBytes int64, entriesGauge, bytesGauge prometheus.Gauge) *lruCache {
	return &lruCache{
		maxEntries:   maxEntries,
		maxBytes:     maxBytes,
		order:        list.New(),
		entries:      make(map[cacheKey]*list.Element),
		entriesGauge: entriesGauge,
		bytesGauge:   bytesGauge,
	}
}

// get returns the cached token ids for k; the caller must not modify them.
func (c *lruCache) get(k cacheKey) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*cacheEntry).tokens, true
}

// put stores tokens under k, evicting the least recently used entries to
// stay within bounds. An entry larger than the whole byte bound is not kept.
func (c *lruCache) put(k cacheKey, tokens []uint32) {
	cost := entryCost(tokens)
	if c.maxEntries <= 0 || cost > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		c.order.MoveToFront(el)
		return
	}
	c.entries[k] = c.order.PushFront(&cacheEntry{key: k, tokens: tokens})
	c.bytes += cost
	for len(c.entries) > c.maxEntries || c.bytes > c.maxBytes {
		oldest := c.order.Back()
		e := oldest.Value.(*cacheEntry)
		c.order.Remove(oldest)
		delete(c.entries, e.key)
		c.bytes -= entryCost(e.tokens)
	}
	c.entriesGauge.Set(float64(len(c.entries)))
	c.bytesGauge.Set(float64(c.bytes))
}

func (c *lruCache) len() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.bytes
}
