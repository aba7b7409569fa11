package index

import (
	"iter"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"unsafe"
)

// keyTable maps block keys to holder words. It is an open-addressing hash
// table with linear probing over one flat array of (key, value) pairs: a
// request's lookup walks hundreds of keys that are mostly cold in cache, and
// here each costs one cache miss where a Go map's header, table and group
// cost up to three.
//
// Removal shifts the rest of the probe run back, so no tombstones build up.
// Keys hash with a random seed per table: keys follow from prompts a client
// chooses, and must not be steerable into one long run. The table shrinks
// when it is mostly empty, so an endpoint that leaves gives its memory back.
// It is not safe for concurrent use; the shard's lock guards it, except
// for what a lookup's prefetching reads (seed, hint).
type keyTable struct {
	// seed is set before the table is shared and never changes, so it is
	// read without the lock (by a lookup's prefetching).
	seed uint64
	// hint is the address of slots with log2 of its length in the top
	// eight bits (heap addresses fit in 48), republished by every resize
	// for slotAddr, which reads it without the lock. It is never made a
	// pointer again, only an address to prefetch, so a stale hint (its
	// array resized away, even collected) costs a useless prefetch and
	// nothing else.
	hint  atomic.Uint64
	slots []keySlot // a power of two long, or empty
	n     int       // keys held, the zero key included
	// The zero key marks an empty slot, so it is kept aside.
	zeroVal uint64
	hasZero bool
}

type keySlot struct{ key, val uint64 }

const (
	keyTableMinSlots = 16
	// The table grows past 3/4 full and shrinks below 1/8 full.
	keyTableMaxLoadNum, keyTableMaxLoadDen = 3, 4
	keyTableMinLoadDen                     = 8
)

func newKeyTable() keyTable { return keyTable{seed: rand.Uint64()} }

// home is key's first slot before masking: the seeded key through
// murmur3's 64-bit finaliser, so that every bit of the key moves the slot.
func (t *keyTable) home(key uint64) uint64 {
	x := key ^ t.seed
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func (t *keyTable) len() int { return t.n }

// get returns key's value and whether the table holds key.
func (t *keyTable) get(key uint64) (uint64, bool) { return t.getHome(key, t.home(key)) }

// getHome is get with key's home, t.home(key), computed by the caller.
func (t *keyTable) getHome(key, home uint64) (uint64, bool) {
	if key == 0 {
		return t.zeroVal, t.hasZero
	}
	if len(t.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(t.slots) - 1)
	for i := home & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == key {
			return s.val, true
		}
		if s.key == 0 {
			return 0, false
		}
	}
}

// set maps key to val, adding key if it is new.
func (t *keyTable) set(key, val uint64) {
	if key == 0 {
		if !t.hasZero {
			t.n++
		}
		t.zeroVal, t.hasZero = val, true
		return
	}
	if (t.n+1)*keyTableMaxLoadDen > len(t.slots)*keyTableMaxLoadNum {
		t.resize(max(keyTableMinSlots, 2*len(t.slots)))
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key) & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == key {
			s.val = val
			return
		}
		if s.key == 0 {
			*s = keySlot{key, val}
			t.n++
			return
		}
	}
}

// del removes key, if held.
func (t *keyTable) del(key uint64) {
	if key == 0 {
		if t.hasZero {
			t.n--
		}
		t.zeroVal, t.hasZero = 0, false
		return
	}
	if len(t.slots) == 0 {
		return
	}
	mask := uint64(len(t.slots) - 1)
	i := t.home(key) & mask
	for ; t.slots[i].key != key; i = (i + 1) & mask {
		if t.slots[i].key == 0 {
			return
		}
	}
	// Close the gap at i: walk the run after it and move back each entry
	// whose home does not lie cyclically in (i, j], i.e. that a lookup
	// starting at its home would no longer reach past the hole.
	for j := (i + 1) & mask; t.slots[j].key != 0; j = (j + 1) & mask {
		h := t.home(t.slots[j].key) & mask
		if (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = keySlot{}
	t.n--
	if len(t.slots) > keyTableMinSlots && t.n*keyTableMinLoadDen < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

// resize rehashes every key into a table of size slots.
func (t *keyTable) resize(size int) {
	old := t.slots
	t.slots = make([]keySlot, size)
	mask := uint64(size - 1)
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := t.home(s.key) & mask
		for t.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
	t.hint.Store(uint64(uintptr(unsafe.Pointer(&t.slots[0]))) | uint64(bits.TrailingZeros(uint(size)))<<hintShift)
}

const hintShift = 56

// slotAddr is the address of the slot a key whose home is home starts
// its probe at, or 0 before the table has slots, computed without the
// lock for a prefetch ahead of a lookup's get under the lock.
func (t *keyTable) slotAddr(home uint64) uintptr {
	h := t.hint.Load()
	if h == 0 {
		return 0
	}
	mask := uint64(1)<<(h>>hintShift) - 1
	return uintptr(h&(1<<hintShift-1)) + uintptr(home&mask)*unsafe.Sizeof(keySlot{})
}

// all yields every key and its value, in no particular order. The table
// must not change while it runs.
func (t *keyTable) all() iter.Seq2[uint64, uint64] {
	return func(yield func(uint64, uint64) bool) {
		if t.hasZero && !yield(0, t.zeroVal) {
			return
		}
		for _, s := range t.slots {
			if s.key != 0 && !yield(s.key, s.val) {
				return
			}
		}
	}
}
