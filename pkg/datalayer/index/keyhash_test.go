package index

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// blockKey computes xxhash64 from the tokens' values, without writing
// their bytes out: it must agree with the library's hash of those bytes
// for every length, each side of a 32-byte stripe and of the 8- and
// 4-byte tails.
func TestBlockKeysAreXXHashOfTheirBytes(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	for n := 0; n <= 300; n++ {
		for range 4 {
			parent := rng.Uint64()
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = rng.Uint32()
			}
			if got, want := blockKey(parent, tokens), referenceKey(parent, tokens); got != want {
				t.Fatalf("%d tokens: key %#x, want %#x", n, got, want)
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
		if got, want := blockKey(parent, tokens), referenceKey(parent, tokens); got != want {
			t.Fatalf("%d tokens: key %#x, want %#x", len(tokens), got, want)
		}
	})
}
