// Package chaos is kvroute's fault matrix: real components on loopback
// (simulated vLLM engines publishing over ZeroMQ as vLLM does, kv-relays
// with their state directories, an embedded NATS server, and EPP replicas
// built by epp.New consuming the same subjects), broken one way or two at
// once while traffic flows through the replicas' picks, and measured:
// time to converge, holdings the index claimed that the engine did not
// have, holdings the engine had that the index did not, and the picks
// made meanwhile. `make chaos` runs every scenario and writes
// docs/reliability.md; the package's tests run the same scenarios and
// require each to end as it must.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// The pool every world serves.
const (
	Namespace = "ns"
	PoolName  = "pool"
	Model     = "llama"
)

// WorldOptions shape a World. Zero values mean the documented defaults.
type WorldOptions struct {
	// Pods is the number of engines, each with its relay (default 3).
	Pods int
	// BlockSize and GPUBlocks size each engine (defaults 4 and 48, so
	// that evictions and removals happen often); CPUBlocks is its offload
	// tier (default 16).
	BlockSize, GPUBlocks, CPUBlocks int
	// NoReplay starts the relays without their engines' replay sockets.
	NoReplay bool
	// Proxied puts a Proxy between every relay and NATS.
	Proxied bool
	// Cluster runs NATS as a cluster of that many routed members (one
	// server when 0 or 1); every client is given all their URLs. A world
	// with a cluster has no Proxy.
	Cluster int
	// HeartbeatInterval is the relays' (default 50ms).
	HeartbeatInterval time.Duration
	// Seed makes the workload and the engines' hashes repeat.
	Seed uint64
	// Dir holds the relays' state directories (a temporary one when empty;
	// Close removes it then).
	Dir string
	// Logger receives the components' logs (default: discarded).
	Logger *slog.Logger
}

// World is a pool of pods on one NATS server.
type World struct {
	opts   WorldOptions
	port   int
	dir    string
	ownDir bool
	// NATS is the server, or the cluster's first member.
	NATS *natsembed.Server
	// Members are the cluster's servers (NATS alone without a cluster); a
	// killed member is nil until StartMember.
	Members     []*natsembed.Server
	clientPorts []int
	routePorts  []int
	Proxy       *Proxy
	Pods        []*Pod
	prompts     []blockpool.Request
	rng         *rand.Rand
}

// Pod is one simulated pod: an engine publishing over ZeroMQ and its relay
// carrying the events to NATS, each restartable on fixed ports.
type Pod struct {
	Name, Addr  string
	servingPort int
	zmqPort     int
	replayPort  int
	seed        uint64
	// Engine is the pod's engine; RestartEngine replaces it.
	Engine *sim.Engine
	// StateDir is the relay's state directory, kept across its restarts as
	// a pod keeps an emptyDir across container restarts.
	StateDir string
	// NoReplay starts the relay without the engine's replay socket;
	// Stateless without a state directory.
	NoReplay, Stateless bool
	// RelayMetrics is the running relay's registry.
	RelayMetrics *prometheus.Registry

	relayCancel context.CancelFunc
	relayDone   chan error
	relayNC     *nats.Conn
}

// NewWorld starts NATS, the engines and their relays.
func NewWorld(o WorldOptions) (*World, error) {
	if o.Pods <= 0 {
		o.Pods = 3
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 4
	}
	if o.GPUBlocks <= 0 {
		o.GPUBlocks = 48
	}
	if o.CPUBlocks <= 0 {
		o.CPUBlocks = 16
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 50 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	w := &World{opts: o, dir: o.Dir, rng: rand.New(rand.NewPCG(o.Seed+7, 11))}
	if w.dir == "" {
		d, err := os.MkdirTemp("", "kvroute-chaos-")
		if err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		w.dir, w.ownDir = d, true
	}
	if o.Cluster > 1 && o.Proxied {
		return nil, errors.New("chaos: a world with a NATS cluster has no proxy")
	}
	var err error
	for range max(o.Cluster, 1) {
		var c, r int
		if c, err = freePort(); err == nil {
			r, err = freePort()
		}
		if err != nil {
			return nil, err
		}
		w.clientPorts, w.routePorts = append(w.clientPorts, c), append(w.routePorts, r)
	}
	w.port = w.clientPorts[0]
	w.Members = make([]*natsembed.Server, len(w.clientPorts))
	if o.Cluster > 1 {
		err = w.startCluster()
	} else {
		err = w.StartNATS()
	}
	if err != nil {
		w.Close()
		return nil, err
	}
	if o.Proxied {
		if w.Proxy, err = NewProxy(w.NATS.Addr().String()); err != nil {
			w.Close()
			return nil, err
		}
	}
	w.prompts = sim.SharedPrefix{Groups: 6, PromptsPerGroup: 5, SystemTokens: 6 * o.BlockSize, QuestionTokens: 3 * o.BlockSize, Seed: o.Seed + 3}.Prompts()
	for i := range o.Pods {
		p := &Pod{
			Name:        fmt.Sprintf("vllm-%d", i),
			servingPort: 8000 + i,
			Addr:        fmt.Sprintf("127.0.0.1:%d", 8000+i),
			seed:        o.Seed*1000 + uint64(100+i),
			StateDir:    filepath.Join(w.dir, fmt.Sprintf("relay-%d", i)),
			NoReplay:    o.NoReplay,
		}
		if p.zmqPort, err = freePort(); err == nil {
			p.replayPort, err = freePort()
		}
		if err == nil {
			err = w.startEngine(p)
		}
		if err == nil {
			w.Pods = append(w.Pods, p)
			err = w.StartRelay(p)
		}
		if err != nil {
			w.Close()
			return nil, err
		}
	}
	return w, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("chaos: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// URL is the NATS server's client URL, or the cluster members' URLs
// separated by commas, as a client is given them.
func (w *World) URL() string {
	urls := make([]string, len(w.clientPorts))
	for i, p := range w.clientPorts {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	return strings.Join(urls, ",")
}

// Prompts are the workload's prompts.
func (w *World) Prompts() []blockpool.Request { return w.prompts }

// StartNATS starts the server on the world's port.
func (w *World) StartNATS() error {
	s, err := natsembed.Start(natsembed.Options{Port: w.port})
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	w.NATS, w.Members[0] = s, s
	return nil
}

// startCluster starts every member and waits until each has a route to
// every other.
func (w *World) startCluster() error {
	for i := range w.Members {
		if err := w.StartMember(i); err != nil {
			return err
		}
	}
	w.NATS = w.Members[0]
	return w.awaitRoutes()
}

// StartMember starts cluster member i on its ports, routed to every other
// member's; a member that was killed comes back this way.
func (w *World) StartMember(i int) error {
	var routes []string
	for j, p := range w.routePorts {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
		}
	}
	s, err := natsembed.Start(natsembed.Options{
		Name: fmt.Sprintf("nats-%d", i), Port: w.clientPorts[i],
		Cluster: &natsembed.Cluster{Name: "kvroute", Port: w.routePorts[i], Routes: routes},
	})
	if err != nil {
		return fmt.Errorf("chaos: NATS member %d: %w", i, err)
	}
	w.Members[i] = s
	return nil
}

// KillMember stops cluster member i: its clients reconnect to the others,
// and what was in flight through it is lost.
func (w *World) KillMember(i int) {
	if s := w.Members[i]; s != nil {
		s.Shutdown()
		w.Members[i] = nil
	}
}

// awaitRoutes waits until every running member is routed to every other
// running one (bounded).
func (w *World) awaitRoutes() error {
	running := 0
	for _, s := range w.Members {
		if s != nil {
			running++
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range w.Members {
		for s != nil && s.NumRemotes() < running-1 {
			if time.Now().After(deadline) {
				return fmt.Errorf("chaos: NATS member %s routes to %d members, want %d", s.Name(), s.NumRemotes(), running-1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// RestartNATS stops the server and starts a new one on the same port: every
// client reconnects, and whatever was in flight is lost.
func (w *World) RestartNATS() error {
	w.NATS.Shutdown()
	return w.StartNATS()
}

func (w *World) startEngine(p *Pod) error {
	p.Engine = sim.NewEngine(sim.EngineConfig{
		Pod: p.Name, Address: p.Addr, Model: Model,
		Pool: blockpool.Config{BlockSize: w.opts.BlockSize, GPUBlocks: w.opts.GPUBlocks, CPUBlocks: w.opts.CPUBlocks, Seed: p.seed},
	}, nil)
	err := p.Engine.StartZMQ(sim.ZMQConfig{
		// vLLM's default endpoint (tcp://*:5557) binds and the relay dials
		// it; Bind keeps the world on loopback.
		Endpoint:       fmt.Sprintf("tcp://127.0.0.1:%d", p.zmqPort),
		Bind:           true,
		ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", p.replayPort),
		Topic:          "kv@" + p.Addr + "@" + Model,
	})
	if err != nil {
		return fmt.Errorf("chaos: engine %s: %w", p.Name, err)
	}
	return nil
}

// RestartEngine stops the pod's engine and starts a new process in its
// place: empty cache, seq from 0, hashes of its own.
func (w *World) RestartEngine(p *Pod) error {
	_ = p.Engine.Close()
	p.seed += 1000
	return w.startEngine(p)
}

// StartRelay starts the pod's relay and waits until it is ready.
func (w *World) StartRelay(p *Pod) error {
	url := w.URL()
	if w.Proxy != nil {
		url = w.Proxy.URL()
	}
	nc, err := relay.DialNATS(relay.NATSOptions{URL: url, ReconnectWait: 50 * time.Millisecond, MaxReconnectWait: 200 * time.Millisecond,
		Logger: w.opts.Logger})
	if err != nil {
		return fmt.Errorf("chaos: relay %s: %w", p.Name, err)
	}
	cfg := relay.Config{
		ZMQEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", p.zmqPort),
		Connect:     true,
		Namespace:   Namespace, Pool: PoolName, Pod: p.Name,
		PodIP: "127.0.0.1", ServingPort: p.servingPort, Model: Model,
		HeartbeatInterval: w.opts.HeartbeatInterval,
		Logger:            w.opts.Logger.With("relay", p.Name),
	}
	if !p.NoReplay {
		cfg.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", p.replayPort)
	}
	if !p.Stateless {
		cfg.StateDir = p.StateDir
	}
	p.RelayMetrics = prometheus.NewRegistry()
	cfg.Registerer = p.RelayMetrics
	r, err := relay.New(cfg, nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("chaos: relay %s: %w", p.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.relayCancel, p.relayNC, p.relayDone = cancel, nc, make(chan error, 1)
	go func() { p.relayDone <- r.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	// Ready is the relay's side; the engine's PUB drops what it sends until
	// the relay's subscription has reached it, so wait for that too.
	for !r.Ready() || !p.Engine.ZMQSubscribed() {
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: relay %s never became ready", p.Name)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// StopRelay stops the pod's relay cleanly (its last checkpoint written).
func (w *World) StopRelay(p *Pod) error {
	if p.relayCancel == nil {
		return nil
	}
	p.relayCancel()
	err := <-p.relayDone
	p.relayNC.Close()
	p.relayCancel = nil
	// The engine notices the subscriber gone in its own time; until then a
	// new relay's subscription could not be told from the old one's.
	deadline := time.Now().Add(30 * time.Second)
	for p.Engine != nil && p.Engine.ZMQSubscribed() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return err
}

// RestartRelay stops the pod's relay and starts another in its place.
func (w *World) RestartRelay(p *Pod) error {
	if err := w.StopRelay(p); err != nil {
		return err
	}
	return w.StartRelay(p)
}

// Serve runs n requests with no EPP in the way, each a random prompt on a
// random engine, as traffic that goes around the pickers would.
func (w *World) Serve(n int) error {
	for i := range n {
		p := w.Pods[w.rng.IntN(len(w.Pods))]
		req := w.prompts[w.rng.IntN(len(w.prompts))]
		req.ID = ""
		if _, err := p.Engine.Serve(req); err != nil {
			return err
		}
		if i%8 == 7 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

// Close stops everything the world started.
func (w *World) Close() {
	var errs []error
	for _, p := range w.Pods {
		errs = append(errs, w.StopRelay(p))
		if p.Engine != nil {
			errs = append(errs, p.Engine.Close())
		}
	}
	if w.Proxy != nil {
		w.Proxy.Close()
	}
	for i := range w.Members {
		w.KillMember(i)
	}
	if w.ownDir {
		errs = append(errs, os.RemoveAll(w.dir))
	}
	if err := errors.Join(errs...); err != nil {
		w.opts.Logger.Warn("chaos world closed with errors", "err", err)
	}
}
