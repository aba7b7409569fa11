package recovery_test

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// The fault tests run the whole event path on loopback: simulated engines
// publishing over ZeroMQ, real relays, an embedded NATS server over TCP,
// and the EPP's consumer, recovery and index. Each breaks the path in one
// way while traffic flows, then requires the index to equal the engines'
// caches for every prompt on every endpoint, exactly, with nothing stale.

func TestIndexConvergesAfterFaults(t *testing.T) {
	tests := []struct {
		name string
		// fault breaks the path and returns the stack to check.
		fault func(t *testing.T, w *world, st *stack) *stack
		// check asserts on the metrics that the fault was seen and healed.
		check func(t *testing.T, w *world, st *stack, okBefore float64)
	}{
		{
			name: "an EPP that starts after the engines catches up from snapshots alone",
			fault: func(t *testing.T, w *world, st *stack) *stack {
				st.stop()
				return w.newStack(stackOptions{})
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "ok"); got < float64(len(w.slots)) {
					t.Errorf("resyncs ok = %v, want one per endpoint at least", got)
				}
				if got := testkit.Value(t, st.reg, "kvroute_events_batches_total", "result", "applied"); got != 0 {
					t.Errorf("the new EPP applied %v live batches; the test wants snapshots alone", got)
				}
			},
		},
		{
			name: "a NATS server restart is healed by resyncs after the reconnect",
			fault: func(t *testing.T, w *world, st *stack) *stack {
				w.restartNATS()
				w.serve(60)
				return st
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, st.reg, "kvroute_events_uncertain_total", "reason", "reconnect"); got == 0 {
					t.Error("no stream was reported uncertain after the reconnect")
				}
				if got := testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "ok"); got-okBefore < float64(len(w.slots)) {
					t.Errorf("resyncs ok after the reconnect = %v, want one per endpoint at least", got-okBefore)
				}
			},
		},
		{
			name: "a relay restart rebuilds its mirror from the engine's replay ring",
			fault: func(t *testing.T, w *world, st *stack) *stack {
				w.restartRelay(w.slots[0])
				w.serve(10) // the engine dropped these while no relay listened, or not
				w.restartRelay(w.slots[0])
				w.serve(60)
				return st
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, w.slots[0].relayReg, "kvroute_relay_gaps_filled_total"); got == 0 {
					t.Error("the restarted relay did not fill the engine's history from its replay ring")
				}
				if got := testkit.Value(t, st.reg, "kvroute_events_engine_restarts_total"); got == 0 {
					t.Error("the relay's new instance was not seen as a restart of the stream")
				}
			},
		},
		{
			name: "an engine restart resets the stream to the new engine's cache",
			fault: func(t *testing.T, w *world, st *stack) *stack {
				w.restartEngine(w.slots[1])
				// The relay notices the engine went away and dials the new
				// one; until then the new engine's batches are lost to it,
				// and it learns of the restart from the first it receives.
				w.serveUntil(func() bool {
					return testkit.Value(t, w.slots[1].relayReg, "kvroute_relay_engine_restarts_total") > 0
				})
				w.serve(60)
				return st
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, st.reg, "kvroute_events_engine_restarts_total"); got == 0 {
					t.Error("the engine restart was not seen")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld(t, worldOptions{pods: 3})
			st := w.newStack(stackOptions{})
			w.serve(120)
			w.converge(st)
			okBefore := testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "ok")
			st = tt.fault(t, w, st)
			w.converge(st)
			if w.heldTotal() == 0 {
				t.Fatal("the engines hold nothing: the test proves nothing")
			}
			tt.check(t, w, st, okBefore)
		})
	}
}

func TestDroppedBatchesAreHealedAndReplicasConverge(t *testing.T) {
	w := newWorld(t, worldOptions{pods: 2})
	proxy := newDropProxy(t, w.ns.Addr().String())
	for _, s := range w.slots {
		s.relayURL = proxy.url()
		w.restartRelay(s)
	}
	a := w.newStack(stackOptions{})
	b := w.newStack(stackOptions{})
	proxy.every.Store(5)
	w.serve(200)
	// The loss of a stream's last batch shows only when the next arrives,
	// as it would in production: more traffic, without loss, reveals it.
	proxy.every.Store(0)
	w.serve(40)
	w.converge(a)
	w.converge(b)
	if proxy.dropped.Load() == 0 {
		t.Fatal("the proxy dropped nothing")
	}
	for name, st := range map[string]*stack{"a": a, "b": b} {
		if got := testkit.Value(t, st.reg, "kvroute_events_gaps_total"); got == 0 {
			t.Errorf("replica %s saw no gap", name)
		}
		if got := testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "ok"); got <= float64(len(w.slots)) {
			t.Errorf("replica %s: resyncs ok = %v, want more than the start's", name, got)
		}
	}
}

func TestSlowConsumerOverrunIsHealed(t *testing.T) {
	w := newWorld(t, worldOptions{pods: 2})
	st := w.newStack(stackOptions{consumer: consumer.Options{Workers: 1, QueueLen: 1, PendingLimit: 2}})
	// A burst with no pause overruns the tiny pending limit.
	for range 3 {
		for _, s := range w.slots {
			for _, p := range w.prompt {
				p.ID = ""
				if _, err := s.eng.Serve(p); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	w.serve(30)
	w.converge(st)
	if got := testkit.Value(t, st.reg, "kvroute_events_uncertain_total", "reason", "slow_consumer"); got == 0 {
		t.Error("no slow consumer was reported")
	}
}

func TestEndpointWithoutRelayStaysUncertainAndIsRetried(t *testing.T) {
	w := newWorld(t, worldOptions{pods: 1})
	const orphan = "127.0.0.1:9999"
	st := w.newStack(stackOptions{
		members: []string{w.slots[0].addr, orphan},
		recovery: recoveryOptions(func(addr string) (string, bool) {
			if addr == w.slots[0].addr {
				return w.slots[0].pod, true
			}
			return "pod-without-relay", true
		}),
	})
	w.serve(30)
	w.converge(st)
	// Joining asks once; a stream found uncertain is retried until it heals.
	st.rec.Uncertain(events.Stream{Endpoint: orphan}, events.ReasonReconnect)
	testkit.WaitFor(t, "the endpoint without a relay to be retried", func() bool {
		return testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "no_responders") >= 3
	})
	if state, _ := st.ix.State(orphan); state.String() != "uncertain" {
		t.Errorf("endpoint without a relay is %s, want uncertain", state)
	}
}

func TestJetStreamReplaysToARestartedEPPAndSurvivesAServerRestart(t *testing.T) {
	w := newWorld(t, worldOptions{pods: 2, jetStream: true})
	st := w.newStack(stackOptions{})
	w.serve(100)
	w.converge(st)

	w.restartNATS() // the stream is on disk and comes back with the server
	w.serve(60)
	w.converge(st)

	st.stop()
	// A new EPP replays what the stream retained; its join snapshots may
	// make it exact first, and the replayed batches are then duplicates.
	again := w.newStack(stackOptions{})
	testkit.WaitFor(t, "the restarted EPP to replay the stream", func() bool {
		return testkit.Value(t, again.reg, "kvroute_events_batches_total", "result", "applied") > 0
	})
	w.converge(again)
}
