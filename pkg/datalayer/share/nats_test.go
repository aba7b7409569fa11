package share_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/share"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// replica is a datastore of two endpoints and its Sharer on a NATS
// server, running until stopped or the test ends.
type replica struct {
	ds   *datalayer.Datastore
	s    *share.Sharer
	stop func()
}

func startReplica(t *testing.T, srv *testkit.NATS, o share.Options) *replica {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000"})
	ds.Upsert(&datalayer.Endpoint{Name: "b", Address: "10.0.0.2:8000"})
	nc := srv.Connect(t, "share", nats.NoEcho())
	o.Namespace, o.Pool = "ns", "pool"
	s, err := share.New(nc, ds, o, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	r := &replica{ds: ds, s: s}
	r.stop = func() {
		if cancel != nil {
			cancel()
			cancel = nil
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(r.stop)
	return r
}

// A replica that starts while a peer has dispatches in flight counts them
// by the time it is caught up (what readiness waits for), without waiting
// for the peer's periodic sync.
func TestAStartingReplicaIsCaughtUpOnlyOnceItCountsItsPeersDispatches(t *testing.T) {
	t.Parallel()
	srv := testkit.StartNATS(t, testkit.NATSOptions{})
	// A sync interval far longer than the test: only the answer to the
	// newcomer can bring the peer's set.
	o := share.Options{SyncInterval: time.Hour, CatchUp: time.Second}
	old := startReplica(t, srv, o)
	now := time.Now()
	for i := range 3 {
		d := old.ds.Dispatch("a", now, 100, 200, 16)
		d.ExpectPrefill(time.Second)
		d.ExpectDecode(time.Second)
		d.Announce()
		if i == 0 {
			d.FirstToken(now)
		}
	}
	fresh := startReplica(t, srv, o)
	if fresh.s.CaughtUp() {
		t.Fatal("caught up before it listened for CatchUp")
	}
	testkit.WaitFor(t, "the new replica to catch up", func() error {
		if !fresh.s.CaughtUp() {
			return fmt.Errorf("catching up: %s", fresh.s.Detail())
		}
		return nil
	})
	if f := fresh.ds.InFlight("a"); f.Prefilling != 2 || f.Decoding != 1 {
		t.Errorf("caught up, the new replica sees %+v on a; want the peer's 2 prefilling and 1 decoding", f)
	}
	if st := fresh.s.State(); st != share.StateSharing {
		t.Errorf("state %v, want sharing", st)
	}
}

// With sharing disabled a replica neither sends nor counts, and says so.
func TestADisabledReplicaKeepsItsOwnView(t *testing.T) {
	t.Parallel()
	srv := testkit.StartNATS(t, testkit.NATSOptions{})
	on := startReplica(t, srv, share.Options{})
	off := startReplica(t, srv, share.Options{Disabled: true})
	peer := startReplica(t, srv, share.Options{})
	off.ds.Dispatch("b", time.Now(), 1, 2, 0).Announce()
	on.ds.Dispatch("b", time.Now(), 1, 2, 0).Announce()
	testkit.WaitFor(t, "each sharing replica to count the other's dispatch", func() error {
		if n := peer.ds.InFlight("b").Requests(); n != 1 {
			return fmt.Errorf("the peer counts %d on b", n)
		}
		return nil
	})
	// Time for anything the disabled replica sent to have arrived: a
	// later message of a sharing peer.
	peer.ds.Dispatch("a", time.Now(), 1, 2, 0).Announce()
	testkit.WaitFor(t, "the sharing replica to hear its peer", func() error {
		if n := on.ds.InFlight("a").Requests(); n != 1 {
			return fmt.Errorf("%d on a", n)
		}
		return nil
	})
	if n := on.ds.InFlight("b").Requests(); n != 1 {
		t.Errorf("the sharing replica counts %d on b, want its own 1", n)
	}
	if n := off.ds.InFlight("a").Requests() + off.ds.InFlight("b").Requests(); n != 1 {
		t.Errorf("the disabled replica counts %d, want its own 1", n)
	}
	if st := off.s.State(); st != share.StateOff || !off.s.CaughtUp() {
		t.Errorf("disabled: state %v, caught up %t", st, off.s.CaughtUp())
	}
}
