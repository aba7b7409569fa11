package datalayer_test

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

func TestEvictedHotCountsWhatAPlacementPushesOut(t *testing.T) {
	t.Parallel()
	const sec = int64(time.Second)
	// Two families, 160 blocks each, sent twice each, last at 1s and 9s;
	// the clock is 10s.
	two := func() *datalayer.Residency {
		r := &datalayer.Residency{}
		r.Touch(1, 160, 1*sec/2)
		r.Touch(1, 160, 1*sec)
		r.Touch(2, 160, 9*sec-sec/2)
		r.Touch(2, 160, 9*sec)
		return r
	}
	w := func(ageSec float64) float64 { return math.Exp(-ageSec / 10) }
	tests := []struct {
		name string
		e    datalayer.Eviction
		want float64
	}{
		{"a request that fits in the free blocks evicts nothing",
			datalayer.Eviction{Need: 80, Capacity: 400, Held: 320}, 0},
		{"blocks in flight there take free room first",
			datalayer.Eviction{Need: 80, Capacity: 400, Held: 320, Pending: 40}, 40 * w(9)},
		{"the least recently used family goes first, weighed by its age",
			datalayer.Eviction{Need: 160, Capacity: 400, Held: 320}, 80 * w(9)},
		{"past it, the next family",
			datalayer.Eviction{Need: 300, Capacity: 400, Held: 400}, 160*w(9) + 60*w(1)},
		{"blocks held outside any family are cold and go before them",
			datalayer.Eviction{Need: 160, Capacity: 400, Held: 360}, 80 * w(9)},
		{"the request's own family is not evicted for it",
			datalayer.Eviction{Need: 100, Capacity: 320, Held: 320, Own: 1}, 100 * w(1)},
		{"families the engine no longer holds, the oldest, are gone already",
			datalayer.Eviction{Need: 100, Capacity: 160, Held: 160}, 100 * w(1)},
		{"an endpoint of unknown capacity costs nothing",
			datalayer.Eviction{Need: 160, Held: 320}, 0},
	}
	for _, tt := range tests {
		tt.e.Now, tt.e.Window = 10*sec, 10*time.Second
		if got := two().EvictedHot(tt.e); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: EvictedHot = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestAFamilySeenOnceWeighsAsMuchAsFamiliesReturnThere(t *testing.T) {
	t.Parallel()
	const sec = int64(time.Second)
	r := &datalayer.Residency{}
	r.Touch(3, 10, 1*sec) // a family that returned once
	r.Touch(3, 10, 2*sec)
	r.Touch(1, 160, 9*sec) // one seen once
	// One request in three came back to its family, each faded over 32.
	returns := 0.0
	for _, back := range []float64{0, 1, 0} {
		returns += (back - returns) / 32
	}
	e := datalayer.Eviction{Need: 100, Capacity: 170, Held: 170, Now: 10 * sec, Window: 10 * time.Second}
	want := 10*math.Exp(-0.8) + 90*math.Exp(-0.1)*returns
	if got := r.EvictedHot(e); math.Abs(got-want) > 1e-9 {
		t.Errorf("EvictedHot = %v, want %v", got, want)
	}
	// Prompts that never come back make an endpoint's cache cold.
	u := &datalayer.Residency{}
	for i := range 100 {
		u.Touch(uint64(i+1), 100, int64(i+1))
	}
	e = datalayer.Eviction{Need: 100, Capacity: 1000, Held: 1000, Now: 101, Window: time.Hour}
	if got := u.EvictedHot(e); got > 1e-9 {
		t.Errorf("unrelated prompts, each seen once: EvictedHot = %v, want 0", got)
	}
}

func TestResidencyKeepsTheLatestFamilies(t *testing.T) {
	t.Parallel()
	r := &datalayer.Residency{}
	for i := range datalayer.ResidencySlots + 4 {
		r.Touch(uint64(i+1), 10, int64(i+1))
		r.Touch(uint64(i+1), 10, int64(i+1))
	}
	// The first four families were pushed out by later ones: the rest,
	// 16 of 10 blocks, are all the engine holds, and each is as hot.
	e := datalayer.Eviction{Need: 10 * datalayer.ResidencySlots, Capacity: 10 * datalayer.ResidencySlots,
		Held: 10 * datalayer.ResidencySlots, Now: 100, Window: time.Hour}
	if got := r.EvictedHot(e); math.Abs(got-float64(e.Need)) > 1e-6 {
		t.Errorf("EvictedHot = %v, want every one of %d blocks hot", got, e.Need)
	}
	// A family sent again grows to its longest request and is the newest.
	r.Touch(5, 40, 200)
	e = datalayer.Eviction{Need: 40, Capacity: 190, Held: 190, Own: 5, Now: 200, Window: time.Hour}
	if got := r.EvictedHot(e); got < 39 || got > 40 {
		t.Errorf("EvictedHot = %v, want 40 blocks of other families", got)
	}
	var nilR *datalayer.Residency
	nilR.Touch(1, 1, 1)
	if got := nilR.EvictedHot(e); got != 0 {
		t.Errorf("a nil Residency: %v", got)
	}
}

func TestEvictedHotAllocatesNothing(t *testing.T) {
	r := &datalayer.Residency{}
	for i := range datalayer.ResidencySlots {
		r.Touch(uint64(i+1), 100, int64(i+1))
		r.Touch(uint64(i+1), 100, int64(i+1))
	}
	e := datalayer.Eviction{Need: 500, Capacity: 1000, Held: 1000, Now: 100, Window: time.Second}
	if n := testing.AllocsPerRun(100, func() { r.EvictedHot(e) }); n != 0 {
		t.Errorf("EvictedHot allocates %v times", n)
	}
}

func BenchmarkEvictedHot(b *testing.B) {
	r := &datalayer.Residency{}
	for i := range datalayer.ResidencySlots {
		r.Touch(uint64(i+1), 100, int64(i+1))
		r.Touch(uint64(i+1), 100, int64(i+1))
	}
	e := datalayer.Eviction{Need: 500, Capacity: 1000, Held: 1000, Now: 100, Window: time.Second}
	for b.Loop() {
		r.EvictedHot(e)
	}
}

func TestAnEndpointKeepsItsResidencyAcrossAnUpdateAtItsAddress(t *testing.T) {
	t.Parallel()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m"})
	first := ds.Candidates(nil)[0].Residency
	if first == nil {
		t.Fatal("a candidate without the endpoint's Residency")
	}
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m", Labels: map[string]string{"x": "y"}})
	if got := ds.Candidates(nil)[0].Residency; got != first {
		t.Error("an update at the same address dropped what was sent to the endpoint")
	}
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.2:8000", Model: "m"})
	if got := ds.Candidates(nil)[0].Residency; got == first {
		t.Error("another engine at a new address inherited the old one's families")
	}
}
