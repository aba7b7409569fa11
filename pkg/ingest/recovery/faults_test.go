package recovery_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
	"github.com/kvroute/kvroute/pkg/sim"
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
		opts worldOptions
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
			name: "a relay restart is a gap, filled from the replay ring, not an engine restart",
			fault: func(t *testing.T, w *world, st *stack) *stack {
				w.restartRelay(w.slots[0])
				w.serve(10) // the engine dropped these while no relay listened, or not
				w.restartRelay(w.slots[0])
				w.serve(60)
				return st
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, w.slots[0].relayReg, "kvroute_relay_resumes_total", "verdict", "same_engine"); got == 0 {
					t.Error("the restarted relay did not resume its engine's stream")
				}
				if got := testkit.Value(t, st.reg, "kvroute_events_engine_restarts_total"); got != 0 {
					t.Errorf("the relay's restart was taken for %v engine restarts", got)
				}
			},
		},
		{
			name: "a relay restart without a replay ring keeps what the EPP knew and goes on",
			opts: worldOptions{noReplay: true},
			fault: func(t *testing.T, w *world, st *stack) *stack {
				// The engine is quiet while its relay restarts, so nothing is
				// lost; its next stores extend blocks it stored before.
				w.restartRelay(w.slots[0])
				w.serve(60)
				return st
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, st.reg, "kvroute_events_engine_restarts_total"); got != 0 {
					t.Errorf("the relay's restart was taken for %v engine restarts", got)
				}
				if got := testkit.Value(t, st.reg, "kvroute_index_events_dropped_total", "reason", "unknown_parent"); got != 0 {
					t.Errorf("%v stored runs dropped as unknown_parent after the relay's restart", got)
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
		{
			name: "an EPP that crashes in the middle of a resync is replaced by one that converges",
			opts: worldOptions{proxied: true},
			fault: func(t *testing.T, w *world, st *stack) *stack {
				// Cut the relays off, so that the resyncs asked for now hang.
				w.proxy.Paused.Store(true)
				w.serve(20)
				for _, s := range w.slots {
					st.rec.Resync(events.Stream{Endpoint: s.addr})
				}
				testkit.WaitFor(t, "the resyncs to be under way", func() error {
					if seen := testkit.Value(t, st.reg, "kvroute_recovery_in_flight"); seen != float64(len(w.slots)) {
						return fmt.Errorf("testkit.Value(t, st.reg, \"kvroute_recovery_in_flight\") is %v, want %v", seen, float64(len(w.slots)))
					}
					return nil
				})
				st.stop()
				again := w.newStack(stackOptions{})
				w.proxy.Paused.Store(false)
				w.serve(20)
				return again
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "ok"); got < float64(len(w.slots)) {
					t.Errorf("resyncs ok = %v, want one per endpoint at least", got)
				}
			},
		},
		{
			name: "a lost tail is found by the relay's heartbeat and healed",
			opts: worldOptions{proxied: true},
			fault: func(t *testing.T, w *world, st *stack) *stack {
				// Every batch from here on is lost, and the engines fall
				// quiet after a burst: no later seq can show it, only the
				// relays' heartbeats, which pass (as snapshots do).
				w.proxy.DropBatches.Store(true)
				w.serve(30)
				return st
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, st.reg, "kvroute_events_lost_tails_total"); got == 0 {
					t.Error("no lost tail was seen")
				}
				if got := testkit.Value(t, st.reg, "kvroute_recovery_lost_tails_total"); got == 0 {
					t.Error("no lost tail was resynchronised")
				}
			},
		},
		{
			name: "a NATS restart and a relay restart at once are both healed",
			fault: func(t *testing.T, w *world, st *stack) *stack {
				w.stopRelay(w.slots[2])
				w.restartNATS()
				w.serve(15)
				w.startRelay(w.slots[2])
				w.serve(60)
				return st
			},
			check: func(t *testing.T, w *world, st *stack, okBefore float64) {
				if got := testkit.Value(t, st.reg, "kvroute_events_engine_restarts_total"); got != 0 {
					t.Errorf("%v engine restarts seen; none happened", got)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.opts
			o.pods = 3
			w := newWorld(t, o)
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

// A relay that joins a running engine it cannot replay, and an EPP that
// joins with it, know nothing of what the engine stored before: the stream
// settles partial, with no false holding and no resync asked again and
// again, while everything stored since is known.
func TestALateJoinSettlesPartialWithNoFalseHolding(t *testing.T) {
	w := newWorld(t, worldOptions{pods: 2, noReplay: true})
	w.serve(80)
	s := w.slots[0]
	// A new pod's relay: no state of its own, the engine already running.
	w.stopRelay(s)
	s.stateDir = t.TempDir()
	w.serve(40)
	w.startRelay(s)
	st := w.newStack(stackOptions{})
	w.serve(80)
	testkit.WaitFor(t, "the late joiner to settle partial with no false holding", func() error {
		if state, _ := st.ix.State(s.addr); state != datalayer.StreamPartial {
			return fmt.Errorf("%s is %s", s.addr, state)
		}
		truth, err := s.eng.TrueHoldings()
		if err != nil {
			t.Fatal(err)
		}
		if d := sim.DiffHoldings(truth, st.ix.Holdings(s.addr)); d.False != 0 || d.WrongTier != 0 {
			return errors.New(d.String())
		}
		return nil
	})
	testkit.WaitFor(t, "nothing pending", func() error {
		if seen := st.rec.Pending(); seen != 0 {
			return fmt.Errorf("st.rec.Pending() is %v, want %v", seen, 0)
		}
		return nil
	})
	truth, _ := s.eng.TrueHoldings()
	d := sim.DiffHoldings(truth, st.ix.Holdings(s.addr))
	if d.Missing == 0 || d.Missing == d.Held {
		t.Errorf("late joiner: %s; want some blocks known and some missing", d)
	}
	// The other pod's relay saw everything: exact.
	w.converge2(st, w.slots[1:])
}

func TestDroppedBatchesAreHealedAndReplicasConverge(t *testing.T) {
	w := newWorld(t, worldOptions{pods: 2})
	proxy := newDropProxy(t, w.ns.Addr().String())
	for _, s := range w.slots {
		s.relayURL = proxy.URL()
		w.restartRelay(s)
	}
	a := w.newStack(stackOptions{})
	b := w.newStack(stackOptions{})
	proxy.Every.Store(5)
	w.serve(200)
	// The loss of a stream's last batch shows only when the next arrives,
	// as it would in production: more traffic, without loss, reveals it.
	proxy.Every.Store(0)
	w.serve(40)
	w.converge(a)
	w.converge(b)
	if proxy.Dropped() == 0 {
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
	testkit.WaitFor(t, "the endpoint without a relay to be retried", func() error {
		if seen := testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "no_responders"); seen < 3 {
			return fmt.Errorf("testkit.Value(t, st.reg, \"kvroute_recovery_resyncs_total\", \"result\", \"no_responders\") is %v, want >= %v", seen, 3)
		}
		return nil
	})
	// A failure is counted just before the state it leaves is set.
	testkit.WaitFor(t, "the endpoint without a relay uncertain", func() error {
		state, _ := st.ix.State(orphan)
		if seen := state.String(); seen != "uncertain" {
			return fmt.Errorf("state.String() is %v, want %v", seen, "uncertain")
		}
		return nil
	})
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
	testkit.WaitFor(t, "the restarted EPP to replay the stream", func() error {
		if seen := testkit.Value(t, again.reg, "kvroute_events_batches_total", "result", "applied"); seen <= 0 {
			return fmt.Errorf("testkit.Value(t, again.reg, \"kvroute_events_batches_total\", \"result\", \"applied\") is %v, want > %v", seen, 0)
		}
		return nil
	})
	w.converge(again)
}
