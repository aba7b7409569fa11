package chaos

import (
	"testing"
	"time"
)

// An engine that restarts while its relay is connected is seen as a
// restart every time, also when the relay reconnects only after the new
// engine's sequence numbers have passed the last one it relayed: the replay
// ring then holds another batch at that seq, which tells a restart from a
// gap.
func TestTheRelaySeesEveryEngineRestart(t *testing.T) {
	w, err := NewWorld(WorldOptions{Pods: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p := w.Pods[0]
	for i := range 20 {
		if err := w.Serve(20); err != nil {
			t.Fatal(err)
		}
		before := Metric(p.RelayMetrics, "kvroute_relay_engine_restarts_total")
		if err := w.RestartEngine(p); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for Metric(p.RelayMetrics, "kvroute_relay_engine_restarts_total") == before {
			if time.Now().After(deadline) {
				t.Fatalf("restart %d: the relay never saw it; %v batches in", i, Metric(p.RelayMetrics, "kvroute_relay_batches_in_total"))
			}
			// The new engine publishes until the relay notices it.
			if err := w.Serve(3); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
