package loadgen

import (
	"os"
	"testing"

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
