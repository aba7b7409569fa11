package epp_test

// A failing pod loses its traffic: simulated engines with vLLM's timing
// behind the assembled EPP, one of them failing every request at once (a
// 500, refused connections, a made-up 200), under 16 concurrent clients
// through ext_proc (the Envoy-like client forwarding to the pick) and
// through the standalone proxy.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// tally counts, per endpoint, the requests sent there and those it
// answered with a 200.
type tally struct {
	mu         sync.Mutex
	total      int
	sent, good map[string]int
	// took are the successful requests' latencies, in order.
	took []served
}

type served struct {
	addr string
	d    time.Duration
}

func newTally() *tally { return &tally{sent: map[string]int{}, good: map[string]int{}} }

func (t *tally) add(addr string, ok bool, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total++
	t.sent[addr]++
	if ok {
		t.good[addr]++
		t.took = append(t.took, served{addr, d})
	}
}

type counts struct {
	total      int
	sent, good map[string]int
	took       int
}

func (t *tally) snapshot() counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	return counts{t.total, maps.Clone(t.sent), maps.Clone(t.good), len(t.took)}
}

// median is the median latency of the successful requests between two
// snapshots that endpoints other than except served.
func (t *tally) median(from, to counts, except string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ds []time.Duration
	for _, s := range t.took[from.took:to.took] {
		if s.addr != except {
			ds = append(ds, s.d)
		}
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// countingTransport counts the proxy's attempts per endpoint, refused
// connections included.
type countingTransport struct {
	next http.RoundTripper
	t    *tally
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t0 := time.Now()
	resp, err := c.next.RoundTrip(r)
	c.t.add(r.URL.Host, err == nil && resp.StatusCode == http.StatusOK, time.Since(t0))
	return resp, err
}

type outlierRig struct {
	e       *epp.EPP
	servers []*sim.Server
	tally   *tally
	logs    *testkit.LogBuffer
}

func startOutlierRig(t *testing.T, viaProxy bool) *outlierRig {
	t.Helper()
	r := &outlierRig{tally: newTally(), logs: &testkit.LogBuffer{}}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	o := epp.Options{
		Pool: "pool", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Scrape: true, Logger: slog.New(slog.NewTextHandler(r.logs, nil)),
		// A pod that refuses connections fails its scrapes too, and the
		// scorers shun stale metrics by themselves; on a loaded machine
		// that could come first and hide what is under test here.
		MetricsStaleness: time.Minute,
		RequestPath:      epp.RequestPathOptions{ExtProcAddr: "127.0.0.1:0", Plaintext: true},
		OutlierDetection: datalayer.OutlierDetection{
			BaseEjectionTime: 200 * time.Millisecond, MaxEjectionTime: 3 * time.Second, ProbationSuccesses: 3,
		},
	}
	if viaProxy {
		o.RequestPath.ProxyAddr = "127.0.0.1:0"
		o.RequestPath.Proxy.Transport = &countingTransport{next: tr, t: r.tally}
	}
	e, err := epp.New(o)
	if err != nil {
		t.Fatal(err)
	}
	r.e = e
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.StartFleet(ctx, sim.FleetConfig{
		Engines: 4, Model: "m",
		Pool:      blockpool.Config{BlockSize: 16, GPUBlocks: 1024},
		Timing:    sim.Timing{PrefillPerToken: 20 * time.Microsecond, DecodeStep: 2 * time.Millisecond, MaxSeqs: 8},
		Publisher: events.NewPublisher(nc, e.Namespace(), e.Pool()),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range f.Servers {
			_ = s.SetFault(sim.FaultNone)
		}
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		nc.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("EPP: %v", err)
		}
	})
	r.servers = f.Servers
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

	// 16 clients, each sending 64-token prompts that share 48 tokens with
	// one of eight system prompts, until the test ends.
	send := r.sendExtProc(t, tr)
	if viaProxy {
		send = r.sendProxy(e.ProxyAddr(), tr)
	}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				prompt := make([]uint32, 64)
				sys := rng.IntN(8)
				for i := range prompt {
					prompt[i] = uint32(sys*100 + i)
					if i >= 48 {
						prompt[i] = rng.Uint32N(50000)
					}
				}
				body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 4})
				send(ctx, body)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// atLeast is a wait for n requests counted in all.
func (r *outlierRig) atLeast(n int) func() error {
	return func() error {
		if got := r.tally.snapshot().total; got < n {
			return fmt.Errorf("%d requests, want %d", got, n)
		}
		return nil
	}
}

func (r *outlierRig) sendProxy(addr string, tr *http.Transport) func(context.Context, []byte) {
	client := &http.Client{Transport: tr}
	return func(ctx context.Context, body []byte) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func (r *outlierRig) sendExtProc(t *testing.T, tr *http.Transport) func(context.Context, []byte) {
	t.Helper()
	client, err := envoy.Dial(r.e.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	up := envoy.HTTPUpstream(&http.Client{Transport: tr})
	return func(ctx context.Context, body []byte) {
		t0 := time.Now()
		res, err := client.Do(ctx, envoy.Request{Path: "/v1/completions", Body: body, Chunks: 2}, up)
		if err != nil || res.Destination == "" {
			return
		}
		r.tally.add(res.Destination, res.Status == http.StatusOK, time.Since(t0))
	}
}

// consecutiveFailures is outlier detection's default Consecutive5xx, which
// the rig keeps.
const consecutiveFailures = 5

func TestAFailingPodLosesItsTrafficAndGetsItBackWhenItRecovers(t *testing.T) {
	for _, path := range []string{"ext_proc", "proxy"} {
		for _, tc := range []struct {
			name   string
			fault  sim.Fault
			reason string
		}{
			{"fails every request at once with a 500", sim.FaultError, "5xx"},
			{"refuses connections", sim.FaultRefuse, "connect"},
			{"answers at once with a made-up 200", sim.FaultFabricate, "liar"},
		} {
			t.Run(path+": a pod that "+tc.name, func(t *testing.T) {
				r := startOutlierRig(t, path == "proxy")
				bad := r.servers[0]
				testkit.WaitFor(t, "traffic on every pod", func() error {
					c := r.tally.snapshot()
					for _, s := range r.servers {
						if c.good[s.Addr()] == 0 {
							return fmt.Errorf("%s has served nothing yet (%v)", s.Addr(), c.good)
						}
					}
					return nil
				})
				before := r.tally.snapshot()
				testkit.WaitFor(t, "400 requests before the fault", r.atLeast(before.total+400))
				healthy := r.tally.snapshot()
				if err := bad.SetFault(tc.fault); err != nil {
					t.Fatal(err)
				}
				// The first 100 requests after the fault are the
				// detection's; the next 400 are measured.
				atFault := r.tally.snapshot()
				start := atFault.total
				testkit.WaitFor(t, "100 requests after the fault", r.atLeast(start+100))
				from := r.tally.snapshot()
				testkit.WaitFor(t, "400 more requests", r.atLeast(from.total+400))
				to := r.tally.snapshot()
				n := to.total - from.total
				share := float64(to.sent[bad.Addr()]-from.sent[bad.Addr()]) / float64(n)
				// Reported, not asserted: the healthy pods' latency with the
				// failing pod ejected, against all four healthy.
				t.Logf("the failing pod got %.1f%% of %d requests; the others' median latency %v, against %v before the fault",
					100*share, n, r.tally.median(from, to, bad.Addr()), r.tally.median(before, healthy, ""))
				if share >= 0.05 {
					t.Errorf("the failing pod got %.1f%% of the requests, want under 5%%", 100*share)
				}
				for _, s := range r.servers[1:] {
					sent, good := to.sent[s.Addr()]-from.sent[s.Addr()], to.good[s.Addr()]-from.good[s.Addr()]
					if good == 0 || good != sent {
						t.Errorf("healthy pod %s served %d of the %d requests it was sent", s.Addr(), good, sent)
					}
				}
				g := r.e.Registry()
				// Outlier detection must eject a pod that failed as often
				// in a row as it allows; one the picks shunned before that
				// gave it nothing to count.
				tried := to.sent[bad.Addr()] - atFault.sent[bad.Addr()]
				if tried < consecutiveFailures {
					t.Logf("the failing pod was tried only %d times after the fault before the picks shunned it", tried)
				} else {
					if v := testkit.Value(t, g, "kvroute_outlier_ejections_total", "reason", tc.reason); v < 1 {
						t.Errorf("no ejection for %s after %d tries: ejections_total{reason=%s} = %v", tc.name, tried, tc.reason, v)
					}
					if !bytes.Contains([]byte(r.logs.String()), []byte("endpoint ejected from picking")) {
						t.Error("no log line for the ejection")
					}
				}

				if err := bad.SetFault(sim.FaultNone); err != nil {
					t.Fatal(err)
				}
				back := r.tally.snapshot()
				testkit.WaitFor(t, "the recovered pod to serve again, out of probation", func() error {
					c := r.tally.snapshot()
					served := c.good[bad.Addr()] - back.good[bad.Addr()]
					ejected := r.e.Datastore().Ejected(bad.Addr())
					probation := testkit.Value(t, g, "kvroute_outlier_endpoints", "state", "probation")
					if served < 20 || ejected || probation != 0 {
						return fmt.Errorf("it served %d requests since it recovered, want 20; ejected %v, on probation %v", served, ejected, probation)
					}
					return nil
				})
				c := r.tally.snapshot()
				t.Logf("after recovery the pod served %d of %d requests", c.good[bad.Addr()]-back.good[bad.Addr()], c.total-back.total)
			})
		}
	}
}
