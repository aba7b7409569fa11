package datalayer_test

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

func TestDistanceIsTheTightestLevelBothKnowAndShare(t *testing.T) {
	t.Parallel()
	a := datalayer.Topology{Host: "h1", Rack: "r1", Zone: "z1", Region: "g1"}
	for _, tc := range []struct {
		name string
		b    datalayer.Topology
		want datalayer.Distance
	}{
		{"one host", a, datalayer.SameHost},
		{"one rack", datalayer.Topology{Host: "h2", Rack: "r1", Zone: "z1", Region: "g1"}, datalayer.SameRack},
		{"one zone", datalayer.Topology{Host: "h2", Rack: "r2", Zone: "z1", Region: "g1"}, datalayer.SameZone},
		{"one region", datalayer.Topology{Host: "h2", Rack: "r2", Zone: "z2", Region: "g1"}, datalayer.SameRegion},
		{"nothing shared", datalayer.Topology{Host: "h2", Rack: "r2", Zone: "z2", Region: "g2"}, datalayer.Apart},
		{"a place not known", datalayer.Topology{}, datalayer.Unknown},
		{"only a zone known, another", datalayer.Topology{Zone: "z2"}, datalayer.Apart},
	} {
		if got := a.DistanceTo(tc.b); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
		if got := tc.b.DistanceTo(a); got != tc.want {
			t.Errorf("%s, the other way: %s, want %s", tc.name, got, tc.want)
		}
	}
	if got := (datalayer.Topology{Zone: "z1"}).DistanceTo(datalayer.Topology{Zone: "z1"}); got != datalayer.SameZone {
		t.Errorf("two places known only by zone: %s, want zone (empty hosts and racks never match)", got)
	}
}

func TestTopologyFromNodeLabels(t *testing.T) {
	t.Parallel()
	labels := map[string]string{
		"kubernetes.io/hostname": "node-7", "topology.kubernetes.io/zone": "us-east-1a",
		"topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/rack": "r12", "example.com/rack": "r9",
	}
	if got, want := datalayer.TopologyFromLabels(labels, ""), (datalayer.Topology{Host: "node-7", Rack: "r12", Zone: "us-east-1a", Region: "us-east-1"}); got != want {
		t.Errorf("default rack label: %+v, want %+v", got, want)
	}
	if got := datalayer.TopologyFromLabels(labels, "example.com/rack"); got.Rack != "r9" {
		t.Errorf("a configured rack label read %q, want r9", got.Rack)
	}
}
