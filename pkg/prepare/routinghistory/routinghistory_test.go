package routinghistory_test

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/prepare/routinghistory"
	"github.com/kvroute/kvroute/pkg/request"
)

func cand(addr string) *datalayer.Candidate {
	return datalayer.NewCandidate(&datalayer.Endpoint{Name: addr, Address: addr, Model: "m"}, datalayer.Metrics{}, datalayer.StreamExact)
}

// Each candidate is answered for the keys it was given (candidates of
// another block size have keys of their own, a text-only request has text
// hashes), with how many of their leading blocks were sent there.
func TestEachCandidateIsAnsweredForItsOwnKeys(t *testing.T) {
	t.Parallel()
	x := approx.New(0, nil)
	small, large, text := []uint64{1, 2, 3, 4}, []uint64{9, 8}, []uint64{50, 51, 52}
	x.Record("a", small[:3])
	x.Record("b", large)
	x.Record("d", text[:1])
	cands := []*datalayer.Candidate{cand("a"), cand("b"), cand("c"), cand("d"), cand("e")}
	cands[0].Put(prefixmatch.RequestBlockKeysKey, small)
	cands[1].Put(prefixmatch.RequestBlockKeysKey, large)
	cands[2].Put(prefixmatch.RequestBlockKeysKey, small)
	cands[3].Put(prefixmatch.ApproxHashesKey, text)
	// e has no keys: a request without a reproducible prefix.
	p := routinghistory.New("", x)
	if err := p.Produce(context.Background(), &request.Request{}, cands); err != nil {
		t.Fatal(err)
	}
	want := []datalayer.RoutedPrefix{{Blocks: 3, TotalBlocks: 4}, {Blocks: 2, TotalBlocks: 2}, {TotalBlocks: 4}, {Blocks: 1, TotalBlocks: 3}, {}}
	for i, c := range cands {
		got, ok := datalayer.RoutedPrefixOf(c)
		if !ok || got != want[i] {
			t.Errorf("%s: routed %+v (published %v), want %+v", c.Address, got, ok, want[i])
		}
	}
}
