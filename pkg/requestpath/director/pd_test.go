package director_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// newSplitDirector is a director whose every pick is split: decode on b,
// prefill on a.
func newSplitDirector(t *testing.T, rec *recorder) (*director.Director, *datalayer.Datastore, *time.Time) {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m"})
	ds.Upsert(&datalayer.Endpoint{Name: "b", Address: "10.0.0.2:8000", Model: "m"})
	now := time.Unix(1000, 0)
	d, err := director.New(director.Options{Datastore: ds, Scheduler: splitPicker{}, InFlight: ds, Outliers: ds,
		PluginObservers: []plugin.ResponseObserver{rec}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return d, ds, &now
}

func TestEachLegOfASplitPickIsAccountedOnItsOwnEndpoint(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d, ds, now := newSplitDirector(t, rec)
	ids := make([]uint32, 64)
	p, err := d.HandleRequest(context.Background(), &director.Input{
		Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":` + jsonIDs(ids) + `,"stream":true,"max_tokens":9}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	start := *now
	if got := inFlightNow(ds.InFlight("a")); got != (datalayer.InFlight{Prefilling: 1, PrefillTokens: 64, OldestPrefill: start.UnixNano()}) {
		t.Fatalf("the prefill pod after the pick: %+v, want the whole prompt to prefill", got)
	}
	// The decode pod prefills none of it: 64 tokens are whole blocks of
	// any size, all transferred (no block size known here: none computed).
	if got := inFlightNow(ds.InFlight("b")); got.Prefilling != 1 || got.PrefillTokens != 0 {
		t.Fatalf("the decode pod after the pick: %+v, want one request with nothing of its own to prefill", got)
	}

	*now = start.Add(30 * time.Millisecond)
	d.HandlePrefill(p, director.Served{Endpoint: p.Prefill, Status: 200, End: *now,
		Usage: openai.Usage{PromptTokens: 64, CompletionTokens: 1}})
	if got := inFlightNow(ds.InFlight("a")); got != (datalayer.InFlight{}) {
		t.Errorf("the prefill pod after its leg: %+v, want nothing in flight", got)
	}
	*now = start.Add(40 * time.Millisecond)
	d.HandleFirstByte(p)
	d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200, Streamed: true,
		FirstByte: start.Add(40 * time.Millisecond), End: start.Add(120 * time.Millisecond),
		Usage: openai.Usage{PromptTokens: 64, CompletionTokens: 9, CachedTokens: 64}})
	if got := inFlightNow(ds.InFlight("b")); got != (datalayer.InFlight{}) {
		t.Errorf("the decode pod after its leg: %+v, want nothing in flight", got)
	}

	if len(rec.seen) != 2 {
		t.Fatalf("observers heard %d legs, want the prefill and the decode legs", len(rec.seen))
	}
	pre, dec := rec.seen[0], rec.seen[1]
	if ttft, ok := pre.TTFT(); pre.Endpoint != "10.0.0.1:8000" || !ok || ttft != 30*time.Millisecond || pre.Picked == nil {
		t.Errorf("prefill leg: endpoint %s, TTFT %v (%v), picked %v; want the prefill pod's 30ms with its prediction", pre.Endpoint, ttft, ok, pre.Picked)
	}
	if _, ok := pre.TPOT(); ok {
		t.Error("a one-token prefill leg taught a TPOT")
	}
	if _, ok := dec.TTFT(); ok || dec.Endpoint != "10.0.0.2:8000" {
		t.Errorf("decode leg on %s taught a TTFT: its first token waited on the transfer, not its own prefill", dec.Endpoint)
	}
	if tpot, ok := dec.TPOT(); !ok || tpot != 10*time.Millisecond {
		t.Errorf("decode leg TPOT %v (%v), want 10ms", tpot, ok)
	}
}

func TestAFailedPrefillLegEndsItsAccountingAndTeachesNothing(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d, ds, _ := newSplitDirector(t, rec)
	p, err := d.HandleRequest(context.Background(), &director.Input{
		Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":[1,2,3,4,5]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	d.HandlePrefill(p, director.Served{Endpoint: p.Prefill, Status: 500})
	// The decode leg was never sent: no answer of the decode pod's.
	d.HandleResponse(p, director.Served{Endpoint: p.Targets[0]})
	for _, n := range []string{"a", "b"} {
		if got := inFlightNow(ds.InFlight(n)); got != (datalayer.InFlight{}) {
			t.Errorf("%s: %+v in flight, want nothing", n, got)
		}
	}
	for _, r := range rec.seen {
		// A response with no status is one the predictor learns nothing from.
		if r.Status != 0 {
			t.Errorf("observers heard a leg of a failed split answered %d on %s, want none", r.Status, r.Endpoint)
		}
	}
}

func TestASidecarsPrefillLegEndsWithTheDecodePodsFirstToken(t *testing.T) {
	t.Parallel()
	d, ds, now := newSplitDirector(t, &recorder{})
	p, err := d.HandleRequest(context.Background(), &director.Input{
		Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":[1,2,3,4,5],"stream":true}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := inFlightNow(ds.InFlight("a")); got.Prefilling != 1 {
		t.Fatalf("the prefill pod: %+v, want the prefill in flight", got)
	}
	first := now.Add(50 * time.Millisecond)
	d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200, Streamed: true, FirstByte: first, End: first.Add(time.Second),
		Usage: openai.Usage{PromptTokens: 5, CompletionTokens: 3}})
	for _, n := range []string{"a", "b"} {
		if got := inFlightNow(ds.InFlight(n)); got != (datalayer.InFlight{}) {
			t.Errorf("%s: %+v in flight, want nothing", n, got)
		}
	}
	if f := ds.InFlight("a"); f.RecentEndsAt != first.UnixNano() {
		t.Errorf("the prefill pod's leg ended at %v, want the decode pod's first token %v", f.RecentEndsAt, first.UnixNano())
	}
}

func TestTheTransferIsMeasuredByTheDistanceBetweenThePods(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ds := datalayer.NewDatastore(nil)
	// a prefills, b decodes: one rack, two hosts.
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m", Topology: datalayer.Topology{Host: "h1", Rack: "r1"}})
	ds.Upsert(&datalayer.Endpoint{Name: "b", Address: "10.0.0.2:8000", Model: "m", Topology: datalayer.Topology{Host: "h2", Rack: "r1"}})
	now := time.Unix(1000, 0)
	d, err := director.New(director.Options{Datastore: ds, Scheduler: splitPicker{}, InFlight: ds, Outliers: ds,
		Metrics: director.NewMetrics(reg), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.HandleRequest(context.Background(), &director.Input{
		Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":[1,2,3,4,5],"stream":true}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	d.HandlePrefill(p, director.Served{Endpoint: p.Prefill, Status: 200, End: now.Add(30 * time.Millisecond),
		Usage: openai.Usage{PromptTokens: 5, CompletionTokens: 1}})
	d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200, Streamed: true,
		FirstByte: now.Add(40 * time.Millisecond), End: now.Add(90 * time.Millisecond), Usage: openai.Usage{PromptTokens: 5, CompletionTokens: 3}})
	if got := testkit.HistCount(t, reg, "kvroute_pd_transfer_duration_seconds", "distance", "rack"); got != 1 {
		t.Errorf("transfers within a rack measured %d, want 1", got)
	}
	if got := testkit.HistSum(t, reg, "kvroute_pd_transfer_duration_seconds", "distance", "rack"); got < 0.0099 || got > 0.0101 {
		t.Errorf("the transfer within a rack measured %vs, want the 10ms from the prefill leg's end to the first token", got)
	}
	if got := testkit.HistCount(t, reg, "kvroute_pd_transfer_duration_seconds"); got != 1 {
		t.Errorf("transfers measured %d in all, want 1", got)
	}
}
