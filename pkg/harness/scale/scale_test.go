package scale

import (
	"context"
	"testing"
	"time"
)

// A small fleet run measures the report's figures of work and time, the replayed
// replica ends with the live one's index, and replicas routing the same
// pool in turn answer alike but for their own speculative holdings.
func TestASmallFleetRunMeasuresEveryFigureAndTheReplicasAgree(t *testing.T) {
	rep, err := Run(context.Background(), Options{
		Engines: 48, Pools: 3, Models: 2, Duration: 2 * time.Second, Replicas: []int{1, 2, 3}, Lookups: 50, Seed: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	f, in := rep.Fleet, rep.Ingest
	t.Logf("fleet %+v", f)
	t.Logf("ingest %+v: %.0f events/core-s, %.0f B/holding", in, in.EventsPerCoreSecond(), in.BytesPerHolding())
	for _, r := range rep.Replicas {
		t.Logf("replicas %+v", r)
	}
	switch {
	case f.Routes == 0 || f.Batches == 0 || f.Events < f.Batches || f.Blocks == 0:
		t.Fatalf("the fleet ran nothing: %+v", f)
	case f.HitRate <= 0 || f.HitRate > 1:
		t.Fatalf("fleet hit rate %v", f.HitRate)
	// The heap figures are not checked: at a thousand holdings the index's
	// share is inside the noise of the process's heap (other tests'
	// goroutines, the NATS server); `make scale` measures them at sizes
	// where it is not.
	case in.Batches == 0 || in.Events == 0 || in.CPU <= 0 || in.LookupNs <= 0 || in.PickUs <= 0:
		t.Fatalf("the replay measured nothing: %+v", in)
	case in.Holdings != f.Holdings[0]:
		t.Fatalf("the replayed replica holds %d, the live one held %d", in.Holdings, f.Holdings[0])
	}
	if len(rep.Replicas) != 3 {
		t.Fatalf("%d replica runs, want 3", len(rep.Replicas))
	}
	for _, r := range rep.Replicas {
		if r.Routes == 0 || r.HitRate <= 0 {
			t.Errorf("%d replicas: %d routes, hit rate %v", r.Replicas, r.Routes, r.HitRate)
		}
		if want := (r.Replicas - 1) * 16 * 16; r.Pairs != want {
			t.Errorf("%d replicas: %d pairs compared, want %d", r.Replicas, r.Pairs, want)
		}
		if r.Disagree != 0 || r.Agree+r.SpeculativeOnly != r.Pairs {
			t.Errorf("%d replicas disagree on %d of %d pairs: %s", r.Replicas, r.Disagree, r.Pairs, r.Detail)
		}
	}
}
