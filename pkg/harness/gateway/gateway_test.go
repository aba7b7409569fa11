package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// extProcOn has a fleet's EPP serve ext_proc in plaintext on loopback, and
// cut its streams at once when it stops, as a replica that dies does.
func extProcOn(o *epp.Options) {
	o.RequestPath.ExtProcAddr = "127.0.0.1:0"
	o.RequestPath.Plaintext = true
	o.RequestPath.ExtProc.ShutdownGrace = time.Millisecond
}

// replica is a further EPP on a fleet's NATS server and endpoints, as a
// second replica of a deployment is.
type replica struct {
	e      *epp.EPP
	cancel context.CancelFunc
	done   chan error
}

func startReplica(t *testing.T, f *fleet.Fleet, adjust ...func(*epp.Options)) *replica {
	t.Helper()
	o := epp.Options{
		NATSURL: f.EPP.NATSURL(), Namespace: f.EPP.Namespace(), Pool: f.EPP.Pool(), HTTPAddr: "127.0.0.1:0",
		Scrape: true, ScrapeOptions: scrape.Options{Interval: 20 * time.Millisecond},
		Prefix:      prefixmatch.Params{DefaultBlockSizeTokens: 4},
		RequestPath: epp.RequestPathOptions{Tokenize: true, TokenizeTimeout: 2 * time.Second},
	}
	extProcOn(&o)
	for _, a := range adjust {
		a(&o)
	}
	e, err := epp.New(o)
	if err != nil {
		t.Fatal(err)
	}
	for i, ms := range f.Servers {
		name := fmt.Sprintf("pod-%d", i)
		e.Datastore().Upsert(&datalayer.Endpoint{Name: name, Address: ms.Addr, Pod: name, Model: "m"})
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{e: e, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- e.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *replica) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil {
		t.Errorf("replica: %v", err)
	}
}

func startGateway(t *testing.T, o gateway.Options) *gateway.Gateway {
	t.Helper()
	if o.Health.Interval == 0 {
		// Checked often, each check given long enough that a loaded
		// machine does not take a host out.
		o.Health.Interval, o.Health.Timeout = 20*time.Millisecond, 5*time.Second
	}
	g, err := gateway.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// waitHealthy waits until n hosts pass their health checks.
func waitHealthy(t *testing.T, g *gateway.Gateway, n int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%d healthy ext_proc hosts", n), func() error {
		healthy := 0
		for _, h := range g.Hosts() {
			if h.Healthy {
				healthy++
			}
		}
		if healthy != n {
			return fmt.Errorf("%d healthy: %+v", healthy, g.Hosts())
		}
		return nil
	})
}

func tokens(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func completion(toks []uint32, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": toks, "max_tokens": 3, "stream": stream})
	return b
}

// post sends a completion through the gateway and reads the whole answer.
func post(t *testing.T, g *gateway.Gateway, body []byte, header map[string]string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.URL()+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// served is which stand-in served each of the requests since before.
func served(f *fleet.Fleet, before []int64) (string, int) {
	addr, n := "", 0
	for i, ms := range f.Servers {
		if d := ms.Requests.Load() - before[i]; d > 0 {
			addr, n = ms.Addr, n+int(d)
		}
	}
	return addr, n
}

func counts(f *fleet.Fleet) []int64 {
	out := make([]int64, len(f.Servers))
	for i, ms := range f.Servers {
		out[i] = ms.Requests.Load()
	}
	return out
}

// Through the gateway, over ext_proc to kvroute's EPP, a prompt sent again
// goes back to the engine that computed it the first time, streamed back
// whole, and the answer names the replica that picked.
func TestARepeatedPromptReturnsToTheEngineThatHoldsIt(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{EPP: extProcOn})
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{{Name: "epp-0", ExtProcAddr: f.EPP.ExtProcAddr()}}})
	waitHealthy(t, g, 1)
	prompt := tokens(1000, 64)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			prompt := append(append([]uint32(nil), prompt...), map[bool]uint32{false: 1, true: 2}[stream])
			before := counts(f)
			resp, body, err := post(t, g, completion(prompt, stream), nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("first request: %v, %v: %s", resp, err, body)
			}
			if h := resp.Header.Get(gateway.HeaderExtProcHost); h != "epp-0" {
				t.Errorf("answer names ext_proc host %q, want epp-0", h)
			}
			first, n := served(f, before)
			if n != 1 {
				t.Fatalf("%d engines served the first request, want 1", n)
			}
			if stream && !bytes.Contains(body, []byte("data: [DONE]")) {
				t.Errorf("the streamed answer did not reach its end: %q", body)
			}
			f.WaitHeld(t, first, prompt)
			for range 3 {
				before = counts(f)
				resp, body, err = post(t, g, completion(prompt, stream), nil)
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("repeat: %v, %v: %s", resp, err, body)
				}
				if again, _ := served(f, before); again != first {
					t.Fatalf("the repeated prompt went to %s, not to %s which holds it", again, first)
				}
			}
		})
	}
}

// Two replicas behind the gateway share its streams round-robin: each
// gets its share of a sequence of requests (half, unless a slow health
// check took one out for a while), and the metrics say so per host.
func TestTwoReplicasBothReceiveStreams(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{EPP: extProcOn})
	r := startReplica(t, f)
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{
		{Name: "epp-0", ExtProcAddr: f.EPP.ExtProcAddr()}, {Name: "epp-1", ExtProcAddr: r.e.ExtProcAddr()},
	}})
	waitHealthy(t, g, 2)
	const n = 20
	by := map[string]int{}
	for i := range n {
		resp, body, err := post(t, g, completion(tokens(uint32(100*i), 16), false), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %v, %v: %s", i, resp, err, body)
		}
		by[resp.Header.Get(gateway.HeaderExtProcHost)]++
	}
	if by["epp-0"]+by["epp-1"] != n || by["epp-0"] < n/4 || by["epp-1"] < n/4 {
		t.Errorf("streams by replica %v, want %d in all, each a share", by, n)
	}
	for _, h := range []string{"epp-0", "epp-1"} {
		if v := testkit.Value(t, g.Registry(), "kvroute_gateway_extproc_streams_total", "host", h); v != float64(by[h]) {
			t.Errorf("kvroute_gateway_extproc_streams_total{host=%s} = %v, the answers named it %d times", h, v, by[h])
		}
	}
	if v := testkit.Value(t, g.Registry(), "kvroute_gateway_requests_total", "outcome", gateway.OutcomeServed); v != n {
		t.Errorf("served %v requests, want %d", v, n)
	}
}

// A replica that stops mid-load takes the streams open on it with it,
// and nothing else: its requests in flight fail (each counted as its
// stream's error), and every request after the stop is served by the
// other replica, the dead one's refused stream retried there.
func TestStoppingAReplicaLosesOnlyTheRequestsInFlightOnIt(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{EPP: extProcOn})
	r := startReplica(t, f)
	g := startGateway(t, gateway.Options{OpenRetries: 1, Hosts: []gateway.Host{
		{Name: "epp-0", ExtProcAddr: f.EPP.ExtProcAddr()}, {Name: "epp-1", ExtProcAddr: r.e.ExtProcAddr()},
	}})
	waitHealthy(t, g, 2)

	// Hold every answer after its first event, so that the requests are
	// in flight, on both replicas, when one stops.
	gate := make(chan struct{})
	for _, ms := range f.Servers {
		ms.SetGate(gate)
	}
	const held = 8
	before := counts(f)
	type outcome struct {
		host string
		err  error
	}
	outcomes := make(chan outcome, held)
	for i := range held {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, g.URL()+"/v1/completions", bytes.NewReader(completion(tokens(uint32(5000+100*i), 16), true)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				outcomes <- outcome{err: err}
				return
			}
			defer resp.Body.Close()
			host := resp.Header.Get(gateway.HeaderExtProcHost)
			b, err := io.ReadAll(resp.Body)
			if err == nil && (resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte("[DONE]"))) {
				err = fmt.Errorf("status %d: %q", resp.StatusCode, b)
			}
			outcomes <- outcome{host: host, err: err}
		}()
	}
	// In flight: picked, and at its engine (a stream the replica has not
	// answered yet could be retried elsewhere).
	var inFlight int64
	testkit.WaitFor(t, "every held request picked and at its engine", func() error {
		var active, atEngines int64
		for _, h := range g.Hosts() {
			active += h.Active
			if h.Name == "epp-1" {
				inFlight = h.Active
			}
		}
		for i, ms := range f.Servers {
			atEngines += ms.Requests.Load() - before[i]
		}
		if active != held || atEngines != held {
			return fmt.Errorf("%d streams open, %d requests at the engines", active, atEngines)
		}
		return nil
	})
	if inFlight == 0 {
		t.Fatal("no request in flight on the replica to stop")
	}
	r.stop(t)
	for _, ms := range f.Servers {
		ms.SetGate(nil)
	}
	close(gate)

	failed := 0
	for range held {
		o := <-outcomes
		if o.err != nil {
			failed++
			if o.host != "epp-1" {
				t.Errorf("a request on %q failed: %v", o.host, o.err)
			}
		}
	}
	if int64(failed) != inFlight {
		t.Errorf("%d requests failed, want the %d in flight on the stopped replica", failed, inFlight)
	}
	// After the stop: every request served, whichever host its turn fell on.
	for i := range 10 {
		resp, body, err := post(t, g, completion(tokens(uint32(9000+100*i), 16), false), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d after the stop: %v, %v: %s", i, resp, err, body)
		}
		if h := resp.Header.Get(gateway.HeaderExtProcHost); h != "epp-0" {
			t.Errorf("request %d after the stop passed %q", i, h)
		}
	}
	lost := testkit.Value(t, g.Registry(), "kvroute_gateway_extproc_stream_errors_total", "host", "epp-1", "kind", gateway.StreamErrBroken)
	if lost != float64(inFlight) {
		t.Errorf("the gateway counted %v broken streams on the stopped replica, want %d", lost, inFlight)
	}
	// Cut once the answer had begun, or failed with Envoy's 500 before.
	cut := testkit.Value(t, g.Registry(), "kvroute_gateway_requests_total", "outcome", gateway.OutcomeCut)
	failed500 := testkit.Value(t, g.Registry(), "kvroute_gateway_requests_total", "outcome", gateway.OutcomeExtProcError)
	if cut+failed500 != float64(inFlight) {
		t.Errorf("the gateway counted %v cut responses and %v ext_proc errors, want %d in all", cut, failed500, inFlight)
	}
	// Each says why, on the stopped replica.
	fs := g.RecentFailures()
	cuts := 0
	for _, f := range fs {
		if f.Host != "epp-1" || f.Err == "" {
			t.Errorf("a failure recorded as %+v", f)
		}
		if f.Cut {
			cuts++
		}
	}
	if len(fs) != int(inFlight) || cuts != int(cut) {
		t.Errorf("%d failures recorded (%d cut), want %d (%v cut): %+v", len(fs), cuts, inFlight, cut, fs)
	}
}

// A gateway without ext_proc spreads requests round-robin over its
// endpoints: each engine gets its share, and no EPP sees them.
func TestAGatewayWithoutExtProcSpreadsOverItsEndpoints(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{})
	var addrs []string
	for _, ms := range f.Servers {
		addrs = append(addrs, ms.Addr)
	}
	g := startGateway(t, gateway.Options{Endpoints: addrs})
	before := counts(f)
	for i := range 9 {
		resp, body, err := post(t, g, completion(tokens(uint32(100*i), 16), i%2 == 0), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %v, %v: %s", i, resp, err, body)
		}
	}
	for i, ms := range f.Servers {
		if d := ms.Requests.Load() - before[i]; d != 3 {
			t.Errorf("engine %s served %d requests, want 3", ms.Addr, d)
		}
	}
	if v := testkit.Value(t, f.Metrics, "kvroute_picks_total"); v != 0 {
		t.Errorf("the EPP picked %v times for requests that bypass it", v)
	}
}

// The EPP's refusals reach the client as it made them: the status, its
// headers and its body.
func TestAnImmediateResponseReachesTheClientWithItsBody(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{EPP: extProcOn})
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{{ExtProcAddr: f.EPP.ExtProcAddr()}}})
	waitHealthy(t, g, 1)
	tests := []struct {
		name   string
		body   []byte
		header map[string]string
		status int
		want   string
	}{
		{"a body that is not JSON", []byte("model=m"), nil, http.StatusBadRequest, "error"},
		{"a subset hint naming no endpoint of the pool", completion(tokens(1, 16), false),
			map[string]string{director.HeaderSubsetHint: "10.255.0.1:8000"}, http.StatusServiceUnavailable, "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body, err := post(t, g, tt.body, tt.header)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.status || !strings.Contains(string(body), tt.want) {
				t.Fatalf("got %d %q, want %d with %q", resp.StatusCode, body, tt.status, tt.want)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content-type %q, want the EPP's application/json", ct)
			}
			if tt.status == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
				t.Error("the EPP's retry-after did not reach the client")
			}
		})
	}
	if v := testkit.Value(t, g.Registry(), "kvroute_gateway_requests_total", "outcome", gateway.OutcomeRefused); v != float64(len(tests)) {
		t.Errorf("counted %v refusals, want %d", v, len(tests))
	}
}

// An endpoint that refuses connections gets Envoy's own 503, and the EPP
// hears of it through the response phase as Envoy tells it (a 503 with
// Envoy's local reply body), which its outlier detection counts as the
// endpoint's connection failure.
func TestAnUnreachableUpstreamIsEnvoys503AndTheEPPHearsIt(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{EPP: func(o *epp.Options) {
		extProcOn(o)
		o.OutlierDetection = datalayer.DefaultOutlierDetection
	}})
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{{ExtProcAddr: f.EPP.ExtProcAddr()}}})
	waitHealthy(t, g, 1)
	gone := f.Servers[1]
	gone.Close()
	resp, body, err := post(t, g, completion(tokens(1, 16), false), map[string]string{director.HeaderSubsetHint: gone.Addr})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || string(body) != gateway.UpstreamFailureBody {
		t.Fatalf("got %d %q, want Envoy's 503 %q", resp.StatusCode, body, gateway.UpstreamFailureBody)
	}
	if v := testkit.Value(t, g.Registry(), "kvroute_gateway_upstream_failures_total", "kind", gateway.FailureRefused); v != 1 {
		t.Errorf("counted %v refused upstreams, want 1", v)
	}
	testkit.WaitFor(t, "the EPP to count the connection failure against the endpoint", func() error {
		if v := testkit.Value(t, f.Metrics, "kvroute_outlier_failures_total", "endpoint", gone.Addr, "reason", "connect"); v != 1 {
			return fmt.Errorf("kvroute_outlier_failures_total{endpoint=%s,reason=connect} = %v", gone.Addr, v)
		}
		return nil
	})
}

// A destination naming fallbacks is tried in order: an endpoint that
// cannot be reached gives way to the next.
func TestADestinationListFallsBackInOrder(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{})
	dead := testkit.FreeAddr(t)
	fl := envoy.StartFloor(t, dead+","+f.Servers[2].Addr)
	// The floor serves no health checks: its host is never healthy, and
	// with none healthy, Envoy's panic threshold routes to it all the same.
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{{ExtProcAddr: fl.Addr()}}})
	before := counts(f)
	resp, body, err := post(t, g, completion(tokens(1, 16), false), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%v, %v: %s", resp, err, body)
	}
	if d := f.Servers[2].Requests.Load() - before[2]; d != 1 {
		t.Errorf("the fallback served %d requests, want 1", d)
	}
}

// With failure_mode_allow false, a request whose ext_proc stream cannot
// be had fails with Envoy's 500, counted; so does one whose stream the
// server breaks.
func TestAnExtProcFailureFailsTheRequestWith500(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{{Name: "nobody", ExtProcAddr: testkit.FreeAddr(t)}}})
	resp, body, err := post(t, g, completion(tokens(1, 16), false), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("got %d %q, want 500", resp.StatusCode, body)
	}
	if v := testkit.Value(t, g.Registry(), "kvroute_gateway_extproc_stream_errors_total", "host", "nobody", "kind", gateway.StreamErrOpen); v != 1 {
		t.Errorf("counted %v streams not opened, want 1", v)
	}
	if v := testkit.Value(t, g.Registry(), "kvroute_gateway_requests_total", "outcome", gateway.OutcomeExtProcError); v != 1 {
		t.Errorf("counted %v ext_proc errors, want 1", v)
	}
	// Its health endpoint says it cannot route; its liveness that it runs.
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503} {
		resp, err := http.Get("http://" + g.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}

// A request body over the limit is refused by the gateway itself, before
// any EPP sees it.
func TestABodyOverTheLimitIs413(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gateway.Options{MaxBodyBytes: 1024, Hosts: []gateway.Host{{ExtProcAddr: testkit.FreeAddr(t)}}})
	resp, _, err := post(t, g, bytes.Repeat([]byte("x"), 2048), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("got %d, want 413", resp.StatusCode)
	}
}

// The metrics page serves the gateway's series.
func TestTheMetricsPageServesTheGatewaysSeries(t *testing.T) {
	t.Parallel()
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{{Name: "h", ExtProcAddr: testkit.FreeAddr(t)}}})
	_, _, _ = post(t, g, completion(tokens(1, 4), false), nil)
	resp, err := http.Get("http://" + g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if name, _, ok := strings.Cut(sc.Text(), "{"); ok && !strings.HasPrefix(name, "#") {
			seen[name] = true
		}
	}
	for _, name := range []string{"kvroute_gateway_requests_total", "kvroute_gateway_extproc_stream_errors_total",
		"kvroute_gateway_extproc_streams_total", "kvroute_gateway_extproc_host_healthy"} {
		if !seen[name] {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// The exchange runs on its own against a server, as tests of the EPP
// drive it: the floor answers, and the exchange hands back its pick.
func TestExchangeAloneHandsBackThePick(t *testing.T) {
	t.Parallel()
	fl := envoy.StartFloor(t, "10.0.0.9:8000")
	c, err := envoy.Dial(fl.Addr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var got []string
	up := func(_ context.Context, target, _ string, _ map[string]string, _ []byte) (*gateway.Response, error) {
		got = append(got, target)
		return nil, errors.New("refused")
	}
	res, err := gateway.Exchange(context.Background(), extprocv3.NewExternalProcessorClient(c.Conn()), gateway.Request{Path: "/v1/completions", Body: completion(tokens(1, 4), false), Mode: extproc.FullDuplexStreamed}, up, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "10.0.0.9:8000" || res.Status != http.StatusServiceUnavailable || string(res.ResponseBody) != gateway.UpstreamFailureBody {
		t.Errorf("tried %v, got %d %q; want 10.0.0.9:8000 tried and Envoy's 503", got, res.Status, res.ResponseBody)
	}
}
