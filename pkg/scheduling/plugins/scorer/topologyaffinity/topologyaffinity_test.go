package topologyaffinity_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/topologyaffinity"
)

func place(h, r, z, g string) datalayer.Topology {
	return datalayer.Topology{Host: h, Rack: r, Zone: z, Region: g}
}

func score(peer *schedtest.C, cands ...schedtest.C) []float64 {
	cs := schedtest.Cycle()
	if peer != nil {
		cs.Write(framework.PeerEndpointKey, peer.Build())
	}
	out := make([]float64, len(cands))
	for i := range out {
		out[i] = -1 // every entry must be written
	}
	topologyaffinity.New("s", nil).Score(context.Background(), cs, &request.Request{}, schedtest.Cands(cands...), out)
	return out
}

func TestTheScorerGradesProximityOnUpstreamsCurve(t *testing.T) {
	t.Parallel()
	peer := schedtest.C{Name: "decode", Topology: place("h1", "r1", "z1", "g1")}
	cands := []schedtest.C{
		{Name: "host", Topology: place("h1", "r1", "z1", "g1")},
		{Name: "rack", Topology: place("h2", "r1", "z1", "g1")},
		{Name: "zone", Topology: place("h3", "r2", "z1", "g1")},
		{Name: "region", Topology: place("h4", "r3", "z2", "g1")},
		{Name: "apart", Topology: place("h5", "r4", "z3", "g2")},
		{Name: "nowhere"},
	}
	want := []float64{1, 0.2, 0.05, 0.02, 0, 0}
	if got := score(&peer, cands...); !slices.Equal(got, want) {
		t.Fatalf("scores %v, want %v", got, want)
	}
}

func TestTheScorerScoresZeroWithoutAPeerPlace(t *testing.T) {
	t.Parallel()
	cands := []schedtest.C{{Name: "a", Topology: place("h1", "r1", "z1", "g1")}, {Name: "b"}}
	for _, tc := range []struct {
		name string
		peer *schedtest.C
	}{
		{"no peer", nil},
		{"a peer with no known place", &schedtest.C{Name: "decode"}},
	} {
		if got := score(tc.peer, cands...); !slices.Equal(got, []float64{0, 0}) {
			t.Errorf("%s: scores %v, want all 0", tc.name, got)
		}
	}
}

func TestARackLevelPlaceScoresTheRackWithoutAHost(t *testing.T) {
	t.Parallel()
	// Rack-scale NVLink domains label racks, not hosts.
	peer := schedtest.C{Name: "decode", Topology: place("", "nvl-1", "z1", "")}
	got := score(&peer, schedtest.C{Name: "a", Topology: place("", "nvl-1", "z1", "")}, schedtest.C{Name: "b", Topology: place("", "nvl-2", "z1", "")})
	if want := []float64{0.2, 0.05}; !slices.Equal(got, want) {
		t.Fatalf("scores %v, want %v", got, want)
	}
}
