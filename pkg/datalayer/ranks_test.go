package datalayer

import (
	"slices"
	"testing"
	"time"
)

func TestRankLoadsFollowEachRequestOnItsRank(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	d1 := ds.Dispatch("a", time.Unix(1, 0), 300, 1000, 0)
	d1.OnRank(2)
	d1.OnRank(3) // a request has one rank
	d2 := ds.Dispatch("a", time.Unix(1, 0), 40, 1000, 0)
	d2.OnRank(0)
	d3 := ds.Dispatch("a", time.Unix(1, 0), 40, 1000, 0)
	d3.OnRank(MaxRanks) // out of bounds: not counted
	want := []RankLoad{{Prefilling: 1, PrefillTokens: 40}, {}, {Prefilling: 1, PrefillTokens: 300}}
	if got := ds.RankLoads("a", nil); !slices.Equal(got, want) {
		t.Fatalf("after dispatch: %+v, want %+v", got, want)
	}
	d1.FirstToken(time.Unix(2, 0))
	d2.Done()
	want = []RankLoad{{}, {}, {Decoding: 1}}
	if got := ds.RankLoads("a", nil); !slices.Equal(got, want) {
		t.Fatalf("after a first token and an end: %+v, want %+v", got, want)
	}
	d1.Fail()
	d1.Done()
	d3.Done()
	if got := ds.RankLoads("a", nil); !slices.Equal(got, []RankLoad{{}, {}, {}}) {
		t.Fatalf("after every end: %+v", got)
	}
	if got := ds.RankLoads("gone", nil); len(got) != 0 {
		t.Fatalf("an unknown endpoint has loads: %+v", got)
	}
}

func TestPickRankWeighsTheCachedPrefixAgainstTheLoad(t *testing.T) {
	t.Parallel()
	ranks := func(rs ...RankPrefix) *PrefixCacheInfo {
		return &PrefixCacheInfo{BlockSizeTokens: 16, Ranks: &rs}
	}
	tests := []struct {
		name  string
		info  *PrefixCacheInfo
		loads []RankLoad
		size  int
		want  int
		ok    bool
	}{
		{name: "an endpoint with one rank has no choice", info: &PrefixCacheInfo{BlockSizeTokens: 16}},
		{name: "nor one whose metrics say one", info: &PrefixCacheInfo{BlockSizeTokens: 16}, size: 1},
		{name: "metrics alone say the ranks: the least loaded", size: 4, ok: true, want: 2,
			info: &PrefixCacheInfo{BlockSizeTokens: 16}, loads: []RankLoad{{Decoding: 1}, {Decoding: 1}}},
		{name: "ranks the index has no stream for hold nothing", ok: true, want: 0,
			info: ranks(RankPrefix{Rank: 2, MatchBlocks: 10, State: StreamUncertain})},
		{name: "the only rank the index knows, holding the prefix", ok: true, want: 3, size: 2,
			info: ranks(RankPrefix{Rank: 3, MatchBlocks: 10, State: StreamExact})},
		{name: "idle ranks: the one holding the prefix", ok: true, want: 2,
			info: ranks(RankPrefix{Rank: 0, State: StreamExact}, RankPrefix{Rank: 1, MatchBlocks: 10, State: StreamExact}, RankPrefix{Rank: 2, MatchBlocks: 50, State: StreamExact})},
		{name: "an uncertain rank is not preferred on its word", ok: true, want: 1,
			info: ranks(RankPrefix{Rank: 0, MatchBlocks: 60, State: StreamUncertain}, RankPrefix{Rank: 1, MatchBlocks: 10, State: StreamExact})},
		{name: "a recovering rank neither", ok: true, want: 1,
			info: ranks(RankPrefix{Rank: 0, MatchBlocks: 60, State: StreamRecovering}, RankPrefix{Rank: 1, MatchBlocks: 10, State: StreamPartial})},
		{name: "a holder buried in prefills loses to an idle rank", ok: true, want: 0,
			info:  ranks(RankPrefix{Rank: 0, State: StreamExact}, RankPrefix{Rank: 1, MatchBlocks: 8, State: StreamExact}),
			loads: []RankLoad{{}, {Prefilling: 3, PrefillTokens: 4000}}},
		{name: "a small queue does not outweigh a long hit", ok: true, want: 1,
			info:  ranks(RankPrefix{Rank: 0, State: StreamExact}, RankPrefix{Rank: 1, MatchBlocks: 60, State: StreamExact}),
			loads: []RankLoad{{}, {Prefilling: 1, PrefillTokens: 100, Decoding: 4}}},
		{name: "nothing cached: the least loaded rank", ok: true, want: 1,
			info:  ranks(RankPrefix{Rank: 0, State: StreamExact}, RankPrefix{Rank: 1, State: StreamExact}, RankPrefix{Rank: 2, State: StreamExact}),
			loads: []RankLoad{{Decoding: 2}, {}, {Decoding: 1}}},
		{name: "equal costs: the fewest requests, then the lowest rank", ok: true, want: 1,
			info:  ranks(RankPrefix{Rank: 0, State: StreamExact}, RankPrefix{Rank: 1, State: StreamExact}, RankPrefix{Rank: 2, State: StreamExact}),
			loads: []RankLoad{{Prefilling: 2, PrefillTokens: 0}, {}, {}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := PickRank(tc.info, tc.loads, 1024, tc.size)
			if ok != tc.ok || got != tc.want {
				t.Fatalf("PickRank = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
