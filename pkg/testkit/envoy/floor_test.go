package envoy_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// TestMain lets the floor run in a process of its own
// (envoy.StartFloorProcess): this binary, started again, is that process.
func TestMain(m *testing.M) {
	envoy.Main()
	os.Exit(m.Run())
}

// The floor, working or not, in this process or its own, answers as an endpoint picker must: the
// destination in the header and the metadata, the body passed back whole
// (here across two of its 64 KiB chunks).
func TestFloorAnswersWithItsDestinationAndTheBodyWhole(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte(`{"prompt":[1,2,3]}`), 5000)
	for name, addr := range map[string]string{
		"floor":                         envoy.StartFloor(t, "10.0.0.7:8000").Addr(),
		"working floor":                 envoy.StartWorkingFloor(t, "10.0.0.7:8000", 50*time.Microsecond).Addr(),
		"floor in a process of its own": envoy.StartFloorProcess(t, "10.0.0.7:8000", 0).Addr(),
		"working floor in its own":      envoy.StartFloorProcess(t, "10.0.0.7:8000", 50*time.Microsecond).Addr(),
	} {
		c, err := envoy.Dial(addr, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body, Chunks: 7}, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.Immediate != nil {
			t.Fatalf("%s refused: %v", name, res.Immediate)
		}
		if res.Destination != "10.0.0.7:8000" || res.MetadataDestination != "10.0.0.7:8000" {
			t.Errorf("%s: destination %q, metadata %q; want 10.0.0.7:8000 in both", name, res.Destination, res.MetadataDestination)
		}
		if !bytes.Equal(res.Body, body) {
			t.Errorf("%s passed back %d bytes, want the %d sent unchanged", name, len(res.Body), len(body))
		}
	}
}

// A floor process's statistics are its own: the CPU and allocations of
// the requests it served grow there, and a floor that spends work on each
// request spends it in its own process.
func TestAFloorProcessCountsItsOwnWork(t *testing.T) {
	t.Parallel()
	fl := envoy.StartFloorProcess(t, "10.0.0.7:8000", time.Millisecond)
	c, err := envoy.Dial(fl.Addr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	before, err := fl.Stats()
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	res := envoy.Load{Bodies: [][]byte{bytes.Repeat([]byte("x"), 40000)}, N: n, Workers: 1}.Run(c)
	if res.Failures > 0 {
		t.Fatalf("%d of %d requests failed", res.Failures, n)
	}
	after, err := fl.Stats()
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	// n ms of spinning, at least half of it seen however coarse the
	// kernel's accounting.
	if d.CPU < n*time.Millisecond/2 {
		t.Errorf("the floor process counted %v of CPU for %d requests of 1ms work each", d.CPU, n)
	}
	if d.Allocs < n || d.AllocBytes < n*40000 {
		t.Errorf("the floor process counted %d allocations, %d bytes for %d requests of 40 kB", d.Allocs, d.AllocBytes, n)
	}
}
