package tokenizer

import (
	"hash/maphash"
	"math/bits"
)

// The loaded tables hold no pointers: strings live in one byte array each,
// found by offsets, and the hash tables are slices of integers. A
// vocabulary of 150k tokens as a map of strings and a slice of slices was
// some 11 MiB that every garbage collection of the process scanned
// (BenchmarkLoadedHeap); as flat arrays the collector never looks inside.

// byteStrings is an array of byte strings by index, all in one byte array.
type byteStrings struct {
	data []byte
	off  []uint32 // string i is data[off[i]:off[i+1]]
}

func (s *byteStrings) len() int { return len(s.off) - 1 }

func (s *byteStrings) at(i uint32) []byte { return s.data[s.off[i]:s.off[i+1]] }

func newByteStrings(n, total int) byteStrings {
	return byteStrings{data: make([]byte, 0, total), off: make([]uint32, 1, n+1)}
}

func (s *byteStrings) add(b []byte) {
	s.data = append(s.data, b...)
	s.off = append(s.off, uint32(len(s.data)))
}

// tableSize is the power of two of slots that keeps n keys under about
// three quarters full.
func tableSize(n int) int {
	return 1 << bits.Len(uint(n+n/3+1))
}

// strTable maps byte strings to ids by open addressing with linear probing.
// A slot holds the top 32 bits of the key's hash and the key's index plus
// one (0 is empty), so that a probe compares bytes only when 32 bits of
// hash agree.
type strTable struct {
	seed  maphash.Seed
	slots []uint64
	keys  byteStrings
	ids   []uint32
}

func newStrTable(n, keyBytes int) *strTable {
	return &strTable{
		seed:  maphash.MakeSeed(),
		slots: make([]uint64, tableSize(n)),
		keys:  newByteStrings(n, keyBytes),
		ids:   make([]uint32, 0, n),
	}
}

// put adds key → id; a key already present keeps its id.
func (t *strTable) put(key []byte, id uint32) {
	h := maphash.Bytes(t.seed, key)
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			t.keys.add(key)
			t.ids = append(t.ids, id)
			t.slots[i] = h>>32<<32 | uint64(len(t.ids))
			return
		}
		if s>>32 == h>>32 && string(t.keys.at(uint32(s)-1)) == string(key) {
			return
		}
	}
}

func (t *strTable) get(key string) (uint32, bool) {
	h := maphash.String(t.seed, key)
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return 0, false
		}
		if s>>32 == h>>32 {
			if e := uint32(s) - 1; string(t.keys.at(e)) == key {
				return t.ids[e], true
			}
		}
	}
}

// pairTable maps a pair of ids (pairKey) to its merge, by open addressing
// with linear probing; a slot is one 16-byte record, so a probe touches
// one cache line.
type pairTable struct {
	slots []pairSlot
	shift uint
}

type pairSlot struct {
	key uint64 // emptyPair when free
	merge
}

// emptyPair is no pair of ids: ids are below 2^22 (setToken's bound), so
// neither half of a real key is all ones.
const emptyPair = ^uint64(0)

func newPairTable(n int) *pairTable {
	size := tableSize(n)
	t := &pairTable{slots: make([]pairSlot, size), shift: uint(64 - bits.Len(uint(size-1)))}
	for i := range t.slots {
		t.slots[i].key = emptyPair
	}
	return t
}

func (t *pairTable) home(k uint64) uint64 {
	// Fibonacci hashing: the top bits of the product mix both ids.
	return (k * 0x9e3779b97f4a7c15) >> t.shift
}

// put adds k → m; a pair already present keeps its merge (the first,
// lowest-ranked, as the reference keeps it).
func (t *pairTable) put(k uint64, m merge) {
	mask := uint64(len(t.slots) - 1)
	for i := t.home(k); ; i = (i + 1) & mask {
		switch t.slots[i].key {
		case emptyPair:
			t.slots[i] = pairSlot{key: k, merge: m}
			return
		case k:
			return
		}
	}
}

func (t *pairTable) get(k uint64) (merge, bool) {
	mask := uint64(len(t.slots) - 1)
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		switch s.key {
		case k:
			return s.merge, true
		case emptyPair:
			return merge{}, false
		}
	}
}
