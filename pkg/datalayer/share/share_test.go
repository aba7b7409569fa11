package share

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// rig is a Sharer without NATS over a datastore of two endpoints, fed
// messages by hand at times of the test's choosing.
type rig struct {
	t   *testing.T
	ds  *datalayer.Datastore
	s   *Sharer
	now int64
}

func newRig(t *testing.T, o Options) *rig {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000"})
	ds.Upsert(&datalayer.Endpoint{Name: "b", Address: "10.0.0.2:8000"})
	o.Replica = 1
	r := &rig{t: t, ds: ds, now: now0}
	o.Now = func() time.Time { return time.Unix(0, r.now) }
	s, err := New(nil, ds, o, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	return r
}

func (r *rig) apply(m Message) {
	r.t.Helper()
	if m.Now == 0 {
		m.Now = r.now
	}
	r.s.rmu.Lock()
	defer r.s.rmu.Unlock()
	_ = r.s.apply(&m, r.now)
}

func (r *rig) inFlight(ep string) int { return r.ds.InFlight(ep).Requests() }

func sent(id uint64, ep string, at, end int64) Entry {
	return Entry{Kind: datalayer.NoteSent, ID: id, Endpoint: ep, At: at, End: end, Prefill: 100, Prompt: 200, Outputs: 8}
}

func TestAPeersDispatchesCountUntilTheyEnd(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{})
	r.apply(Message{Replica: 2, Seq: 1, Entries: []Entry{sent(1, "a", r.now, 0), sent(2, "a", r.now, 0), sent(3, "b", r.now, 0)}})
	if a, b := r.inFlight("a"), r.inFlight("b"); a != 2 || b != 1 {
		t.Fatalf("in flight a=%d b=%d, want 2 and 1", a, b)
	}
	r.apply(Message{Replica: 2, Seq: 2, Entries: []Entry{{Kind: datalayer.NoteFirst, ID: 1, At: r.now}}})
	if f := r.ds.InFlight("a"); f.Prefilling != 1 || f.Decoding != 1 {
		t.Fatalf("after a first token: %+v", f)
	}
	r.apply(Message{Replica: 2, Seq: 3, Entries: []Entry{{Kind: datalayer.NoteDone, ID: 1, At: r.now}, {Kind: datalayer.NoteFailed, ID: 3}}})
	if a, b := r.inFlight("a"), r.inFlight("b"); a != 1 || b != 0 {
		t.Errorf("after two ends: a=%d b=%d, want 1 and 0", a, b)
	}
	if got := r.s.RemoteInFlight(); got != 1 {
		t.Errorf("RemoteInFlight %d, want 1", got)
	}
}

func TestAReplicaIgnoresItsOwnMessages(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{})
	r.apply(Message{Replica: 1, Seq: 1, Entries: []Entry{sent(1, "a", r.now, 0)}})
	if n := r.inFlight("a"); n != 0 {
		t.Errorf("its own dispatch counted again: %d in flight", n)
	}
}

func TestGapsInAPeersSequenceAreCountedAndOldMessagesIgnored(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{})
	r.apply(Message{Replica: 2, Seq: 1, Entries: []Entry{sent(1, "a", r.now, 0)}})
	r.apply(Message{Replica: 2, Seq: 5, Entries: []Entry{sent(2, "a", r.now, 0)}})
	if got := testutil.ToFloat64(r.s.m.gaps); got != 3 {
		t.Errorf("missed messages %v, want 3", got)
	}
	// A message overtaken (or sent twice) is not applied again.
	r.apply(Message{Replica: 2, Seq: 4, Entries: []Entry{{Kind: datalayer.NoteDone, ID: 2}}})
	if n := r.inFlight("a"); n != 2 {
		t.Errorf("%d in flight after an old message, want 2", n)
	}
}

func TestAPeersDispatchFadesAtItsExpectedEndPlusTheMargin(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{FadeMargin: time.Second, UnknownLife: 5 * time.Second})
	end := r.now + int64(3*time.Second)
	r.apply(Message{Replica: 2, Seq: 1, Entries: []Entry{sent(1, "a", r.now, end), sent(2, "b", r.now, 0)}})
	r.s.sweep(end + int64(time.Second) - 1)
	if a, b := r.inFlight("a"), r.inFlight("b"); a != 1 || b != 1 {
		t.Fatalf("faded early: a=%d b=%d", a, b)
	}
	r.s.sweep(end + int64(time.Second))
	if a := r.inFlight("a"); a != 0 {
		t.Errorf("a dispatch past its end and margin still counts")
	}
	// One with no end expected lives UnknownLife from its dispatch.
	r.s.sweep(r.now + int64(6*time.Second) - 1)
	if b := r.inFlight("b"); b != 1 {
		t.Fatalf("the dispatch with no end faded before UnknownLife and the margin")
	}
	r.s.sweep(r.now + int64(6*time.Second))
	if b := r.inFlight("b"); b != 0 {
		t.Errorf("the dispatch with no end never faded")
	}
	if got := testutil.ToFloat64(r.s.m.faded); got != 2 {
		t.Errorf("faded %v, want 2", got)
	}
}

func TestAPeerCannotSetAnEndBeyondMaxLife(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{MaxLife: time.Minute})
	r.apply(Message{Replica: 2, Seq: 1, Entries: []Entry{sent(1, "a", r.now, r.now+int64(24*time.Hour))}})
	r.s.sweep(r.now + int64(time.Minute))
	if n := r.inFlight("a"); n != 0 {
		t.Errorf("a dispatch outlived MaxLife")
	}
}

func TestThePeersEntriesAreCappedPerEndpointAndInAll(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{MaxRemote: 5, MaxRemotePerEndpoint: 3})
	var flood []Entry
	for i := range uint64(100) {
		flood = append(flood, sent(i+1, "a", r.now, 0))
	}
	r.apply(Message{Replica: 2, Seq: 1, Entries: flood})
	if n := r.inFlight("a"); n != 3 {
		t.Errorf("%d of a flood on one endpoint counted, want the cap of 3", n)
	}
	r.apply(Message{Replica: 3, Seq: 1, Entries: []Entry{sent(1, "b", r.now, 0), sent(2, "b", r.now, 0), sent(3, "b", r.now, 0)}})
	if n := r.inFlight("b"); n != 2 {
		t.Errorf("%d counted on b, want 2 (5 in all)", n)
	}
	if got := testutil.ToFloat64(r.s.m.dropped.WithLabelValues("cap")); got != 98 {
		t.Errorf("dropped at the cap %v, want 98", got)
	}
}

func TestTooManyPeersAreNotTracked(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{MaxPeers: 2})
	for p := range uint64(10) {
		r.apply(Message{Replica: p + 2, Seq: 1, Entries: []Entry{sent(1, "a", r.now, 0)}})
	}
	if n := r.inFlight("a"); n != 2 {
		t.Errorf("%d counted from ten peers, want the 2 tracked", n)
	}
}

func TestACompleteSyncEndsWhatItsSenderNoLongerHas(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{})
	// Dispatch 1's end and dispatch 3's sending were lost; the sync
	// lists 2 and 3 (decoding).
	r.apply(Message{Replica: 2, Seq: 1, Entries: []Entry{sent(1, "a", r.now, 0), sent(2, "a", r.now, 0)}})
	s3 := sent(3, "b", r.now, 0)
	s3.First = r.now
	r.apply(Message{Replica: 2, Seq: 3, Sync: true, Complete: true, Entries: []Entry{sent(2, "a", r.now, 0), s3}})
	if a := r.inFlight("a"); a != 1 {
		t.Errorf("a: %d in flight, want 1", a)
	}
	if f := r.ds.InFlight("b"); f.Decoding != 1 || f.Prefilling != 0 {
		t.Errorf("b: %+v, want one decoding", f)
	}
	// An incomplete sync removes nothing.
	r.apply(Message{Replica: 2, Seq: 4, Sync: true, Entries: []Entry{s3}})
	if a := r.inFlight("a"); a != 1 {
		t.Errorf("an incomplete sync removed what it did not list")
	}
}

func TestADispatchToAnUnknownEndpointIsDropped(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{})
	r.apply(Message{Replica: 2, Seq: 1, Entries: []Entry{sent(1, "gone", r.now, 0)}})
	if got := r.s.RemoteInFlight(); got != 0 {
		t.Errorf("%d remote entries for an endpoint not in the datastore", got)
	}
}

func TestASharerWithoutNATSSaysItSeesItsOwnView(t *testing.T) {
	t.Parallel()
	r := newRig(t, Options{})
	if st := r.s.State(); st != StateLocalOnly || !r.s.CaughtUp() {
		t.Errorf("state %v (caught up %t), want local-only and caught up", st, r.s.CaughtUp())
	}
	off := newRig(t, Options{Disabled: true})
	if st := off.s.State(); st != StateOff {
		t.Errorf("disabled: state %v, want off", st)
	}
}
