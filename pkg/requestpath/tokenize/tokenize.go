// Package tokenize says what a tokenizer is on the request path: something
// that finds a request's prompt token ids as the model server computes them,
// so that its block keys match the keys built from the server's KV events.
// The implementations are its subpackages: localtokenizer (in process, with
// pkg/tokenizer) and remotetokenizer (the model server's /tokenize).
package tokenize

import (
	"context"
	"errors"

	"github.com/kvroute/kvroute/pkg/request"
)

// Tokenizer returns the token ids the model server would compute for the
// request's prompt (for chat, the messages rendered with the chat template
// and the same special-token rules the chat endpoint applies).
type Tokenizer interface {
	Tokenize(ctx context.Context, req *request.Request) ([]uint32, error)
}

// ContextLengths is implemented by tokenizers that learn each model's
// context length from its model server (vLLM's max_model_len), so that a
// prompt that cannot fit is refused before it is routed.
type ContextLengths interface {
	MaxModelLen(model string) (tokens int, ok bool)
}

// ErrUnsupported is returned for a request the tokenizer cannot handle
// (an unknown model, an API without a prompt).
var ErrUnsupported = errors.New("tokenization not supported for this request")
