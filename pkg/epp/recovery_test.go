package epp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

const recWait = 30 * time.Second

func runEPP(t *testing.T, o Options) (*EPP, func()) {
	t.Helper()
	o.HTTPAddr = "127.0.0.1:0"
	o.Logger = slog.New(slog.DiscardHandler)
	e, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("EPP run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("EPP did not stop within 10s of cancel")
		}
	}
	t.Cleanup(stop)
	return e, stop
}

// waitExact waits until the EPP's index holds exactly what the engines do
// for every prompt.
func waitExact(t *testing.T, e *EPP, engines []*sim.Engine, prompts []blockpool.Request) {
	t.Helper()
	addrs := make([]string, len(engines))
	for i, g := range engines {
		addrs[i] = g.Config().Address
	}
	out := make([]index.Match, len(addrs))
	testkit.WaitFor(t, "the index matching the engines", func() error {
		for _, a := range addrs {
			if s, _ := e.Index().State(a); s != datalayer.StreamExact {
				return fmt.Errorf("%s is %s", a, s)
			}
		}
		for _, p := range prompts {
			e.Index().Lookup(index.AppendBlockKeys(nil, index.RootKey("m", "", ""), p.Tokens, 4), addrs, out)
			for i, g := range engines {
				want := g.Held(p)
				if got := (blockpool.Held{Blocks: out[i].Blocks, ByTier: out[i].ByTier}); got != want {
					return fmt.Errorf("%s: index %+v, engine %+v", addrs[i], got, want)
				}
			}
		}
		return nil
	})
}

func prompts() []blockpool.Request {
	return sim.SharedPrefix{Groups: 4, PromptsPerGroup: 4, SystemTokens: 24, QuestionTokens: 12, Seed: 1}.Prompts()
}

func serveAll(t *testing.T, engines []*sim.Engine, ps []blockpool.Request) {
	t.Helper()
	for i, p := range ps {
		p.ID = ""
		if _, err := engines[i%len(engines)].Serve(p); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRestartedEPPReplaysTheJetStreamStream(t *testing.T) {
	ns, err := natsembed.Start(natsembed.Options{JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	opts := Options{NATSURL: ns.ClientURL(), Pool: "pool-js", JetStream: true}
	first, stop := runEPP(t, opts)

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub := events.NewPublisher(nc, first.Namespace(), first.Pool())
	var engines []*sim.Engine
	for i := range 2 {
		cfg := sim.EngineConfig{Pod: fmt.Sprintf("pod-%d", i), Address: fmt.Sprintf("127.0.0.1:%d", 8100+i), Model: "m",
			Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 40, Seed: uint64(i + 1)}}
		engines = append(engines, sim.NewEngine(cfg, pub))
		first.Datastore().Upsert(&datalayer.Endpoint{Name: cfg.Pod, Address: cfg.Address, Pod: cfg.Pod, Model: "m"})
	}
	ps := prompts()
	serveAll(t, engines, ps)
	waitExact(t, first, engines, ps)
	stop()

	// The new EPP starts empty, its endpoints read from a file as it
	// starts; the stream still holds every batch.
	var file strings.Builder
	file.WriteString("endpoints:\n")
	for _, g := range engines {
		c := g.Config()
		fmt.Fprintf(&file, "- {name: %s, address: '%s', model: m}\n", c.Pod, c.Address)
	}
	opts.EndpointsFile = filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(opts.EndpointsFile, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	second, _ := runEPP(t, opts)
	waitExact(t, second, engines, ps)
	if got := testkit.Value(t, second.Registry(), "kvroute_events_batches_total", "result", "applied"); got == 0 {
		t.Fatal("the restarted EPP applied no replayed batch")
	}
	if got := testkit.Value(t, second.Registry(), "kvroute_recovery_resyncs_total", "result", "ok"); got != 0 {
		t.Errorf("resyncs ok = %v: with no relay the stream alone must have rebuilt the index", got)
	}

	// A discovery source that takes its time (an informer cache still
	// filling): the stream waits for it rather than dropping the batches
	// of endpoints it does not know yet.
	opts.EndpointsFile = ""
	opts.Discovery = func(ds *datalayer.Datastore, _ *datalayer.Objectives, _ prometheus.Registerer, _ *slog.Logger) (Discovery, error) {
		return &slowDiscovery{ds: ds, delay: 300 * time.Millisecond, engines: engines}, nil
	}
	third, _ := runEPP(t, opts)
	waitExact(t, third, engines, ps)
	if got := testkit.Value(t, third.Registry(), "kvroute_index_events_dropped_total", "reason", "unknown_endpoint"); got != 0 {
		t.Errorf("%v events dropped as from unknown endpoints", got)
	}
}

// slowDiscovery registers the engines as endpoints after a delay, then
// reports itself synced.
type slowDiscovery struct {
	ds      *datalayer.Datastore
	delay   time.Duration
	engines []*sim.Engine
	synced  atomic.Bool
}

func (d *slowDiscovery) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(d.delay):
	}
	for _, g := range d.engines {
		c := g.Config()
		d.ds.Upsert(&datalayer.Endpoint{Name: c.Pod, Address: c.Address, Pod: c.Pod, Model: "m"})
	}
	d.synced.Store(true)
	<-ctx.Done()
	return nil
}

func (d *slowDiscovery) Synced() bool { return d.synced.Load() }

func TestEPPCatchesUpFromARelaySnapshot(t *testing.T) {
	ns, err := natsembed.Start(natsembed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	zport := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rep := fmt.Sprintf("tcp://%s", l.Addr())
	_ = l.Close()

	// An engine and its relay that ran before the EPP started.
	eng := sim.NewEngine(sim.EngineConfig{Pod: "vllm-0", Address: "127.0.0.1:8200", Model: "m",
		Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 40, Seed: 3}}, nil)
	zep := fmt.Sprintf("tcp://127.0.0.1:%d", zport)
	// The relay's first batch is seldom seq 0 (ZeroMQ drops what a PUB
	// sends before the subscription arrives); the replay ring gives it the
	// rest, so that its snapshot is exact.
	if err := eng.StartZMQ(sim.ZMQConfig{Endpoint: zep, Bind: true, ReplayEndpoint: rep}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	rnc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rnc.Close)
	rreg := prometheus.NewRegistry()
	r, err := relay.New(relay.Config{ZMQEndpoint: zep, Connect: true, ReplayEndpoint: rep, Namespace: "default", Pool: "pool-r",
		Pod: "vllm-0", PodIP: "127.0.0.1", ServingPort: 8200, Model: "m", Logger: slog.New(slog.DiscardHandler),
		Registerer: rreg}, rnc)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- r.Run(rctx) }()
	t.Cleanup(func() { rcancel(); <-rdone })
	deadline := time.Now().Add(recWait)
	ps := prompts()
	for r.Mirror().Position().Seq < uint64(len(ps)-1) {
		if time.Now().After(deadline) {
			t.Fatal("the relay never saw the engine's batches")
		}
		serveAll(t, []*sim.Engine{eng}, ps[:1])
		time.Sleep(5 * time.Millisecond)
	}
	serveAll(t, []*sim.Engine{eng}, ps)
	// Every batch is through the relay and the NATS server before the EPP
	// subscribes: it has only the snapshot to catch up from.
	last, _ := eng.LastSeq()
	for r.Mirror().Position().Seq != last || testkit.Value(t, rreg, "kvroute_relay_buffer_depth_batches") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the relay never forwarded the engine's last batch %d", last)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := rnc.Flush(); err != nil {
		t.Fatal(err)
	}

	e, _ := runEPP(t, Options{NATSURL: ns.ClientURL(), Pool: "pool-r"})
	// The pod name, and so the snapshot subject, comes from discovery.
	e.Datastore().Upsert(&datalayer.Endpoint{Name: "vllm-0", Address: "127.0.0.1:8200", Pod: "vllm-0", Model: "m"})
	waitExact(t, e, []*sim.Engine{eng}, ps)
	// The stream is marked exact inside the resync, which is counted as it
	// ends, a moment later.
	testkit.WaitFor(t, "the resync counted", func() error {
		if seen := testkit.Value(t, e.Registry(), "kvroute_recovery_resyncs_total", "result", "ok"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, e.Registry(), \"kvroute_recovery_resyncs_total\", \"result\", \"ok\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	if got := testkit.Value(t, e.Registry(), "kvroute_recovery_resyncs_total", "result", "ok"); got != 1 {
		t.Errorf("resyncs ok = %v, want 1", got)
	}
	if got := testkit.Value(t, e.Registry(), "kvroute_events_batches_total", "result", "applied"); got != 0 {
		t.Errorf("applied %v live batches; the test wants the snapshot alone", got)
	}
}
