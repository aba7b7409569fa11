package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// startEPP runs an EPP on natsURL that knows the fleet's engines.
func startEPP(t *testing.T, natsURL string, f *sim.Fleet) (*epp.EPP, func()) {
	t.Helper()
	e, err := epp.New(epp.Options{NATSURL: natsURL, Namespace: "ns", Pool: "pool", HTTPAddr: "127.0.0.1:0",
		Recovery: recovery.Options{MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		Logger:   slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Cores() {
		c := r.Engine().Config()
		e.Datastore().Upsert(&datalayer.Endpoint{Name: c.Pod, Address: c.Address, Pod: c.Pod, Model: c.Model})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() {
		if ctx.Err() == nil {
			stop()
		}
	})
	testkit.WaitFor(t, "the EPP to be ready", func() error {
		if !e.Ready() {
			return errors.New("e.Ready() is false")
		}
		return nil
	})
	return e, stop
}

// An EPP that restarts beside engines publishing straight to NATS (no
// relay) catches up from the engines' own snapshots, and ends answering
// exactly as its twin that never restarted: both equal to every engine's
// whole cache.
func TestARestartedReplicaBesideEnginesOnNATSAgreesWithItsTwin(t *testing.T) {
	srv := testkit.StartNATS(t, testkit.NATSOptions{})
	nc := srv.Connect(t, "fleet")
	ctx, cancel := context.WithCancel(context.Background())
	f, err := sim.StartFleet(ctx, sim.FleetConfig{Engines: 3, Model: "m",
		Pool:      blockpool.Config{BlockSize: 4, GPUBlocks: 64, CPUBlocks: 8, Seed: 5},
		Publisher: events.NewPublisher(nc, "ns", "pool"), HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	prompts := sim.SharedPrefix{Groups: 6, PromptsPerGroup: 4, SystemTokens: 24, QuestionTokens: 12, Seed: 4}.Prompts()
	serve := func(n, offset int) {
		for i := range n {
			eng := f.Cores()[(i+offset)%3].Engine()
			p := prompts[(i*7+offset)%len(prompts)]
			p.ID = ""
			if _, err := eng.Serve(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	a, _ := startEPP(t, srv.URL(), f)
	b, stopB := startEPP(t, srv.URL(), f)
	serve(120, 0)
	stopB()
	serve(60, 1) // b misses these
	b, _ = startEPP(t, srv.URL(), f)
	testkit.WaitFor(t, "both replicas equal to the engines' caches", func() error {
		for _, r := range f.Cores() {
			eng := r.Engine()
			addr := eng.Config().Address
			truth, err := eng.TrueHoldings()
			if err != nil {
				t.Fatal(err)
			}
			for name, e := range map[string]*epp.EPP{"twin": a, "restarted": b} {
				if st, _ := e.Index().State(addr); st != datalayer.StreamExact {
					return fmt.Errorf("%s: %s is %s", name, addr, st)
				}
				if d := sim.DiffHoldings(truth, e.Index().Holdings(addr)); !d.Exact() {
					return fmt.Errorf("%s: %s: %s", name, addr, d)
				}
			}
			if !maps.Equal(a.Index().Holdings(addr), b.Index().Holdings(addr)) {
				return errors.New("the replicas differ at " + addr)
			}
		}
		return nil
	})
	// Each stream is marked exact inside its resync, which is counted as
	// it ends, a moment later.
	testkit.WaitFor(t, "the restarted replica's resyncs, one per engine, counted", func() error {
		if seen := testkit.Value(t, b.Registry(), "kvroute_recovery_resyncs_total", "result", "ok"); seen < 3 {
			return fmt.Errorf("testkit.Value(t, b.Registry(), \"kvroute_recovery_resyncs_total\", \"result\", \"ok\") is %v, want >= %v", seen, 3)
		}
		return nil
	})
}
