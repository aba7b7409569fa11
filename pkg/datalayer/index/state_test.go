package index

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

func TestTrustStatesSayWhatIsKnown(t *testing.T) {
	t.Parallel()
	s := func(rank int) events.Stream { return events.Stream{Endpoint: ixTestAddr, DPRank: rank} }
	tests := []struct {
		name string
		run  func(ix *Index, f *ixFeeder)
		want datalayer.StreamState
	}{
		{"a stream seen from its seq 0 is exact", func(ix *Index, f *ixFeeder) {
			f.apply(evStore([]uint64{1}, blockToks(1)))
		}, datalayer.StreamExact},
		{"a late join is partial, and stays so through the parents it never saw", func(ix *Index, f *ixFeeder) {
			ix.Uncertain(f.o.Stream, events.ReasonLateJoin)
			f.apply(evStoreChild(77, []uint64{2}, blockToks(2)), evStore([]uint64{1}, blockToks(1)))
		}, datalayer.StreamPartial},
		{"a partial stream whose engine clears its cache is exact", func(ix *Index, f *ixFeeder) {
			ix.Uncertain(f.o.Stream, events.ReasonLateJoin)
			f.apply(events.Event{Kind: events.KindAllBlocksCleared})
		}, datalayer.StreamExact},
		{"a gap after a late join is uncertain", func(ix *Index, f *ixFeeder) {
			ix.Uncertain(f.o.Stream, events.ReasonLateJoin)
			f.apply(evStore([]uint64{1}, blockToks(1)))
			ix.Uncertain(f.o.Stream, events.ReasonGap)
		}, datalayer.StreamUncertain},
		{"a late join does not make an uncertain stream look better", func(ix *Index, f *ixFeeder) {
			ix.Uncertain(f.o.Stream, events.ReasonGap)
			ix.Uncertain(f.o.Stream, events.ReasonLateJoin)
		}, datalayer.StreamUncertain},
		{"an unknown parent on an exact stream is uncertain", func(ix *Index, f *ixFeeder) {
			f.apply(evStoreChild(77, []uint64{2}, blockToks(2)))
		}, datalayer.StreamUncertain},
		{"the endpoint reads as its least trustworthy rank", func(ix *Index, f *ixFeeder) {
			f.apply(evStore([]uint64{1}, blockToks(1)))
			ix.SetStreamState(s(1), datalayer.StreamPartial)
			ix.SetStreamState(s(2), datalayer.StreamRecovering)
		}, datalayer.StreamRecovering},
		{"recovery's verdict replaces the state", func(ix *Index, f *ixFeeder) {
			ix.Uncertain(f.o.Stream, events.ReasonReconnect)
			ix.SetStreamState(f.o.Stream, datalayer.StreamRecovering)
			ix.SetStreamState(f.o.Stream, datalayer.StreamPartial)
		}, datalayer.StreamPartial},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ix := New(Options{}, nil)
			ix.AddEndpoint(ixTestAddr)
			tt.run(ix, newIxFeeder(ix, ixTestAddr, 0))
			if got, _ := ix.State(ixTestAddr); got != tt.want {
				t.Fatalf("state = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestHoldingsListEveryRealHoldingWithItsTiers(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	f := newIxFeeder(ix, ixTestAddr, 0)
	f.apply(evStore([]uint64{1, 2}, blockToks(1, 2)))
	f.apply(events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{1}, Medium: events.TierCPU})
	ix.Speculate(ixTestAddr, ixReq{tokens: blockToks(9)}.keys())
	got := ix.Holdings(ixTestAddr)
	keys := ixReq{tokens: blockToks(1, 2)}.keys()
	want := map[uint64]uint8{keys[0]: 1<<events.TierGPU | 1<<events.TierCPU, keys[1]: 1 << events.TierGPU}
	if len(got) != len(want) {
		t.Fatalf("holdings = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("holdings = %v, want %v", got, want)
		}
	}
	if ix.Holdings("10.9.9.9:1") != nil {
		t.Fatal("an unknown endpoint has holdings")
	}
}
