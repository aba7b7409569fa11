package topologyaffinity_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/topologyaffinity"
)

// place is a pod on host h of rack r, zone z, region g.
func place(h, r, z, g string) datalayer.Topology {
	return datalayer.Topology{Host: h, Rack: r, Zone: z, Region: g}
}

// The peer (the decode pick) runs on host h1, rack r1, zone z1, region g1;
// each candidate is one level further away than the one before.
var (
	peer      = schedtest.C{Name: "decode", Topology: place("h1", "r1", "z1", "g1")}
	sameHost  = schedtest.C{Name: "host", Topology: place("h1", "r1", "z1", "g1")}
	sameRack  = schedtest.C{Name: "rack", Topology: place("h2", "r1", "z1", "g1")}
	sameZone  = schedtest.C{Name: "zone", Topology: place("h3", "r2", "z1", "g1")}
	sameReg   = schedtest.C{Name: "region", Topology: place("h4", "r3", "z2", "g1")}
	apart     = schedtest.C{Name: "apart", Topology: place("h5", "r4", "z3", "g2")}
	nowhere   = schedtest.C{Name: "nowhere"}
	everybody = []schedtest.C{sameHost, sameRack, sameZone, sameReg, apart, nowhere}
)

func run(t *testing.T, raw string, peer *schedtest.C, cands ...schedtest.C) []string {
	t.Helper()
	var params json.RawMessage
	if raw != "" {
		params = json.RawMessage(raw)
	}
	p, err := topologyaffinity.Factory("f", params, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := schedtest.Cycle()
	if peer != nil {
		cs.Write(framework.PeerEndpointKey, peer.Build())
	}
	return schedtest.Names(p.(framework.Filter).Filter(context.Background(), cs, &request.Request{}, schedtest.Cands(cands...)))
}

func TestTheFilterKeepsCandidatesNoFartherThanMinAffinity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, params string
		want         []string
	}{
		{"the default minAffinity keeps the peer's host alone", ``, []string{"host"}},
		{"host keeps the peer's host alone", `{"minAffinity":"host"}`, []string{"host"}},
		{"rack keeps its host and its rack", `{"minAffinity":"rack"}`, []string{"host", "rack"}},
		{"zone keeps everything within its zone", `{"minAffinity":"zone"}`, []string{"host", "rack", "zone"}},
		{"region keeps everything within its region, not a pod with no known place", `{"minAffinity":"region"}`, []string{"host", "rack", "zone", "region"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := run(t, tc.params, &peer, everybody...); !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTheFilterFailsOpen(t *testing.T) {
	t.Parallel()
	far := []schedtest.C{sameZone, sameReg, apart, nowhere}
	farNames := []string{"zone", "region", "apart", "nowhere"}
	for _, tc := range []struct {
		name   string
		params string
		peer   *schedtest.C
		cands  []schedtest.C
		want   []string
	}{
		{"no candidate meets minAffinity: all pass", `{"minAffinity":"rack"}`, &peer, far, farNames},
		{"no peer (a request not split, or the first stage): all pass", `{"minAffinity":"host"}`, nil, everybody, []string{"host", "rack", "zone", "region", "apart", "nowhere"}},
		{"a peer whose place is unknown: all pass", `{"minAffinity":"host"}`, &nowhere, far, farNames},
		{"only pods with no known place: all pass", `{"minAffinity":"region"}`, &peer, []schedtest.C{nowhere, {Name: "nowhere-2"}}, []string{"nowhere", "nowhere-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := run(t, tc.params, tc.peer, tc.cands...); !slices.Equal(got, tc.want) {
				t.Fatalf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAnEmptyFieldNeverMatches(t *testing.T) {
	t.Parallel()
	// Neither knows its host or rack: they are not on one host for it.
	p := schedtest.C{Name: "decode", Topology: place("", "", "z1", "")}
	cands := []schedtest.C{{Name: "zone-only", Topology: place("", "", "z1", "")}, {Name: "other", Topology: place("", "", "z2", "")}}
	if got := run(t, `{"minAffinity":"rack"}`, &p, cands...); !slices.Equal(got, []string{"zone-only", "other"}) {
		t.Fatalf("minAffinity rack kept %v, want both (none is in the peer's rack: fail open)", got)
	}
	if got := run(t, `{"minAffinity":"zone"}`, &p, cands...); !slices.Equal(got, []string{"zone-only"}) {
		t.Fatalf("minAffinity zone kept %v, want [zone-only]", got)
	}
}

func TestTheFilterRefusesAnUnknownLevel(t *testing.T) {
	t.Parallel()
	_, err := topologyaffinity.Factory("f", json.RawMessage(`{"minAffinity":"datacenter"}`), nil)
	if err == nil || !strings.Contains(err.Error(), `topology level "datacenter", want host, rack, zone or region`) {
		t.Fatalf("err = %v", err)
	}
}
