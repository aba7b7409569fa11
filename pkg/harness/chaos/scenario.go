package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
)

// Outcome is what a scenario must end in, pod by pod.
type Outcome uint8

const (
	// Exact: the index equals the engine's truth over every block, and the
	// stream reads exact.
	Exact Outcome = iota
	// Partial: no block the index claims is false, and the stream reads
	// partial (a late join: what came before is not to be had).
	Partial
	// Honest: the loss could not be made good (batches lost with no replay
	// ring to recover them), so the index may differ from the engine, but
	// its state must say so: uncertain if it holds anything false, partial
	// or uncertain if it misses anything.
	Honest
)

func (o Outcome) String() string {
	switch o {
	case Exact:
		return "exact"
	case Partial:
		return "partial"
	}
	return "honest"
}

// Scenario is one row of the fault matrix.
type Scenario struct {
	Name string
	// What says, for the report, what the fault does.
	What  string
	World WorldOptions
	// Replicas are the EPP replicas' options; two by default.
	Replicas []ReplicaOptions
	// Inject breaks the world while traffic flows (Run.Serve); it returns
	// when the fault is over.
	Inject func(r *Run) error
	// Expect is the outcome each pod must reach (Exact when nil).
	Expect func(pod int) Outcome
	// Quiet: no traffic after the fault, so that no later batch can show
	// what was lost (a lost tail).
	Quiet bool
}

// Run is a scenario under way: the world, the replicas, and what the
// picks said meanwhile.
type Run struct {
	W        *World
	Replicas []*Replica
	opts     []ReplicaOptions
	picks    Picks
	peak     int
	logger   *slog.Logger
}

// Serve runs n requests through the replicas' picks, counting the picks
// and the index's worst false claim meanwhile.
func (r *Run) Serve(n int) error {
	for n > 0 {
		k := min(n, 10)
		p, err := r.W.ServeVia(k, r.live())
		r.picks.add(p)
		if err != nil {
			return err
		}
		n -= k
		if err := r.sample(); err != nil {
			return err
		}
	}
	return nil
}

// live are the replicas running.
func (r *Run) live() []*Replica {
	var out []*Replica
	for _, rp := range r.Replicas {
		if rp.cancel != nil {
			out = append(out, rp)
		}
	}
	return out
}

func (r *Run) sample() error {
	for _, rp := range r.live() {
		v, err := r.W.View(rp)
		if err != nil {
			return err
		}
		f := 0
		for _, pv := range v {
			f += pv.Diff.False + pv.Diff.WrongTier
		}
		r.peak = max(r.peak, f)
	}
	return nil
}

// servePod runs n random prompts on one pod's engine, around the pickers.
func (r *Run) servePod(p *Pod, n int) error {
	for range n {
		req := r.W.prompts[r.W.rng.IntN(len(r.W.prompts))]
		req.ID = ""
		if _, err := p.Engine.Serve(req); err != nil {
			return err
		}
	}
	return nil
}

// Crash stops replica i and starts another in its place, whose index
// starts empty.
func (r *Run) Crash(i int) error {
	if err := r.Replicas[i].Stop(); err != nil {
		return err
	}
	rp, err := r.W.StartReplica(r.Replicas[i].Name+"'", r.opts[i])
	if err != nil {
		return err
	}
	r.Replicas[i] = rp
	return nil
}

// Until serves traffic until cond holds (bounded), as engines keep
// stepping while a fault runs its course.
func (r *Run) Until(what string, cond func() bool) error {
	return r.until(what, cond, func() error { return r.Serve(3) })
}

// UntilOn is Until with the traffic sent to pod p itself, for what only
// p's own batches can bring about: the picks may all go to other pods (a
// restarted engine's empty cache draws none).
func (r *Run) UntilOn(p *Pod, what string, cond func() bool) error {
	return r.until(what, cond, func() error { return r.servePod(p, 3) })
}

func (r *Run) until(what string, cond func() bool, serve func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %s never happened", what)
		}
		if err := serve(); err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// Wait waits, without traffic, until cond holds (bounded).
func (r *Run) Wait(what string, cond func() bool) error {
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %s never happened", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// Result is what a scenario measured.
type Result struct {
	Scenario Scenario
	// Converged says whether every pod reached its outcome on every
	// replica, and the replicas answer alike, within the bound; Converge is
	// how long after the fault ended that took.
	Converged bool
	Converge  time.Duration
	// False and Missing are the holdings, summed over pods and replicas at
	// the end, that the index claimed and the engine did not have, and that
	// the engine had and the index did not. PeakFalse is the largest sum of
	// false holdings seen on one replica while the fault ran.
	False, Missing, PeakFalse int
	// Held is the blocks the engines held at the end, per replica's view.
	Held int
	// States counts (pod, replica) pairs by their stream state at the end.
	States map[datalayer.StreamState]int
	// Picks are the picks made from the fault's start to convergence.
	Picks Picks
	// Agree says the replicas answer alike at the end.
	Agree bool
	// Detail says what did not converge, if anything.
	Detail string
	Err    error
}

// ConvergeLimit bounds the wait for a scenario to settle.
const ConvergeLimit = 30 * time.Second

// RunScenario builds a world and its replicas, warms them up until every
// replica is exact, injects the fault with traffic flowing, serves a
// little more traffic after it (as engines go on stepping), and measures
// how the replicas settle.
func RunScenario(ctx context.Context, s Scenario, logger *slog.Logger) Result {
	res := Result{Scenario: s, States: map[datalayer.StreamState]int{}}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	wo := s.World
	wo.Logger = logger
	w, err := NewWorld(wo)
	if err != nil {
		res.Err = err
		return res
	}
	defer w.Close()
	opts := s.Replicas
	if len(opts) == 0 {
		opts = []ReplicaOptions{{}, {}}
	}
	run := &Run{W: w, opts: opts, logger: logger}
	defer func() {
		for _, rp := range run.Replicas {
			_ = rp.Stop()
		}
	}()
	for i, o := range opts {
		rp, err := w.StartReplica(fmt.Sprintf("epp-%c", 'a'+i), o)
		if err != nil {
			res.Err = err
			return res
		}
		run.Replicas = append(run.Replicas, rp)
	}
	if err := w.Serve(120); err != nil {
		res.Err = err
		return res
	}
	if ok, detail := run.settle(func(int) Outcome { return Exact }, ConvergeLimit); !ok {
		res.Err = fmt.Errorf("chaos: the replicas never converged before the fault: %s", detail)
		return res
	}
	run.picks, run.peak = Picks{ByState: map[datalayer.StreamState]int{}}, 0
	if err := ctx.Err(); err != nil {
		res.Err = err
		return res
	}
	if err := s.Inject(run); err != nil {
		res.Err = err
		return res
	}
	end := time.Now()
	if !s.Quiet {
		if err := run.Serve(30); err != nil {
			res.Err = err
			return res
		}
	}
	expect := s.Expect
	if expect == nil {
		expect = func(int) Outcome { return Exact }
	}
	res.Converged, res.Detail = run.settle(expect, ConvergeLimit)
	res.Converge = time.Since(end)
	res.Picks, res.PeakFalse = run.picks, run.peak
	// The end state is read once the replicas agree (bounded): a stream
	// left honestly uncertain is still resynced now and then, and one
	// replica may be in the middle of it while the other is not.
	deadline, settled := time.Now().Add(5*time.Second), res.Detail
	for {
		res.Detail = settled
		if err := run.readEnd(&res); err != nil {
			res.Err = err
			return res
		}
		if res.Agree || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return res
}

// readEnd reads the end state of every replica into res.
func (r *Run) readEnd(res *Result) error {
	res.False, res.Missing, res.Held = 0, 0, 0
	res.States = map[datalayer.StreamState]int{}
	var views [][]PodView
	for _, rp := range r.Replicas {
		v, err := r.W.View(rp)
		if err != nil {
			return err
		}
		views = append(views, v)
		for _, pv := range v {
			res.False += pv.Diff.False + pv.Diff.WrongTier
			res.Missing += pv.Diff.Missing
			res.Held += pv.Diff.Held
			res.States[pv.State]++
		}
	}
	res.Agree = true
	for _, v := range views[1:] {
		if ok, d := SameAnswers(views[0], v); !ok {
			res.Agree = false
			if res.Detail == "" {
				res.Detail = d
			}
		}
	}
	return nil
}

// settle waits until every pod meets its outcome on every replica and the
// replicas answer alike; it returns what was still wrong if the limit
// passed first.
func (r *Run) settle(expect func(int) Outcome, limit time.Duration) (bool, string) {
	deadline := time.Now().Add(limit)
	for {
		detail, err := r.unsettled(expect)
		if err != nil {
			return false, err.Error()
		}
		if detail == "" {
			return true, ""
		}
		if time.Now().After(deadline) {
			return false, detail
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *Run) unsettled(expect func(int) Outcome) (string, error) {
	// A stream that stays honestly uncertain keeps a resync due, at the
	// longest backoff; one that must heal has none left.
	healing := true
	for i := range r.W.Pods {
		if expect(i) == Honest {
			healing = false
		}
	}
	var first []PodView
	for k, rp := range r.Replicas {
		v, err := r.W.View(rp)
		if err != nil {
			return "", err
		}
		for i, pv := range v {
			if d := meets(expect(i), pv); d != "" {
				return fmt.Sprintf("%s on %s: %s", pv.Pod, rp.Name, d), nil
			}
		}
		if k == 0 {
			first = v
		} else if ok, d := SameAnswers(first, v); !ok {
			return d, nil
		}
		if n := rp.EPP.Recovery().Pending(); healing && n != 0 {
			return fmt.Sprintf("%s has %d resyncs pending", rp.Name, n), nil
		}
	}
	return "", nil
}

// meets says what keeps a pod's view from its outcome ("" when nothing).
func meets(o Outcome, pv PodView) string {
	d := pv.Diff
	switch o {
	case Exact:
		if pv.State != datalayer.StreamExact || !d.Exact() {
			return fmt.Sprintf("%s, %s", pv.State, d)
		}
	case Partial:
		if pv.State != datalayer.StreamPartial || d.False != 0 || d.WrongTier != 0 {
			return fmt.Sprintf("%s, %s", pv.State, d)
		}
	case Honest:
		if (d.False != 0 || d.WrongTier != 0) && pv.State != datalayer.StreamUncertain {
			return fmt.Sprintf("%s while %d holdings are false", pv.State, d.False+d.WrongTier)
		}
		if d.Missing != 0 && !(pv.State == datalayer.StreamUncertain || pv.State == datalayer.StreamPartial) {
			return fmt.Sprintf("%s while %d holdings are missing", pv.State, d.Missing)
		}
	}
	return ""
}

// Metric sums a registry's series of one name whose labels include the
// given name, value pairs: what the rigs of pkg/sim read counters with.
func Metric(g prometheus.Gatherer, name string, labels ...string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return v
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Scenarios is the fault matrix, in the order the report shows it.
func Scenarios() []Scenario {
	resyncAll := func(r *Run, rp *Replica) {
		for _, p := range r.W.Pods {
			rp.EPP.Recovery().Resync(events.Stream{Endpoint: p.Addr})
		}
	}
	return []Scenario{
		{
			Name: "baseline", What: "no fault: what events in flight alone make the index lag by",
			Inject: func(r *Run) error { return r.Serve(60) },
		},
		{
			Name: "nats-restart", What: "the NATS server restarts under traffic",
			Inject: func(r *Run) error {
				if err := r.W.RestartNATS(); err != nil {
					return err
				}
				return r.Serve(60)
			},
		},
		{
			Name: "nats-cluster-members", What: "NATS is a 3-node cluster; each member in turn is killed under traffic and comes back",
			World: WorldOptions{Cluster: 3},
			Inject: func(r *Run) error {
				reconnects := func(rp *Replica) float64 {
					return Metric(rp.EPP.Registry(), "kvroute_events_uncertain_total", "reason", events.ReasonReconnect.String())
				}
				before := make([]float64, len(r.Replicas))
				for k, rp := range r.Replicas {
					before[k] = reconnects(rp)
				}
				for i := range r.W.Members {
					r.W.KillMember(i)
					if err := r.Serve(30); err != nil {
						return err
					}
					if err := r.W.StartMember(i); err != nil {
						return err
					}
					if err := r.W.awaitRoutes(); err != nil {
						return err
					}
					if err := r.Serve(20); err != nil {
						return err
					}
				}
				// Every member was down once, so every client was on a
				// member that died and must have moved to another.
				for k, rp := range r.Replicas {
					if reconnects(rp) == before[k] {
						return fmt.Errorf("chaos: replica %s never reconnected to another member", rp.Name)
					}
				}
				for _, p := range r.W.Pods {
					if p.relayNC.Stats().Reconnects == 0 {
						return fmt.Errorf("chaos: relay %s never reconnected to another member", p.Name)
					}
				}
				return nil
			},
		},
		{
			Name: "relay-restart", What: "a relay restarts, its engine busy meanwhile; the replay ring fills its downtime",
			Inject: func(r *Run) error {
				p := r.W.Pods[0]
				if err := r.W.StopRelay(p); err != nil {
					return err
				}
				if err := r.W.Serve(20); err != nil {
					return err
				}
				if err := r.W.StartRelay(p); err != nil {
					return err
				}
				return r.Serve(40)
			},
		},
		{
			Name: "relay-restart-no-replay", What: "a relay without a replay ring restarts while its engine is quiet",
			World: WorldOptions{NoReplay: true},
			Inject: func(r *Run) error {
				if err := r.W.RestartRelay(r.W.Pods[0]); err != nil {
					return err
				}
				return r.Serve(60)
			},
		},
		{
			Name: "relay-crash-no-replay-busy", What: "a relay without a replay ring is down while its engine serves: the batches are gone",
			World:  WorldOptions{NoReplay: true},
			Expect: func(int) Outcome { return Honest },
			Inject: func(r *Run) error {
				p := r.W.Pods[0]
				if err := r.W.StopRelay(p); err != nil {
					return err
				}
				if err := r.servePod(p, 20); err != nil {
					return err
				}
				if err := r.W.StartRelay(p); err != nil {
					return err
				}
				return r.Serve(40)
			},
		},
		{
			Name: "relay-restart-stateless", What: "a relay with no state directory restarts: a new instance, rebuilt from the replay ring",
			Inject: func(r *Run) error {
				p := r.W.Pods[0]
				p.Stateless = true
				if err := r.W.RestartRelay(p); err != nil {
					return err
				}
				return r.Serve(60)
			},
		},
		{
			Name: "epp-crash-mid-resync", What: "the relays are cut off, an EPP asks for snapshots and crashes before they come",
			World: WorldOptions{Proxied: true},
			Inject: func(r *Run) error {
				r.W.Proxy.Paused.Store(true)
				if err := r.Serve(20); err != nil {
					return err
				}
				a := r.Replicas[0]
				resyncAll(r, a)
				if err := r.Wait("the resyncs to be under way", func() bool {
					return Metric(a.EPP.Registry(), "kvroute_recovery_in_flight") == float64(len(r.W.Pods))
				}); err != nil {
					return err
				}
				if err := r.Crash(0); err != nil {
					return err
				}
				r.W.Proxy.Paused.Store(false)
				return r.Serve(20)
			},
		},
		{
			Name: "engine-restart", What: "an engine restarts: empty cache, seq from 0",
			Inject: func(r *Run) error {
				p := r.W.Pods[1]
				if err := r.W.RestartEngine(p); err != nil {
					return err
				}
				if err := r.UntilOn(p, "the relay to see the restart", func() bool {
					return Metric(p.RelayMetrics, "kvroute_relay_engine_restarts_total") > 0
				}); err != nil {
					return err
				}
				return r.Serve(40)
			},
		},
		{
			Name: "late-join", What: "a new relay and a new EPP join an engine that has served for a while, with no replay ring",
			World:  WorldOptions{NoReplay: true},
			Expect: func(pod int) Outcome { return map[bool]Outcome{true: Partial, false: Exact}[pod == 0] },
			Inject: func(r *Run) error {
				p := r.W.Pods[0]
				if err := r.W.StopRelay(p); err != nil {
					return err
				}
				p.StateDir += "-new" // a new pod's volume
				if err := r.W.Serve(40); err != nil {
					return err
				}
				if err := r.W.StartRelay(p); err != nil {
					return err
				}
				for i := range r.Replicas {
					if err := r.Crash(i); err != nil {
						return err
					}
				}
				// The engine goes on serving (traffic from elsewhere too),
				// so that its new relay has something to relay.
				if err := r.servePod(p, 10); err != nil {
					return err
				}
				return r.Serve(40)
			},
		},
		{
			Name: "dropped-batches", What: "one publish in five on the way to NATS is lost",
			World: WorldOptions{Proxied: true},
			Inject: func(r *Run) error {
				r.W.Proxy.Every.Store(5)
				err := r.Serve(150)
				r.W.Proxy.Every.Store(0)
				return err
			},
		},
		{
			Name: "slow-consumer", What: "one EPP cannot keep up: its NATS client drops what it cannot hold",
			Replicas: []ReplicaOptions{{}, {Consumer: consumer.Options{Workers: 1, QueueLen: 1, PendingLimit: 2}}},
			Inject: func(r *Run) error {
				// A burst with no pause overruns the tiny pending limit.
				for range 3 {
					for _, p := range r.W.Pods {
						for _, req := range r.W.prompts {
							req.ID = ""
							if _, err := p.Engine.Serve(req); err != nil {
								return err
							}
						}
					}
				}
				return r.Serve(30)
			},
		},
		{
			Name: "lost-tail", What: "a burst's batches are all lost, then every engine falls quiet: only heartbeats can tell",
			World: WorldOptions{Proxied: true}, Quiet: true,
			Inject: func(r *Run) error {
				// Batches are lost from here to the end; heartbeats and
				// snapshots pass. The engines fall quiet after the burst, so
				// nothing but a heartbeat can show the loss.
				r.W.Proxy.DropBatches.Store(true)
				return r.Serve(30)
			},
		},
		{
			Name: "nats-and-relay-restart", What: "two at once: NATS restarts while a relay is down",
			Inject: func(r *Run) error {
				p := r.W.Pods[2]
				if err := r.W.StopRelay(p); err != nil {
					return err
				}
				if err := r.W.RestartNATS(); err != nil {
					return err
				}
				if err := r.W.Serve(15); err != nil {
					return err
				}
				if err := r.W.StartRelay(p); err != nil {
					return err
				}
				return r.Serve(40)
			},
		},
		{
			Name: "engine-restart-and-drops", What: "two at once: an engine restarts while one publish in four is lost",
			World: WorldOptions{Proxied: true},
			Inject: func(r *Run) error {
				r.W.Proxy.Every.Store(4)
				p := r.W.Pods[1]
				err := r.W.RestartEngine(p)
				if err == nil {
					err = r.UntilOn(p, "the relay to see the restart", func() bool {
						return Metric(p.RelayMetrics, "kvroute_relay_engine_restarts_total") > 0
					})
				}
				if err == nil {
					err = r.Serve(60)
				}
				r.W.Proxy.Every.Store(0)
				return err
			},
		},
	}
}

// RunAll runs every scenario in turn, within limit overall.
func RunAll(ctx context.Context, limit time.Duration, logger *slog.Logger) ([]Result, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var out []Result
	for _, s := range Scenarios() {
		if err := ctx.Err(); err != nil {
			return out, errors.Join(fmt.Errorf("chaos: stopped before %s", s.Name), err)
		}
		out = append(out, RunScenario(ctx, s, logger))
	}
	return out, nil
}
