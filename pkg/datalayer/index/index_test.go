package index

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

const (
	ixTestModel = "llama"
	ixTestBS    = 4
	ixTestAddr  = "10.0.0.1:8000"
)

// ixClock is a settable clock for expiry tests.
type ixClock struct{ ns atomic.Int64 }

func newIxClock() *ixClock {
	c := &ixClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *ixClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *ixClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// toks returns n blocks of tokens where block i is [base+i]*ixTestBS, so prompts
// built from the same bases share those blocks.
func blockToks(bases ...uint32) []uint32 {
	out := make([]uint32, 0, len(bases)*ixTestBS)
	for _, b := range bases {
		for j := range ixTestBS {
			out = append(out, b*100+uint32(j))
		}
	}
	return out
}

func evStore(hashes []uint64, tokens []uint32) events.Event {
	return events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: ixTestBS}
}

func evStoreChild(parent uint64, hashes []uint64, tokens []uint32) events.Event {
	e := evStore(hashes, tokens)
	e.ParentHash, e.HasParent = parent, true
	return e
}

func evRemove(tier events.Tier, hashes ...uint64) events.Event {
	return events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes, Medium: tier}
}

func evPlaceholder(tier events.Tier, hashes ...uint64) events.Event {
	return events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, Medium: tier}
}

func evWithExtras(e events.Event, extras ...events.ExtraKey) events.Event {
	e.ExtraKeys = extras
	return e
}

func evWithLoRA(e events.Event, name string) events.Event {
	e.LoRAName = name
	return e
}

// ixFeeder applies batches for one stream with increasing sequence numbers.
type ixFeeder struct {
	ix  *Index
	o   events.Origin
	seq uint64
}

func newIxFeeder(ix *Index, addr string, rank int) *ixFeeder {
	return &ixFeeder{ix: ix, o: events.Origin{
		Stream: events.Stream{Endpoint: addr, DPRank: rank}, Model: ixTestModel,
		Instance: "i1", BlockSize: ixTestBS,
	}}
}

func (f *ixFeeder) apply(evs ...events.Event) {
	f.o.Seq = f.seq
	f.seq++
	f.ix.Apply(f.o, &events.Batch{Events: evs, DPRank: f.o.DPRank, HasDPRank: true})
}

type ixReq struct {
	lora, salt string
	tokens     []uint32
}

func (r ixReq) keys() []uint64 {
	return AppendBlockKeys(nil, RootKey(ixTestModel, r.lora, r.salt), r.tokens, ixTestBS)
}

func ixLookupOne(ix *Index, r ixReq, addr string) Match {
	out := make([]Match, 1)
	ix.Lookup(r.keys(), []string{addr}, out)
	return out[0]
}

func gpuMatch(n int) Match { return Match{Blocks: n, ByTier: [events.NumTiers]int{n}} }

func TestIndexEdgeCases(t *testing.T) {
	t.Parallel()
	plain := func(bases ...uint32) ixReq { return ixReq{tokens: blockToks(bases...)} }
	const neg = uint64(1) << 63 // a negative Python hash, as vLLM's oldest versions send
	tests := []struct {
		name      string
		batches   [][]events.Event
		lookup    ixReq
		want      Match
		wantState datalayer.StreamState
	}{
		{
			name:      "a run stored from the root is found by a request with the same tokens",
			batches:   [][]events.Event{{evStore([]uint64{1, 2}, blockToks(1, 2))}},
			lookup:    plain(1, 2, 3),
			want:      gpuMatch(2),
			wantState: datalayer.StreamExact,
		},
		{
			name:      "a request that diverges at its second block matches only the first",
			batches:   [][]events.Event{{evStore([]uint64{1, 2}, blockToks(1, 2))}},
			lookup:    plain(1, 9),
			want:      gpuMatch(1),
			wantState: datalayer.StreamExact,
		},
		{
			name: "a child run resolves its parent through the engine's hash",
			batches: [][]events.Event{
				{evStore([]uint64{1, 2}, blockToks(1, 2))},
				{evStoreChild(2, []uint64{3}, blockToks(3))},
			},
			lookup: plain(1, 2, 3), want: gpuMatch(3), wantState: datalayer.StreamExact,
		},
		{
			name: "a run whose parent was never seen is dropped and makes the stream uncertain",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1))},
				{evStoreChild(77, []uint64{3}, blockToks(1))},
			},
			lookup: plain(1, 1), want: gpuMatch(1), wantState: datalayer.StreamUncertain,
		},
		{
			name: "a removal in the middle of a chain cuts the match there",
			batches: [][]events.Event{
				{evStore([]uint64{1, 2, 3}, blockToks(1, 2, 3))},
				{evRemove(events.TierGPU, 2)},
			},
			lookup: plain(1, 2, 3), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
		{
			name: "a hash stored twice and removed once is still held",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1)), evStore([]uint64{1}, blockToks(1))},
				{evRemove(events.TierGPU, 1)},
			},
			lookup: plain(1), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
		{
			name: "a hash stored twice and removed twice is gone",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1)), evStore([]uint64{1}, blockToks(1))},
				{evRemove(events.TierGPU, 1), evRemove(events.TierGPU, 1)},
			},
			lookup: plain(1), want: Match{}, wantState: datalayer.StreamExact,
		},
		{
			name: "a removal of a hash never stored changes nothing",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1))},
				{evRemove(events.TierGPU, 99), evRemove(events.TierCPU, 1)},
			},
			lookup: plain(1), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
		{
			name: "AllBlocksCleared forgets every tier",
			batches: [][]events.Event{
				{evStore([]uint64{1, 2}, blockToks(1, 2)), evPlaceholder(events.TierCPU, 1, 2)},
				{{Kind: events.KindAllBlocksCleared}},
			},
			lookup: plain(1, 2), want: Match{}, wantState: datalayer.StreamExact,
		},
		{
			name: "a placeholder store adds a tier, which outlives the GPU copy",
			batches: [][]events.Event{
				{evStore([]uint64{1, 2}, blockToks(1, 2)), evPlaceholder(events.TierCPU, 1, 2)},
				{evRemove(events.TierGPU, 2)},
			},
			lookup:    plain(1, 2),
			want:      Match{Blocks: 2, ByTier: [events.NumTiers]int{1, 1, 0}},
			wantState: datalayer.StreamExact,
		},
		{
			name: "a placeholder for a hash never seen is skipped",
			batches: [][]events.Event{
				{evPlaceholder(events.TierCPU, 5)},
			},
			lookup: plain(1), want: Match{}, wantState: datalayer.StreamExact,
		},
		{
			name: "a block in GPU and storage counts as GPU, in storage only as storage",
			batches: [][]events.Event{
				{evStore([]uint64{1, 2}, blockToks(1, 2)), evPlaceholder(events.TierStorage, 1, 2)},
				{evRemove(events.TierGPU, 2)},
			},
			lookup:    plain(1, 2),
			want:      Match{Blocks: 2, ByTier: [events.NumTiers]int{1, 0, 1}},
			wantState: datalayer.StreamExact,
		},
		{
			name: "a child run resolves a parent held only in the CPU tier",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1)), evPlaceholder(events.TierCPU, 1)},
				{evRemove(events.TierGPU, 1)},
				{evStoreChild(1, []uint64{2}, blockToks(2))},
			},
			lookup:    plain(1, 2),
			want:      Match{Blocks: 2, ByTier: [events.NumTiers]int{1, 1, 0}},
			wantState: datalayer.StreamExact,
		},
		{
			name:      "LoRA blocks are found by requests for that adapter",
			batches:   [][]events.Event{{evWithExtras(evWithLoRA(evStore([]uint64{1, 2}, blockToks(1, 2)), "sql"), events.ExtraKey{"sql"}, events.ExtraKey{"sql"})}},
			lookup:    ixReq{lora: "sql", tokens: blockToks(1, 2)},
			want:      gpuMatch(2),
			wantState: datalayer.StreamExact,
		},
		{
			name:      "LoRA blocks are not found by base-model requests",
			batches:   [][]events.Event{{evWithExtras(evWithLoRA(evStore([]uint64{1, 2}, blockToks(1, 2)), "sql"), events.ExtraKey{"sql"}, events.ExtraKey{"sql"})}},
			lookup:    plain(1, 2),
			want:      Match{},
			wantState: datalayer.StreamExact,
		},
		{
			name:      "a salted prompt is found by requests with that salt",
			batches:   [][]events.Event{{evWithExtras(evStore([]uint64{1, 2}, blockToks(1, 2)), events.ExtraKey{"tenant-a"}, nil)}},
			lookup:    ixReq{salt: "tenant-a", tokens: blockToks(1, 2)},
			want:      gpuMatch(2),
			wantState: datalayer.StreamExact,
		},
		{
			name:      "a salted prompt is not found by requests with another salt",
			batches:   [][]events.Event{{evWithExtras(evStore([]uint64{1, 2}, blockToks(1, 2)), events.ExtraKey{"tenant-a"}, nil)}},
			lookup:    ixReq{salt: "tenant-b", tokens: blockToks(1, 2)},
			want:      Match{},
			wantState: datalayer.StreamExact,
		},
		{
			name:      "a salted LoRA prompt is found by a request with both",
			batches:   [][]events.Event{{evWithExtras(evWithLoRA(evStore([]uint64{1, 2}, blockToks(1, 2)), "sql"), events.ExtraKey{"sql", "s"}, events.ExtraKey{"sql"})}},
			lookup:    ixReq{lora: "sql", salt: "s", tokens: blockToks(1, 2)},
			want:      gpuMatch(2),
			wantState: datalayer.StreamExact,
		},
		{
			name: "multimodal blocks and their children never match a plain request, yet chain without uncertainty",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1))},
				{evWithExtras(evStoreChild(1, []uint64{2}, blockToks(2)), events.ExtraKey{"img-hash"})},
				{evStoreChild(2, []uint64{3}, blockToks(3))},
			},
			lookup: plain(1, 2, 3), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
		{
			name: "an adapter known only by its integer id never matches",
			batches: [][]events.Event{{func() events.Event {
				e := evStore([]uint64{1}, blockToks(1))
				e.LoRAID, e.HasLoRAID = 5, true
				return e
			}()}},
			lookup: plain(1), want: Match{}, wantState: datalayer.StreamExact,
		},
		{
			name: "an event without a block size takes the stream's",
			batches: [][]events.Event{{func() events.Event {
				e := evStore([]uint64{1, 2}, blockToks(1, 2))
				e.BlockSize = 0
				return e
			}()}},
			lookup: plain(1, 2), want: gpuMatch(2), wantState: datalayer.StreamExact,
		},
		{
			name:      "blocks without a full block of tokens are left out",
			batches:   [][]events.Event{{evStore([]uint64{1, 2}, blockToks(1, 2)[:ixTestBS+1])}},
			lookup:    plain(1, 2),
			want:      gpuMatch(1),
			wantState: datalayer.StreamExact,
		},
		{
			name: "a block another KV-cache group holds is no hit while group 0 does not hold it",
			batches: [][]events.Event{{func() events.Event {
				e := evStore([]uint64{1}, blockToks(1))
				e.GroupIdx = 1
				return e
			}()}},
			lookup: plain(1), want: Match{}, wantState: datalayer.StreamExact,
		},
		{
			name: "negative hashes are handles like any other",
			batches: [][]events.Event{
				{evStore([]uint64{neg | 1}, blockToks(1))},
				{evStoreChild(neg|1, []uint64{neg | 2}, blockToks(2))},
				{evRemove(events.TierGPU, neg|2)},
			},
			lookup: plain(1, 2), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
		{
			name: "a block removed and its hash stored again in one batch is held",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1))},
				{evRemove(events.TierGPU, 1), evStore([]uint64{1}, blockToks(1))},
			},
			lookup: plain(1), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
		{
			name: "an event of a kind this version does not know is skipped",
			batches: [][]events.Event{
				{{Kind: events.Kind(99), BlockHashes: []uint64{1}}, evStore([]uint64{1}, blockToks(1))},
			},
			lookup: plain(1), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
		{
			name: "an engine hash reused for other tokens refiles the block",
			batches: [][]events.Event{
				{evStore([]uint64{1}, blockToks(1))},
				{evStore([]uint64{1}, blockToks(2))},
			},
			lookup: plain(2), want: gpuMatch(1), wantState: datalayer.StreamExact,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ix := feedAndLookup(t, tc.batches, tc.lookup, tc.want)
			if st, _ := ix.State(ixTestAddr); st != tc.wantState {
				t.Errorf("State = %v, want %v", st, tc.wantState)
			}
			checkGaugesMatchContents(t, ix)
		})
	}
}

// checkGaugesMatchContents recounts the key store and compares it with the
// gauges kept incrementally.
func checkGaugesMatchContents(t *testing.T, ix *Index) {
	t.Helper()
	var holdings [events.NumTiers]int64
	var blocks, spec int64
	perEP := map[uint16]int64{}
	for i := range ix.shards {
		sh := &ix.shards[i]
		sh.mu.RLock()
		for _, v := range sh.m.all() {
			blocks++
			hs := []uint64{v}
			if v&setBit != 0 {
				hs = sh.sets[uint32(v)][setHeader:]
				if len(hs) < 2 {
					t.Errorf("a holder list of %d is not inline", len(hs))
				}
				var sig, nspec uint64
				for _, h := range hs {
					sig ^= sigOf(h)
					nspec += specCount(h)
				}
				if head := sh.sets[uint32(v)][:setHeader]; head[0] != sig || head[1] != nspec {
					t.Errorf("holder list header %v, recomputed [%d %d]", head, sig, nspec)
				}
			}
			for _, h := range hs {
				if h&specBit != 0 {
					spec++
					continue
				}
				if h&refsMask == 0 {
					t.Errorf("a holder with no references is kept")
				}
				for tier := events.Tier(0); tier < events.NumTiers; tier++ {
					if holderRefs(h, tier) > 0 {
						holdings[tier]++
						perEP[holderEP(h)]++
					}
				}
			}
		}
		sh.mu.RUnlock()
	}
	for _, ep := range *ix.members.Load() {
		ep.mu.Lock()
		if ep.held != perEP[ep.id] {
			t.Errorf("endpoint %s counts %d holdings, store has %d", ep.addr, ep.held, perEP[ep.id])
		}
		ep.mu.Unlock()
	}
	for tier := range holdings {
		if got := ix.stats.holdings[tier].Load(); got != holdings[tier] {
			t.Errorf("holdings gauge for %v = %d, store has %d", events.Tier(tier), got, holdings[tier])
		}
	}
	if got := ix.stats.blocks.Load(); got != blocks {
		t.Errorf("blocks gauge = %d, store has %d", got, blocks)
	}
	if got := ix.stats.spec.Load(); got != spec {
		t.Errorf("speculative gauge = %d, store has %d", got, spec)
	}
}

func TestUnknownParentCallsTheHookOnceAndCounts(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var calls []events.Stream
	reg := prometheus.NewRegistry()
	ix := New(Options{OnUncertain: func(s events.Stream, r events.Reason) {
		if r != events.ReasonUnknownParent {
			t.Errorf("reason %v", r)
		}
		mu.Lock()
		calls = append(calls, s)
		mu.Unlock()
	}}, reg)
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 2)
	f.apply(evStoreChild(9, []uint64{1, 2}, blockToks(1, 2)), evStoreChild(8, []uint64{3}, blockToks(3)))
	if len(calls) != 1 || calls[0] != (events.Stream{Endpoint: ixTestAddr, DPRank: 2}) {
		t.Fatalf("hook calls = %v, want one for rank 2", calls)
	}
	want := `
# HELP kvroute_index_uncertain_total Times a stream was marked uncertain, by reason.
# TYPE kvroute_index_uncertain_total counter
kvroute_index_uncertain_total{reason="disagreement"} 0
kvroute_index_uncertain_total{reason="gap"} 0
kvroute_index_uncertain_total{reason="late_join"} 0
kvroute_index_uncertain_total{reason="lost_tail"} 0
kvroute_index_uncertain_total{reason="reconnect"} 0
kvroute_index_uncertain_total{reason="slow_consumer"} 0
kvroute_index_uncertain_total{reason="unknown_parent"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvroute_index_uncertain_total"); err != nil {
		t.Fatal(err)
	}
	if n := ix.stats.dropped[dropUnknownParent].Load(); n != 3 {
		t.Fatalf("dropped unknown_parent = %d blocks, want 3", n)
	}
}

func TestStreamStateFollowsTheStream(t *testing.T) {
	t.Parallel()
	clk := newIxClock()
	ix := New(Options{Now: clk.Now}, nil)
	if st, at := ix.State(ixTestAddr); st != datalayer.StreamNone || !at.IsZero() {
		t.Fatalf("unknown endpoint: %v %v", st, at)
	}
	ix.AddEndpoint(ixTestAddr)
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamNone {
		t.Fatalf("before any event: %v", st)
	}
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.apply(evStore([]uint64{1}, blockToks(1)))
	st, at := ix.State(ixTestAddr)
	if st != datalayer.StreamExact || !at.Equal(clk.Now()) {
		t.Fatalf("after an event: %v at %v", st, at)
	}
	ix.Uncertain(events.Stream{Endpoint: ixTestAddr, DPRank: 0}, events.ReasonGap)
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamUncertain {
		t.Fatalf("after Uncertain: %v", st)
	}
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != gpuMatch(1) {
		t.Fatalf("an uncertain endpoint lost its holdings: %+v", got)
	}
	ix.MarkExact(ixTestAddr)
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamExact {
		t.Fatalf("after MarkExact: %v", st)
	}
	// One uncertain rank makes the endpoint uncertain.
	ix.Uncertain(events.Stream{Endpoint: ixTestAddr, DPRank: 1}, events.ReasonReconnect)
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamUncertain {
		t.Fatalf("with one rank uncertain: %v", st)
	}
	ix.Restart(events.Stream{Endpoint: ixTestAddr, DPRank: 1})
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamExact {
		t.Fatalf("after the uncertain rank restarted: %v", st)
	}
}

func TestRestartAndNewInstanceClearTheStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		restart func(ix *Index, f *ixFeeder)
	}{
		{"an explicit Restart", func(ix *Index, f *ixFeeder) {
			ix.Restart(f.o.Stream)
			f.seq = 0
		}},
		{"a batch from a new instance", func(ix *Index, f *ixFeeder) {
			f.o.Instance = "i2"
			f.seq = 0
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ix := New(Options{}, nil)
			ix.AddEndpoint(ixTestAddr)
			f := newIxFeeder(ix, ixTestAddr, 0)
			f.apply(evStore([]uint64{1, 2}, blockToks(1, 2)))
			f.apply(evStore([]uint64{3}, blockToks(3)))
			tc.restart(ix, f)
			// The new engine reuses hash 1 for other content, from seq 0.
			f.apply(evStore([]uint64{1}, blockToks(5)))
			if got := ixLookupOne(ix, ixReq{tokens: blockToks(1, 2)}, ixTestAddr); got != (Match{}) {
				t.Fatalf("old engine's blocks survive: %+v", got)
			}
			if got := ixLookupOne(ix, ixReq{tokens: blockToks(5)}, ixTestAddr); got != gpuMatch(1) {
				t.Fatalf("new engine's first batch lost: %+v", got)
			}
			checkGaugesMatchContents(t, ix)
		})
	}
}

func TestABatchAppliedTwiceCountsOnce(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	o := newIxFeeder(ix, ixTestAddr, 0).o
	b := &events.Batch{Events: []events.Event{evStore([]uint64{1}, blockToks(1))}}
	o.Seq = 4
	ix.Apply(o, b)
	ix.Apply(o, b)
	o.Seq = 3
	ix.Apply(o, b)
	o.Seq = 5
	ix.Apply(o, &events.Batch{Events: []events.Event{evRemove(events.TierGPU, 1)}})
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != (Match{}) {
		t.Fatalf("a replayed store outlived its removal: %+v", got)
	}
	if n := ix.stats.dropped[dropDuplicateBatch].Load(); n != 2 {
		t.Fatalf("duplicate events dropped = %d, want 2", n)
	}
}

func TestMembership(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.apply(evStore([]uint64{1}, blockToks(1)))
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != (Match{}) {
		t.Fatalf("events of an endpoint never added were applied: %+v", got)
	}
	if n := ix.stats.dropped[dropUnknownEndpoint].Load(); n != 1 {
		t.Fatalf("unknown_endpoint drops = %d", n)
	}

	ix.AddEndpoint(ixTestAddr)
	ix.AddEndpoint("10.0.0.2:8000")
	f2 := newIxFeeder(ix, "10.0.0.2:8000", 0)
	f.apply(evStore([]uint64{1}, blockToks(1)))
	f2.apply(evStore([]uint64{1}, blockToks(1)))
	ix.Speculate(ixTestAddr, ixReq{tokens: blockToks(1, 2)}.keys())
	ix.RemoveEndpoint(ixTestAddr)
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamNone {
		t.Fatalf("a removed endpoint has state %v", st)
	}
	f.apply(evStore([]uint64{2}, blockToks(2)))
	ix.AddEndpoint(ixTestAddr)
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != (Match{}) {
		t.Fatalf("a re-added endpoint kept old holdings: %+v", got)
	}
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamNone {
		t.Fatalf("a re-added endpoint starts in state %v", st)
	}
	// A late event naming the old engine's hash as parent is unknown now.
	f.apply(evStoreChild(1, []uint64{2}, blockToks(2)))
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamUncertain {
		t.Fatalf("late child of a forgotten block: state %v", st)
	}
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, "10.0.0.2:8000"); got != gpuMatch(1) {
		t.Fatalf("another endpoint lost its holdings: %+v", got)
	}
	checkGaugesMatchContents(t, ix)
}

func TestLookup(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	addrs := []string{"a:1", "b:1", "c:1"}
	for _, a := range addrs {
		ix.AddEndpoint(a)
	}
	newIxFeeder(ix, "a:1", 0).apply(evStore([]uint64{1, 2, 3}, blockToks(1, 2, 3)))
	fb := newIxFeeder(ix, "b:1", 0)
	fb.apply(evStore([]uint64{1, 2}, blockToks(1, 2)), evPlaceholder(events.TierCPU, 1, 2))
	fb.apply(evRemove(events.TierGPU, 1))
	newIxFeeder(ix, "c:1", 0).apply(evStore([]uint64{1}, blockToks(9)))

	r := ixReq{tokens: blockToks(1, 2, 3, 4)}
	tests := []struct {
		name  string
		addrs []string
		want  []Match
	}{
		{"each candidate gets its own run and tiers", []string{"a:1", "b:1", "c:1"},
			[]Match{gpuMatch(3), {Blocks: 2, ByTier: [events.NumTiers]int{1, 1, 0}}, {}}},
		{"an unknown address matches nothing", []string{"zz:1", "a:1"}, []Match{{}, gpuMatch(3)}},
		{"a repeated address gets the same answer twice", []string{"b:1", "a:1", "b:1"},
			[]Match{{Blocks: 2, ByTier: [events.NumTiers]int{1, 1, 0}}, gpuMatch(3), {Blocks: 2, ByTier: [events.NumTiers]int{1, 1, 0}}}},
		{"no candidates is fine", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out := make([]Match, len(tc.addrs))
			for i := range out {
				out[i] = Match{Blocks: 99} // stale values must be cleared
			}
			ix.Lookup(r.keys(), tc.addrs, out)
			for i := range tc.want {
				if out[i] != tc.want[i] {
					t.Errorf("%s: %+v, want %+v", tc.addrs[i], out[i], tc.want[i])
				}
			}
		})
	}
}

// speculationRig is an index with speculative holdings of a second, whose
// one endpoint holds block 1 (blockToks(1)) for real.
func speculationRig() (*ixClock, *Index, *ixFeeder) {
	clk := newIxClock()
	ix := New(Options{Now: clk.Now, SpeculativeTTL: time.Second}, prometheus.NewRegistry())
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.apply(evStore([]uint64{1}, blockToks(1)))
	return clk, ix, f
}

func TestSpeculativeHoldings(t *testing.T) {
	t.Parallel()
	clk, ix, f := speculationRig()
	r := ixReq{tokens: blockToks(1, 2, 3)}

	ix.Speculate(ixTestAddr, r.keys())
	want := Match{Blocks: 3, ByTier: [events.NumTiers]int{1, 0, 0}, Speculative: 2}
	if got := ixLookupOne(ix, r, ixTestAddr); got != want {
		t.Fatalf("after Speculate: %+v, want %+v", got, want)
	}
	// A real store replaces the speculation on block 2.
	f.apply(evStoreChild(1, []uint64{2}, blockToks(2)))
	want = Match{Blocks: 3, ByTier: [events.NumTiers]int{2, 0, 0}, Speculative: 1}
	if got := ixLookupOne(ix, r, ixTestAddr); got != want {
		t.Fatalf("after a real store: %+v, want %+v", got, want)
	}
	checkGaugesMatchContents(t, ix)
	// Past the TTL the rest is ignored by lookups even before it is swept...
	clk.Advance(1500 * time.Millisecond)
	if got := ixLookupOne(ix, r, ixTestAddr); got != gpuMatch(2) {
		t.Fatalf("after the TTL: %+v", got)
	}
	// ...and Expire removes it.
	ix.Expire()
	checkGaugesMatchContents(t, ix)
	if n := ix.stats.spec.Load(); n != 0 {
		t.Fatalf("%d speculative holdings left", n)
	}
	if n := ix.stats.evictions[evictSpeculative].Load(); n != 1 {
		t.Fatalf("speculative evictions = %d, want 1", n)
	}
	// Real removals do not disturb the count, and the removed block is gone.
	f.apply(evRemove(events.TierGPU, 2))
	if got := ixLookupOne(ix, r, ixTestAddr); got != gpuMatch(1) {
		t.Fatalf("after removal: %+v", got)
	}
}

func TestTierMaxAgeEvictsBlocksNeverRemoved(t *testing.T) {
	t.Parallel()
	clk := newIxClock()
	var ages [events.NumTiers]time.Duration
	ages[events.TierCPU] = time.Minute
	ix := New(Options{Now: clk.Now, TierMaxAge: ages}, nil)
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.apply(evStore([]uint64{1, 2}, blockToks(1, 2)), evPlaceholder(events.TierCPU, 1, 2), evPlaceholder(events.TierCPU, 1))
	clk.Advance(40 * time.Second)
	f.apply(evPlaceholder(events.TierCPU, 2)) // stored again: its age restarts
	clk.Advance(30 * time.Second)
	ix.Expire()
	r := ixReq{tokens: blockToks(1, 2)}
	want := Match{Blocks: 2, ByTier: [events.NumTiers]int{2, 0, 0}}
	if got := ixLookupOne(ix, r, ixTestAddr); got != want {
		t.Fatalf("GPU copies must stay: %+v", got)
	}
	f.apply(evRemove(events.TierGPU, 1, 2))
	if got := ixLookupOne(ix, r, ixTestAddr); got != (Match{}) {
		t.Fatalf("block 1's CPU copy (and its duplicate) should have aged out: %+v", got)
	}
	// Block 2's CPU copy was refreshed and is still held by handle.
	f.apply(evRemove(events.TierCPU, 2))
	if n := ix.stats.dropped[dropUnknownHandle].Load(); n != 0 {
		t.Fatalf("block 2's refreshed CPU copy was evicted too early")
	}
	clk.Advance(2 * time.Minute)
	ix.Expire()
	checkGaugesMatchContents(t, ix)
	if n := ix.stats.holdings[events.TierCPU].Load(); n != 0 {
		t.Fatalf("%d CPU holdings left", n)
	}
	// Block 2 was stored in CPU twice and removed once: its remaining
	// reference ages out too.
	if n := ix.stats.evictions[evictMaxAge].Load(); n != 2 {
		t.Fatalf("max_age evictions = %d, want 2", n)
	}
}

func TestMaxHoldingsDropsStoresAndMarksUncertain(t *testing.T) {
	t.Parallel()
	ix := New(Options{MaxHoldings: 3, MaxHoldingsPerEndpoint: -1}, nil)
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.apply(evStore([]uint64{1, 2, 3, 4, 5}, blockToks(1, 2, 3, 4, 5)))
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1, 2, 3, 4, 5)}, ixTestAddr); got != gpuMatch(3) {
		t.Fatalf("Lookup = %+v, want the first three", got)
	}
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamUncertain {
		t.Fatalf("State = %v", st)
	}
	if n := ix.stats.dropped[dropCapacity].Load(); n != 2 {
		t.Fatalf("capacity drops = %d", n)
	}
}

func TestOneEndpointCannotTakeTheRoomOfTheOthers(t *testing.T) {
	t.Parallel()
	const total, perEndpoint = 64, 8
	ix := New(Options{MaxHoldings: total}, nil)
	const flooder, other = "10.0.0.66:8000", "10.0.0.7:8000"
	ix.AddEndpoint(flooder)
	ix.AddEndpoint(other)
	// One stream names far more blocks than its share, in one batch and
	// then in many, on several ranks.
	var hashes []uint64
	var bases []uint32
	for i := range 40 {
		hashes = append(hashes, uint64(1000+i))
		bases = append(bases, uint32(1000+i))
	}
	feeders := []*ixFeeder{newIxFeeder(ix, flooder, 0), newIxFeeder(ix, flooder, 1), newIxFeeder(ix, flooder, 2)}
	for _, f := range feeders {
		f.apply(evStore(hashes, blockToks(bases...)))
	}
	for i := range 20 {
		feeders[0].apply(evStore([]uint64{uint64(5000 + i)}, blockToks(uint32(5000+i))))
	}
	if n := ix.stats.dropped[dropEndpointCapacity].Load(); n == 0 {
		t.Fatal("no endpoint_capacity drops")
	}
	if st, _ := ix.State(flooder); st != datalayer.StreamUncertain {
		t.Fatalf("the flooding endpoint's state = %v, want uncertain: it no longer mirrors its engine", st)
	}
	// The other endpoint still indexes everything up to its own share.
	f := newIxFeeder(ix, other, 0)
	f.apply(evStore([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, blockToks(1, 2, 3, 4, 5, 6, 7, 8)))
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1, 2, 3, 4, 5, 6, 7, 8)}, other); got != gpuMatch(8) {
		t.Fatalf("the other endpoint's stores: %+v, want all eight", got)
	}
	if st, _ := ix.State(other); st != datalayer.StreamExact {
		t.Fatalf("the other endpoint's state = %v, want exact", st)
	}
	checkGaugesMatchContents(t, ix)
	// Clearing gives the flooder its room back.
	for _, f := range feeders {
		f.apply(events.Event{Kind: events.KindAllBlocksCleared})
	}
	checkGaugesMatchContents(t, ix)
	feeders[0].apply(evStore([]uint64{9}, blockToks(9)))
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(9)}, flooder); got != gpuMatch(1) {
		t.Fatalf("after clearing, the flooder's store: %+v", got)
	}
}

func TestDataParallelRanksKeepTheirOwnHandles(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	r0, r1 := newIxFeeder(ix, ixTestAddr, 0), newIxFeeder(ix, ixTestAddr, 1)
	r0.apply(evStore([]uint64{1}, blockToks(1)))
	r1.apply(evStore([]uint64{1}, blockToks(1)))
	r1.apply(evStore([]uint64{7}, blockToks(2)))
	r0.apply(evRemove(events.TierGPU, 1))
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != gpuMatch(1) {
		t.Fatalf("rank 1's copy lost with rank 0's: %+v", got)
	}
	r1.apply(evRemove(events.TierGPU, 1))
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != (Match{}) {
		t.Fatalf("block held after both ranks removed it: %+v", got)
	}
	checkGaugesMatchContents(t, ix)
}

func TestMetricsAreExported(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ix := New(Options{}, reg)
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.apply(evStore([]uint64{1, 2}, blockToks(1, 2)), evPlaceholder(events.TierCPU, 1), evRemove(events.TierGPU, 9))
	want := `
# HELP kvroute_index_blocks Distinct block keys held by at least one endpoint.
# TYPE kvroute_index_blocks gauge
kvroute_index_blocks 2
# HELP kvroute_index_endpoints Endpoints whose events the index applies.
# TYPE kvroute_index_endpoints gauge
kvroute_index_endpoints 1
# HELP kvroute_index_holdings (block, endpoint) holdings in the exact prefix index, by cache tier.
# TYPE kvroute_index_holdings gauge
kvroute_index_holdings{tier="CPU"} 1
kvroute_index_holdings{tier="GPU"} 2
kvroute_index_holdings{tier="STORAGE"} 0
# HELP kvroute_index_events_applied_total KV events applied, by kind.
# TYPE kvroute_index_events_applied_total counter
kvroute_index_events_applied_total{kind="AllBlocksCleared"} 0
kvroute_index_events_applied_total{kind="BlockRemoved"} 1
kvroute_index_events_applied_total{kind="BlockStored"} 2
`
	names := []string{"kvroute_index_blocks", "kvroute_index_endpoints", "kvroute_index_holdings", "kvroute_index_events_applied_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n < 20 {
		t.Fatalf("%d series, %v", n, err)
	}
}

func TestRunStopsWithItsContext(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		ix.Run(ctx, time.Millisecond)
		close(done)
	}()
	time.Sleep(5 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestSpeculativeDeadlinesSurviveTheirCounterWrapping(t *testing.T) {
	t.Parallel()
	const wrap = specMsMask + 1
	tests := []struct {
		name           string
		deadline, now  uint64
		wantStillAlive bool
	}{
		{"a deadline ahead is live", 5000, 3000, true},
		{"a deadline reached is over", 3000, 3000, false},
		{"a deadline passed is over", 3000, 5000, false},
		{"a deadline ahead across the wrap is live", wrap + 1000, wrap - 1000, true},
		{"a deadline passed across the wrap is over", wrap - 1000, wrap + 1000, false},
		{"a deadline ahead after years of uptime is live", 3*wrap + 2000, 3*wrap + 1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := specLive(specHolder(1, tc.deadline), tc.now); got != tc.wantStillAlive {
				t.Fatalf("specLive = %v", got)
			}
		})
	}
}

func TestABatchThatClearsTheCacheIsStillNotAppliedTwice(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	o := newIxFeeder(ix, ixTestAddr, 0).o
	b := &events.Batch{Events: []events.Event{
		{Kind: events.KindAllBlocksCleared}, evStore([]uint64{1}, blockToks(1)),
	}}
	ix.Apply(o, b)
	ix.Apply(o, b)
	if n := ix.stats.dropped[dropDuplicateBatch].Load(); n != 2 {
		t.Fatalf("duplicate events dropped = %d, want the replay's 2", n)
	}
	o.Seq = 1
	ix.Apply(o, &events.Batch{Events: []events.Event{evRemove(events.TierGPU, 1)}})
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != (Match{}) {
		t.Fatalf("the store outlived its removal: %+v", got)
	}
}

// feedAndLookup applies batches to one endpoint of a fresh index in order
// and checks what lookup r then answers; it returns the index.
func feedAndLookup(t *testing.T, batches [][]events.Event, r ixReq, want Match) *Index {
	t.Helper()
	ix := New(Options{}, prometheus.NewRegistry())
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 0)
	for _, b := range batches {
		f.apply(b...)
	}
	if got := ixLookupOne(ix, r, ixTestAddr); got != want {
		t.Errorf("Lookup = %+v, want %+v", got, want)
	}
	return ix
}

func TestSpeculatingManyBlocksRecordsEachOnceWhateverItsShard(t *testing.T) {
	t.Parallel()
	// Below groupMinKeys the blocks are recorded one lock each; from it
	// on, grouped by shard: the answers must not tell the two apart.
	for _, n := range []int{3, groupMinKeys - 1, groupMinKeys, 600} {
		t.Run(fmt.Sprintf("%d blocks", n), func(t *testing.T) {
			clk, ix, _ := speculationRig()
			bases := make([]uint32, n)
			for i := range bases {
				bases[i] = uint32(i + 1)
			}
			r := ixReq{tokens: blockToks(bases...)}
			keys := r.keys()
			// Twice: a block speculated again is renewed, not counted again.
			ix.Speculate(ixTestAddr, keys)
			ix.Speculate(ixTestAddr, keys)
			want := Match{Blocks: n, ByTier: [events.NumTiers]int{1, 0, 0}, Speculative: n - 1}
			if got := ixLookupOne(ix, r, ixTestAddr); got != want {
				t.Fatalf("after Speculate: %+v, want %+v", got, want)
			}
			if got := ix.stats.spec.Load(); got != int64(n-1) {
				t.Fatalf("%d speculative holdings counted, want %d", got, n-1)
			}
			checkGaugesMatchContents(t, ix)
			clk.Advance(1500 * time.Millisecond)
			ix.Expire()
			if got := ix.stats.spec.Load(); got != 0 {
				t.Fatalf("%d speculative holdings left after their TTL", got)
			}
			if got := ixLookupOne(ix, r, ixTestAddr); got != gpuMatch(1) {
				t.Fatalf("after the TTL: %+v", got)
			}
			checkGaugesMatchContents(t, ix)
		})
	}
}

func TestGroupingKeysByShardKeepsEachKeyAndTheirOrderWithinAShard(t *testing.T) {
	t.Parallel()
	keys := AppendBlockKeys(nil, RootKey(ixTestModel, "", ""), make([]uint32, 700*ixTestBS), ixTestBS)
	keys = append(keys, keys[5], keys[0]) // repeats stay
	var bounds [numShards + 1]int32
	got := groupByShard([]uint64{42}, keys, keyOf, &bounds)
	if got[0] != 42 || len(got) != 1+len(keys) {
		t.Fatalf("the keys were not appended after what dst held: len %d", len(got))
	}
	got = got[1:]
	if bounds[0] != 0 || int(bounds[numShards]) != len(keys) {
		t.Fatalf("bounds run %d..%d, want 0..%d", bounds[0], bounds[numShards], len(keys))
	}
	for s := range numShards {
		var want []uint64
		for _, k := range keys {
			if int(k>>shardShift) == s {
				want = append(want, k)
			}
		}
		if g := got[bounds[s]:bounds[s+1]]; !slices.Equal(g, want) {
			t.Fatalf("shard %d holds %x, want %x", s, g, want)
		}
	}
}
