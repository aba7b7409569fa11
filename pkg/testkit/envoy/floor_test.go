package envoy_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// The floor, working or not, answers as an endpoint picker must: the
// destination in the header and the metadata, the body passed back whole
// (here across two of its 64 KiB chunks).
func TestFloorAnswersWithItsDestinationAndTheBodyWhole(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte(`{"prompt":[1,2,3]}`), 5000)
	for name, fl := range map[string]*envoy.Floor{
		"floor":         envoy.StartFloor(t, "10.0.0.7:8000"),
		"working floor": envoy.StartWorkingFloor(t, "10.0.0.7:8000", 50*time.Microsecond),
	} {
		c, err := envoy.Dial(fl.Addr(), true)
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
