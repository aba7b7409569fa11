package scale

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/chaos"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// Report is what one run measured.
type Report struct {
	Options Options
	// The whole fleet: every pool with one replica, for the run's virtual
	// time.
	Fleet FleetResult
	// Ingest is pool 0's events replayed into a fresh replica, alone.
	Ingest IngestResult
	// Replicas are the hit-rate runs on one pool, one per replica count.
	Replicas []ReplicaResult
	Wall     time.Duration
}

// FleetResult is the whole fleet's run.
type FleetResult struct {
	Routes, Batches, Events, Blocks int
	// HitRate is the share of prompt blocks that were cache hits.
	HitRate float64
	// Holdings are the index holdings of each pool's replica at the end.
	Holdings []int
	Wall     time.Duration
	CPU      time.Duration
}

// IngestResult is one replica taking a pool's whole event history.
type IngestResult struct {
	Engines                 int
	Batches, Events, Blocks int
	// CPU is the median of Replays replays' (CPUMin to CPUMax), each into
	// a fresh replica; Wall is the last one's.
	CPU, CPUMin, CPUMax, Wall time.Duration
	Replays                   int
	// Holdings is the index's size at the end; IndexBytes the heap it
	// added (the replica's heap before the replay subtracted), and
	// ReplicaBytes the replica's whole heap, its fixed cost included.
	Holdings                 int
	IndexBytes, ReplicaBytes uint64
	// LookupNs is one index lookup of a prompt over every endpoint of
	// the pool; PickUs one whole pick (PrepareData, scorers, picker).
	LookupNs, PickUs float64
}

// EventsPerCoreSecond is the ingest rate one core sustains.
func (r IngestResult) EventsPerCoreSecond() float64 { return perSecond(r.Events, r.CPU) }

// BatchesPerCoreSecond is the same in batches.
func (r IngestResult) BatchesPerCoreSecond() float64 { return perSecond(r.Batches, r.CPU) }

// BlocksPerCoreSecond is the same in blocks named by the events.
func (r IngestResult) BlocksPerCoreSecond() float64 { return perSecond(r.Blocks, r.CPU) }

// BytesPerHolding is the index's heap per holding.
func (r IngestResult) BytesPerHolding() float64 {
	if r.Holdings == 0 {
		return 0
	}
	return float64(r.IndexBytes) / float64(r.Holdings)
}

func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// ReplicaResult is one pool routed by Replicas replicas in turn.
type ReplicaResult struct {
	Replicas int
	Routes   int
	HitRate  float64
	// Agreement at the end, every replica against the first, over every
	// (prompt, endpoint) pair: Agree answered alike; SpeculativeOnly
	// differed only in unexpired speculative holdings (a replica's own
	// picks); Disagree differed in what the events said.
	Pairs, Agree, SpeculativeOnly, Disagree int
	// Detail names the first disagreement.
	Detail string
}

// Run runs the fleet, the ingest replay and the replica runs.
func Run(ctx context.Context, o Options) (Report, error) {
	if err := o.defaults(); err != nil {
		return Report{}, err
	}
	start := time.Now()
	rep := Report{Options: o}
	srv, err := natsembed.Start(natsembed.Options{Port: -1})
	if err != nil {
		return rep, fmt.Errorf("scale: %w", err)
	}
	defer srv.Shutdown()
	tap, err := runFleet(ctx, &o, srv, &rep.Fleet)
	if err != nil {
		return rep, err
	}
	if rep.Ingest, err = replay(ctx, &o, srv, tap); err != nil {
		return rep, err
	}
	tap = nil
	per := o.Engines / o.Pools
	for _, n := range o.Replicas {
		pl, err := newPool(&o, srv, o.Pools, per, n, o.Seed+99)
		if err != nil {
			return rep, err
		}
		err = pl.run(ctx)
		var rr ReplicaResult
		if err == nil {
			rr, err = pl.agreement()
		}
		pl.close()
		if err != nil {
			return rep, err
		}
		rr.Replicas, rr.Routes, rr.HitRate = n, pl.routes, ratio(pl.hitBlocks, pl.promptBlocks)
		rep.Replicas = append(rep.Replicas, rr)
	}
	rep.Wall = time.Since(start)
	return rep, nil
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// captured is one message of pool 0, as the replicas received it.
type captured struct {
	subject string
	header  nats.Header
	data    []byte
}

// runFleet runs every pool, Parallel at a time, each with one replica, and
// returns pool 0's messages.
func runFleet(ctx context.Context, o *Options, srv *natsembed.Server, res *FleetResult) ([]captured, error) {
	per := o.Engines / o.Pools
	var tap []captured
	tc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name("tap"))
	if err != nil {
		return nil, fmt.Errorf("scale: tap: %w", err)
	}
	defer tc.Close()
	var tapMu sync.Mutex
	sub, err := tc.Subscribe(events.PoolSubject(Namespace, "pool-0"), func(m *nats.Msg) {
		tapMu.Lock()
		tap = append(tap, captured{m.Subject, m.Header, m.Data})
		tapMu.Unlock()
	})
	if err == nil {
		err = sub.SetPendingLimits(-1, -1)
	}
	if err == nil {
		err = tc.Flush()
	}
	if err != nil {
		return nil, fmt.Errorf("scale: tap: %w", err)
	}
	cpu0, wall0 := cpuTime(), time.Now()
	var (
		mu           sync.Mutex
		hits, blocks int
		errs         []error
		wg           sync.WaitGroup
		sem          = make(chan struct{}, o.Parallel)
	)
	res.Holdings = make([]int, o.Pools)
	for p := range o.Pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pl, err := newPool(o, srv, p, per, 1, o.Seed+uint64(p))
			if err == nil {
				err = pl.run(ctx)
				r := pl.replicas[0].epp.Registry()
				mu.Lock()
				res.Routes += pl.routes
				res.Batches += int(chaos.Metric(r, "kvroute_events_batches_total", "result", "applied"))
				res.Events += int(chaos.Metric(r, "kvroute_events_events_total", "result", "applied"))
				res.Blocks += int(chaos.Metric(r, "kvroute_events_blocks_total"))
				res.Holdings[p] = int(chaos.Metric(r, "kvroute_index_holdings"))
				hits, blocks = hits+pl.hitBlocks, blocks+pl.promptBlocks
				mu.Unlock()
				pl.close()
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	res.HitRate = ratio(hits, blocks)
	res.CPU, res.Wall = cpuTime()-cpu0, time.Since(wall0)
	if err := sub.Drain(); err != nil {
		return nil, fmt.Errorf("scale: tap: %w", err)
	}
	for sub.IsValid() {
		time.Sleep(time.Millisecond)
	}
	tapMu.Lock()
	defer tapMu.Unlock()
	return tap, nil
}

// replay gives pool 0's messages, in the order received, to a fresh
// replica with nothing else running, and measures what it cost.
func replay(ctx context.Context, o *Options, srv *natsembed.Server, tap []captured) (IngestResult, error) {
	per := o.Engines / o.Pools
	res := IngestResult{Engines: per}
	// The pool's engines are rebuilt (with no traffic) only for their
	// endpoints: the replica admits batches of the pool's members alone.
	pl, err := newPool(o, srv, 0, per, 0, o.Seed)
	if err != nil {
		return res, err
	}
	defer pl.close()
	// A replica's fixed cost: one started with no event, then stopped.
	empty, err := pl.startReplica(srv, o.Seed)
	if err != nil {
		return res, err
	}
	withEmpty := heap0()
	empty.stop()
	fixed := sub(withEmpty, heap0())

	// The history is replayed into fresh replicas, each taking all of it;
	// the last is kept for the lookups and the heap.
	var cpus []time.Duration
	var r *replica
	for k := range replays {
		if r != nil {
			r.stop()
		}
		if r, err = pl.startReplica(srv, o.Seed); err != nil {
			return res, err
		}
		cpu, wall, err := pl.replayInto(ctx, r, tap)
		if err != nil {
			r.stop()
			return res, err
		}
		cpus = append(cpus, cpu)
		if k == replays-1 {
			res.Wall = wall
		}
	}
	pl.replicas = []*replica{r}
	reg := r.epp.Registry()
	slices.Sort(cpus)
	res.CPU, res.CPUMin, res.CPUMax, res.Replays = cpus[len(cpus)/2], cpus[0], cpus[len(cpus)-1], len(cpus)
	res.Batches = len(tap)
	res.Events = int(chaos.Metric(reg, "kvroute_events_events_total", "result", "applied"))
	res.Blocks = int(chaos.Metric(reg, "kvroute_events_blocks_total"))
	res.Holdings = int(chaos.Metric(reg, "kvroute_index_holdings"))
	if res.LookupNs, res.PickUs, err = pl.timeLookups(ctx, r); err != nil {
		return res, err
	}
	// The timed picks' speculative holdings expire, which leaves the
	// index as the events made it.
	pl.clock.set(time.Hour)
	r.epp.Index().Expire()
	// The replica's heap is what stopping it frees: measured so, the
	// garbage other parts of the run leave meanwhile does not count.
	full := heap0()
	r.stop()
	pl.replicas = nil
	res.ReplicaBytes = sub(full, heap0())
	res.IndexBytes = sub(res.ReplicaBytes, fixed)
	return res, nil
}

// replays is how many fresh replicas take pool 0's history.
const replays = 5

// replayInto publishes the captured history to r and waits until it has
// applied all of it, polling its counter every millisecond (the poll's
// own CPU is on the measurement, a little).
func (pl *pool) replayInto(ctx context.Context, r *replica, tap []captured) (cpu, wall time.Duration, err error) {
	reg := r.epp.Registry()
	// What came before is collected now, not on the replay's time.
	runtime.GC()
	cpu0, wall0 := cpuTime(), time.Now()
	for i := range tap {
		m := &nats.Msg{Subject: tap[i].subject, Header: tap[i].header, Data: tap[i].data}
		if err := pl.nc.PublishMsg(m); err != nil {
			return 0, 0, fmt.Errorf("scale: replay: %w", err)
		}
	}
	if err := pl.nc.Flush(); err != nil {
		return 0, 0, fmt.Errorf("scale: replay: %w", err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for chaos.Metric(reg, "kvroute_events_batches_total", "result", "applied") < float64(len(tap)) {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("scale: replay: %.0f of %d batches applied", chaos.Metric(reg, "kvroute_events_batches_total", "result", "applied"), len(tap))
		}
		time.Sleep(time.Millisecond)
	}
	return cpuTime() - cpu0, time.Since(wall0), nil
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// heap0 is the live heap after a collection.
func heap0() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// timeLookups times index lookups of the pool's prompts over all its
// endpoints, then whole picks, in CPU time.
func (pl *pool) timeLookups(ctx context.Context, r *replica) (lookupNs, pickUs float64, err error) {
	n := pl.o.Lookups
	addrs := make([]string, len(pl.engines))
	for i, e := range pl.engines {
		addrs[i] = e.Config().Address
	}
	keys := pl.keys()
	out := make([]index.Match, len(addrs))
	ix := r.epp.Index()
	c0 := cpuTime()
	for i := range n {
		ix.Lookup(keys[i%len(keys)], addrs, out)
	}
	lookupNs = float64(cpuTime()-c0) / float64(n)
	c0 = cpuTime()
	for i := range n {
		p := pl.prompts[i%len(pl.prompts)]
		if _, err := r.epp.Director().Route(ctx, &request.Request{Model: pl.model, TokenIDs: p.Tokens}, nil); err != nil {
			return 0, 0, fmt.Errorf("scale: timed pick: %w", err)
		}
	}
	pickUs = float64(cpuTime()-c0) / float64(n) / 1e3
	return lookupNs, pickUs, nil
}

// keys are the block keys of each of the pool's prompts.
func (pl *pool) keys() [][]uint64 {
	root := index.RootKey(pl.model, "", "")
	out := make([][]uint64, len(pl.prompts))
	for i, p := range pl.prompts {
		out[i] = index.AppendBlockKeys(nil, root, p.Tokens, pl.o.BlockSize)
	}
	return out
}

// agreement compares every replica's answers with the first's for every
// (prompt, endpoint) pair, once every batch is delivered.
func (pl *pool) agreement() (ReplicaResult, error) {
	var rr ReplicaResult
	if err := pl.deliver(); err != nil {
		return rr, err
	}
	addrs := make([]string, len(pl.engines))
	for i, e := range pl.engines {
		addrs[i] = e.Config().Address
	}
	first := make([]index.Match, len(addrs))
	other := make([]index.Match, len(addrs))
	for _, r := range pl.replicas {
		r.epp.Index().Expire()
	}
	for _, keys := range pl.keys() {
		pl.replicas[0].epp.Index().Lookup(keys, addrs, first)
		for k, r := range pl.replicas[1:] {
			r.epp.Index().Lookup(keys, addrs, other)
			for i := range addrs {
				a, b := first[i], other[i]
				rr.Pairs++
				switch {
				case a == b:
					rr.Agree++
				case a.ByTier == b.ByTier:
					rr.SpeculativeOnly++
				default:
					if rr.Disagree == 0 {
						rr.Detail = fmt.Sprintf("replica %d holds %v of a prompt on %s, replica 0 %v", k+1, b.ByTier, addrs[i], a.ByTier)
					}
					rr.Disagree++
				}
			}
		}
	}
	return rr, nil
}
