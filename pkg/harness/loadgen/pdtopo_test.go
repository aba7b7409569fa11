package loadgen

import (
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/discovery/static"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/sim"
)

func TestAPlacedFleetsEndpointsFileCarriesEachEnginesPlace(t *testing.T) {
	t.Parallel()
	plan := PDTopologyPlan()
	spec := ReplicaSpec{Namespace: "ns", Model: "m"}
	for i, pl := range plan.Places {
		spec.Engines = append(spec.Engines, Engine{Pod: "vllm-" + string(rune('0'+i)), Address: "127.0.0.1:" + string(rune('1'+i)) + "000",
			Labels: map[string]string{sim.RoleLabel: plan.Roles[i]}, Topology: topologyOf(pl)})
	}
	path, cleanup, err := endpointsFileOf(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := static.Parse(data)
	if err != nil {
		t.Fatalf("the EPP refuses the file: %v\n%s", err, data)
	}
	if len(eps) != 6 {
		t.Fatalf("%d endpoints, want 6", len(eps))
	}
	// Two racks of a prefill engine and two decode engines.
	for i, ep := range eps {
		want := datalayer.Topology{Host: "host-" + string(rune('0'+i)), Rack: "rack-" + string(rune('1'+i/3)), Zone: "zone-a", Region: "region-1"}
		if ep.Topology != want || ep.Labels[sim.RoleLabel] != plan.Roles[i] {
			t.Errorf("endpoint %s at %+v with role %q, want %+v and %q", ep.Name, ep.Topology, ep.Labels[sim.RoleLabel], want, plan.Roles[i])
		}
	}
	if d := eps[0].Topology.DistanceTo(eps[1].Topology); d != datalayer.SameRack {
		t.Errorf("engines 0 and 1 are %s apart, want one rack", d)
	}
	if d := eps[0].Topology.DistanceTo(eps[4].Topology); d != datalayer.SameZone {
		t.Errorf("engines 0 and 4 are %s apart, want one zone", d)
	}

	unplaced, none, err := endpointsFileOf(ReplicaSpec{Engines: []Engine{{Pod: "a", Address: "127.0.0.1:1"}}})
	if err != nil || unplaced != "" {
		t.Errorf("a fleet without places got file %q, %v", unplaced, err)
	}
	none()
}

func TestTheTopologyPoliciesConfigurationsLoad(t *testing.T) {
	t.Parallel()
	for _, pol := range PDTopologyPolicies {
		if !isPD(pol) || !hearsEvents(pol) {
			t.Errorf("%s: a P/D policy %v, hearing events %v; want both", pol, isPD(pol), hearsEvents(pol))
		}
		e, err := epp.New(epp.Options{Pool: "p", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigText: pdConfig(pol)})
		if err != nil {
			t.Fatalf("the EPP rejects %s's configuration: %v", pol, err)
		}
		e.Close()
	}
}

// Each topology-aware policy is judged against the same policy blind to
// topology, on the mean over its seeds.
func TestTheTopologyChecksJudgeEachAwarePolicyAgainstItsOwnBlindOne(t *testing.T) {
	t.Parallel()
	pt := func(pol string, seeds ...[2]time.Duration) Point {
		pd := &PDResult{}
		for _, s := range seeds {
			pd.SeedRuns = append(pd.SeedRuns, PDSeed{TTFTp90: s[0], TransferMean: s[1]})
		}
		return Point{Workload: "pd-topology", Policy: pol, Rate: 30, Summary: Summary{TTFTp90: seeds[0][0]}, PD: pd}
	}
	ms := time.Millisecond
	got := PDTopologyChecks([]Point{
		// llm-d's pair: the transfer cut, the TTFT 1.3x.
		pt(PolicyPDTopologyBlind, [2]time.Duration{50 * ms, 3 * ms}, [2]time.Duration{50 * ms, 3 * ms}),
		pt(PolicyPDTopologyAware, [2]time.Duration{80 * ms, 2 * ms}, [2]time.Duration{50 * ms, 2 * ms}),
		// kvroute's pair: both met, though one seed is slower.
		pt(PolicyPDTopologyPredictedBlind, [2]time.Duration{50 * ms, 3 * ms}, [2]time.Duration{50 * ms, 3 * ms}),
		pt(PolicyPDTopologyPredicted, [2]time.Duration{54 * ms, 2 * ms}, [2]time.Duration{48 * ms, 2 * ms}),
	})
	want := []struct {
		policy  string
		outcome Outcome
	}{{PolicyPDTopologyAware, Pass}, {PolicyPDTopologyAware, Fail}, {PolicyPDTopologyPredicted, Pass}, {PolicyPDTopologyPredicted, Pass}}
	if len(got) != len(want) {
		t.Fatalf("%d checks, want %d: %+v", len(got), len(want), got)
	}
	for i, c := range got {
		if c.Policy != want[i].policy || c.Outcome != want[i].outcome {
			t.Errorf("check %d %q (%s): %s %s, want %s %s", i, c.Claim, c.Detail, c.Policy, c.Outcome, want[i].policy, want[i].outcome)
		}
	}
}
