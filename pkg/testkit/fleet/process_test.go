package fleet_test

import (
	"net/http"
	"os"
	"testing"

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
