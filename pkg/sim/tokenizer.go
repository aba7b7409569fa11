package sim

import (
	"hash/fnv"
	"strings"
)

// TokenVocab bounds the simulated tokenizer's ids.
const TokenVocab = 50000

// Tokenize is the simulated engines' tokenizer, shared with the load
// generator: one token per whitespace-separated word, a hash of the word
// below TokenVocab. It only has to be deterministic and prefix-preserving
// (a text's tokens start with those of any word-aligned prefix), which is
// what prefix caching needs from a real one.
func Tokenize(s string) []uint32 {
	ids := make([]uint32, 0, len(s)/4)
	for _, w := range strings.Fields(s) {
		ids = append(ids, wordID(w))
	}
	return ids
}

func wordID(w string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(w))
	return h.Sum32() % TokenVocab
}
