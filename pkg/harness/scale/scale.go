// Package scale is kvroute's fleet-scale run: thousands of simulated
// engines in several pools, stepped in virtual time, whose event batches
// take the real path into EPP replicas built by epp.New (NATS in process,
// the consumer's admission, ordering and decoding, the index), with every
// pick made by a replica's own director behind a round-robin front. It
// measures event ingest per core, index memory per replica, lookup cost at
// the pool's size, the hit rate with 1, 2 and 8 replicas routing the same
// pool, and whether the replicas answer alike at the end. `make scale` runs
// it at 1k and 10k engines and writes docs/results/scale.md.
package scale

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/chaos"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// Namespace is the namespace every pool of the run is in.
const Namespace = "scale"

// Options shape a run. Zero values mean the documented defaults.
type Options struct {
	// Engines in the whole fleet, split evenly over Pools (default 4),
	// which serve Models base models between them (default 2; pool p
	// serves model p mod Models).
	Engines, Pools, Models int
	// Duration is the virtual time each pool is run for (default 5s).
	Duration time.Duration
	// RequestRate is requests per engine per second (default 2).
	RequestRate float64
	// Service is the mean time a request keeps its engine busy, which is
	// the load the queue scorer sees (default 4s).
	Service time.Duration
	// Tick is the virtual time between two deliveries of the events
	// published meanwhile, and between two scrapes of the engines' load
	// (default 50ms): within a tick a replica does not see what others'
	// picks caused.
	Tick time.Duration
	// BlockSize and GPUBlocks size each engine (defaults 16 and 512).
	BlockSize, GPUBlocks int
	// SystemTokens and QuestionTokens shape the prompts (defaults 512 and
	// 64): each pool has one prompt group per 8 engines, 8 prompts a group
	// sharing a system prompt. OutputTokens are generated per request and
	// cached after it (default 256), as vLLM caches decoded blocks.
	SystemTokens, QuestionTokens, OutputTokens int
	// Replicas are the replica counts of the hit-rate runs on one pool
	// (default 1, 2, 8).
	Replicas []int
	// Lookups is how many lookups and picks are timed (default 2000).
	Lookups int
	// Parallel bounds the pools simulated at once (default GOMAXPROCS).
	Parallel int
	Seed     uint64
	// Logger receives the components' logs (default: discarded).
	Logger *slog.Logger
}

func (o *Options) defaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Pools, 4)
	def(&o.Models, 2)
	def(&o.BlockSize, 16)
	def(&o.GPUBlocks, 512)
	def(&o.SystemTokens, 512)
	def(&o.QuestionTokens, 64)
	def(&o.OutputTokens, 256)
	def(&o.Lookups, 2000)
	def(&o.Parallel, runtime.GOMAXPROCS(0))
	if o.Duration == 0 {
		o.Duration = 5 * time.Second
	}
	if o.RequestRate == 0 {
		o.RequestRate = 2
	}
	if o.Service == 0 {
		o.Service = 4 * time.Second
	}
	if o.Tick == 0 {
		o.Tick = 50 * time.Millisecond
	}
	if len(o.Replicas) == 0 {
		o.Replicas = []int{1, 2, 8}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.Engines <= 0 || o.Pools <= 0 || o.Models <= 0:
		return errors.New("scale: engines, pools and models must be positive")
	case o.Engines/o.Pools < 1:
		return fmt.Errorf("scale: %d engines cannot fill %d pools", o.Engines, o.Pools)
	case o.Engines/o.Pools > 60000:
		return fmt.Errorf("scale: %d engines in one pool is past an index's endpoint limit", o.Engines/o.Pools)
	case o.RequestRate < 0 || o.Duration < 0 || o.Tick < 0 || o.Service < 0:
		return errors.New("scale: negative rate or duration")
	}
	for _, r := range o.Replicas {
		if r <= 0 {
			return fmt.Errorf("scale: replica count %d", r)
		}
	}
	return nil
}

// vclock is a pool's virtual time since a fixed origin, which the
// replicas' indexes read so that speculative holdings expire in it.
type vclock struct{ elapsed atomic.Int64 }

var origin = time.Unix(1e9, 0)

func (c *vclock) Now() time.Time            { return origin.Add(time.Duration(c.elapsed.Load())) }
func (c *vclock) set(elapsed time.Duration) { c.elapsed.Store(int64(elapsed)) }

// replica is one EPP of a pool, running.
type replica struct {
	epp    *epp.EPP
	cancel context.CancelFunc
	done   chan error
}

// pool is one InferencePool: its engines, the connection they publish on
// (one per pool: each engine's batches keep their order on it, as on a
// relay's own connection), and its EPP replicas.
type pool struct {
	o        *Options
	name     string
	model    string
	engines  []*sim.Engine
	pods     []string
	byAddr   map[string]int
	nc       *nats.Conn
	replicas []*replica
	prompts  []blockpool.Request
	clock    *vclock
	rng      *rand.Rand
	// active is each engine's requests in service; ends their end times.
	active []int
	ends   endHeap
	outSeq uint32
	// queued are the requests picked in the current tick: their prefill
	// (and so their batch) comes at the next tick's start, so that a pick
	// is known, until then, only as the picking replica's speculation.
	queued []queuedReq

	// What the run measured.
	routes, promptBlocks, hitBlocks int
}

type queuedReq struct {
	engine       int
	tokens       []uint32
	promptBlocks int
}

type end struct {
	at     time.Duration
	engine int
}

type endHeap []end

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(end)) }
func (h *endHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// newPool builds pool p's engines, publishing through srv in process, and
// its replicas, each consuming every event of the pool and ready.
func newPool(o *Options, srv *natsembed.Server, p, engines, replicas int, seed uint64) (*pool, error) {
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name(fmt.Sprintf("engines-%d", p)))
	if err != nil {
		return nil, fmt.Errorf("scale: pool %d: connect: %w", p, err)
	}
	pl := &pool{
		o: o, name: fmt.Sprintf("pool-%d", p), model: fmt.Sprintf("model-%d", p%o.Models),
		byAddr: map[string]int{}, nc: nc, active: make([]int, engines),
		clock: &vclock{}, rng: rand.New(rand.NewPCG(seed, 0x5ca1e)),
	}
	pub := events.NewPublisher(nc, Namespace, pl.name)
	groups := max(engines/8, 1)
	pl.prompts = sim.SharedPrefix{Groups: groups, PromptsPerGroup: 8, SystemTokens: o.SystemTokens,
		QuestionTokens: o.QuestionTokens, Seed: seed + 1}.Prompts()
	for i := range engines {
		pod := fmt.Sprintf("%s-vllm-%d", pl.name, i)
		addr := fmt.Sprintf("10.%d.%d.%d:8000", p%250, i/250, i%250+1)
		pl.engines = append(pl.engines, sim.NewEngine(sim.EngineConfig{
			Pod: pod, Address: addr, Model: pl.model,
			Pool: blockpool.Config{BlockSize: o.BlockSize, GPUBlocks: o.GPUBlocks, Seed: seed*100000 + uint64(i) + 1},
		}, pub))
		pl.pods = append(pl.pods, pod)
		pl.byAddr[addr] = i
	}
	for k := range replicas {
		r, err := pl.startReplica(srv, seed+uint64(k)*7919)
		if err != nil {
			pl.close()
			return nil, err
		}
		pl.replicas = append(pl.replicas, r)
	}
	return pl, nil
}

func (pl *pool) startReplica(srv *natsembed.Server, seed uint64) (*replica, error) {
	e, err := epp.New(epp.Options{
		NATSURL: srv.ClientURL(), NATSOptions: []nats.Option{nats.InProcessServer(srv)},
		Namespace: Namespace, Pool: pl.name, HTTPAddr: "127.0.0.1:0",
		// The engines answer no snapshot requests: every replica hears
		// every stream from its first batch, so none is ever due.
		NoRecovery: true, Seed: seed,
		Prefix: prefixmatch.Params{DefaultBlockSizeTokens: pl.o.BlockSize},
		Index:  index.Options{Now: pl.clock.Now},
		Logger: pl.o.Logger.With("epp", pl.name),
	})
	if err != nil {
		return nil, fmt.Errorf("scale: %s replica: %w", pl.name, err)
	}
	for i, eng := range pl.engines {
		c := eng.Config()
		e.Datastore().Upsert(&datalayer.Endpoint{Name: pl.pods[i], Address: c.Address, Pod: pl.pods[i], Namespace: Namespace, Model: pl.model})
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{epp: e, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- e.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !e.Ready() {
		if time.Now().After(deadline) {
			cancel()
			<-r.done
			return nil, fmt.Errorf("scale: %s replica never became ready", pl.name)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return r, nil
}

// stop stops the replica and waits until it has.
func (r *replica) stop() {
	r.cancel()
	<-r.done
}

func (pl *pool) close() {
	for _, r := range pl.replicas {
		r.stop()
	}
	pl.replicas = nil
	pl.nc.Close()
}

// run simulates the pool for the run's duration: arrivals at RequestRate
// per engine, each picked by the replicas in turn and served by the engine
// picked, with the batches published meanwhile delivered at every tick.
func (pl *pool) run(ctx context.Context) error {
	o := pl.o
	rate := o.RequestRate * float64(len(pl.engines))
	next := time.Duration(0)
	if rate > 0 {
		next = time.Duration(pl.rng.ExpFloat64() / rate * float64(time.Second))
	}
	for t := time.Duration(0); t < o.Duration; t += o.Tick {
		if err := ctx.Err(); err != nil {
			return err
		}
		pl.scrape(t)
		if err := pl.prefill(); err != nil {
			return err
		}
		for rate > 0 && next < t+o.Tick && next < o.Duration {
			if err := pl.serve(ctx, next); err != nil {
				return err
			}
			next += time.Duration(pl.rng.ExpFloat64() / rate * float64(time.Second))
		}
		if err := pl.deliver(); err != nil {
			return err
		}
	}
	return nil
}

// scrape gives every replica the engines' load at virtual time t, as its
// metrics scraper would.
func (pl *pool) scrape(t time.Duration) {
	pl.clock.set(t)
	for pl.ends.Len() > 0 && pl.ends[0].at <= t {
		e := heap.Pop(&pl.ends).(end)
		pl.active[e.engine]--
	}
	const maxRunning = 32
	now := time.Now() // the scorers judge staleness by the wall clock
	for _, r := range pl.replicas {
		ds := r.epp.Datastore()
		for i, n := range pl.active {
			ds.SetMetrics(pl.pods[i], datalayer.Metrics{
				RunningRequests: min(n, maxRunning), WaitingQueueSize: max(n-maxRunning, 0),
				KVCacheUsage: min(1, float64(n)/maxRunning), BlockSize: pl.o.BlockSize, NumGPUBlocks: pl.o.GPUBlocks, UpdateTime: now,
			})
		}
	}
}

// serve routes one request arriving at virtual time at through the next
// replica and runs it on the engine picked.
func (pl *pool) serve(ctx context.Context, at time.Duration) error {
	pl.clock.set(at)
	prompt := pl.prompts[pl.rng.IntN(len(pl.prompts))]
	r := pl.replicas[pl.routes%len(pl.replicas)]
	pick, err := r.epp.Director().Route(ctx, &request.Request{Model: pl.model, TokenIDs: prompt.Tokens}, nil)
	if err != nil {
		return fmt.Errorf("scale: %s pick: %w", pl.name, err)
	}
	i, ok := pl.byAddr[pick.Targets[0]]
	if !ok {
		return fmt.Errorf("scale: %s picked %s, no engine's address", pl.name, pick.Targets[0])
	}
	pl.routes++
	// The reply's tokens are the request's own, cached after it as vLLM
	// caches the blocks it decodes.
	tokens := make([]uint32, len(prompt.Tokens), len(prompt.Tokens)+pl.o.OutputTokens)
	copy(tokens, prompt.Tokens)
	for range pl.o.OutputTokens {
		pl.outSeq++
		tokens = append(tokens, 40000+pl.outSeq)
	}
	pl.queued = append(pl.queued, queuedReq{engine: i, tokens: tokens, promptBlocks: len(prompt.Tokens) / pl.o.BlockSize})
	pl.active[i]++
	heap.Push(&pl.ends, end{at: at + time.Duration(pl.rng.ExpFloat64()*float64(pl.o.Service)), engine: i})
	return nil
}

// prefill runs the requests picked in the tick before on their engines;
// those picked in the last tick stay in flight at the run's end.
func (pl *pool) prefill() error {
	for _, q := range pl.queued {
		hit, err := pl.engines[q.engine].Serve(blockpool.Request{Tokens: q.tokens})
		if err != nil {
			return err
		}
		pl.promptBlocks += q.promptBlocks
		pl.hitBlocks += min(hit, q.promptBlocks)
	}
	clear(pl.queued)
	pl.queued = pl.queued[:0]
	return nil
}

// published is how many batches the pool's engines have published.
func (pl *pool) published() float64 {
	n := 0.0
	for _, e := range pl.engines {
		if seq, ok := e.LastSeq(); ok {
			n += float64(seq + 1)
		}
	}
	return n
}

// deliver waits until every replica has applied every batch published so
// far (bounded): the end of a tick.
func (pl *pool) deliver() error {
	if err := pl.nc.Flush(); err != nil {
		return fmt.Errorf("scale: %s: flush: %w", pl.name, err)
	}
	want := pl.published()
	deadline := time.Now().Add(60 * time.Second)
	for _, r := range pl.replicas {
		for {
			got := chaos.Metric(r.epp.Registry(), "kvroute_events_batches_total", "result", "applied")
			if got >= want {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("scale: %s: a replica applied %.0f of %.0f batches", pl.name, got, want)
			}
			time.Sleep(500 * time.Microsecond)
		}
	}
	return nil
}
