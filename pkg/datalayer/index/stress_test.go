package index

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// TestConcurrentIngestLookupAndMembership runs ingest for several endpoints,
// lookups, speculation, expiry and membership churn at once. The race
// detector checks the locking; the answers are checked for consistency as
// they come, and the gauges against the contents once all stop. Long
// prompts take the paths that lock many shards at once (a walk past
// walkLockAllAfter, Speculate and expiry of groupMinKeys keys or more):
// a deadlock there would hang the test.
func TestConcurrentIngestLookupAndMembership(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// sharedBlocks is the prefix prompts share, maxBlocks the most of
		// it a prompt takes; gpu and cpu size each engine's pool.
		sharedBlocks, maxBlocks, gpu, cpu int
	}{
		{"short prompts", 64, 40, 200, 100},
		{"long prompts", 700, 640, 2000, 600},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stressIndex(t, tc.sharedBlocks, tc.maxBlocks, tc.gpu, tc.cpu)
		})
	}
}

func stressIndex(t *testing.T, sharedBlocks, maxBlocks, gpu, cpu int) {
	clk := newIxClock()
	ix := New(Options{Now: clk.Now, SpeculativeTTL: 50 * time.Millisecond}, nil)
	const endpoints = 4
	addrs := make([]string, endpoints)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.2.0.%d:8000", i)
		ix.AddEndpoint(addrs[i])
	}
	shared := make([]uint32, sharedBlocks*modelBS)
	for i := range shared {
		shared[i] = uint32(i % 37)
	}
	prompt := func(rng *rand.Rand) []uint32 {
		n := modelBS * (1 + rng.IntN(maxBlocks))
		p := append([]uint32(nil), shared[:n]...)
		for range rng.IntN(3 * modelBS) {
			p = append(p, uint32(rng.IntN(1000)))
		}
		return p
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for i, addr := range addrs {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			pool := blockpool.New(blockpool.Config{BlockSize: modelBS, GPUBlocks: gpu, CPUBlocks: cpu, Seed: uint64(i)})
			o := events.Origin{Stream: events.Stream{Endpoint: addr}, Model: modelModel, Instance: "i", BlockSize: modelBS}
			var running []string
			for n := 0; ctx.Err() == nil; n++ {
				r := blockpool.Request{ID: fmt.Sprint(n), Tokens: prompt(rng)}
				if _, err := pool.Allocate(r); errors.Is(err, blockpool.ErrNoSpace) {
					for _, id := range running {
						_ = pool.Free(id)
					}
					running = running[:0]
				} else if err != nil {
					fail(err)
					return
				} else {
					running = append(running, r.ID)
				}
				if b, seq, ok := pool.Step(); ok {
					o.Seq = seq
					ix.Apply(o, b)
				}
			}
		})
	}
	for g := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			out := make([]Match, len(addrs))
			var keys []uint64
			for ctx.Err() == nil {
				keys = AppendBlockKeys(keys[:0], RootKey(modelModel, "", ""), prompt(rng), modelBS)
				ix.Lookup(keys, addrs, out)
				for i, m := range out {
					sum := m.Speculative
					for _, n := range m.ByTier {
						sum += n
					}
					if m.Blocks > len(keys) || sum != m.Blocks {
						fail(fmt.Errorf("%s: inconsistent match %+v for %d keys", addrs[i], m, len(keys)))
						return
					}
				}
				if rng.IntN(4) == 0 {
					ix.Speculate(addrs[rng.IntN(len(addrs))], keys)
				}
			}
		})
	}
	// The membership churn sets the length of the run: a count of cycles,
	// not a duration, so that a slow machine does as much work as a fast one.
	for range 200 {
		ix.RemoveEndpoint(addrs[0])
		time.Sleep(time.Millisecond)
		ix.AddEndpoint(addrs[0])
		clk.Advance(20 * time.Millisecond)
		ix.Expire()
		_, _ = ix.State(addrs[1])
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkGaugesMatchContents(t, ix)
	for _, a := range addrs {
		ix.RemoveEndpoint(a)
	}
	checkGaugesMatchContents(t, ix)
	if n := ix.stats.blocks.Load(); n != 0 {
		t.Fatalf("%d blocks left after every endpoint left", n)
	}
}
