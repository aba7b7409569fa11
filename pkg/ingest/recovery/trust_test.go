package recovery_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// withState marks a snapshot's chunks with Kv-Snapshot-State.
func withState(msgs []*nats.Msg, state string) []*nats.Msg {
	for _, m := range msgs {
		m.Header.Set(events.HeaderSnapshotState, state)
	}
	return msgs
}

func TestAPartialSnapshotSettlesTheStreamPartial(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 12)
	u := newUnit(t, recovery.Options{})
	u.respond(t, nil, func() []*nats.Msg {
		return withState(chunks(tape.origin("inst-a", 11), tape.snapshotAt(t, "inst-a", 11), false), events.SnapshotPartial)
	})
	u.rec.Apply(tape.origin("inst-a", 0), tape.batches[0])
	u.run(t)
	u.rec.Uncertain(unitStream, events.ReasonReconnect)
	testkit.WaitFor(t, "the partial install", func() error {
		if seen := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "partial"); seen != 1 {
			return fmt.Errorf("testkit.Value(t, u.reg, \"kvroute_recovery_resyncs_total\", \"result\", \"partial\") is %v, want %v", seen, 1)
		}
		return nil
	})
	testkit.WaitFor(t, "the resync to end", func() error {
		if seen := u.rec.Pending(); seen != 0 {
			return fmt.Errorf("u.rec.Pending() is %v, want %v", seen, 0)
		}
		return nil
	})
	if s := stateOf(u); s != datalayer.StreamPartial {
		t.Fatalf("state = %s, want partial", s)
	}
	if d := tape.diff(u.ix, tape.reference(11)); d != "" {
		t.Fatal(d)
	}
}

func TestALateJoinNobodyCanFillSettlesPartial(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 12)
	u := newUnit(t, recovery.Options{}) // no relay answers
	u.run(t)
	u.rec.Uncertain(unitStream, events.ReasonLateJoin)
	u.rec.Apply(tape.origin("inst-a", 5), tape.batches[5])
	if s := stateOf(u); s != datalayer.StreamPartial {
		t.Fatalf("state after a late join = %s, want partial", s)
	}
	testkit.WaitFor(t, "the one attempt", func() error {
		if seen := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "no_responders"); seen != 1 {
			return fmt.Errorf("testkit.Value(t, u.reg, \"kvroute_recovery_resyncs_total\", \"result\", \"no_responders\") is %v, want %v", seen, 1)
		}
		return nil
	})
	testkit.WaitFor(t, "nothing pending", func() error {
		if seen := u.rec.Pending(); seen != 0 {
			return fmt.Errorf("u.rec.Pending() is %v, want %v", seen, 0)
		}
		return nil
	})
	// A heartbeat of the stream asks again no more.
	u.rec.Tail(tape.origin("inst-a", 5))
	if n := u.rec.Pending(); n != 0 {
		t.Fatalf("pending after a heartbeat = %d, want 0", n)
	}
	if s := stateOf(u); s != datalayer.StreamPartial {
		t.Fatalf("state = %s, want partial", s)
	}
}

func TestAHeartbeatPastTheStreamHealsItsLostTail(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 12)
	u := newUnit(t, recovery.Options{})
	u.respond(t, nil, func() []*nats.Msg {
		return chunks(tape.origin("inst-a", 11), tape.snapshotAt(t, "inst-a", 11), true)
	})
	for i := 0; i <= 8; i++ {
		u.rec.Apply(tape.origin("inst-a", i), tape.batches[i])
	}
	u.run(t)
	// Batches 9..11 were lost, and the engine fell quiet.
	u.rec.Tail(tape.origin("inst-a", 11))
	if s := stateOf(u); s != datalayer.StreamRecovering {
		t.Fatalf("state after the heartbeat = %s, want recovering", s)
	}
	testkit.WaitFor(t, "the stream to be exact", func() error {
		if seen := stateOf(u); seen != datalayer.StreamExact {
			return fmt.Errorf("stateOf(u) is %v, want %v", seen, datalayer.StreamExact)
		}
		return nil
	})
	if d := tape.diff(u.ix, tape.reference(11)); d != "" {
		t.Fatal(d)
	}
	if got := testkit.Value(t, u.reg, "kvroute_recovery_lost_tails_total"); got != 1 {
		t.Errorf("lost tails = %v, want 1", got)
	}
}

func TestAHeartbeatTheSnapshotCoveredIsNoLoss(t *testing.T) {
	t.Parallel()
	tape, u := joinedAtSnapshot(t)
	// The consumer never saw a batch; the heartbeat is ahead of it but not
	// of the snapshot.
	u.rec.Tail(tape.origin("inst-a", 8))
	if n, s := u.rec.Pending(), stateOf(u); n != 0 || s != datalayer.StreamExact {
		t.Fatalf("after a covered heartbeat: %d pending, state %s; want 0, exact", n, s)
	}
}

func TestDistrustMarksTheEndpointUncertainAndResyncsIt(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 12)
	u := newUnit(t, recovery.Options{})
	release := make(chan struct{})
	resp := u.respond(t, release, func() []*nats.Msg {
		return chunks(tape.origin("inst-a", 11), tape.snapshotAt(t, "inst-a", 11), true)
	})
	for i := 0; i <= 11; i++ {
		u.rec.Apply(tape.origin("inst-a", i), tape.batches[i])
	}
	u.run(t)
	u.rec.Distrust(unitAddr)
	if s := stateOf(u); s != datalayer.StreamUncertain {
		t.Fatalf("state after distrust = %s, want uncertain", s)
	}
	<-resp.requests
	close(release)
	testkit.WaitFor(t, "the stream to be exact again", func() error {
		if seen := stateOf(u); seen != datalayer.StreamExact {
			return fmt.Errorf("stateOf(u) is %v, want %v", seen, datalayer.StreamExact)
		}
		return nil
	})
	if got := testkit.Value(t, u.reg, "kvroute_recovery_distrusted_total"); got != 1 {
		t.Errorf("distrusted = %v, want 1", got)
	}
}
