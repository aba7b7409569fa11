package index

import (
	"slices"
	"sync"

	"github.com/kvroute/kvroute/pkg/events"
)

// The key store maps a block key to the endpoints holding it. It is split
// into shards, each behind its own RWMutex, so Apply for one endpoint and
// lookups for many requests rarely meet on a lock. A long lookup read-locks
// every shard its keys fall in, each lock an atomic instruction on a line
// that is often cold, so there are few shards: 64 (256 cost an 8k-token
// lookup about 7 µs more on the ext_proc path, and Apply and speculation
// measured the same with either). The price is in a table's growth: each
// shard's table is four times larger than with 256, so the write lock a
// resize holds lasts four times longer, a quarter as often; as a long
// lookup takes every shard's lock, it meets every resize either way.
//
// Memory is the constraint that shapes it: a holding must cost well under 64
// bytes at ten million of them. So a key's holders are packed words, and the
// common case, a key held by one endpoint, keeps that word in the map value
// itself; only keys with several holders point into a per-shard slab.
const (
	numShards  = 64
	shardShift = 64 - 6
)

// A holder word packs one endpoint's hold on one key:
//
//	bits  0-15  endpoint id (interned address)
//	bits 16-51  real holding: a 12-bit reference count per tier (GPU, CPU, STORAGE);
//	            speculative holding: the deadline in ms since the index's epoch
//	bit  52     speculative: held only because a pick said it soon would be
//
// A map value with setBit holds instead the slab index of a holder list.
// A list starts with two header words, then the holders:
//
//	[0] signature: the XOR of sigOf over the real holders, which depends
//	    only on who holds the key in which tiers (not on reference counts),
//	    so a lookup can tell in O(1) that a block has the same holders as
//	    the one before it and credit the same candidates again
//	[1] the number of speculative holders (their liveness depends on the
//	    clock, so lists with any are never taken as unchanged)
const (
	setHeader = 2

	epBits     = 16
	epMask     = 1<<epBits - 1
	refShift   = epBits
	refBits    = 12
	refMax     = 1<<refBits - 1
	refsMask   = (1<<(refBits*events.NumTiers) - 1) << refShift
	specBit    = 1 << 52
	specMsMask = 1<<36 - 1
	setBit     = 1 << 63
)

func holderEP(h uint64) uint16 { return uint16(h & epMask) }

func holderRefs(h uint64, t events.Tier) uint64 {
	return h >> (refShift + refBits*uint(t)) & refMax
}

func refUnit(t events.Tier) uint64 { return 1 << (refShift + refBits*uint(t)) }

// sigOf is a holder's contribution to its list's signature: a mix of its
// endpoint and the set of tiers it holds (0 for a speculative holder).
func sigOf(h uint64) uint64 {
	if h == 0 || h&specBit != 0 {
		return 0
	}
	x := h & epMask
	for t := events.Tier(0); t < events.NumTiers; t++ {
		if holderRefs(h, t) != 0 {
			x |= 1 << (epBits + uint(t))
		}
	}
	// splitmix64's finaliser: XORs of mixed values collide only by chance.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x | 1 // never 0, which would make a holder invisible in the XOR
}

func specCount(h uint64) uint64 { return h >> 52 & 1 }

func specHolder(ep uint16, deadlineMs uint64) uint64 {
	return uint64(ep) | (deadlineMs&specMsMask)<<refShift | specBit
}

// specLive reports whether a speculative holder's deadline is still ahead
// of nowMs. Deadlines keep only 36 bits (over two years of milliseconds), so
// they are compared modulo 2^36: a deadline at most half that range ahead
// is live, which holds for any sane TTL however long the index runs.
func specLive(h, nowMs uint64) bool {
	ahead := (h>>refShift - nowMs) & specMsMask
	return ahead != 0 && ahead < 1<<35
}

// delta gathers one operation's changes to the index's gauges, so that they
// are published with a few atomic adds per batch rather than per block.
type delta struct {
	holdings [events.NumTiers]int64
	blocks   int64
	spec     int64
}

// held is the change in holdings, all tiers.
func (d *delta) held() int64 {
	var n int64
	for _, h := range d.holdings {
		n += h
	}
	return n
}

type keyShard struct {
	mu   sync.RWMutex
	m    keyTable
	sets [][]uint64
	free []uint32
	// Keep neighbouring shards' locks off one cache line.
	_ [64]byte
}

// get returns ep's holder word for key, 0 if ep does not hold it.
func (s *keyShard) get(key uint64, ep uint16) uint64 {
	v, ok := s.m.get(key)
	switch {
	case !ok:
		return 0
	case v&setBit == 0:
		if holderEP(v) == ep {
			return v
		}
		return 0
	}
	for _, h := range s.sets[uint32(v)][setHeader:] {
		if holderEP(h) == ep {
			return h
		}
	}
	return 0
}

// put sets ep's holder word for key to h (0 drops ep's hold), keeping the
// holders in their most compact form: inline when there is one. It returns
// the change in the number of distinct keys.
func (s *keyShard) put(key uint64, ep uint16, h uint64) int64 {
	v, ok := s.m.get(key)
	switch {
	case !ok:
		if h == 0 {
			return 0
		}
		s.m.set(key, h)
		return 1
	case v&setBit == 0:
		switch {
		case holderEP(v) == ep && h == 0:
			s.m.del(key)
			return -1
		case holderEP(v) == ep:
			s.m.set(key, h)
		case h != 0:
			s.m.set(key, setBit|uint64(s.allocSet(v, h)))
		}
		return 0
	}
	idx := uint32(v)
	hs := s.sets[idx]
	i := indexOfEP(hs[setHeader:], ep)
	var old uint64
	if i >= 0 {
		i += setHeader
		old = hs[i]
	}
	switch {
	case i < 0 && h == 0:
		return 0
	case i < 0:
		hs = append(hs, h)
	case h != 0:
		hs[i] = h
	default:
		last := len(hs) - 1
		hs[i] = hs[last]
		hs = hs[:last]
		if len(hs) == setHeader+1 {
			s.m.set(key, hs[setHeader])
			s.freeSet(idx)
			return 0
		}
	}
	hs[0] ^= sigOf(old) ^ sigOf(h)
	hs[1] += specCount(h) - specCount(old)
	s.sets[idx] = hs
	return 0
}

func (s *keyShard) allocSet(a, b uint64) uint32 {
	if n := len(s.free); n > 0 {
		idx := s.free[n-1]
		s.free = s.free[:n-1]
		s.sets[idx] = append(s.sets[idx][:0], sigOf(a)^sigOf(b), specCount(a)+specCount(b), a, b)
		return idx
	}
	s.sets = append(s.sets, append(make([]uint64, 0, setHeader+4), sigOf(a)^sigOf(b), specCount(a)+specCount(b), a, b))
	return uint32(len(s.sets) - 1)
}

// maxKeptSet is the largest holder list whose backing array a freed slab slot
// keeps for reuse; larger ones go back to the garbage collector.
const maxKeptSet = setHeader + 16

func (s *keyShard) freeSet(idx uint32) {
	if cap(s.sets[idx]) > maxKeptSet {
		s.sets[idx] = nil
	} else {
		s.sets[idx] = s.sets[idx][:0]
	}
	s.free = append(s.free, idx)
}

// groupMinKeys is how many keys make it worth grouping them by shard, so
// that each shard is locked once rather than once per key: below it,
// grouping (a pass over the shards) costs about what the locks it saves do
// (BenchmarkIndexSpeculate with 256 shards: 64 keys cost 20-30% more
// grouped, 512 keys 15% less, 2048 keys 20% less; with 64 shards, 64 keys
// cost the same either way).
const groupMinKeys = 256

// groupByShard appends items to dst ordered by the shard of their key (in
// their order within a shard) and sets bounds so that shard s's items are
// dst[base+bounds[s]:base+bounds[s+1]], base being len(dst) before.
func groupByShard[T any](dst, items []T, key func(*T) uint64, bounds *[numShards + 1]int32) []T {
	*bounds = [numShards + 1]int32{}
	for i := range items {
		bounds[key(&items[i])>>shardShift+1]++
	}
	for s := 1; s <= numShards; s++ {
		bounds[s] += bounds[s-1]
	}
	base := len(dst)
	dst = slices.Grow(dst, len(items))[:base+len(items)]
	var next [numShards]int32
	copy(next[:], bounds[:numShards])
	for i := range items {
		s := key(&items[i]) >> shardShift
		dst[base+int(next[s])] = items[i]
		next[s]++
	}
	return dst
}

func keyOf(k *uint64) uint64 { return *k }

// writeByShard calls f on each of items with the write lock of its key's
// shard held, one shard at a time. From groupMinKeys items on they are
// grouped by shard (in memory scratch picks from a pooled lookupScratch),
// so that each shard is locked once for all of its items (512 keys fall
// in all 64 shards), and the calls then come in shard order, not the
// items'.
func writeByShard[T any](ix *Index, items []T, key func(*T) uint64, scratch func(*lookupScratch) *[]T, f func(sh *keyShard, it *T)) {
	if len(items) < groupMinKeys {
		for i := range items {
			sh := ix.shard(key(&items[i]))
			sh.mu.Lock()
			f(sh, &items[i])
			sh.mu.Unlock()
		}
		return
	}
	sc := ix.scratch.Get().(*lookupScratch)
	buf := scratch(sc)
	var bounds [numShards + 1]int32
	*buf = groupByShard((*buf)[:0], items, key, &bounds)
	for s := range numShards {
		group := (*buf)[bounds[s]:bounds[s+1]]
		if len(group) == 0 {
			continue
		}
		sh := &ix.shards[s]
		sh.mu.Lock()
		for i := range group {
			f(sh, &group[i])
		}
		sh.mu.Unlock()
	}
	ix.scratch.Put(sc)
}

func indexOfEP(hs []uint64, ep uint16) int {
	for i, h := range hs {
		if holderEP(h) == ep {
			return i
		}
	}
	return -1
}

// addRef adds one reference to ep's holding of key in tier t, replacing a
// speculative holding. It reports false, changing nothing, if the count is
// already at its maximum.
func (s *keyShard) addRef(key uint64, ep uint16, t events.Tier, d *delta) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.get(key, ep)
	if h == 0 || h&specBit != 0 {
		if h != 0 {
			d.spec--
		}
		h = uint64(ep)
	}
	switch holderRefs(h, t) {
	case refMax:
		return false
	case 0:
		d.holdings[t]++
	}
	d.blocks += s.put(key, ep, h+refUnit(t))
	return true
}

// delRef drops one reference to ep's holding of key in tier t.
func (s *keyShard) delRef(key uint64, ep uint16, t events.Tier, d *delta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.get(key, ep)
	if h == 0 || h&specBit != 0 || holderRefs(h, t) == 0 {
		return
	}
	h -= refUnit(t)
	if holderRefs(h, t) == 0 {
		d.holdings[t]--
	}
	if h&refsMask == 0 {
		h = 0
	}
	d.blocks += s.put(key, ep, h)
}

// speculate records that ep will soon hold key, until deadlineMs; s.mu is
// held for writing. It reports whether anything was recorded: a real
// holding needs no speculation.
func (s *keyShard) speculate(key uint64, ep uint16, deadlineMs uint64, d *delta) bool {
	h := s.get(key, ep)
	if h != 0 && h&specBit == 0 {
		return false
	}
	if h == 0 {
		d.spec++
	}
	d.blocks += s.put(key, ep, specHolder(ep, deadlineMs))
	return true
}

// unspeculate removes ep's speculative holding of key if its deadline is at
// or before nowMs (any deadline when force is set).
func (s *keyShard) unspeculate(key uint64, ep uint16, nowMs uint64, force bool, d *delta) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unspeculateLocked(key, ep, nowMs, force, d)
}

// unspeculateLocked is unspeculate with s.mu held for writing.
func (s *keyShard) unspeculateLocked(key uint64, ep uint16, nowMs uint64, force bool, d *delta) bool {
	h := s.get(key, ep)
	if h&specBit == 0 || (!force && specLive(h, nowMs)) {
		return false
	}
	d.spec--
	d.blocks += s.put(key, ep, 0)
	return true
}
