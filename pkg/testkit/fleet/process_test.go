package fleet_test

import (
	"context"
	"net/http"
	"os"
	"testing"

	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

func TestMain(m *testing.M) {
	fleet.Main()
	os.Exit(m.Run())
}

// A fleet in a process of its own feeds the EPP here as one in this
// process does: its stand-ins' KV events reach the index, and they answer
// /metrics for the EPP's scrapes.
func TestAFleetInAProcessOfItsOwnFeedsTheIndex(t *testing.T) {
	f := fleet.Start(t, fleet.Options{Endpoints: 2, Process: true})
	prefixes := f.FillPrefixes(t, 64)
	for i, s := range f.Servers {
		if s.Engine != nil {
			t.Fatalf("stand-in %d has an engine in this process", i)
		}
		f.WaitHeld(t, s.Addr, prefixes[i])
		resp, err := http.Get("http://" + s.Addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stand-in %d: /metrics answered %s", i, resp.Status)
		}
	}
}

// EPPs in processes of their own are fed by the same stand-ins, each
// routes a prompt to the stand-in holding it, and each counts its own
// work.
func TestEPPsInProcessesOfTheirOwnRouteByTheirIndexes(t *testing.T) {
	f := fleet.Start(t, fleet.Options{Endpoints: 2, NoTokenizer: true, EPPProcesses: []fleet.EPPProcessOptions{{}, {}}})
	if f.EPP != nil || len(f.Processes) != 2 {
		t.Fatalf("fleet has EPP %v and %d processes, want none here and two", f.EPP, len(f.Processes))
	}
	prefixes := f.FillPrefixes(t, 64)
	for i, s := range f.Servers {
		f.WaitHeld(t, s.Addr, prefixes[i])
	}
	bodies := fleet.PrefixBodies(prefixes, 48)
	for n, p := range f.Processes {
		before, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		c, err := envoy.Dial(p.ExtProcAddr(), true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		for i, s := range f.Servers {
			res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: bodies[i], Chunks: 2}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Destination != s.Addr {
				t.Errorf("EPP process %d sent prompt %d to %q, want %s, which holds it", n, i, res.Destination, s.Addr)
			}
		}
		after, err := p.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if d := after.Sub(before); d.CPU <= 0 || d.Allocs == 0 {
			t.Errorf("EPP process %d counted %v of CPU and %d allocations for its requests", n, d.CPU, d.Allocs)
		}
		if _, err := p.EncodeChat([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)); err == nil {
			t.Errorf("EPP process %d without a tokenizer encoded a chat prompt", n)
		}
	}
}
