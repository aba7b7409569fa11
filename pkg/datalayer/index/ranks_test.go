package index

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

func TestEachRankAnswersForItsOwnCache(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	r0 := newIxFeeder(ix, ixTestAddr, 0)
	// Rank 0 alone: nothing to choose, and no per-rank sets are kept.
	r0.apply(evStore([]uint64{1, 2}, blockToks(1, 2)))
	req := ixReq{tokens: blockToks(1, 2, 3)}
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); len(got) != 0 {
		t.Fatalf("a single-rank endpoint answered per rank: %+v", got)
	}
	// Rank 1 appears: rank 0's blocks are counted from what it held.
	r1 := newIxFeeder(ix, ixTestAddr, 1)
	r1.apply(evStore([]uint64{1}, blockToks(1)))
	r1.apply(evStoreChild(1, []uint64{2}, blockToks(2)), evStoreChild(2, []uint64{3}, blockToks(3)))
	want := []RankMatch{
		{Rank: 0, Blocks: 2, State: datalayer.StreamExact},
		{Rank: 1, Blocks: 3, State: datalayer.StreamExact},
	}
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("ranks: got %+v, want %+v", got, want)
	}
	// The endpoint's own match is the union, as before.
	if got := ixLookupOne(ix, req, ixTestAddr); got.Blocks != 3 {
		t.Fatalf("endpoint match %+v, want 3 blocks", got)
	}
	// A removal on one rank leaves the other's copy.
	r1.apply(evRemove(events.TierGPU, 2))
	want[1].Blocks = 1
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("after rank 1 removed block 2: got %+v, want %+v", got, want)
	}
	// A third rank joins late, in order.
	r2 := newIxFeeder(ix, ixTestAddr, 2)
	r2.apply(evStore([]uint64{9}, blockToks(1)))
	want = append(want, RankMatch{Rank: 2, Blocks: 1, State: datalayer.StreamExact})
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("with rank 2: got %+v, want %+v", got, want)
	}
	// A rank whose stream is in doubt says so; its holdings stand.
	ix.Uncertain(events.Stream{Endpoint: ixTestAddr, DPRank: 0}, events.ReasonGap)
	want[0].State = datalayer.StreamUncertain
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("after rank 0's gap: got %+v, want %+v", got, want)
	}
	// A restarted rank holds nothing, exactly.
	ix.Restart(events.Stream{Endpoint: ixTestAddr, DPRank: 0})
	want[0] = RankMatch{Rank: 0, State: datalayer.StreamExact}
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("after rank 0's restart: got %+v, want %+v", got, want)
	}
	checkGaugesMatchContents(t, ix)
	ix.RemoveEndpoint(ixTestAddr)
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); len(got) != 0 {
		t.Fatalf("a removed endpoint answered: %+v", got)
	}
}

func TestARankPickIsHeldSpeculativelyUntilItsEventsCome(t *testing.T) {
	t.Parallel()
	clock := newIxClock()
	ix := New(Options{Now: clock.Now}, nil)
	ix.AddEndpoint(ixTestAddr)
	r0, r1 := newIxFeeder(ix, ixTestAddr, 0), newIxFeeder(ix, ixTestAddr, 1)
	r0.apply(evStore([]uint64{1}, blockToks(5)))
	r1.apply(evStore([]uint64{1}, blockToks(6)))
	req := ixReq{tokens: blockToks(1, 2)}
	ix.SpeculateRank(ixTestAddr, 1, req.keys())
	ix.SpeculateRank(ixTestAddr, 7, req.keys()) // no such rank: nothing
	got := ix.LookupRanks(req.keys(), ixTestAddr, nil)
	if got[0].Blocks != 0 || got[1].Blocks != 2 || got[1].Speculative != 2 {
		t.Fatalf("after a pick of rank 1: %+v", got)
	}
	// Its events replace the speculation.
	r1.apply(evStore([]uint64{2}, blockToks(1)))
	clock.Advance(DefaultSpeculativeTTL + time.Millisecond)
	got = ix.LookupRanks(req.keys(), ixTestAddr, nil)
	if got[1].Blocks != 1 || got[1].Speculative != 0 {
		t.Fatalf("after the TTL with block 0 stored: %+v", got)
	}
}

// checkRankSets checks that each rank's key set counts exactly the (handle,
// tier) references its stream holds, once an endpoint keeps them.
func checkRankSets(t *testing.T, ix *Index, addr string) {
	t.Helper()
	ep := ix.member(addr)
	if ep == nil || ep.rankSets.Load() == nil {
		return
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	for rank, st := range ep.streams {
		// The rank's own references and its groups' (whose keys carry
		// their group's mask).
		want := map[uint64]uint32{}
		for _, sub := range append([]*ixStream{st}, slices.Collect(maps.Values(st.groups))...) {
			for _, hv := range sub.handles {
				for tier := range events.NumTiers {
					if hv&(1<<tier) != 0 {
						want[hv&keyMask]++
					}
				}
			}
		}
		if !maps.Equal(want, st.rankKeys) {
			t.Fatalf("rank %d's key set %v, its handles say %v", rank, st.rankKeys, want)
		}
	}
}

// A hybrid model's rank hits what its own groups can serve, by the rule the
// endpoint's match follows: a rank whose sliding-window group lost the
// blocks at the prompt's end hits less than its full-attention run.
func TestARankOfAHybridModelHitsWhatItsOwnGroupsServe(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	full := func(e events.Event) events.Event { return evGroup(e, 0, "full_attention", 0) }
	window := func(e events.Event) events.Event { return evGroup(e, 1, "sliding_window", 2*ixTestBS+1) }
	r0, r1 := newIxFeeder(ix, ixTestAddr, 0), newIxFeeder(ix, ixTestAddr, 1)
	r0.apply(full(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4))), window(evStore([]uint64{1, 2}, blockToks(1, 2))))
	r1.apply(full(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4))), window(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4))))
	req := ixReq{tokens: blockToks(1, 2, 3, 4)}
	want := []RankMatch{
		{Rank: 0, Blocks: 2, State: datalayer.StreamExact},
		{Rank: 1, Blocks: 4, State: datalayer.StreamExact},
	}
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("ranks: got %+v, want %+v", got, want)
	}
	// Rank 1's window group loses the last block: its hit ends one short.
	r1.apply(evRemoveGroup(1, 4))
	want[1].Blocks = 3
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("after rank 1's window lost block 4: got %+v, want %+v", got, want)
	}
	checkRankSets(t, ix, ixTestAddr)
	// Clearing a rank clears its groups' keys with it.
	r1.apply(events.Event{Kind: events.KindAllBlocksCleared})
	want[1].Blocks = 0
	if got := ix.LookupRanks(req.keys(), ixTestAddr, nil); !slices.Equal(got, want) {
		t.Fatalf("after rank 1 cleared: got %+v, want %+v", got, want)
	}
	checkRankSets(t, ix, ixTestAddr)
}
