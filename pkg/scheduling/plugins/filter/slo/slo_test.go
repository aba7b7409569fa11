package slo_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/slo"
)

func predicted(name string, headroom float64) *datalayer.Candidate {
	c := schedtest.C{Name: name}.Build()
	c.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{TTFTValid: true, HasTTFTSLO: true, TTFTHeadroom: headroom, TTFT: 100 - headroom})
	return c
}

func TestTheFilterKeepsTheCandidatesPredictedToMeetTheSLO(t *testing.T) {
	t.Parallel()
	p, err := slo.Factory("f", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(framework.Filter)
	withSLO := &request.Request{SLO: request.SLO{TTFT: 100 * time.Millisecond}}
	tests := []struct {
		name  string
		req   *request.Request
		cands []*datalayer.Candidate
		want  []string
	}{
		{"those predicted to meet it are kept", withSLO, []*datalayer.Candidate{predicted("a", 10), predicted("b", -5), predicted("c", 0)}, []string{"a", "c"}},
		{"when none is, all are kept for admission to decide", withSLO, []*datalayer.Candidate{predicted("a", -1), predicted("b", -5)}, []string{"a", "b"}},
		{"a request without an SLO passes untouched", &request.Request{}, []*datalayer.Candidate{predicted("a", -1), predicted("b", 5)}, []string{"a", "b"}},
		{"a candidate without a prediction is not predicted to meet it", withSLO, []*datalayer.Candidate{schedtest.C{Name: "x"}.Build(), predicted("b", 5)}, []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := f.Filter(context.Background(), nil, tt.req, tt.cands)
			var names []string
			for _, c := range got {
				names = append(names, c.Name)
			}
			if len(names) != len(tt.want) {
				t.Fatalf("kept %v, want %v", names, tt.want)
			}
			for i := range names {
				if names[i] != tt.want[i] {
					t.Fatalf("kept %v, want %v", names, tt.want)
				}
			}
		})
	}
}

// priced is a candidate with u of the request's 164 blocks uncached,
// predicted ttft (p90) against a 250ms SLO, alone of it its own prefill.
func priced(name string, u int, ttft, alone float64) *datalayer.Candidate {
	c := schedtest.C{Name: name}.Build()
	c.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{TTFTValid: true, HasTTFTSLO: true,
		TTFT: ttft, TTFTMean: ttft, TTFTAlone: alone, TTFTHeadroom: 250 - ttft})
	c.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{MatchBlocks: 164 - u, TotalBlocks: 164, BlockSizeTokens: 16, State: datalayer.StreamExact})
	return c
}

func TestEveryCandidatesOwnPrefillIsPricedAtOneRate(t *testing.T) {
	t.Parallel()
	p, err := slo.Factory("f", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(framework.Filter)
	req := &request.Request{SLO: request.SLO{TTFT: 250 * time.Millisecond}}
	tests := []struct {
		name  string
		cands []*datalayer.Candidate
		want  []string
	}{
		{
			// a's model has learned what a cold prefill costs (1.28ms a
			// block); b's and c's still price it at 0.8ms: at a's rate
			// neither meets the SLO either, so none is dropped for it.
			"the endpoint whose model knows a cold prefill's cost is not dropped for it",
			[]*datalayer.Candidate{priced("a", 164, 260, 210), priced("b", 164, 200, 131), priced("c", 164, 190, 131)},
			[]string{"a", "b", "c"},
		},
		{
			"a candidate holding the prefix keeps its own figure, the step's fixed cost included",
			[]*datalayer.Candidate{priced("a", 164, 260, 210), priced("hit", 4, 40, 18), priced("b", 164, 200, 131)},
			[]string{"hit"},
		},
		{
			"a queue alone still fails a candidate",
			[]*datalayer.Candidate{priced("a", 164, 220, 210), priced("b", 164, 330, 131)},
			[]string{"a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var names []string
			for _, c := range f.Filter(context.Background(), nil, req, tt.cands) {
				names = append(names, c.Name)
			}
			if len(names) != len(tt.want) {
				t.Fatalf("kept %v, want %v", names, tt.want)
			}
			for i := range names {
				if names[i] != tt.want[i] {
					t.Fatalf("kept %v, want %v", names, tt.want)
				}
			}
		})
	}
}
