package chaos

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// A replica that starts beside engines that have long been serving (as one
// does in a rollout or after a crash) is not ready while it cannot reach
// their relays' snapshots, and once ready it answers with the engines'
// whole truth from its first moment: a rolling update never puts a replica
// that knows less than its twin behind the front.
func TestAReplicaIsReadyOnlyOnceItHasCaughtUpWithEveryPod(t *testing.T) {
	w, err := NewWorld(WorldOptions{Pods: 3, Proxied: true, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Serve(90); err != nil {
		t.Fatal(err)
	}
	// The relays' heartbeats and snapshot replies are held back.
	w.Proxy.Paused.Store(true)
	r, err := w.launchReplica("late", ReplicaOptions{ReadyGrace: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for Metric(r.EPP.Registry(), "kvroute_events_connected") != 1 || Metric(r.EPP.Registry(), "kvroute_recovery_resyncs_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the replica never connected and tried a resync")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if r.EPP.Ready() {
		t.Fatal("ready while every resync it tried failed")
	}
	w.Proxy.Paused.Store(false)
	for !r.EPP.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("never ready once the relays were reachable")
		}
		time.Sleep(time.Millisecond)
	}
	views, err := w.View(r)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, v := range views {
		if v.State != datalayer.StreamExact || v.Diff.False != 0 || v.Diff.Missing != 0 || v.Diff.WrongTier != 0 {
			t.Errorf("%s at the first ready moment: %s, %v", v.Pod, v.State, v.Diff)
		}
		held += v.Diff.Held
	}
	if held == 0 {
		t.Fatal("the engines hold nothing: the test proves nothing")
	}
}
