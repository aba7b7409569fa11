package tokenload_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/tokenload"
)

// cand has prefill tokens in flight and holds match of the request's
// blocks of 16 tokens.
func cand(name string, inflight, match int) *datalayer.Candidate {
	c := schedtest.C{Name: name, Prefix: &datalayer.PrefixCacheInfo{MatchBlocks: match, TotalBlocks: 4, BlockSizeTokens: 16, MatchTokens: match * 16}}.Build()
	c.InFlight.PrefillTokens = inflight
	return c
}

func TestTheScoreFallsWithPromptTokensStillToCompute(t *testing.T) {
	t.Parallel()
	req := &request.Request{TokenIDs: make([]uint32, 64)}
	tests := []struct {
		name   string
		params string
		cands  []*datalayer.Candidate
		want   []float64
	}{
		{"nothing in flight and the whole prompt cached scores 1", `{"queueThresholdTokens": 100}`,
			[]*datalayer.Candidate{cand("a", 0, 4)}, []float64{1}},
		{"tokens in flight and this request's uncached ones add up", `{"queueThresholdTokens": 100}`,
			[]*datalayer.Candidate{cand("a", 20, 4), cand("b", 20, 2), cand("c", 0, 0)}, []float64{0.8, 0.48, 0.36}},
		{"a load over the threshold scores 0", `{"queueThresholdTokens": 100}`,
			[]*datalayer.Candidate{cand("a", 500, 0)}, []float64{0}},
		{"no threshold means upstream's default", ``,
			[]*datalayer.Candidate{cand("a", tokenload.DefaultQueueThresholdTokens/2-64, 0)}, []float64{0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := tokenload.Factory("s", json.RawMessage(tt.params), nil)
			if err != nil {
				t.Fatal(err)
			}
			out := make([]float64, len(tt.cands))
			p.(framework.Scorer).Score(context.Background(), framework.NewCycleState(schedtest.Now, 1, 2), req, tt.cands, out)
			for i := range out {
				if d := out[i] - tt.want[i]; d > 1e-9 || d < -1e-9 {
					t.Fatalf("scores %v, want %v", out, tt.want)
				}
			}
		})
	}
}
