package loadgen

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// RunVirtual runs w under policy on a fleet simulated in virtual time: one
// clock advances through arrivals, engine steps and think times, with no
// HTTP, no NATS and no sleeping, so a run costs only its computation. The
// client-side policies give the same result every run; kvroute's pickers
// break ties at random, so theirs vary a little.
//
// The engines are the real-time ones (block pools, scheduler loop, timing
// model). The client-side policies are those of real time. kvroute's run its
// real index, PrepareData and scheduler in process, from an EPP that is
// built but not served. Each engine step's KV batch is applied to the index
// as the step ends, and each pick sees the engines' queues and KV usage as
// they are at that moment. In real time the events take a NATS hop and the
// metrics a 50ms scrape; here both are exact, so this mode shows what
// routing could do with perfect information, and the real-time mode what
// it does through the real transport.
func RunVirtual(ctx context.Context, policy string, fo FleetOptions, w Workload, o RunOptions) (Result, error) {
	v, err := newVirtualRun(policy, fo, o.Seed, o.Record)
	if err != nil {
		return Result{}, err
	}
	defer v.close()
	if v.eppSrv != nil {
		setObjectives(v.eppSrv, w)
	}
	res, err := v.run(ctx, w, o)
	if err == nil && v.eppSrv != nil {
		if a, ok := predictorAccuracy(v.eppSrv.Registry()); ok {
			res.Predictor = &a
		}
	}
	return res, err
}

type virtualRun struct {
	clock    *virtualClock
	replicas []*sim.Core
	addrs    map[string]int
	// ranks, for a fleet of data-parallel engines, are each engine's
	// replicas by rank, indexed by the engine's first replica.
	ranks map[int][]int
	// Exactly one of these picks.
	router router
	eppSrv *epp.EPP
	dir    director.Handler
	// evictions sits between each engine and the index.
	evictions []*evictionCounter
}

// virtualClock is the run's time: a fixed origin plus the simulated time
// elapsed, so that the index's speculative holdings expire in virtual time.
type virtualClock struct {
	mu   sync.Mutex
	base time.Time
	now  time.Duration
}

func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(c.now)
}

func (c *virtualClock) set(d time.Duration) {
	c.mu.Lock()
	c.now = d
	c.mu.Unlock()
}

func newVirtualRun(policy string, fo FleetOptions, seed uint64, record func(predict.Sample)) (*virtualRun, error) {
	if upstreamBinary(policy) {
		return nil, fmt.Errorf("loadgen: %s runs the upstream binary, in real time only", policy)
	}
	v := &virtualRun{clock: &virtualClock{base: time.Unix(1e9, 0)}, addrs: map[string]int{}}
	if viaEPP(policy) {
		e, err := epp.New(epp.Options{
			Pool: "kvsim", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			ConfigText: eppConfig(policy), NoRecovery: true, Seed: seed, Engine: fo.engineLimits(),
			Prefix: prefixmatch.Params{DefaultBlockSizeTokens: fo.Pool.BlockSize},
			Index:  index.Options{Now: v.clock.Now},
			// The request path is timed by the run's clock, and the
			// predictor learns each response as it ends, so that a run
			// repeats exactly.
			Now:         v.clock.Now,
			Predict:     epp.PredictOptions{Synchronous: true, Record: record},
			RequestPath: epp.RequestPathOptions{NoRankPick: policy == PolicyDPVLLMBalance},
			Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			return nil, fmt.Errorf("loadgen: EPP: %w", err)
		}
		v.eppSrv, v.dir = e, e.Director()
	}
	fc := fo.fleetConfig(seed)
	// The engines' clock, by which a family's silence ends.
	fc.Pool.Now = v.clock.Now
	ranks := max(fo.DataParallel, 1)
	for i := range max(fo.Engines, 1) {
		// The real-time fleet's engines, at addresses nothing listens on.
		ec := fc.EngineConfig(i, fmt.Sprintf("10.0.0.%d:8000", i+1))
		if v.eppSrv != nil {
			v.eppSrv.Datastore().Upsert(&datalayer.Endpoint{Name: ec.Pod, Address: ec.Address, Pod: ec.Pod, Model: fo.Model})
		}
		v.addrs[ec.Address] = len(v.replicas)
		first := len(v.replicas)
		for rank := range ranks {
			rc := ec
			if ranks > 1 {
				// As sim.StartFleet makes a data-parallel engine's ranks.
				rc.Pool.DPRank = rank
				rc.Pool.Seed = ec.Pool.Seed*sim.MaxDPRanks + uint64(rank)
				if v.ranks == nil {
					v.ranks = map[int][]int{}
				}
				v.ranks[first] = append(v.ranks[first], len(v.replicas))
			}
			ev := &evictionCounter{}
			if v.eppSrv != nil && policy != PolicyApproxEPP {
				// The approximate policy's EPP hears no events: that is the point.
				ev.next = v.eppSrv.Index()
			}
			rc.Sink = ev
			v.evictions = append(v.evictions, ev)
			v.replicas = append(v.replicas, sim.NewCore(sim.NewEngine(rc, nil), fc.TimingOf(i)))
		}
	}
	if v.eppSrv == nil {
		// Virtual time has no hop to pay for: no proxy.
		r, err := newDirect(policy, v.replicas, "", fo.Model, seed, v.clock.Now)
		if err != nil {
			return nil, err
		}
		v.router = r
	}
	return v, nil
}

func (v *virtualRun) close() {
	if v.eppSrv != nil {
		v.eppSrv.Close()
	}
}

// pick chooses the replica for a parsed request; p is the EPP's pick,
// when the EPP picked.
func (v *virtualRun) pick(ctx context.Context, path string, body []byte, headers map[string]string) (i int, tokens []uint32, p *director.Pick, err error) {
	req, err := openai.ParseRequest(path, body)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("loadgen: own request refused: %w", err)
	}
	if tokens, err = engineTokens(ctx, req); err != nil {
		return 0, nil, nil, fmt.Errorf("loadgen: own request: %w", err)
	}
	if v.dir == nil {
		_, endpoint := v.router.route(req.Prompt, tokens)
		return v.addrs[endpoint], tokens, nil, nil
	}
	ds := v.eppSrv.Datastore()
	for _, first := range v.addrs {
		r := v.replicas[first]
		if r.Engine().MetricsSilent() {
			continue // as a scrape would find nothing
		}
		cfg := r.Engine().Config()
		// Wall-clock stamped: the scorers judge staleness by the wall clock.
		m := datalayer.Metrics{BlockSize: cfg.Pool.BlockSize, NumGPUBlocks: cfg.Pool.GPUBlocks, UpdateTime: time.Now()}
		ranks := v.ranksOf(first)
		for _, j := range ranks {
			// A data-parallel server's page: its ranks summed, their
			// usage averaged, and one cache_config_info series each.
			waiting, running := v.replicas[j].Load()
			m.WaitingQueueSize += waiting
			m.RunningRequests += running
			m.KVCacheUsage += v.replicas[j].Engine().Usage() / float64(len(ranks))
		}
		if len(ranks) > 1 {
			m.DataParallelRanks = len(ranks)
		}
		ds.SetMetrics(cfg.Pod, m)
	}
	req.TokenIDs = tokens // as the engines' /tokenize would answer
	req.Headers = headers
	p, err = v.dir.Route(ctx, req, nil)
	if err != nil {
		return 0, tokens, nil, err
	}
	i, ok := v.addrs[p.Targets[0]]
	if !ok {
		return 0, nil, nil, fmt.Errorf("loadgen: picked %s, no engine's address", p.Targets[0])
	}
	return v.rank(i, p.Rank), tokens, p, nil
}

// ranksOf are the replicas of the engine whose first replica is first,
// by rank.
func (v *virtualRun) ranksOf(first int) []int {
	if rs := v.ranks[first]; len(rs) > 0 {
		return rs
	}
	return []int{first}
}

// rank is the replica a request for the engine whose first replica is
// first runs on, as its API server places it (sim's dp.go): the rank the
// pick names, else the least of waiting*4 + running.
func (v *virtualRun) rank(first, named int) int {
	rs := v.ranksOf(first)
	if named >= 0 && named < len(rs) {
		return rs[named]
	}
	best, bestScore := rs[0], 0
	for k, j := range rs {
		waiting, running := v.replicas[j].Load()
		if score := 4*waiting + running; k == 0 || score < bestScore {
			best, bestScore = j, score
		}
	}
	return best
}

// vreq is a request in flight in virtual time.
type vreq struct {
	conv    *vconv
	seq     *sim.Seq
	sample  Sample
	started time.Duration
	out     int
	// pick is the EPP's, whose response path the run plays out.
	pick      *director.Pick
	firstByte time.Time
}

// vconv is a conversation: its turns so far and their replies.
type vconv struct {
	conv    Conversation
	turn    int
	replies []string
}

type vevent struct {
	at      time.Duration
	order   uint64 // ties go first in, first out
	replica int    // a step's end when conv is nil
	conv    *vconv // an arrival of conv's next turn
	step    time.Duration
}

type vqueue []vevent

func (q vqueue) Len() int { return len(q) }
func (q vqueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].order < q[j].order
}
func (q vqueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *vqueue) Push(x any)   { *q = append(*q, x.(vevent)) }
func (q *vqueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func (v *virtualRun) run(ctx context.Context, w Workload, o RunOptions) (Result, error) {
	var (
		q       vqueue
		order   uint64
		now     time.Duration
		busy    = make([]bool, len(v.replicas))
		flight  = make([][]*vreq, len(v.replicas))
		samples []Sample
		end     = o.Duration + o.Drain
	)
	push := func(e vevent) {
		order++
		e.order = order
		heap.Push(&q, e)
	}
	// Arrivals as in real time: the same generator, seeds and gaps.
	gen := newGenerator(w, o.Seed)
	arrivals := rand.New(rand.NewPCG(o.Seed, 0xa771))
	convRate := o.Rate / w.meanTurns()
	for t := time.Duration(0); ; {
		t += time.Duration(arrivals.ExpFloat64() / convRate * float64(time.Second))
		if t >= o.Duration {
			break
		}
		push(vevent{at: t, conv: &vconv{conv: gen.next()}})
	}

	step := func(i int) {
		if busy[i] {
			return
		}
		work, ok := v.replicas[i].Plan()
		v.collect(i, now, flight, &samples, push, o)
		if !ok {
			return
		}
		busy[i] = true
		d := v.replicas[i].Timing().Step(work)
		v.replicas[i].Stepping(v.clock.base.Add(now + d))
		push(vevent{at: now + d, replica: i, step: d})
	}
	for q.Len() > 0 {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		e := heap.Pop(&q).(vevent)
		if e.at > end {
			break
		}
		now = e.at
		v.clock.set(now)
		if e.conv == nil {
			if err := v.replicas[e.replica].Finish(e.step); err != nil {
				return Result{}, fmt.Errorf("loadgen: %w", err)
			}
			busy[e.replica] = false
			v.collect(e.replica, now, flight, &samples, push, o)
			step(e.replica)
			continue
		}
		c := e.conv
		if c.turn > 0 && now >= o.Duration {
			continue // the run's arrivals are over
		}
		path, body, err := c.conv.body(o.Model, c.turn, c.replies, o.MaxTokens)
		if err != nil {
			return Result{}, err
		}
		i, tokens, pick, err := v.pick(ctx, path, body, c.conv.headers())
		r := &vreq{conv: c, started: now, pick: pick, sample: Sample{Start: now, PromptTokens: len(tokens), SLO: c.conv.SLO, Engine: -1}}
		if err != nil {
			if director.StatusOf(err) == http.StatusTooManyRequests {
				r.sample.Shed = true
			} else {
				r.sample.Err = err
			}
			samples = append(samples, r.sample)
			continue
		}
		r.seq, err = v.replicas[i].Submit(blockpool.Request{Tokens: tokens}, o.MaxTokens)
		if err != nil {
			return Result{}, fmt.Errorf("loadgen: %w", err)
		}
		r.sample.Engine = i
		flight[i] = append(flight[i], r)
		step(i)
	}
	// What is still in flight at the cut is counted with its time so far.
	for i := range flight {
		for _, r := range flight[i] {
			r.sample.Cut = true
			if r.sample.TTFT == 0 {
				r.sample.TTFT = end - r.started
			}
			r.sample.E2E = end - r.started
			samples = append(samples, r.sample)
		}
	}
	evicted := make([]int, len(v.evictions))
	for i, e := range v.evictions {
		evicted[i] = e.n
	}
	return Result{Samples: samples, Makespan: min(now, end), Evicted: evicted}, nil
}

// evictionCounter counts the GPU blocks an engine's batches remove, and
// passes every batch on.
type evictionCounter struct {
	next events.Sink
	n    int
}

func (c *evictionCounter) Apply(o events.Origin, b *events.Batch) {
	for i := range b.Events {
		if e := &b.Events[i]; e.Kind == events.KindBlockRemoved && e.Medium == events.TierGPU {
			c.n += len(e.BlockHashes)
		}
	}
	if c.next != nil {
		c.next.Apply(o, b)
	}
}

func (c *evictionCounter) Uncertain(s events.Stream, r events.Reason) {
	if c.next != nil {
		c.next.Uncertain(s, r)
	}
}

func (c *evictionCounter) Restart(s events.Stream) {
	if c.next != nil {
		c.next.Restart(s)
	}
}

// collect takes the tokens replica i's sequences produced, records the
// requests that ended, and schedules their conversations' next turns.
func (v *virtualRun) collect(i int, now time.Duration, flight [][]*vreq, samples *[]Sample, push func(vevent), o RunOptions) {
	kept := flight[i][:0]
	for _, r := range flight[i] {
		done := false
	drain:
		for {
			select {
			case t, ok := <-r.seq.Tokens:
				if !ok {
					done = true
					break drain
				}
				if t.Err != nil {
					r.sample.Err = t.Err
					done = true
					break drain
				}
				if t.Done {
					done = true
					break drain
				}
				if r.out == 0 {
					r.sample.TTFT = now - r.started
					if r.pick != nil {
						r.firstByte = v.clock.base.Add(now)
						v.dir.HandleFirstByte(r.pick)
					}
				}
				r.out++
				if r.pick != nil {
					v.dir.HandleProgress(r.pick, r.out)
				}
			default:
				break drain
			}
		}
		if !done {
			kept = append(kept, r)
			continue
		}
		r.sample.E2E = now - r.started
		r.sample.CachedTokens, r.sample.OutputTokens = r.seq.Cached(), r.out
		*samples = append(*samples, r.sample)
		if r.pick != nil {
			status := http.StatusOK
			if r.sample.Err != nil {
				status = http.StatusServiceUnavailable
			}
			v.dir.HandleResponse(r.pick, director.Served{
				Endpoint: r.pick.Targets[0], Status: status, Streamed: true,
				FirstByte: r.firstByte, End: v.clock.base.Add(now),
				Usage: openai.Usage{PromptTokens: r.seq.PromptTokens(), CompletionTokens: r.out, CachedTokens: r.seq.Cached()},
			})
		}
		if r.sample.Err != nil && errors.Is(r.sample.Err, sim.ErrStopped) {
			continue
		}
		c := r.conv
		if r.sample.Err == nil && c.turn+1 < len(c.conv.Users) {
			c.replies = append(c.replies, sim.ReplyText(r.out))
			c.turn++
			push(vevent{at: now + o.ThinkTime, conv: c})
		}
	}
	clear(flight[i][len(kept):])
	flight[i] = kept
}
