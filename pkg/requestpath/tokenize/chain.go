package tokenize

import (
	"context"
	"errors"

	"github.com/kvroute/kvroute/pkg/request"
)

// Chain tokenizes with first, and with next the requests first does not
// handle (ErrUnsupported). Context lengths are the first one's that knows
// the model; Close closes both.
func Chain(first, next Tokenizer) Tokenizer { return chain{first, next} }

type chain struct{ first, next Tokenizer }

var _ ContextLengths = chain{}

func (c chain) Tokenize(ctx context.Context, req *request.Request) ([]uint32, error) {
	ids, err := c.first.Tokenize(ctx, req)
	if errors.Is(err, ErrUnsupported) {
		return c.next.Tokenize(ctx, req)
	}
	return ids, err
}

func (c chain) MaxModelLen(model string) (int, bool) {
	for _, t := range [2]Tokenizer{c.first, c.next} {
		if cl, ok := t.(ContextLengths); ok {
			if n, ok := cl.MaxModelLen(model); ok {
				return n, true
			}
		}
	}
	return 0, false
}

func (c chain) Close() {
	for _, t := range [2]Tokenizer{c.first, c.next} {
		if cl, ok := t.(interface{ Close() }); ok {
			cl.Close()
		}
	}
}
