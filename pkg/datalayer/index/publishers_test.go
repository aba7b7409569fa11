package index

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/events"
)

// What each publisher's events, and vLLM's newer fields, mean for what the
// index says an engine would hit.

func evGroup(e events.Event, g int, kind string, window int) events.Event {
	e.GroupIdx, e.KVCacheSpecKind, e.SlidingWindow = g, kind, window
	return e
}

func evRemoveGroup(g int, hashes ...uint64) events.Event {
	e := evRemove(events.TierGPU, hashes...)
	e.GroupIdx = g
	return e
}

func evRemoveLeaving(tier events.Tier, remaining []int32, hashes ...uint64) events.Event {
	e := evRemove(tier, hashes...)
	e.RemainingCopies = remaining
	return e
}

func cpuMatch(gpu, cpu int) Match {
	return Match{Blocks: gpu + cpu, ByTier: [events.NumTiers]int{gpu, cpu, 0}}
}

func TestWhatPublishersEventsMean(t *testing.T) {
	t.Parallel()
	plain := func(bases ...uint32) ixReq { return ixReq{tokens: blockToks(bases...)} }
	full := func(e events.Event) events.Event { return evGroup(e, 0, "full_attention", 0) }
	window := func(e events.Event) events.Event { return evGroup(e, 1, "sliding_window", 2*ixTestBS+1) }
	mamba := func(e events.Event, offsets ...int32) events.Event {
		e = evGroup(e, 1, "mamba", 0)
		e.BlockOffsets = offsets
		return e
	}
	tests := []struct {
		name    string
		batches [][]events.Event
		lookup  ixReq
		want    Match
	}{
		{
			name: "a removal saying no copy remains drops a block the index counted twice",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1)), evStore([]uint64{1}, blockToks(1))},
				{evRemoveLeaving(events.TierGPU, []int32{0}, 1)},
			},
			lookup: plain(1), want: Match{},
		},
		{
			name: "a removal saying a copy remains keeps a block whose second store the index never saw",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1))},
				{evRemoveLeaving(events.TierGPU, []int32{1}, 1)},
			},
			lookup: plain(1), want: gpuMatch(1),
		},
		{
			name: "a removal without copy counts drops one reference",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1))},
				{evRemove(events.TierGPU, 1)},
			},
			lookup: plain(1), want: Match{},
		},
		{
			name: "a self-describing CPU store is keyed from its own tokens under its GPU parent",
			batches: [][]events.Event{
				{evStore([]uint64{1, 2}, blockToks(1, 2))},
				{func() events.Event {
					e := evStoreChild(1, []uint64{2}, blockToks(2))
					e.Medium = events.TierCPU
					return e
				}(), evRemove(events.TierGPU, 2)},
			},
			lookup: plain(1, 2), want: cpuMatch(1, 1),
		},
		{
			name: "a sliding-window group that dropped the prompt's head still serves it",
			batches: [][]events.Event{
				{full(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4))), window(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4)))},
				{evRemoveGroup(1, 1, 2)},
			},
			lookup: plain(1, 2, 3, 4), want: gpuMatch(4),
		},
		{
			name: "a prefix ending where the sliding-window group has dropped its blocks is no hit",
			batches: [][]events.Event{
				{full(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4))), window(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4)))},
				{evRemoveGroup(1, 1, 2)},
			},
			lookup: plain(1, 2, 3, 9), want: Match{},
		},
		{
			name: "full attention must hold every block whatever the window holds",
			batches: [][]events.Event{
				{full(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4))), window(evStore([]uint64{1, 2, 3, 4}, blockToks(1, 2, 3, 4)))},
				{evRemoveGroup(0, 3)},
			},
			lookup: plain(1, 2, 3, 4), want: gpuMatch(2),
		},
		{
			name: "a sparse Mamba store holds the state at the chunk its offset names",
			batches: [][]events.Event{
				{full(evStore([]uint64{1, 2, 3}, blockToks(1, 2, 3))), mamba(evStore([]uint64{3}, blockToks(1, 2, 3)), 2)},
			},
			lookup: plain(1, 2, 3, 4), want: gpuMatch(3),
		},
		{
			name: "a prefix ending where Mamba kept no state hits only up to the last state before it",
			batches: [][]events.Event{
				{full(evStore([]uint64{1, 2, 3}, blockToks(1, 2, 3))), mamba(evStore([]uint64{1}, blockToks(1)), 0), mamba(evStoreChild(1, []uint64{3}, blockToks(2, 3)), 1)},
			},
			lookup: plain(1, 2, 9), want: gpuMatch(1),
		},
		{
			name: "a group of a kind that is not prefix-cached is left out",
			batches: [][]events.Event{
				{full(evStore([]uint64{1}, blockToks(1))), evGroup(evStore([]uint64{1}, blockToks(1)), 1, "cross_attention", 0)},
			},
			lookup: plain(1), want: gpuMatch(1),
		},
		{
			name: "chunked local attention, whose chunk events do not carry, is held to every block",
			batches: [][]events.Event{
				{full(evStore([]uint64{1, 2}, blockToks(1, 2))), evGroup(evStore([]uint64{2}, blockToks(2)), 1, "chunked_local_attention", 0)},
			},
			lookup: plain(1, 2), want: Match{},
		},
		{
			name: "an LMCache chunk of four blocks is held block by block in the CPU tier",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1)), func() events.Event {
					e := evStore([]uint64{40}, blockToks(1, 2, 3, 4))
					e.BlockSize, e.Medium = 4*ixTestBS, events.TierCPU
					return e
				}()},
			},
			lookup: plain(1, 2, 3, 4, 5), want: cpuMatch(1, 3),
		},
		{
			name: "the next LMCache chunk chains from the last block of the one before",
			batches: [][]events.Event{
				{func() events.Event {
					e := evStore([]uint64{40}, blockToks(1, 2))
					e.BlockSize, e.Medium = 2*ixTestBS, events.TierCPU
					return e
				}(), func() events.Event {
					e := evStoreChild(40, []uint64{41}, blockToks(3, 4))
					e.BlockSize, e.Medium = 2*ixTestBS, events.TierCPU
					return e
				}()},
			},
			lookup: plain(1, 2, 3, 4), want: cpuMatch(0, 4),
		},
		{
			name: "a store whose block is not a whole number of the engine's has no key",
			batches: [][]events.Event{
				{func() events.Event {
					e := evStore([]uint64{1}, blockToks(1)[:ixTestBS-1])
					e.BlockSize = ixTestBS - 1
					return e
				}()},
			},
			lookup: plain(1), want: Match{},
		},
		{
			name:    "blocks keyed by token pairs never match a plain request",
			batches: [][]events.Event{{bigramStore(blockToks(1, 2, 3), 1, 2)}},
			lookup:  plain(1, 2, 3), want: Match{},
		},
		{
			name: "a TensorRT-LLM multimodal token marks its block",
			batches: [][]events.Event{{func() events.Event {
				e := evStore([]uint64{1, 2, 3}, blockToks(1, 2, 3))
				e.OpaqueTokens = []int32{ixTestBS + 1}
				return e
			}()}},
			lookup: plain(1, 2, 3), want: gpuMatch(1),
		},
		{
			name: "TensorRT-LLM multimodal keys mark their block",
			batches: [][]events.Event{{evWithExtras(evStore([]uint64{1, 2}, blockToks(1, 2)), nil,
				events.ExtraKey{[]any{"mm_key", "9f", int64(0), nil}})}},
			lookup: plain(1, 2), want: gpuMatch(1),
		},
		{
			name: "a salt in SGLang's metadata names the run's root",
			batches: [][]events.Event{{func() events.Event {
				e := evStore([]uint64{1}, blockToks(1))
				e.CacheSalt = "tenant"
				return e
			}()}},
			lookup: ixReq{salt: "tenant", tokens: blockToks(1)}, want: gpuMatch(1),
		},
		{
			name: "an SGLang salt keeps unsalted requests out",
			batches: [][]events.Event{{func() events.Event {
				e := evStore([]uint64{1}, blockToks(1))
				e.CacheSalt = "tenant"
				return e
			}()}},
			lookup: plain(1), want: Match{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ix := feedAndLookup(t, tc.batches, tc.lookup, tc.want)
			checkGaugesMatchContents(t, ix)
		})
	}
}

// bigramStore is an SGLang store with EAGLE: its tokens as pairs, so each
// block's key takes the token after it.
func bigramStore(tokens []uint32, hashes ...uint64) events.Event {
	n := len(hashes) * ixTestBS
	e := evStore(hashes, tokens[:n])
	e.Bigram, e.BigramNext = true, tokens[n]
	return e
}

func TestTokenPairKeysNeedTheTokenAfterEachBlock(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	newIxFeeder(ix, ixTestAddr, 0).apply(bigramStore(blockToks(1, 2, 3), 1, 2))
	if !ix.Bigram(ixTestAddr) {
		t.Fatal("an engine sending token pairs is not marked as such")
	}
	lookup := func(tokens []uint32) Match {
		out := make([]Match, 1)
		ix.Lookup(AppendBigramBlockKeys(nil, BigramRootKey(ixTestModel, "", ""), tokens, ixTestBS), []string{ixTestAddr}, out)
		return out[0]
	}
	for _, tc := range []struct {
		name   string
		tokens []uint32
		want   int
	}{
		{"both blocks and the token after them", blockToks(1, 2, 3), 2},
		{"both blocks and only the first token after them", blockToks(1, 2, 3)[:2*ixTestBS+1], 2},
		{"both blocks and no token after them: the second has no key", blockToks(1, 2), 1},
		{"another token after the second block", append(blockToks(1, 2), 7), 1},
	} {
		if got := lookup(tc.tokens); got.Blocks != tc.want {
			t.Errorf("%s: %d blocks, want %d", tc.name, got.Blocks, tc.want)
		}
	}
}

func TestLMCacheStoresAreBoundedByTheCPUTiersAge(t *testing.T) {
	t.Parallel()
	clk := newIxClock()
	var ages [events.NumTiers]time.Duration
	ages[events.TierCPU] = time.Minute
	ix := New(Options{Now: clk.Now, TierMaxAge: ages}, prometheus.NewRegistry())
	ix.AddEndpoint(ixTestAddr)
	chunk := evStore([]uint64{40}, blockToks(1, 2, 3, 4))
	chunk.BlockSize, chunk.Medium = 4*ixTestBS, events.TierCPU
	newIxFeeder(ix, ixTestAddr, 0).apply(chunk)
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1, 2, 3, 4)}, ixTestAddr); got != cpuMatch(0, 4) {
		t.Fatalf("fresh chunk: %+v", got)
	}
	clk.Advance(2 * time.Minute)
	ix.Expire()
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1, 2, 3, 4)}, ixTestAddr); got != (Match{}) {
		t.Fatalf("a chunk older than the CPU tier's age bound is still held: %+v", got)
	}
	checkGaugesMatchContents(t, ix)
}

func TestFieldsDecodedButNotUsedAreCounted(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ix := New(Options{}, reg)
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.o.Seq = 0
	b := &events.Batch{Events: []events.Event{evStore([]uint64{1}, blockToks(1))}}
	b.Ignored[events.IgnoredLocality] = 2
	b.Ignored[events.IgnoredUnknown] = 1
	ix.Apply(f.o, b)
	want := `
# HELP kvroute_index_event_fields_ignored_total Event fields decoded but not acted on, by field (unknown: fields no known publisher sends).
# TYPE kvroute_index_event_fields_ignored_total counter
kvroute_index_event_fields_ignored_total{field="event_version"} 0
kvroute_index_event_fields_ignored_total{field="locality"} 2
kvroute_index_event_fields_ignored_total{field="ownership"} 0
kvroute_index_event_fields_ignored_total{field="session_id"} 0
kvroute_index_event_fields_ignored_total{field="unknown"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvroute_index_event_fields_ignored_total"); err != nil {
		t.Fatal(err)
	}
}
