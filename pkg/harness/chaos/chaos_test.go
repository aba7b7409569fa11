package chaos_test

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/harness/chaos"
)

// Every fault of the matrix, against the real components on loopback with
// two EPP replicas: each must end as its outcome says, checked over every
// block the engines hold, with both replicas answering alike.
func TestEveryFaultEndsWithTheIndexTellingTheTruth(t *testing.T) {
	for _, s := range chaos.Scenarios() {
		t.Run(s.Name, func(t *testing.T) {
			res := chaos.RunScenario(context.Background(), s, nil)
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			if !res.Converged || !res.Agree {
				t.Fatalf("did not settle within %v: %s", chaos.ConvergeLimit, res.Detail)
			}
			if res.Held == 0 {
				t.Fatal("the engines hold nothing: the scenario proves nothing")
			}
			if res.Picks.Total == 0 {
				t.Fatal("no pick was made while the fault ran")
			}
			exact, partial := true, false
			for i := range len(res.States) + 8 {
				switch {
				case s.Expect == nil:
				case s.Expect(i) == chaos.Partial:
					partial, exact = true, false
				case s.Expect(i) == chaos.Honest:
					exact = false
				}
			}
			switch {
			case exact && (res.False != 0 || res.Missing != 0):
				t.Fatalf("ended with %d false and %d missing holdings", res.False, res.Missing)
			case partial && res.False != 0:
				t.Fatalf("a late join ended with %d false holdings", res.False)
			}
			t.Logf("converged in %v; %d picks (%v), %d over-claimed; peak false holdings %d; end: %d false, %d missing of %d held; states %v",
				res.Converge, res.Picks.Total, res.Picks.ByState, res.Picks.Overclaimed, res.PeakFalse, res.False, res.Missing, res.Held, res.States)
		})
	}
}
