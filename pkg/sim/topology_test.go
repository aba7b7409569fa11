package sim

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

func TestPlacesAreNearAtTheTightestLevelTheyShare(t *testing.T) {
	t.Parallel()
	a := Place{Host: "h1", Rack: "r1", Zone: "z1", Region: "g1"}
	for _, tc := range []struct {
		b    Place
		want Near
	}{
		{a, NearHost},
		{Place{Host: "h2", Rack: "r1", Zone: "z1", Region: "g1"}, NearRack},
		{Place{Host: "h2", Rack: "r2", Zone: "z1", Region: "g1"}, NearZone},
		{Place{Host: "h2", Rack: "r2", Zone: "z2", Region: "g1"}, NearRegion},
		{Place{Host: "h2", Rack: "r2", Zone: "z2", Region: "g2"}, NearNone},
		{Place{}, NearNone},
	} {
		if got := a.NearTo(tc.b); got != tc.want {
			t.Errorf("%+v near %+v: %s, want %s", a, tc.b, got, tc.want)
		}
	}
	if got := (Place{}).NearTo(Place{}); got != NearNone {
		t.Errorf("two unknown places are near at %s, want none", got)
	}
}

func TestAPullCostsTheLinkOfTheTwoEnginesDistance(t *testing.T) {
	t.Parallel()
	tr := Transfer{Latency: 8 * time.Millisecond, BlockBytes: 1 << 20, Bandwidth: 1 << 28}
	tr.ByNear[NearHost] = Link{Latency: time.Millisecond, Bandwidth: 1 << 32}
	tr.ByNear[NearRack] = Link{Latency: 2 * time.Millisecond, Bandwidth: 1 << 30}
	// Engine 0 prefills in rack r1; 1 decodes beside it on its host, 2 in
	// its rack, 3 in another rack of its zone, 4 somewhere unknown.
	ctx, cancel := context.WithCancel(context.Background())
	f, err := StartFleet(ctx, FleetConfig{
		Engines: 5, Model: "m",
		Pool:   blockpool.Config{BlockSize: 4, GPUBlocks: 512, CPUBlocks: 64},
		Timing: Timing{PrefillPerToken: time.Microsecond, DecodeStep: 100 * time.Microsecond, MaxSeqs: 4},
		Roles:  []string{RolePrefill, RoleDecode, RoleDecode, RoleDecode, RoleDecode},
		Places: []Place{
			{Host: "h1", Rack: "r1", Zone: "z1"}, {Host: "h1", Rack: "r1", Zone: "z1"},
			{Host: "h2", Rack: "r1", Zone: "z1"}, {Host: "h3", Rack: "r2", Zone: "z1"}, {},
		},
		Transfer: tr,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	})
	p := f.Servers[0]
	for i, want := range map[int]time.Duration{
		1: tr.CostAt(5, NearHost), 2: tr.CostAt(5, NearRack), 3: tr.Cost(5), 4: tr.Cost(5),
	} {
		d := f.Servers[i]
		code, _, body := decodeLeg(t, d, pdPrompt, prefillLeg(t, p, pdPrompt))
		if code != http.StatusOK {
			t.Fatalf("decode leg on engine %d: status %d: %s", i, code, body)
		}
		if st := d.PDStats(); st.PulledBlocks != 5 || st.TransferTime != want {
			t.Errorf("engine %d pulled %d blocks in %v, want 5 in %v", i, st.PulledBlocks, st.TransferTime, want)
		}
		wantNear := [...]Near{1: NearHost, 2: NearRack, 3: NearZone, 4: NearNone}[i]
		if st := d.PDStats(); st.PullsByNear[wantNear] != 1 {
			t.Errorf("engine %d counted its pull by distance as %v, want one at %s", i, st.PullsByNear, wantNear)
		}
	}
	if tr.CostAt(5, NearHost) >= tr.CostAt(5, NearRack) || tr.CostAt(5, NearRack) >= tr.Cost(5) {
		t.Fatalf("the links are not ordered: host %v, rack %v, default %v", tr.CostAt(5, NearHost), tr.CostAt(5, NearRack), tr.Cost(5))
	}
}
