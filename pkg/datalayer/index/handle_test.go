package index

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// storeAt applies one BlockStored of n blocks of blockSize tokens from the
// root, as engine addr would publish it.
func storeAt(ix *Index, addr string, blockSize, n int) {
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	o := events.Origin{Stream: events.Stream{Endpoint: addr}, Model: "m", Instance: "i", BlockSize: blockSize}
	ix.Apply(o, &events.Batch{Events: []events.Event{{
		Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: make([]uint32, n*blockSize), BlockSize: blockSize,
	}}})
}

func TestCandidatesCarryWhatTheIndexSaysOfEachEndpointUntilItLeaves(t *testing.T) {
	t.Parallel()
	const addr = "10.0.0.1:8000"
	ix := New(Options{}, nil)
	ds := datalayer.NewDatastore(nil)
	ds.SetStreamStates(ix)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: addr, Model: "m"})
	info := func() (datalayer.StreamState, datalayer.StreamInfo, bool) {
		t.Helper()
		c := ds.Candidates(nil)[0]
		if _, ok := c.StreamInfoFrom(New(Options{}, nil)); ok {
			t.Fatal("a candidate claims its info came from another index")
		}
		got, ok := c.StreamInfoFrom(ix)
		return c.Stream, got, ok
	}
	check := func(step string, wantState datalayer.StreamState, want datalayer.StreamInfo, wantOK bool) {
		t.Helper()
		state, got, ok := info()
		if state != wantState || ok != wantOK || got != want {
			t.Errorf("%s: candidate's stream %v, info %+v (from the index: %v), want %v, %+v (%v)", step, state, got, ok, wantState, want, wantOK)
		}
		if ok {
			var d [1]EndpointInfo
			ix.Describe([]string{addr}, d[:])
			if d[0] != got {
				t.Errorf("%s: candidate's info %+v, Describe says %+v", step, got, d[0])
			}
		}
	}

	check("before the index knows the address", datalayer.StreamNone, datalayer.StreamInfo{}, false)
	ix.AddEndpoint(addr)
	check("a member with no events", datalayer.StreamNone, datalayer.StreamInfo{}, true)
	storeAt(ix, addr, 16, 2)
	check("after its first store", datalayer.StreamExact, datalayer.StreamInfo{State: datalayer.StreamExact, BlockSize: 16, GPUBlocks: 2}, true)
	ix.SetStreamState(events.Stream{Endpoint: addr}, datalayer.StreamUncertain)
	check("once its stream is in doubt", datalayer.StreamUncertain, datalayer.StreamInfo{State: datalayer.StreamUncertain, BlockSize: 16, GPUBlocks: 2}, true)
	ix.RemoveEndpoint(addr)
	check("once it left the index", datalayer.StreamNone, datalayer.StreamInfo{}, false)
	ix.AddEndpoint(addr)
	storeAt(ix, addr, 32, 1)
	check("back, with another block size (what it held before is forgotten)", datalayer.StreamExact, datalayer.StreamInfo{State: datalayer.StreamExact, BlockSize: 32, GPUBlocks: 1}, true)
	ds.SetStreamStates(nil)
	check("with no stream states", datalayer.StreamNone, datalayer.StreamInfo{}, false)
}

// BenchmarkDatastoreCandidatesFromIndex measures making a request's 64
// candidates into reused memory, each endpoint's stream state read from
// the index, as the request path does: "warm" one request after another,
// "cold" with a buffer four times the size of L2 written between requests
// (not timed), as a request that has just parsed its body meets them.
func BenchmarkDatastoreCandidatesFromIndex(b *testing.B) {
	for _, cold := range []bool{false, true} {
		name := "64 endpoints/warm"
		if cold {
			name = "64 endpoints/cold"
		}
		b.Run(name, func(b *testing.B) {
			ix := New(Options{}, nil)
			ds := datalayer.NewDatastore(nil)
			ds.SetStreamStates(ix)
			for i := range 64 {
				name, addr := fmt.Sprintf("pod-%d", i), benchAddr(i)
				ds.Upsert(&datalayer.Endpoint{Name: name, Address: addr, Model: "m"})
				ds.SetMetrics(name, datalayer.Metrics{WaitingQueueSize: i, UpdateTime: time.Now()})
				ix.AddEndpoint(addr)
				storeAt(ix, addr, benchBS, 4)
			}
			var set datalayer.CandidateSet
			var flush []byte
			if cold {
				flush = make([]byte, 8<<20)
			}
			var cpu time.Duration
			b.ReportAllocs()
			for b.Loop() {
				for j := 0; j < len(flush); j += 64 {
					flush[j]++
				}
				cpu0 := testkit.CPUTime()
				cands := ds.CandidatesInto(&set, nil)
				if cands[63].Stream != datalayer.StreamExact {
					b.Fatalf("candidate's stream %v, want exact", cands[63].Stream)
				}
				cpu += testkit.CPUTime() - cpu0
			}
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/request")
		})
	}
}

func TestTheGPUBlocksCountFollowsStoresRemovalsRestartsAndAges(t *testing.T) {
	t.Parallel()
	const addr = "10.0.0.1:8000"
	now := time.Unix(1000, 0)
	var opts Options
	opts.TierMaxAge[events.TierGPU] = time.Minute
	opts.Now = func() time.Time { return now }
	ix := New(opts, nil)
	ix.AddEndpoint(addr)
	gpu := func() int {
		var d [1]EndpointInfo
		ix.Describe([]string{addr}, d[:])
		return d[0].GPUBlocks
	}
	o := events.Origin{Stream: events.Stream{Endpoint: addr}, Model: "m", Instance: "i", BlockSize: 16}
	storeAt(ix, addr, 16, 4)
	if got := gpu(); got != 4 {
		t.Fatalf("after 4 stored: %d GPU blocks", got)
	}
	o.Seq = 1 // the batch after storeAt's
	ix.Apply(o, &events.Batch{Events: []events.Event{{Kind: events.KindBlockRemoved, BlockHashes: []uint64{4}, Medium: events.TierGPU}}})
	if got := gpu(); got != 3 {
		t.Errorf("after one removed: %d GPU blocks, want 3", got)
	}
	ix.Restart(o.Stream)
	if got := gpu(); got != 0 {
		t.Errorf("after the engine restarted: %d GPU blocks, want 0", got)
	}
	storeAt(ix, addr, 16, 2)
	now = now.Add(2 * time.Minute)
	ix.Expire()
	if got := gpu(); got != 0 {
		t.Errorf("after the GPU tier's holdings aged out: %d GPU blocks, want 0", got)
	}
}
