package upstreamepp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/discovery/k8s"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// require fails under make test (KVROUTE_NO_SKIPS) and in CI when err
// says something is not built, and skips elsewhere, saying how to build it.
func require(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("KVROUTE_NO_SKIPS") != "" || os.Getenv("CI") != "" {
		t.Fatal(err)
	}
	t.Skip(err)
}

// world is a tiny fleet on pod addresses and the cluster that lists it.
type world struct {
	pods    *upstreamepp.PodListeners
	fleet   *sim.Fleet
	cluster *upstreamepp.Cluster
	addrs   []string // engine i's address, as the EPP names it
	model   string
}

// startCluster makes the cluster of a pool of engines pods, each with its
// own loopback address and the pool's one port; startFleet then starts
// the engines on them.
func startCluster(t *testing.T, engines int) *world {
	t.Helper()
	assets, err := upstreamepp.Assets()
	require(t, err)
	pods, err := upstreamepp.ListenPods(engines)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pods.Close() })
	w := &world{pods: pods, model: "m"}
	var ps []upstreamepp.Pod
	for i := range engines {
		// The simulator names engine i's pod so.
		ps = append(ps, upstreamepp.Pod{Name: fmt.Sprintf("vllm-%d", i), IP: upstreamepp.PodIP(i)})
		w.addrs = append(w.addrs, pods.Addr(i))
	}
	w.cluster, err = upstreamepp.StartCluster(context.Background(), upstreamepp.ClusterOptions{
		Assets: assets, Port: pods.Port, Pods: ps, Dir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.cluster.Stop(); err != nil {
			t.Error(err)
		}
	})
	return w
}

// startFleet starts the engines on the pods' addresses; pub, when set,
// carries their KV events.
func (w *world) startFleet(t *testing.T, pub *events.Publisher) {
	t.Helper()
	fc := sim.FleetConfig{
		Engines: w.pods.Len(), Model: w.model,
		Pool:   blockpool.Config{BlockSize: 16, GPUBlocks: 2048},
		Timing: sim.Timing{PrefillPerToken: 5 * time.Microsecond, DecodeStep: 2 * time.Millisecond, MaxSeqs: 8},
		Listen: w.pods.Listen,
	}
	if pub != nil {
		fc.Publisher, fc.Sidecar = pub, simkit.Relays(pub, 0)
	}
	var err error
	if w.fleet, err = sim.StartFleet(context.Background(), fc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.fleet.Close(); err != nil {
			t.Error(err)
		}
	})
	for i, s := range w.fleet.Servers {
		if s.Addr() != w.addrs[i] || s.Core().Engine().Config().Pod != w.cluster.Pods()[i].Name {
			t.Fatalf("engine %d is pod %s at %s; the cluster lists %v at %s", i, s.Core().Engine().Config().Pod, s.Addr(), w.cluster.Pods()[i], w.addrs[i])
		}
	}
}

// served counts requests per engine, by the engines' own counters.
func (w *world) served() []int64 {
	out := make([]int64, len(w.fleet.Servers))
	for i, s := range w.fleet.Servers {
		out[i] = s.Core().Stats().Requests
	}
	return out
}

// gateway sends requests through an ext_proc server as Envoy does and
// forwards each to the endpoint it names.
type gateway struct {
	c  *envoy.Client
	up envoy.Upstream
}

func newGateway(t *testing.T, addr string) *gateway {
	t.Helper()
	c, err := envoy.Dial(addr, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &gateway{c: c, up: envoy.HTTPUpstream(&http.Client{Timeout: 30 * time.Second})}
}

// answer is what one request through the gateway came back with.
type answer struct {
	dest   string
	cached int
}

func (g *gateway) complete(t *testing.T, model, prompt string) answer {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := g.c.Do(ctx, envoy.Request{Path: "/v1/completions", Body: body, Chunks: 2}, g.up)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if res.Immediate != nil {
		t.Fatalf("the EPP refused: %d %s", res.Immediate.GetStatus().GetCode(), res.Immediate.GetBody())
	}
	if res.UpstreamErr != nil || res.Status != http.StatusOK {
		t.Fatalf("upstream %s answered %d (%v): %s", res.Destination, res.Status, res.UpstreamErr, res.ResponseBody)
	}
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(res.ResponseBody, &out); err != nil || out.Usage.PromptTokens == 0 {
		t.Fatalf("response body %q: %v", res.ResponseBody, err)
	}
	return answer{dest: res.Destination, cached: out.Usage.Details.Cached}
}

// checkRoutes sends distinct prompts, then one long prompt again and
// again, through the gateway and checks that every answer came from the
// engine the EPP named, that every engine was named, and that the long
// prompt stayed on one engine, which then served it from its cache.
func checkRoutes(t *testing.T, w *world, g *gateway, tag string) {
	t.Helper()
	before := w.served()
	named := make([]int64, len(w.addrs))
	for i := range 30 {
		// Distinct from the first word: no prefix to follow, so that only
		// the load scorers and the picker's tie-break spread them.
		a := g.complete(t, w.model, fmt.Sprintf("%d %s: how many words fit here", i, tag))
		k := slices.Index(w.addrs, a.dest)
		if k < 0 {
			t.Fatalf("the EPP named %q, not an engine of the pool %v", a.dest, w.addrs)
		}
		named[k]++
	}
	after := w.served()
	for i := range named {
		if got := after[i] - before[i]; got != named[i] {
			t.Errorf("engine %s served %d requests; the EPP named it for %d", w.addrs[i], got, named[i])
		}
		if named[i] == 0 {
			t.Errorf("engine %s got none of 30 distinct prompts (per engine: %v)", w.addrs[i], named)
		}
	}

	long := tag + " context:" + strings.Repeat(" the shared system prompt of a long conversation", 60)
	var first answer
	for i := range 6 {
		a := g.complete(t, w.model, long)
		if i == 0 {
			first = a
			continue
		}
		if a.dest != first.dest {
			t.Fatalf("repeat %d of the long prompt went to %s; the first went to %s", i, a.dest, first.dest)
		}
		if a.cached == 0 {
			t.Errorf("repeat %d of the long prompt on %s was not served from its cache", i, a.dest)
		}
	}
}

// TestUpstreamEPPRoutesASimulatedFleet runs upstream's own EPP binary on
// three engines with its built-in configuration and with its chart's, and
// checks through an Envoy-like gateway that it routes: to the pool's
// engines, all of them, a repeated prompt to the engine that holds it;
// and again after a restart.
func TestUpstreamEPPRoutesASimulatedFleet(t *testing.T) {
	_, err := upstreamepp.Binary()
	require(t, err)
	w := startCluster(t, 3)
	w.startFleet(t, nil)
	for _, tc := range []struct {
		name, config, configName string
	}{
		{"built-in default", upstreamepp.ConfigDefault, ""},
		{"chart configuration", upstreamepp.ConfigApprox, upstreamepp.ConfigApproxName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			out := t.TempDir()
			name := "upstream-epp-" + strings.ReplaceAll(tc.name, " ", "-")
			e, err := w.cluster.StartEPP(ctx, upstreamepp.EPPOptions{Config: tc.config, ConfigName: tc.configName, Name: name, OutDir: out})
			if err != nil {
				t.Fatal(err)
			}
			stopped := false
			defer func() {
				if !stopped {
					_ = e.Close()
				}
			}()
			report := e.Report()
			for _, want := range []string{upstreamepp.Version, "--pool-name=kvsim", "--secure-serving=false"} {
				if !strings.Contains(report, want) {
					t.Errorf("report lacks %q:\n%s", want, report)
				}
			}
			withFile := slices.ContainsFunc(e.Args(), func(a string) bool { return strings.HasPrefix(a, "--config-file=") })
			if withFile == (tc.config == upstreamepp.ConfigDefault) {
				t.Errorf("flags %v for configuration %q", e.Args(), tc.name)
			}
			scraped, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := e.WaitScraped(scraped); err != nil {
				t.Fatal(err)
			}
			g := newGateway(t, e.Addr())
			checkRoutes(t, w, g, tc.name)

			if err := e.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			checkRoutes(t, w, g, tc.name+" after restart")

			stopped = true
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			log, err := os.ReadFile(e.LogPath())
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(log), "=== start "); n != 2 {
				t.Errorf("log %s records %d starts, want 2", e.LogPath(), n)
			}
			metrics, err := os.ReadFile(e.MetricsPath())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(metrics), "inference_pool_per_pod_queue_size") {
				t.Errorf("metrics file %s lacks the pool's series", e.MetricsPath())
			}
		})
	}
	t.Run("a configuration it refuses", func(t *testing.T) {
		_, err := w.cluster.StartEPP(context.Background(), upstreamepp.EPPOptions{
			Config: "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: no-such-scorer\n",
			Name:   "refused", OutDir: t.TempDir(),
		})
		if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "no-such-scorer") {
			t.Errorf("start on a configuration the binary refuses: %v; want its exit, with its own words", err)
		}
	})
}

// TestKvrouteLoadsTheUpstreamConfiguration is the drop-in case: kvroute's
// EPP given the very configuration file the upstream EPP runs with,
// discovering the same pool from the same API server, with the engines'
// KV events on its NATS, routes the same tiny fleet through the gateway.
func TestKvrouteLoadsTheUpstreamConfiguration(t *testing.T) {
	w := startCluster(t, 3)
	e, err := epp.New(epp.Options{
		Namespace: w.cluster.Namespace(), Pool: w.cluster.Pool(),
		EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		// The file the upstream EPP is given (ConfigApprox embeds it).
		ConfigFile: upstreamepp.ConfigApproxName,
		Scrape:     true, ScrapeOptions: scrape.Options{Interval: 50 * time.Millisecond},
		Prefix: prefixmatch.Params{DefaultBlockSizeTokens: 16},
		RequestPath: epp.RequestPathOptions{
			ExtProcAddr: "127.0.0.1:0", Plaintext: true,
			Tokenize: true, TokenizeTimeout: 5 * time.Second, Tokenizer: simkit.Tokenizer{Model: w.model},
		},
		Discovery: epp.DiscoveryFrom(k8s.SourceOptions{
			Namespace: w.cluster.Namespace(), Pool: w.cluster.Pool(), Config: w.cluster.Config(), DefaultModel: w.model,
		}, k8s.NewSource),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the fleet's: the fleet stops publishing first.
	t.Cleanup(nc.Close)
	w.startFleet(t, events.NewPublisher(nc, e.Namespace(), e.Pool()))
	testkit.WaitFor(t, "kvroute to discover and scrape every pod", func() error {
		if !e.Ready() {
			return errors.New("not ready")
		}
		eps := e.Datastore().List()
		if len(eps) != len(w.addrs) {
			return fmt.Errorf("%d endpoints discovered, want %d", len(eps), len(w.addrs))
		}
		for _, ep := range eps {
			if !slices.Contains(w.addrs, ep.Address) {
				return fmt.Errorf("endpoint %s at %s is none of the pods' %v", ep.Name, ep.Address, w.addrs)
			}
			if _, ok := e.Datastore().Metrics(ep.Name); !ok {
				return fmt.Errorf("endpoint %s not scraped yet", ep.Name)
			}
		}
		return nil
	})
	checkRoutes(t, w, newGateway(t, e.ExtProcAddr()), "kvroute")
}
