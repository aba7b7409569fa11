package chaos

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/request"
)

// Replica is one EPP, built by epp.New as cmd/epp builds it, consuming the
// world's subjects.
type Replica struct {
	Name   string
	EPP    *epp.EPP
	cancel context.CancelFunc
	done   chan error
}

// ReplicaOptions tune one replica.
type ReplicaOptions struct {
	// Consumer tunes its event consumer (a slow consumer, say).
	Consumer consumer.Options
	// ReadyGrace is the replica's (epp.Options.ReadyGrace).
	ReadyGrace time.Duration
}

// StartReplica starts an EPP that knows every pod of the world and
// consumes their events, and waits until it is ready.
func (w *World) StartReplica(name string, o ReplicaOptions) (*Replica, error) {
	r, err := w.launchReplica(name, o)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for !r.EPP.Ready() {
		if time.Now().After(deadline) {
			r.Stop()
			return nil, fmt.Errorf("chaos: replica %s never became ready", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return r, nil
}

// launchReplica starts the replica without waiting for it to be ready.
func (w *World) launchReplica(name string, o ReplicaOptions) (*Replica, error) {
	e, err := epp.New(epp.Options{
		NATSURL: w.URL(), Namespace: Namespace, Pool: PoolName, HTTPAddr: "127.0.0.1:0",
		// The client's own prints of the slow consumers the matrix makes
		// on purpose; the consumer counts them.
		NATSOptions: []nats.Option{nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})},
		Consumer:    o.Consumer, ReadyGrace: o.ReadyGrace,
		Recovery: recovery.Options{MinBackoff: 20 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, Timeout: 3 * time.Second},
		Logger:   w.opts.Logger.With("epp", name),
	})
	if err != nil {
		return nil, fmt.Errorf("chaos: replica %s: %w", name, err)
	}
	for _, p := range w.Pods {
		e.Datastore().Upsert(&datalayer.Endpoint{Name: p.Name, Address: p.Addr, Pod: p.Name, Namespace: Namespace, Model: Model})
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Replica{Name: name, EPP: e, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- e.Run(ctx) }()
	return r, nil
}

// Stop stops the replica. Its index lives in memory only, so as far as its
// state goes a stop is a crash.
func (r *Replica) Stop() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	return <-r.done
}

// Picks are what a replica's picks said while a scenario ran.
type Picks struct {
	// Total picks, and those by the trust state of the picked endpoint's
	// answer.
	Total   int
	ByState map[datalayer.StreamState]int
	// Overclaimed picks credited the picked endpoint with more blocks
	// (speculation aside) than its engine held at that moment.
	Overclaimed int
}

func (p *Picks) add(q Picks) {
	p.Total += q.Total
	p.Overclaimed += q.Overclaimed
	if p.ByState == nil {
		p.ByState = map[datalayer.StreamState]int{}
	}
	for s, n := range q.ByState {
		p.ByState[s] += n
	}
}

// ServeVia runs n requests, each a random prompt, picked by the replicas in
// turn and served by the engine picked, as a gateway's traffic would be.
func (w *World) ServeVia(n int, replicas []*Replica) (Picks, error) {
	picks := Picks{ByState: map[datalayer.StreamState]int{}}
	if len(replicas) == 0 {
		return picks, w.Serve(n)
	}
	byAddr := map[string]*Pod{}
	for _, p := range w.Pods {
		byAddr[p.Addr] = p
	}
	ctx := context.Background()
	for i := range n {
		prompt := w.prompts[w.rng.IntN(len(w.prompts))]
		r := replicas[i%len(replicas)]
		pick, err := r.EPP.Director().Route(ctx, &request.Request{Model: Model, TokenIDs: prompt.Tokens}, nil)
		if err != nil {
			return picks, fmt.Errorf("chaos: %s picks: %w", r.Name, err)
		}
		target := pick.Result.Targets()[0]
		pod := byAddr[target.Address]
		if info, ok := datalayer.PrefixCacheInfoOf(target); ok {
			picks.ByState[info.State]++
			held := 0
			for _, b := range info.BlocksByTier {
				held += b
			}
			if held > pod.Engine.Held(prompt).Blocks {
				picks.Overclaimed++
			}
		}
		picks.Total++
		prompt.ID = ""
		if _, err := pod.Engine.Serve(prompt); err != nil {
			return picks, err
		}
		if i%8 == 7 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	return picks, nil
}

// PodView is one replica's view of one pod, beside the engine's truth.
type PodView struct {
	Pod   string
	State datalayer.StreamState
	Diff  simkit.HoldingsDiff
	// holdings are the replica's, to compare replicas.
	holdings map[uint64]uint8
}

// View compares a replica's index with every engine's ground truth over
// all the blocks it holds.
func (w *World) View(r *Replica) ([]PodView, error) {
	out := make([]PodView, 0, len(w.Pods))
	for _, p := range w.Pods {
		truth, err := simkit.TrueHoldings(p.Engine)
		if err != nil {
			return nil, err
		}
		h := r.EPP.Index().Holdings(p.Addr)
		st, _ := r.EPP.Index().State(p.Addr)
		out = append(out, PodView{Pod: p.Name, State: st, Diff: simkit.DiffHoldings(truth, h), holdings: h})
	}
	return out, nil
}

// SameAnswers reports whether two replicas' views hold the same blocks in
// the same tiers and states for every pod, which is when they answer
// every (prompt, endpoint) question alike.
func SameAnswers(a, b []PodView) (bool, string) {
	if len(a) != len(b) {
		return false, "different pods"
	}
	for i := range a {
		if a[i].State != b[i].State {
			return false, fmt.Sprintf("%s: %s on one replica, %s on the other", a[i].Pod, a[i].State, b[i].State)
		}
		if !maps.Equal(a[i].holdings, b[i].holdings) {
			return false, fmt.Sprintf("%s: %d holdings on one replica, %d on the other", a[i].Pod, len(a[i].holdings), len(b[i].holdings))
		}
	}
	return true, ""
}
