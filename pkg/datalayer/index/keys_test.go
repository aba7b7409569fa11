package index

import (
	"encoding/binary"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/events"
)

// referenceKey is the block key written the plain way: the tokens' bytes
// written out one by one into a slice, one call of the library's seeded
// hash. blockKey's view of the tokens in place, and the portable path's
// stack buffer and streaming hash, must agree with it.
func referenceKey(parent uint64, tokens []uint32) uint64 {
	var b []byte
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return xxh3.HashSeed(b, parent) & keyMask
}

func countingTokens(n int, from uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

func TestRootKeySeparatesItsFields(t *testing.T) {
	t.Parallel()
	distinct := [][3]string{
		{"ab", "c", ""}, {"a", "bc", ""}, {"abc", "", ""}, {"", "abc", ""}, {"", "", "abc"},
		{"m", "", "s"}, {"m", "s", ""}, {"m", "", ""},
	}
	seen := map[uint64][3]string{}
	for _, f := range distinct {
		k := RootKey(f[0], f[1], f[2])
		if prev, dup := seen[k]; dup {
			t.Fatalf("RootKey%q equals RootKey%q", f, prev)
		}
		seen[k] = f
		if k&^keyMask != 0 {
			t.Fatalf("RootKey%q = %#x has low bits set", f, k)
		}
	}
	if RootKey("m", "l", "s") != RootKey("m", "l", "s") {
		t.Fatal("RootKey is not deterministic")
	}
}

func TestAppendBlockKeys(t *testing.T) {
	t.Parallel()
	root := RootKey("m", "", "")
	tests := []struct {
		name      string
		tokens    int
		blockSize int
		wantKeys  int
	}{
		{"full blocks of sixteen each get a key", 64, 16, 4},
		{"a trailing partial block gets no key", 70, 16, 4},
		{"a prompt shorter than a block has no key", 15, 16, 0},
		{"a block of exactly the buffer size hashes in one call", 128, keyChunkTokens, 2},
		{"blocks larger than the buffer stream through a digest", 3 * 200, 200, 3},
		{"a block size of one keys every token", 5, 1, 5},
		{"a zero block size yields nothing", 64, 0, 0},
		{"a negative block size yields nothing", 64, -4, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tokens := countingTokens(tc.tokens, 7)
			got := AppendBlockKeys(nil, root, tokens, tc.blockSize)
			if len(got) != tc.wantKeys {
				t.Fatalf("got %d keys, want %d", len(got), tc.wantKeys)
			}
			parent := root
			for i, k := range got {
				want := referenceKey(parent, tokens[i*tc.blockSize:(i+1)*tc.blockSize])
				if k != want {
					t.Fatalf("key %d = %#x, want %#x", i, k, want)
				}
				parent = k
			}
		})
	}
}

func TestAppendBlockKeysChainsSoAPrefixHasThePrefixKeys(t *testing.T) {
	t.Parallel()
	root := RootKey("m", "", "")
	long := AppendBlockKeys(nil, root, countingTokens(160, 1), 16)
	short := AppendBlockKeys(nil, root, countingTokens(48, 1), 16)
	for i := range short {
		if short[i] != long[i] {
			t.Fatalf("key %d of a prefix differs from the full prompt's", i)
		}
	}
	// Continuing from the last key of a prefix gives the rest of the chain.
	rest := AppendBlockKeys(nil, short[2], countingTokens(160, 1)[48:], 16)
	for i := range rest {
		if rest[i] != long[3+i] {
			t.Fatalf("continued key %d differs", i)
		}
	}
	// The same tokens under another root never share a key.
	other := AppendBlockKeys(nil, RootKey("m", "lora", ""), countingTokens(48, 1), 16)
	for i := range other {
		if other[i] == short[i] {
			t.Fatalf("key %d is the same under two roots", i)
		}
	}
}

// Not parallel: AllocsPerRun refuses to run alongside other tests.
func TestAppendBlockKeysKeepsDstAndAllocatesNothingWithRoom(t *testing.T) {
	dst := make([]uint64, 1, 300)
	dst[0] = 42
	tokens := countingTokens(4096, 3)
	got := AppendBlockKeys(dst, 1, tokens, 16)
	if got[0] != 42 || len(got) != 257 {
		t.Fatalf("dst not kept: len %d first %d", len(got), got[0])
	}
	allocs := testing.AllocsPerRun(100, func() { _ = AppendBlockKeys(dst[:0], 1, tokens, 16) })
	if allocs != 0 {
		t.Fatalf("%.0f allocations with room in dst", allocs)
	}
	big := countingTokens(1000, 3)
	allocs = testing.AllocsPerRun(100, func() { _ = AppendBlockKeys(dst[:0], 1, big, 250) })
	if allocs != 0 {
		t.Fatalf("%.0f allocations for large blocks", allocs)
	}
}

func TestPlainExtras(t *testing.T) {
	t.Parallel()
	named := &events.Event{LoRAName: "sql"}
	byID := &events.Event{LoRAID: 3, HasLoRAID: true}
	base := &events.Event{}
	tests := []struct {
		name      string
		extra     events.ExtraKey
		e         *events.Event
		first     bool
		wantSalt  string
		wantPlain bool
	}{
		{"no extras are plain", nil, base, true, "", true},
		{"a lone string on a first block is the salt", events.ExtraKey{"s1"}, base, true, "s1", true},
		{"a lone string on a later block is not plain", events.ExtraKey{"s1"}, base, false, "", false},
		{"the adapter's name alone is plain", events.ExtraKey{"sql"}, named, false, "", true},
		{"the adapter's name then a salt is plain on a first block", events.ExtraKey{"sql", "s"}, named, true, "s", true},
		{"the adapter's integer id is taken as the adapter", events.ExtraKey{int8(3)}, byID, false, "", true},
		{"another adapter's name is not plain", events.ExtraKey{"other"}, named, false, "", false},
		{"a multimodal hash after the adapter is not plain", events.ExtraKey{"sql", "mmhash", "s"}, named, true, "", false},
		{"a byte digest is not plain", events.ExtraKey{[]byte{1, 2}}, base, true, "", false},
		{"a nested tuple is not plain", events.ExtraKey{[]any{"h", 3}}, base, true, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			salt, plain := plainExtras(tc.extra, tc.e, tc.first)
			if plain != tc.wantPlain || (plain && salt != tc.wantSalt) {
				t.Fatalf("plainExtras = (%q, %v), want (%q, %v)", salt, plain, tc.wantSalt, tc.wantPlain)
			}
		})
	}
}

func TestMarkedKeysDependOnTheExtrasContent(t *testing.T) {
	t.Parallel()
	k := RootKey("m", "", "")
	a := markedKey(k, events.ExtraKey{"img-1"})
	b := markedKey(k, events.ExtraKey{"img-2"})
	c := markedKey(k, events.ExtraKey{int64(1)})
	d := markedKey(k, events.ExtraKey{"1"})
	if a == b || c == d || a == k {
		t.Fatalf("marked keys collide: %#x %#x %#x %#x (plain %#x)", a, b, c, d, k)
	}
	if markedKey(k, events.ExtraKey{uint8(1)}) != c {
		t.Fatal("integer widths change the marked key")
	}
}
