package epp

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
)

// Endpoints that publish no events are routed on the routing history: a
// pick must teach it, so that the same prompt is later matched to where it
// went, whether the request carried token ids or only text.
func TestPicksTeachTheRoutingHistoryOfEndpointsWithoutEvents(t *testing.T) {
	// The prefix scorer alone, so that the second pick follows what the
	// history says: the default profile would send a request away from an
	// endpoint still computing the same prompt, which is what it should do
	// but not what this test asks.
	e := startEPPWith(t, Options{ConfigText: config.PrecisePrefixConfigText})
	for i := range 4 {
		e.Datastore().Upsert(&datalayer.Endpoint{Name: fmt.Sprintf("pod-%d", i), Address: fmt.Sprintf("10.9.0.%d:8000", i+1), Model: "m"})
	}
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(7 + i)
	}
	tests := []struct {
		name string
		req  func() *request.Request
	}{
		{"with token ids", func() *request.Request { return &request.Request{Model: "m", TokenIDs: tokens} }},
		{"with text only", func() *request.Request {
			return &request.Request{Model: "m", Prompt: strings.Repeat("the same long system prompt ", 40)}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			first, err := e.Director().Route(context.Background(), tc.req(), nil)
			if err != nil {
				t.Fatal(err)
			}
			second, err := e.Director().Route(context.Background(), tc.req(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if second.Targets[0] != first.Targets[0] {
				t.Errorf("second pick %s, want the first pick's %s", second.Targets[0], first.Targets[0])
			}
			for _, c := range second.Candidates {
				v, _ := c.Get(datalayer.PrefixCacheMatchInfoKey)
				info := v.(datalayer.PrefixCacheInfo)
				if info.Exact {
					t.Errorf("%s: an answer without events is marked exact", c.Address)
				}
				held := c.Address == first.Targets[0]
				if got := info.MatchBlocks > 0 && info.MatchBlocks == info.TotalBlocks; got != held {
					t.Errorf("%s: match %d of %d blocks; want all only for the first pick %s",
						c.Address, info.MatchBlocks, info.TotalBlocks, first.Targets[0])
				}
			}
		})
	}
}
