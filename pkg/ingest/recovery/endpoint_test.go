package recovery_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// An endpoint's streams share one backoff and one resync at a time: a
// relay that keeps failing costs one snapshot request per backoff, however
// many data-parallel streams name its endpoint.
func TestAnEndpointsStreamsShareOneResyncAtATimeAndOneBackoff(t *testing.T) {
	t.Parallel()
	const ranks = 20
	const otherAddr, otherPod = "10.0.0.8:8000", "vllm-1"
	tape := recordEngine(t, 4)
	u := newUnit(t, recovery.Options{
		MinBackoff: time.Hour, MaxBackoff: time.Hour,
		Pod: func(addr string) (string, bool) {
			if addr == otherAddr {
				return otherPod, true
			}
			return unitPod, true
		},
	})
	u.ix.AddEndpoint(otherAddr)
	// unitAddr's relay refuses every snapshot; otherAddr's answers.
	u.respond(t, nil, func() []*nats.Msg {
		h := nats.Header{}
		h.Set(events.HeaderSnapshotError, relay.ErrNoSnapshot.Error())
		return []*nats.Msg{{Header: h}}
	})
	other := tape.origin("inst-a", 3)
	other.Endpoint, other.Pod = otherAddr, otherPod
	answer := chunks(other, tape.snapshotAt(t, "inst-a", 3), true)
	nc, err := nats.Connect("", nats.InProcessServer(u.ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe(events.SnapshotSubject(testNS, testPool, otherPod), func(m *nats.Msg) {
		for _, out := range answer {
			out.Subject = m.Reply
			_ = nc.PublishMsg(out)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	for rank := range ranks {
		o := tape.origin("inst-a", 0)
		o.DPRank = rank
		u.rec.Apply(o, tape.batches[0])
		u.rec.Uncertain(o.Stream, events.ReasonReconnect)
	}
	u.run(t)
	testkit.WaitFor(t, "the first refusal", func() error {
		if seen := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "refused"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, u.reg, \"kvroute_recovery_resyncs_total\", \"result\", \"refused\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	// Another endpoint's resync runs past the gated streams: once it has
	// succeeded, Run has passed over them after the refusal.
	o := tape.origin("inst-a", 0)
	o.Endpoint, o.Pod = otherAddr, otherPod
	u.rec.Apply(o, tape.batches[0])
	u.rec.Uncertain(o.Stream, events.ReasonReconnect)
	testkit.WaitFor(t, "the other endpoint's resync", func() error {
		if seen := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "ok"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, u.reg, \"kvroute_recovery_resyncs_total\", \"result\", \"ok\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	if got := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "refused"); got != 1 {
		t.Errorf("%v refused resyncs for %d streams of one endpoint, want 1: one at a time, then the endpoint's backoff", got, ranks)
	}
	if got := u.rec.Pending(); got != ranks {
		t.Errorf("Pending = %d, want every stream of the refusing endpoint still wanting its resync", got)
	}
}
