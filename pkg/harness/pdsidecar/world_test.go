package pdsidecar_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/pdsidecar"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

const blockSize = 16

// engine is one simulated pod of the world.
type engine struct {
	srv  *sim.Server
	role string
	// addr is where the pool routes to: the sidecar's for a decode pod,
	// the engine's own for a prefill pod.
	addr string
	side *pdsidecar.Sidecar
}

// pdConfig splits every request: the decode pod is picked by the exact
// prefix it holds, the prefill pod by its queue.
const pdConfig = `plugins:
- type: precise-prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: always-disagg-pd-decider
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: precise-prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
`

// world is a P/D pool on loopback: prefill engines, decode engines each
// behind a P/D sidecar, all publishing KV events to an EPP (its NATS
// server, exact index, scraping, pdConfig's scheduling) that serves
// ext_proc and the standalone proxy.
type world struct {
	epp     *epp.EPP
	prefill []*engine
	decode  []*engine
}

type worldOptions struct {
	prefill, decode int
	// prefillTiming is the prefill engines' timing (fast when zero).
	prefillTiming sim.Timing
	// noOutliers turns the EPP's outlier detection off.
	noOutliers bool
	// timing is every engine's (fastTiming when zero, for the prefill
	// engines prefillTiming when set); transfer the KV transfer's cost
	// (1 ms plus 1 MiB a block at 8 GiB/s when zero).
	timing   sim.Timing
	transfer *sim.Transfer
}

func fastTiming() sim.Timing {
	return sim.Timing{PrefillPerToken: 20 * time.Microsecond, DecodeStep: time.Millisecond, MaxSeqs: 8}
}

func startWorld(t testing.TB, o worldOptions) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	eo := epp.Options{
		Pool: "pd", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0",
		ConfigText: pdConfig, Scrape: true,
		ScrapeOptions: scrape.Options{Interval: 20 * time.Millisecond},
		Prefix:        prefixmatch.Params{DefaultBlockSizeTokens: blockSize},
		RequestPath:   epp.RequestPathOptions{ProxyAddr: "127.0.0.1:0", ExtProcAddr: "127.0.0.1:0", Plaintext: true},
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	// Off where a test needs a failing pod to stay a candidate, so that
	// every request meets the failure under test.
	eo.OutlierDetection.Disabled = o.noOutliers
	e, err := epp.New(eo)
	if err != nil {
		t.Fatal(err)
	}
	eppDone := make(chan error, 1)
	go func() { eppDone <- e.Run(ctx) }()
	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	pub := events.NewPublisher(nc, e.Namespace(), e.Pool())
	w := &world{epp: e}
	var stops []chan error
	run := func(f func(context.Context) error) {
		c := make(chan error, 1)
		stops = append(stops, c)
		go func() { c <- f(ctx) }()
	}
	tr := sim.Transfer{Latency: time.Millisecond, BlockBytes: 1 << 20, Bandwidth: 8 << 30, HoldTimeout: time.Hour}
	if o.transfer != nil {
		tr = *o.transfer
	}
	dt := o.timing
	if dt.MaxSeqs == 0 {
		dt = fastTiming()
	}
	add := func(i int, role string, tm sim.Timing) *engine {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		en := &engine{role: role, addr: ln.Addr().String()}
		if role == sim.RoleDecode {
			if en.side, err = pdsidecar.New("127.0.0.1:0", ln.Addr().String()); err != nil {
				t.Fatal(err)
			}
			en.addr = en.side.Addr()
			run(en.side.Run)
		}
		pod := fmt.Sprintf("%s-%d", role, i)
		eng := sim.NewEngine(sim.EngineConfig{Pod: pod, Address: en.addr, Model: "m", Role: role, Transfer: tr,
			Pool: blockpool.Config{BlockSize: blockSize, GPUBlocks: 2048, Seed: uint64(i + 1)}}, pub)
		en.srv = sim.NewServer(sim.NewCore(eng, tm), ln)
		run(en.srv.Core().Run)
		run(en.srv.Run)
		e.Datastore().Upsert(&datalayer.Endpoint{Name: pod, Address: en.addr, Pod: pod, Namespace: e.Namespace(), Model: "m",
			Labels: eng.Config().Labels()})
		return en
	}
	pt := o.prefillTiming
	if pt.MaxSeqs == 0 {
		pt = dt
	}
	for i := range o.prefill {
		w.prefill = append(w.prefill, add(i, sim.RolePrefill, pt))
	}
	for i := range o.decode {
		w.decode = append(w.decode, add(i, sim.RoleDecode, dt))
	}
	t.Cleanup(func() {
		cancel()
		for _, c := range stops {
			if err := <-c; err != nil {
				t.Error(err)
			}
		}
		nc.Close()
		if err := <-eppDone; err != nil {
			t.Error(err)
		}
	})
	testkit.WaitFor(t, "the EPP scraped every engine", func() error {
		for _, ep := range e.Datastore().List() {
			if _, ok := e.Datastore().Metrics(ep.Name); !ok {
				return fmt.Errorf("no metrics of %s yet", ep.Name)
			}
		}
		return nil
	})
	return w
}

// proxy starts the standalone proxy on the world's director.
func (w *world) proxy(t testing.TB, o proxy.Options) (string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Addr, o.Registerer = "127.0.0.1:0", reg
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := proxy.New(w.epp.Director(), o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return "http://" + p.Addr(), reg
}

// byAddr finds the engine the pool routes to at addr.
func (w *world) byAddr(addr string) *engine {
	for _, en := range append(append([]*engine{}, w.prefill...), w.decode...) {
		if en.addr == addr {
			return en
		}
	}
	return nil
}

// nothingHeld fails unless no prefill engine holds blocks for a remote
// decode, and none has blocks allocated to a request.
func (w *world) nothingHeld() error {
	for _, en := range w.prefill {
		st := en.srv.PDStats()
		if u := en.srv.Core().Engine().Usage(); st.Held != 0 || u != 0 {
			return fmt.Errorf("prefill engine %s holds %d transfers, %.3f of its blocks in use (%+v)", en.addr, st.Held, u, st)
		}
	}
	return nil
}

// proxyOptions are the proxy's options in tests: its log discarded.
func proxyOptions() proxy.Options { return proxy.Options{} }

// nothingInFlight fails unless the EPP accounts no request in flight on
// any pod: each leg ended on its own endpoint.
func (w *world) nothingInFlight() error {
	for _, ep := range w.epp.Datastore().List() {
		if f := w.epp.Datastore().InFlight(ep.Name); f.Prefilling != 0 || f.Decoding != 0 {
			return fmt.Errorf("%s has %d prefilling and %d decoding in flight", ep.Name, f.Prefilling, f.Decoding)
		}
	}
	return nil
}
