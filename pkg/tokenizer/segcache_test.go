package tokenizer

import (
	"slices"
	"testing"
)

func TestSegmentCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	ids := func(v uint32) []uint32 { return slices.Repeat([]uint32{v}, 10) }
	// Room for three entries of ten ids in each shard; the keys share one.
	c := newSegmentCache(segmentShards*3*entryBytes(make([]uint32, 10)), "t")
	m := metricsFor(nil)
	key := func(i uint64) segKey { return segKey{h1: i * segmentShards, h2: i, n: 10} }
	for i := range uint64(3) {
		c.put(key(i), ids(uint32(i)), m)
	}
	if got, ok := c.get(key(0)); !ok || !slices.Equal(got, ids(0)) {
		t.Fatalf("entry 0 = %v, %v", got, ok)
	}
	c.put(key(3), ids(3), m) // evicts 1, used least recently
	for i, want := range []bool{true, false, true, true} {
		got, ok := c.get(key(uint64(i)))
		if ok != want || (ok && !slices.Equal(got, ids(uint32(i)))) {
			t.Errorf("entry %d = %v, %v; want present %v", i, got, ok, want)
		}
	}
	// Freed entries are reused: the shard's slice does not grow with turnover.
	for i := range uint64(100) {
		c.put(key(10+i), ids(uint32(i)), m)
	}
	s := &c.shards[0]
	if len(s.index) != 3 || len(s.entries) > 4 {
		t.Errorf("after turnover: %d indexed, %d entries; want 3 and at most 4", len(s.index), len(s.entries))
	}
}
