package index

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// blockKey hashes the tokens where they lie, and the portable path through
// a stack buffer and the streaming hash: both must agree with the
// library's hash of the bytes written out, for every length, across each
// of XXH3's length classes (to 16, 128 and 240 bytes, and beyond) and
// either side of the portable buffer's size.
func TestBlockKeysAreXXH3OfTheirBytes(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	for n := 0; n <= 300; n++ {
		for range 4 {
			parent := rng.Uint64()
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = rng.Uint32()
			}
			want := referenceKey(parent, tokens)
			if got := blockKey(parent, tokens); got != want {
				t.Fatalf("%d tokens: key %#x, want %#x", n, got, want)
			}
			if got := blockKeyPortable(parent, tokens); got != want {
				t.Fatalf("%d tokens: portable key %#x, want %#x", n, got, want)
			}
		}
	}
}

// FuzzBlockKey checks blockKey against the library's hash of the bytes it
// stands for, for any parent and tokens.
func FuzzBlockKey(f *testing.F) {
	f.Add(uint64(0), []byte{})
	f.Add(uint64(1), make([]byte, 4*16))
	f.Add(^uint64(0), make([]byte, 4*23))
	f.Fuzz(func(t *testing.T, parent uint64, raw []byte) {
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
		want := referenceKey(parent, tokens)
		if got := blockKey(parent, tokens); got != want {
			t.Fatalf("%d tokens: key %#x, want %#x", len(tokens), got, want)
		}
		if got := blockKeyPortable(parent, tokens); got != want {
			t.Fatalf("%d tokens: portable key %#x, want %#x", len(tokens), got, want)
		}
	})
}
