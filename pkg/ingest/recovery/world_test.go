package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/chaos"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// waitLimit bounds every wait in these tests. It guards against deadlock;
// it is not a timing assertion.
const waitLimit = 30 * time.Second

const (
	testNS    = "ns"
	testPool  = "pool"
	testModel = "llama"
	blockSize = 4
)

var quietLog = slog.New(slog.DiscardHandler)

// quietNATS keeps the client's prints about connections the tests break on
// purpose out of the test output.
var quietNATS = nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startNATS(t testing.TB, o natsembed.Options) *natsembed.Server {
	t.Helper()
	s, err := natsembed.Start(o)
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	return s
}

// slot is one simulated pod: an engine publishing over ZeroMQ as vLLM does
// and the relay carrying its events to NATS, each restartable on fixed ports.
type slot struct {
	pod, addr           string
	zmqPort, replayPort int
	servingPort, gpu    int
	seed                uint64
	eng                 *sim.Engine
	relayCancel         context.CancelFunc
	relayDone           chan error
	relayNC             *nats.Conn
	relayReg            *prometheus.Registry
	relayURL            string
	relayNATS           relay.NATSOptions
	restarts            int
	// stateDir is the relay's state directory, kept across its restarts
	// as a pod keeps an emptyDir across container restarts.
	stateDir string
	// noReplay starts the relay without the engine's replay socket.
	noReplay bool
}

// world is a pool of simulated pods on one NATS server.
type world struct {
	t      testing.TB
	ns     *natsembed.Server
	port   int
	js     bool
	store  string
	server func(t testing.TB, port int) *natsembed.Server
	slots  []*slot
	prompt []blockpool.Request
	rng    *rand.Rand
	// proxy is between the relays and NATS when worldOptions.proxied.
	proxy *chaos.Proxy
}

type worldOptions struct {
	pods      int
	jetStream bool
	// relayURL, when set, is where relays connect instead of the server
	// (a dropping proxy).
	relayURL string
	// relayAuth gives each pod's relay its credentials.
	relayAuth func(pod string) relay.NATSOptions
	// server, when set, starts the NATS server (with an authorization
	// configuration of the test's own) on the given port.
	server func(t testing.TB, port int) *natsembed.Server
	// noReplay starts every relay without its engine's replay socket.
	noReplay bool
	// proxied puts a dropProxy (w.proxy) between every relay and NATS.
	proxied bool
}

func newWorld(t testing.TB, o worldOptions) *world {
	t.Helper()
	w := &world{t: t, port: freePort(t), js: o.jetStream, rng: rand.New(rand.NewPCG(7, 11)), server: o.server}
	if w.js {
		w.store = t.TempDir()
	}
	w.startNATS()
	t.Cleanup(func() { w.ns.Shutdown() })
	if o.proxied {
		w.proxy = newDropProxy(t, w.ns.Addr().String())
		o.relayURL = w.proxy.URL()
	}
	w.prompt = sim.SharedPrefix{Groups: 6, PromptsPerGroup: 5, SystemTokens: 6 * blockSize, QuestionTokens: 3 * blockSize, Seed: 3}.Prompts()
	for i := range o.pods {
		s := &slot{
			pod:         fmt.Sprintf("vllm-%d", i),
			servingPort: 8000 + i,
			addr:        fmt.Sprintf("127.0.0.1:%d", 8000+i),
			zmqPort:     freePort(t),
			replayPort:  freePort(t),
			gpu:         48,
			seed:        uint64(100 + i),
			relayURL:    o.relayURL,
			stateDir:    t.TempDir(),
			noReplay:    o.noReplay,
		}
		if o.relayAuth != nil {
			s.relayNATS = o.relayAuth(s.pod)
		}
		w.slots = append(w.slots, s)
		w.startEngine(s)
		w.startRelay(s)
		// The engine's PUB drops what it publishes before the relay's
		// subscription reaches it: a relay that missed the first batches
		// would start partial without a replay ring, on a busy machine.
		testkit.WaitFor(t, "the engine to see its relay's subscription", func() error {
			if !s.eng.ZMQSubscribed() {
				return errors.New("s.eng.ZMQSubscribed() is false")
			}
			return nil
		})
		t.Cleanup(func() {
			w.stopRelay(s)
			_ = s.eng.Close()
		})
	}
	return w
}

func (w *world) startNATS() {
	if w.server != nil {
		w.ns = w.server(w.t, w.port)
		return
	}
	w.ns = startNATS(w.t, natsembed.Options{Port: w.port, JetStream: w.js, StoreDir: w.store})
	if w.js {
		nc, err := nats.Connect(w.url())
		if err != nil {
			w.t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			w.t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if _, err := events.EnsureStream(ctx, js, events.StreamConfig{Namespace: testNS, Pool: testPool, MaxAge: time.Minute, MaxBytes: 64 << 20}); err != nil {
			w.t.Fatal(err)
		}
	}
}

func (w *world) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", w.port) }

func (w *world) restartNATS() {
	w.ns.Shutdown()
	w.startNATS()
}

func (w *world) startEngine(s *slot) {
	w.t.Helper()
	s.eng = sim.NewEngine(sim.EngineConfig{
		Pod: s.pod, Address: s.addr, Model: testModel,
		Pool: blockpool.Config{BlockSize: blockSize, GPUBlocks: s.gpu, CPUBlocks: 16, Seed: s.seed},
	}, nil)
	err := s.eng.StartZMQ(sim.ZMQConfig{
		// vLLM's default endpoint (tcp://*:5557) binds, and the relay
		// dials it; Bind keeps the test on loopback.
		Endpoint:       fmt.Sprintf("tcp://127.0.0.1:%d", s.zmqPort),
		Bind:           true,
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", s.replayPort),
		Topic:          "kv@" + s.addr + "@" + testModel,
	})
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) restartEngine(s *slot) {
	_ = s.eng.Close()
	s.seed += 1000 // a new process hashes with a new seed
	w.startEngine(s)
}

func (w *world) startRelay(s *slot) {
	w.t.Helper()
	no := s.relayNATS
	no.URL = w.url()
	if s.relayURL != "" {
		no.URL = s.relayURL
	}
	no.ReconnectWait, no.MaxReconnectWait = 50*time.Millisecond, 200*time.Millisecond
	nc, err := relay.DialNATS(no)
	if err != nil {
		w.t.Fatal(err)
	}
	s.relayReg = prometheus.NewRegistry()
	replay := fmt.Sprintf("tcp://127.0.0.1:%d", s.replayPort)
	if s.noReplay {
		replay = ""
	}
	r, err := relay.New(relay.Config{
		ZMQEndpoint:    fmt.Sprintf("tcp://127.0.0.1:%d", s.zmqPort),
		Connect:        true,
		ReplayEndpoint: replay,
		Namespace:      testNS, Pool: testPool, Pod: s.pod,
		PodIP: "127.0.0.1", ServingPort: s.servingPort, Model: testModel,
		StateDir: s.stateDir, HeartbeatInterval: heartbeatEvery,
		Logger: quietLog, Registerer: s.relayReg,
	}, nc)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.relayCancel, s.relayNC, s.relayDone = cancel, nc, make(chan error, 1)
	go func() { s.relayDone <- r.Run(ctx) }()
	testkit.WaitFor(w.t, "the relay to be ready", func() error {
		if !r.Ready() {
			return errors.New("r.Ready() is false")
		}
		return nil
	})
}

func (w *world) stopRelay(s *slot) {
	if s.relayCancel == nil {
		return
	}
	s.relayCancel()
	if err := <-s.relayDone; err != nil {
		w.t.Errorf("relay %s: %v", s.pod, err)
	}
	s.relayNC.Close()
	s.relayCancel = nil
}

func (w *world) restartRelay(s *slot) {
	w.stopRelay(s)
	// The engine's PUB socket drops what it publishes before a subscriber
	// has subscribed, as vLLM's does: a test that serves right after the
	// restart would lose its first batches on a busy machine, unless it
	// waits for the old subscription to go and the new one to arrive.
	testkit.WaitFor(w.t, "the engine to drop the stopped relay's subscription", func() error {
		if s.eng.ZMQSubscribed() {
			return errors.New("s.eng.ZMQSubscribed() is still true")
		}
		return nil
	})
	w.startRelay(s)
	testkit.WaitFor(w.t, "the engine to see the new relay's subscription", func() error {
		if !s.eng.ZMQSubscribed() {
			return errors.New("s.eng.ZMQSubscribed() is false")
		}
		return nil
	})
}

// serve runs n requests, each a random prompt on a random engine, with a
// pause now and then so that ZeroMQ and NATS keep up as a real step rate
// would let them.
func (w *world) serve(n int) {
	w.t.Helper()
	for i := range n {
		s := w.slots[w.rng.IntN(len(w.slots))]
		p := w.prompt[w.rng.IntN(len(w.prompt))]
		p.ID = ""
		if _, err := s.eng.Serve(p); err != nil {
			w.t.Fatal(err)
		}
		if i%8 == 7 {
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// serveUntil serves requests until cond holds, as a live engine keeps
// stepping while a fault heals.
func (w *world) serveUntil(cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatal("condition never held while serving")
		}
		w.serve(3)
		time.Sleep(5 * time.Millisecond)
	}
}

// stack is the EPP's side of the event path: a consumer, recovery and the
// index, on a connection of its own.
type stack struct {
	nc       *nats.Conn
	ix       *index.Index
	rec      *recovery.Recovery
	consumer *consumer.Consumer
	reg      *prometheus.Registry
	cancel   context.CancelFunc
	done     sync.WaitGroup
}

type stackOptions struct {
	consumer consumer.Options
	recovery recovery.Options
	natsOpts []nats.Option
	errs     chan error // receives the connection's async errors
	members  []string   // endpoints of the pool (default every slot's)
}

func (w *world) newStack(o stackOptions) *stack {
	w.t.Helper()
	opts := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond), quietNATS}, o.natsOpts...)
	if o.errs != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case o.errs <- err:
			default:
			}
		}))
	}
	nc, err := nats.Connect(w.url(), opts...)
	if err != nil {
		w.t.Fatal(err)
	}
	st := &stack{nc: nc, reg: prometheus.NewRegistry()}
	var rec atomic.Pointer[recovery.Recovery]
	st.ix = index.New(index.Options{OnUncertain: func(s events.Stream, r events.Reason) {
		if p := rec.Load(); p != nil {
			p.OnUncertain(s, r)
		}
	}}, st.reg)
	ro := o.recovery
	ro.Namespace, ro.Pool, ro.Logger = testNS, testPool, quietLog
	if ro.Pod == nil {
		// As the EPP's datastore does, from discovery.
		ro.Pod = func(addr string) (string, bool) {
			for _, s := range w.slots {
				if s.addr == addr {
					return s.pod, true
				}
			}
			return "", false
		}
	}
	if ro.MinBackoff == 0 {
		ro.MinBackoff, ro.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
	}
	if ro.Timeout == 0 {
		ro.Timeout = 3 * time.Second
	}
	st.rec, err = recovery.New(ro, st.ix, nc, st.reg)
	if err != nil {
		w.t.Fatal(err)
	}
	rec.Store(st.rec)
	co := o.consumer
	co.Namespace, co.Pool, co.Logger, co.JetStream = testNS, testPool, quietLog, co.JetStream || w.js
	st.consumer, err = consumer.New(nc, co, st.rec, st.reg)
	if err != nil {
		w.t.Fatal(err)
	}
	members := o.members
	if members == nil {
		for _, s := range w.slots {
			members = append(members, s.addr)
		}
	}
	for _, a := range members {
		st.ix.AddEndpoint(a)
		st.rec.AddEndpoint(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st.cancel = cancel
	st.done.Add(2)
	go func() {
		defer st.done.Done()
		if err := st.consumer.Run(ctx); err != nil {
			w.t.Errorf("consumer: %v", err)
		}
	}()
	go func() {
		defer st.done.Done()
		_ = st.rec.Run(ctx)
	}()
	testkit.WaitFor(w.t, "the consumer to connect", func() error {
		if !st.consumer.Connected() {
			return errors.New("st.consumer.Connected() is false")
		}
		return nil
	})
	w.t.Cleanup(st.stop)
	return st
}

func (st *stack) stop() {
	if st.cancel == nil {
		return
	}
	st.cancel()
	st.done.Wait()
	st.nc.Close()
	st.cancel = nil
}

// heartbeatEvery is the relays' heartbeat in these tests: a lost tail is
// found within it.
const heartbeatEvery = 50 * time.Millisecond

// mismatch compares the index with the engines' caches over every block
// each engine holds, and for every prompt of the workload on every
// endpoint; it returns the first difference, or "" when the index is exact
// and equal to the ground truth.
func (w *world) mismatch(st *stack) string { return w.mismatchOf(st, w.slots) }

// mismatchOf is mismatch for some of the pods.
func (w *world) mismatchOf(st *stack, slots []*slot) string {
	for _, s := range slots {
		truth, err := s.eng.TrueHoldings()
		if err != nil {
			w.t.Fatal(err)
		}
		if d := sim.DiffHoldings(truth, st.ix.Holdings(s.addr)); !d.Exact() {
			return fmt.Sprintf("%s: index vs engine over all blocks: %s", s.addr, d)
		}
	}
	return w.promptMismatch(st, slots)
}

// promptMismatch is mismatch over the workload's prompts alone, and the
// streams' states.
func (w *world) promptMismatch(st *stack, slots []*slot) string {
	addrs := make([]string, len(slots))
	for i, s := range slots {
		addrs[i] = s.addr
		if state, _ := st.ix.State(s.addr); state != datalayer.StreamExact {
			return fmt.Sprintf("%s is %s", s.addr, state)
		}
	}
	out := make([]index.Match, len(addrs))
	for _, p := range w.prompt {
		keys := index.AppendBlockKeys(nil, index.RootKey(testModel, "", ""), p.Tokens, blockSize)
		st.ix.Lookup(keys, addrs, out)
		for i, s := range slots {
			want := s.eng.Held(p)
			got := blockpool.Held{Blocks: out[i].Blocks, ByTier: out[i].ByTier}
			if got != want {
				return fmt.Sprintf("%s prompt %s: index %+v, engine %+v", s.addr, p.ID, got, want)
			}
		}
	}
	return ""
}

// converge waits until the index equals the ground truth.
func (w *world) converge(st *stack) {
	w.t.Helper()
	w.converge2(st, w.slots)
}

// converge2 is converge for some of the pods.
func (w *world) converge2(st *stack, slots []*slot) {
	w.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		m := w.mismatchOf(st, slots)
		if m == "" {
			return
		}
		if time.Now().After(deadline) {
			w.dump(st)
			w.t.Fatalf("index never converged to the engines' caches: %s (pending resyncs %d)", m, st.rec.Pending())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldTotal is how many prompt blocks the engines hold, so that a test can
// check it is not vacuous.
func (w *world) heldTotal() int {
	n := 0
	for _, s := range w.slots {
		for _, p := range w.prompt {
			n += s.eng.Held(p).Blocks
		}
	}
	return n
}

// newDropProxy is a chaos.Proxy to target that lives until the test ends:
// it can lose publishes on kv.events subjects and hold what clients send.
func newDropProxy(t testing.TB, target string) *chaos.Proxy {
	t.Helper()
	p, err := chaos.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func recoveryOptions(pod func(string) (string, bool)) recovery.Options {
	return recovery.Options{Pod: pod}
}

// dump logs the recovery and consumer counters, for a failure's diagnosis.
func (w *world) dump(st *stack) {
	mfs, _ := st.reg.Gather()
	for _, mf := range mfs {
		n := mf.GetName()
		if !strings.HasPrefix(n, "kvroute_recovery_") && !strings.HasPrefix(n, "kvroute_events_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			if v != 0 {
				w.t.Logf("%s %v = %v", n, m.GetLabel(), v)
			}
		}
	}
}
