package gateway_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// quickFade fades a stopped peer's dispatches within seconds, whether
// their ends were predicted or not.
func quickFade(o *epp.Options) {
	o.Share.FadeMargin, o.Share.UnknownLife = 500*time.Millisecond, 2*time.Second
}

// Two replicas behind one gateway, requests alternating between them: each
// replica's in-flight view of every endpoint is the sum of both replicas'
// dispatches, and once one replica stops, the other's goes back to its own
// as the stopped one's dispatches fade.
func TestTwoReplicasEachCountWhatBothDispatched(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{EPP: func(o *epp.Options) { extProcOn(o); quickFade(o) }})
	r := startReplica(t, f, quickFade)
	g := startGateway(t, gateway.Options{Hosts: []gateway.Host{
		{Name: "epp-0", ExtProcAddr: f.EPP.ExtProcAddr()}, {Name: "epp-1", ExtProcAddr: r.e.ExtProcAddr()},
	}})
	waitHealthy(t, g, 2)
	replicas := map[string]*epp.EPP{"epp-0": f.EPP, "epp-1": r.e}
	testkit.WaitFor(t, "both replicas sharing", func() error {
		for name, e := range replicas {
			if v := testkit.Value(t, e.Registry(), "kvroute_dispatch_share_state", "state", "sharing"); v != 1 {
				return fmt.Errorf("%s: %s", name, e.Share().Detail())
			}
		}
		return nil
	})

	// Every answer held after its first event: the requests stay in
	// flight. Sent one at a time, each one's replica (the answer's
	// header) and engine (the one whose count rose) are known.
	gate := make(chan struct{})
	for _, ms := range f.Servers {
		ms.SetGate(gate)
	}
	defer func() {
		for _, ms := range f.Servers {
			ms.SetGate(nil)
		}
		close(gate)
	}()
	own := map[string][]int{"epp-0": make([]int, len(f.Servers)), "epp-1": make([]int, len(f.Servers))}
	const n = 12
	for i := range n {
		before := counts(f)
		req, _ := http.NewRequest(http.MethodPost, g.URL()+"/v1/completions", bytes.NewReader(completion(tokens(uint32(20000+100*i), 16), true)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		host := resp.Header.Get(gateway.HeaderExtProcHost)
		if resp.StatusCode != http.StatusOK || own[host] == nil {
			t.Fatalf("request %d: status %d from host %q", i, resp.StatusCode, host)
		}
		for j, ms := range f.Servers {
			if ms.Requests.Load() > before[j] {
				own[host][j]++
			}
		}
	}
	for host, by := range own {
		total := 0
		for _, c := range by {
			total += c
		}
		if total != n/2 {
			t.Fatalf("%s dispatched %d of %d requests; the gateway should alternate: %v", host, total, n, own)
		}
	}
	inFlight := func(e *epp.EPP, i int) int { return e.Datastore().InFlight(fmt.Sprintf("pod-%d", i)).Requests() }
	testkit.WaitFor(t, "each replica counting both replicas' dispatches on every endpoint", func() error {
		for name, e := range replicas {
			for i := range f.Servers {
				if got, want := inFlight(e, i), own["epp-0"][i]+own["epp-1"][i]; got != want {
					return fmt.Errorf("%s sees %d in flight on pod-%d, want %d (%v)", name, got, i, want, own)
				}
			}
		}
		return nil
	})
	for name, e := range replicas {
		if got := e.Share().RemoteInFlight(); got != n/2 {
			t.Errorf("%s counts %d of its peer's dispatches, want %d", name, got, n/2)
		}
	}

	r.stop(t)
	testkit.WaitFor(t, "the remaining replica back to its own dispatches", func() error {
		for i := range f.Servers {
			if got, want := inFlight(f.EPP, i), own["epp-0"][i]; got != want {
				return fmt.Errorf("epp-0 sees %d in flight on pod-%d, want its own %d", got, i, want)
			}
		}
		if got := f.EPP.Share().RemoteInFlight(); got != 0 {
			return fmt.Errorf("%d of the stopped peer's dispatches still counted", got)
		}
		return nil
	})
	if v := testkit.Value(t, f.Metrics, "kvroute_dispatch_share_messages_total", "direction", "received"); v == 0 {
		t.Error("no message received counted")
	}
}
