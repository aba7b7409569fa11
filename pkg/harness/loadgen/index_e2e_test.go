package loadgen_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// TestTheIndexMatchesTheEnginesCachesForRandomWorkloads runs random
// workloads (shared prefixes of random lengths, GPU eviction, CPU
// offload, both encodings) through simulated engines publishing over a real
// NATS server into the EPP's consumer and index, and checks that the
// index's answer for every (prompt, engine) is the engine's true cache.
func TestTheIndexMatchesTheEnginesCachesForRandomWorkloads(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 3} {
		t.Run("seed "+strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			checkIndexAgainstEngines(t, seed)
		})
	}
}

func checkIndexAgainstEngines(t *testing.T, seed uint64) {
	const bs = 4
	e, err := epp.New(epp.Options{
		Pool: "pool", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Prefix: prefixmatch.Params{DefaultBlockSizeTokens: bs},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	eppDone := make(chan error, 1)
	go func() { eppDone <- e.Run(ctx) }()
	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.StartFleet(ctx, sim.FleetConfig{
		Engines: 3, Model: "m", MixedEncodings: true,
		Pool:      blockpool.Config{BlockSize: bs, GPUBlocks: 96, CPUBlocks: 48, Seed: seed},
		Timing:    sim.Timing{PrefillPerToken: time.Microsecond, DecodeStep: 50 * time.Microsecond, MaxSeqs: 3},
		Publisher: events.NewPublisher(nc, e.Namespace(), e.Pool()),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		nc.Close()
		cancel()
		if err := <-eppDone; err != nil {
			t.Error(err)
		}
	}()
	for _, s := range f.Servers {
		c := s.Core().Engine().Config()
		e.Datastore().Upsert(&datalayer.Endpoint{Name: c.Pod, Address: c.Address, Pod: c.Pod, Model: "m"})
	}
	testkit.WaitFor(t, "the EPP to be ready", func() error {
		if !e.Ready() {
			return errors.New("e.Ready() is false")
		}
		return nil
	})

	rng := rand.New(rand.NewPCG(seed, 99))
	var prefixes [][]uint32
	for range 6 {
		p := make([]uint32, 4+rng.IntN(60))
		for i := range p {
			p[i] = uint32(rng.IntN(1000))
		}
		prefixes = append(prefixes, p)
	}
	var prompts [][]uint32
	var seqs []*sim.Seq
	for range 150 {
		p := append([]uint32{}, prefixes[rng.IntN(len(prefixes))]...)
		for range rng.IntN(40) {
			p = append(p, uint32(rng.IntN(1000)))
		}
		prompts = append(prompts, p)
		s, err := f.Servers[rng.IntN(len(f.Servers))].Core().Submit(blockpool.Request{Tokens: p}, 1+rng.IntN(3))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	for _, s := range seqs {
		for tok := range s.Tokens {
			if tok.Err != nil {
				t.Fatal(tok.Err)
			}
		}
	}
	// The engines are idle now; give their last events time to land.
	testkit.WaitFor(t, "every answer to be exact", func() error {
		agree, total, miss := compare(t, e, f, prompts)
		if agree != total {
			return fmt.Errorf("%d/%d answers exact; first difference: %s", agree, total, miss)
		}
		if total != len(prompts)*len(f.Servers) {
			t.Fatalf("%d answers for %d prompts on %d engines", total, len(prompts), len(f.Servers))
		}
		return nil
	})
}

func compare(t *testing.T, e *epp.EPP, f *sim.Fleet, prompts [][]uint32) (agree, total int, miss string) {
	byAddr := map[string]*sim.Engine{}
	for _, s := range f.Servers {
		byAddr[s.Addr()] = s.Core().Engine()
	}
	for _, p := range prompts {
		ans, err := e.Lookup(context.Background(), prefixquery.Query{Model: "m", TokenIDs: p})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range ans.Endpoints {
			truth := byAddr[a.Address].Held(blockpool.Request{Tokens: p})
			total++
			if truth.Blocks == a.Prefix.MatchBlocks && truth.ByTier == a.Prefix.BlocksByTier {
				agree++
			} else if miss == "" {
				miss = a.Address + ": engine holds " + itoa(truth.Blocks) + ", index says " + itoa(a.Prefix.MatchBlocks)
			}
		}
	}
	return agree, total, miss
}

func itoa(n int) string { return strconv.Itoa(n) }
