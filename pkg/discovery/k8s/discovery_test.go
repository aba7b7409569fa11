package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// epp is the part of an EPP that discovery feeds: a datastore whose
// changes add and remove endpoints in an exact prefix index, wired as
// pkg/epp wires them.
type epp struct {
	t     *testing.T
	reg   *prometheus.Registry
	ds    *datalayer.Datastore
	index *index.Index
	disc  *Discovery
	stop  func()
}

// startEPP runs discovery with opts against the test's API server until
// the test ends (or stop is called), and checks that it shuts down cleanly.
func startEPP(t *testing.T, cl *cluster, opts Options) *epp {
	t.Helper()
	e := &epp{t: t, reg: prometheus.NewRegistry()}
	e.ds = datalayer.NewDatastore(e.reg)
	e.index = index.New(index.Options{}, e.reg)
	e.ds.OnChange(func(added, removed []*datalayer.Endpoint) {
		for _, ep := range removed {
			e.index.RemoveEndpoint(ep.Address)
		}
		for _, ep := range added {
			e.index.AddEndpoint(ep.Address)
		}
	})
	opts.Namespace = cl.ns
	opts.Registerer = e.reg
	opts.Logger = slog.New(slog.DiscardHandler)
	d, err := New(apiServer.Config, e.ds, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.disc = d
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run after cancel: %v", err)
				}
			case <-time.After(waitLimit):
				t.Errorf("Run did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(e.stop)
	return e
}

// endpoints returns name → address of what the datastore holds.
func (e *epp) endpoints() map[string]string {
	out := map[string]string{}
	for _, ep := range e.ds.List() {
		out[ep.Name] = ep.Address
	}
	return out
}

func (e *epp) waitEndpoints(want map[string]string) {
	e.t.Helper()
	var got map[string]string
	testkit.WaitFor(e.t, fmt.Sprintf("endpoints %v", want), func() error {
		got = e.endpoints()
		if !(maps.Equal(got, want)) {
			return errors.New("maps.Equal(got, want) is false")
		}
		return nil
	})
}

// store applies one batch storing blocks of 4 tokens at addr, as its
// events would, and returns the tokens so a lookup can find them.
func (e *epp) store(addr string, seq uint64, blocks int) []uint32 {
	e.t.Helper()
	tokens := make([]uint32, 4*blocks)
	hashes := make([]uint64, blocks)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	for i := range hashes {
		hashes[i] = uint64(1000 + i)
	}
	e.index.Apply(events.Origin{
		Stream: events.Stream{Endpoint: addr}, Pod: addr, Model: "org/model-a", BlockSize: 4, Seq: seq,
	}, &events.Batch{Events: []events.Event{{
		Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 4, Medium: events.TierGPU,
	}}})
	return tokens
}

// held returns how many leading blocks of tokens the index says addr holds.
func (e *epp) held(addr string, tokens []uint32) int {
	keys := index.AppendBlockKeys(nil, index.RootKey("org/model-a", "", ""), tokens, 4)
	out := make([]index.Match, 1)
	e.index.Lookup(keys, []string{addr}, out)
	return out[0].Blocks
}

// holdings is the index's total (block, endpoint) holdings, from its metrics.
func (e *epp) holdings() float64 {
	return testkit.Value(e.t, e.reg, "kvroute_index_holdings")
}

var vllm = map[string]string{"app": "vllm"}

func TestPoolCreatedMakesOneEndpointPerReadyPodAndPort(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.pod("ready-a", "10.0.0.1", true, vllm)
	cl.pod("ready-b", "10.0.0.2", true, vllm)
	cl.pod("starting", "10.0.0.3", false, vllm)
	cl.pod("other-app", "10.0.0.4", true, map[string]string{"app": "other"})
	e := startEPP(t, cl, Options{PoolName: "pool", Model: "fallback"})

	// No pool yet: once discovery has seen every pod, there is still
	// nothing to route to, and it is not ready.
	testkit.WaitFor(t, "every pod reconciled", func() error {
		if seen := testkit.Value(t, e.reg, "kvroute_k8s_reconciles_total", "kind", "pod", "result", "ok"); seen < 4 {
			return fmt.Errorf("testkit.Value(t, e.reg, \"kvroute_k8s_reconciles_total\", \"kind\", \"pod\", \"result\", \"ok\") is %v, want >= %v", seen, 4)
		}
		return nil
	})
	if e.disc.Synced() || e.ds.Len() != 0 {
		t.Fatalf("before the pool exists: synced=%t endpoints=%v", e.disc.Synced(), e.endpoints())
	}
	cl.pool("pool", vllm, 8000, 8001)
	e.waitEndpoints(map[string]string{
		"ready-a-rank-0": "10.0.0.1:8000", "ready-a-rank-1": "10.0.0.1:8001",
		"ready-b-rank-0": "10.0.0.2:8000", "ready-b-rank-1": "10.0.0.2:8001",
	})
	testkit.WaitFor(t, "synced", func() error {
		if !e.disc.Synced() {
			return errors.New("e.disc.Synced() is false")
		}
		return nil
	})
	ep, _ := e.ds.Get("ready-a-rank-1")
	if ep.Pod != "ready-a" || ep.Namespace != cl.ns || ep.Model != "org/model-a" || ep.Labels["app"] != "vllm" {
		t.Errorf("endpoint = %+v, want pod ready-a in %s serving org/model-a with its labels", ep, cl.ns)
	}
	info, ok := e.disc.Pool()
	if !ok || info.AppProtocol != "http" || info.EndpointPicker != "epp:9002" || info.FailureMode != "FailClose" ||
		!slices.Equal(info.TargetPorts, []int32{8000, 8001}) {
		t.Errorf("Pool() = %+v, %t; want http, epp:9002, FailClose, ports 8000 and 8001", info, ok)
	}
	if got := testkit.Value(t, e.reg, "kvroute_k8s_synced"); got != 1 {
		t.Errorf("kvroute_k8s_synced = %v, want 1", got)
	}
	// The pool's ready pods (inference_pool_ready_pods): two, though
	// their ports and ranks make more endpoints.
	if got := e.ds.ReadyPods(); got != 2 {
		t.Errorf("ready pods = %d, want 2", got)
	}

	// The pod that was starting becomes ready and joins.
	var starting = cl.getPod("starting")
	cl.setReady(starting, true)
	e.waitEndpoints(map[string]string{
		"ready-a-rank-0": "10.0.0.1:8000", "ready-a-rank-1": "10.0.0.1:8001",
		"ready-b-rank-0": "10.0.0.2:8000", "ready-b-rank-1": "10.0.0.2:8001",
		"starting-rank-0": "10.0.0.3:8000", "starting-rank-1": "10.0.0.3:8001",
	})
}

func TestUnreadyPodLosesItsEndpointAndHoldings(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	a := cl.pod("a", "10.0.1.1", true, vllm)
	cl.pod("b", "10.0.1.2", true, vllm)
	cl.pool("pool", vllm, 8000)
	e := startEPP(t, cl, Options{PoolName: "pool"})
	e.waitEndpoints(map[string]string{"a": "10.0.1.1:8000", "b": "10.0.1.2:8000"})

	tokens := e.store("10.0.1.1:8000", 1, 3)
	e.store("10.0.1.2:8000", 1, 2)
	if got := e.held("10.0.1.1:8000", tokens); got != 3 {
		t.Fatalf("before: a holds %d blocks, want 3", got)
	}
	if got := e.holdings(); got != 5 {
		t.Fatalf("before: %v holdings, want 5", got)
	}

	cl.setReady(a, false)
	e.waitEndpoints(map[string]string{"b": "10.0.1.2:8000"})
	// The datastore publishes a removal before it tells its subscribers,
	// the index among them: the holdings go just after the endpoint.
	testkit.WaitFor(t, "a's holdings forgotten", func() error {
		if got := e.held("10.0.1.1:8000", tokens); got != 0 {
			return fmt.Errorf("after a went unready: it still holds %d blocks", got)
		}
		if got := e.holdings(); got != 2 {
			return fmt.Errorf("after a went unready: %v holdings, want b's 2", got)
		}
		return nil
	})

	// Ready again, it comes back clean: its old holdings are not revived.
	cl.setReady(a, true)
	e.waitEndpoints(map[string]string{"a": "10.0.1.1:8000", "b": "10.0.1.2:8000"})
	if got := e.held("10.0.1.1:8000", tokens); got != 0 {
		t.Errorf("after a came back: it holds %d blocks from before", got)
	}
}

// The pod's relay keeps publishing while the pod is deleted: its late
// events arrive through NATS after the endpoint is gone and must neither
// bring the endpoint back nor leave holdings behind.
func TestDeletedPodWithEventsInFlightIsNotReAdded(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	doomed := cl.pod("doomed", "10.0.2.1", true, vllm)
	cl.pod("stays", "10.0.2.2", true, vllm)
	cl.pool("pool", vllm, 8000)
	e := startEPP(t, cl, Options{PoolName: "pool"})
	e.waitEndpoints(map[string]string{"doomed": "10.0.2.1:8000", "stays": "10.0.2.2:8000"})

	bus := startBus(t, cl.ns, "pool", e)
	var published int
	publish := func(pod, addr string) {
		published++
		bus.publish(pod, addr, uint64(published))
	}
	for range 20 {
		publish("doomed", "10.0.2.1:8000")
	}
	testkit.WaitFor(t, "the doomed pod's first batches applied", func() error {
		if seen := e.holdings(); seen <= 0 {
			return fmt.Errorf("e.holdings() is %v, want > %v", seen, 0)
		}
		return nil
	})

	// Delete while a publisher keeps the pod's batches flowing.
	stop := make(chan struct{})
	flowing := make(chan int)
	var sent atomic.Int64
	go func() {
		defer func() { flowing <- int(sent.Load()) }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := sent.Add(1)
			bus.publish("doomed", "10.0.2.1:8000", uint64(1000+n))
			time.Sleep(time.Millisecond)
		}
	}()
	cl.delete(doomed)
	e.waitEndpoints(map[string]string{"stays": "10.0.2.2:8000"})
	// Twenty more batches after the endpoint left, all of them late.
	after := sent.Load()
	testkit.WaitFor(t, "late batches to be published", func() error {
		if seen := sent.Load(); seen < after+20 {
			return fmt.Errorf("sent.Load() is %v, want >= %v", seen, after+20)
		}
		return nil
	})
	close(stop)
	late := <-flowing
	bus.drain(published + late)

	if got := e.endpoints(); !maps.Equal(got, map[string]string{"stays": "10.0.2.2:8000"}) {
		t.Errorf("after late events: endpoints %v, want only stays", got)
	}
	if st, _ := e.index.State("10.0.2.1:8000"); st != datalayer.StreamNone {
		t.Errorf("deleted pod's stream state = %v, want none (not a member)", st)
	}
	if got := e.holdings(); got != 0 {
		t.Errorf("after late events: %v holdings remain, want 0", got)
	}
	if got := testkit.Value(t, e.reg, "kvroute_index_endpoints"); got != 1 {
		t.Errorf("index endpoints = %v, want 1", got)
	}
}

func TestSelectorAndPortChangesMoveEndpoints(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.pod("blue-0", "10.0.3.1", true, map[string]string{"app": "vllm", "track": "blue"})
	cl.pod("green-0", "10.0.3.2", true, map[string]string{"app": "vllm", "track": "green"})
	pool := cl.pool("pool", map[string]string{"track": "blue"}, 8000)
	e := startEPP(t, cl, Options{PoolName: "pool"})
	e.waitEndpoints(map[string]string{"blue-0": "10.0.3.1:8000"})

	tokens := e.store("10.0.3.1:8000", 1, 2)
	setPoolSpec(pool, map[string]string{"track": "green"}, 8000)
	cl.update(pool)
	e.waitEndpoints(map[string]string{"green-0": "10.0.3.2:8000"})
	if got := e.held("10.0.3.1:8000", tokens); got != 0 {
		t.Errorf("blue-0 left the pool but holds %d blocks", got)
	}

	setPoolSpec(pool, map[string]string{"app": "vllm"}, 9000, 9001)
	cl.update(pool)
	e.waitEndpoints(map[string]string{
		"blue-0-rank-0": "10.0.3.1:9000", "blue-0-rank-1": "10.0.3.1:9001",
		"green-0-rank-0": "10.0.3.2:9000", "green-0-rank-1": "10.0.3.2:9001",
	})

	// A pod relabelled out of the selector leaves.
	green := cl.getPod("green-0")
	green.Labels = map[string]string{"app": "moved"}
	cl.update(green)
	e.waitEndpoints(map[string]string{"blue-0-rank-0": "10.0.3.1:9000", "blue-0-rank-1": "10.0.3.1:9001"})
}

func TestDeletedPoolRemovesEveryEndpoint(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.pod("a", "10.0.4.1", true, vllm)
	pool := cl.pool("pool", vllm, 8000)
	cl.pool("another-pool", vllm, 8001)
	e := startEPP(t, cl, Options{PoolName: "pool"})
	e.waitEndpoints(map[string]string{"a": "10.0.4.1:8000"})
	cl.delete(pool)
	e.waitEndpoints(map[string]string{})
	if _, ok := e.disc.Pool(); ok {
		t.Error("Pool() still reports the deleted pool")
	}
}

func TestRestartRebuildsStateFromTheAPIServer(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.pod("a", "10.0.5.1", true, vllm)
	b := cl.pod("b", "10.0.5.2", true, vllm)
	cl.pool("pool", vllm, 8000)
	first := startEPP(t, cl, Options{PoolName: "pool"})
	first.waitEndpoints(map[string]string{"a": "10.0.5.1:8000", "b": "10.0.5.2:8000"})
	first.stop()

	// Changes while no EPP runs are seen by the next one.
	cl.delete(b)
	cl.pod("c", "10.0.5.3", true, vllm)
	second := startEPP(t, cl, Options{PoolName: "pool"})
	second.waitEndpoints(map[string]string{"a": "10.0.5.1:8000", "c": "10.0.5.3:8000"})
	testkit.WaitFor(t, "the restarted EPP synced", func() error {
		if !second.disc.Synced() {
			return errors.New("second.disc.Synced() is false")
		}
		return nil
	})
}

func TestStandaloneModeSelectsPodsWithoutTheCRD(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.pod("a", "10.0.6.1", true, vllm)
	cl.pod("b", "fd00::6:2", true, vllm)
	cl.pod("c", "10.0.6.3", true, map[string]string{"app": "other"})
	sel, err := ParseSelector("app=vllm")
	if err != nil {
		t.Fatal(err)
	}
	e := startEPP(t, cl, Options{Selector: sel, TargetPorts: []int32{8000}})
	e.waitEndpoints(map[string]string{"a": "10.0.6.1:8000", "b": "[fd00::6:2]:8000"})
	testkit.WaitFor(t, "synced", func() error {
		if !e.disc.Synced() {
			return errors.New("e.disc.Synced() is false")
		}
		return nil
	})
	cl.pod("d", "10.0.6.4", true, vllm)
	e.waitEndpoints(map[string]string{"a": "10.0.6.1:8000", "b": "[fd00::6:2]:8000", "d": "10.0.6.4:8000"})
}

func TestLeaderElectionElectsOneReplicaAndAllServe(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	cl.pod("a", "10.0.7.1", true, vllm)
	cl.pool("pool", vllm, 8000)
	var leaders sync.Map
	replica := func(name string) *epp {
		return startEPP(t, cl, Options{
			PoolName: "pool", LeaderElection: true,
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 200 * time.Millisecond,
			OnLeader: func(ctx context.Context) error {
				leaders.Store(name, true)
				<-ctx.Done()
				leaders.Delete(name)
				return nil
			},
		})
	}
	r1, r2 := replica("r1"), replica("r2")
	want := map[string]string{"a": "10.0.7.1:8000"}
	r1.waitEndpoints(want)
	r2.waitEndpoints(want)
	testkit.WaitFor(t, "a leader", func() error {
		if !(r1.disc.Leader() || r2.disc.Leader()) {
			return errors.New("r1.disc.Leader() || r2.disc.Leader() is false")
		}
		return nil
	})
	if r1.disc.Leader() && r2.disc.Leader() {
		t.Fatal("both replicas lead")
	}
	leader, follower := r1, r2
	if r2.disc.Leader() {
		leader, follower = r2, r1
	}
	n := 0
	leaders.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Errorf("%d replicas run the leader work, want 1", n)
	}
	// The leader steps down on shutdown; the other takes over and keeps
	// serving throughout.
	leader.stop()
	testkit.WaitFor(t, "the follower to take over", func() error {
		if !follower.disc.Leader() {
			return errors.New("follower.disc.Leader() is false")
		}
		return nil
	})
	if got := follower.endpoints(); !maps.Equal(got, want) {
		t.Errorf("follower endpoints %v, want %v", got, want)
	}
}

func TestNewRejectsOptionsThatCannotWork(t *testing.T) {
	t.Parallel()
	sel, err := ParseSelector("app=vllm")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		opts Options
	}{
		{"no namespace", Options{PoolName: "p"}},
		{"neither pool nor selector", Options{Namespace: "ns"}},
		{"both pool and selector", Options{Namespace: "ns", PoolName: "p", Selector: sel, TargetPorts: []int32{8000}}},
		{"selector without ports", Options{Namespace: "ns", Selector: sel}},
		{"ports with a pool", Options{Namespace: "ns", PoolName: "p", TargetPorts: []int32{8000}}},
		{"port out of range", Options{Namespace: "ns", Selector: sel, TargetPorts: []int32{70000}}},
		{"another pool group", Options{Namespace: "ns", PoolName: "p", PoolGroup: "inference.networking.x-k8s.io"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := apiServer.Config
			if cfg == nil {
				cfg = &restConfigForValidation
			}
			_, err := New(cfg, datalayer.NewDatastore(nil), tc.opts)
			if !errors.Is(err, ErrOptions) {
				t.Errorf("New(%+v) = %v, want ErrOptions", tc.opts, err)
			}
		})
	}
}
