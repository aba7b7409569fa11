package sim

import (
	"context"
	"hash/fnv"
	"strings"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
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

// Tokenizer is Tokenize on the EPP's request path, for the model Model: an
// EPP given it tokenizes the simulated engines' requests in process, as a
// deployment gives its EPP the model's tokenizer files, instead of asking
// an engine's /tokenize. A chat's prompt is its rendered messages, as the
// engines' chat endpoint renders them.
type Tokenizer struct{ Model string }

// Tokenize implements tokenize.Tokenizer.
func (t Tokenizer) Tokenize(_ context.Context, req *request.Request) ([]uint32, error) {
	if req.Model != t.Model || req.Prompt == "" {
		return nil, tokenize.ErrUnsupported
	}
	return Tokenize(req.Prompt), nil
}
