package tokenize_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/sim"
)

// counting tokenizes every request as one token and counts its calls; it
// knows one context length and can be closed.
type counting struct {
	calls  int
	closed bool
}

func (c *counting) Tokenize(context.Context, *request.Request) ([]uint32, error) {
	c.calls++
	return []uint32{7}, nil
}
func (c *counting) MaxModelLen(model string) (int, bool) { return 4096, model == "other" }
func (c *counting) Close()                               { c.closed = true }

func TestChainTriesTheFirstThenTheNextForWhatTheFirstDoesNotHandle(t *testing.T) {
	next := &counting{}
	c := tokenize.Chain(simkit.Tokenizer{Model: "sim-model"}, next)
	ctx := context.Background()

	ids, err := c.Tokenize(ctx, &request.Request{Model: "sim-model", Prompt: "hello kvroute hello"})
	if want := sim.Tokenize("hello kvroute hello"); err != nil || !slices.Equal(ids, want) {
		t.Errorf("the first's model: %v, %v; want %v from the first", ids, err, want)
	}
	if next.calls != 0 {
		t.Errorf("the next was asked %d times for a request the first handled", next.calls)
	}
	ids, err = c.Tokenize(ctx, &request.Request{Model: "other", Prompt: "hello"})
	if err != nil || !slices.Equal(ids, []uint32{7}) || next.calls != 1 {
		t.Errorf("another model: %v, %v after %d calls of the next; want the next's answer", ids, err, next.calls)
	}
	cl, ok := c.(tokenize.ContextLengths)
	if !ok {
		t.Fatal("a chain does not pass context lengths on")
	}
	if n, ok := cl.MaxModelLen("other"); !ok || n != 4096 {
		t.Errorf("MaxModelLen(other) = %d, %v; want the next's 4096", n, ok)
	}
	if _, ok := cl.MaxModelLen("sim-model"); ok {
		t.Error("a context length known to neither was reported")
	}
	c.(interface{ Close() }).Close()
	if !next.closed {
		t.Error("closing the chain did not close the next")
	}
}

func TestChainPassesOnTheFirstsOtherErrors(t *testing.T) {
	boom := errors.New("boom")
	c := tokenize.Chain(failing{boom}, &counting{})
	if _, err := c.Tokenize(context.Background(), &request.Request{Model: "m", Prompt: "x"}); !errors.Is(err, boom) {
		t.Errorf("err = %v, want the first's own error, not a silent fallback", err)
	}
}

type failing struct{ err error }

func (f failing) Tokenize(context.Context, *request.Request) ([]uint32, error) { return nil, f.err }
