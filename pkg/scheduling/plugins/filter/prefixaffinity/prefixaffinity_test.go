package prefixaffinity_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/prefixaffinity"
)

// cand holds match of 10 blocks, has prefill tokens in flight and, when
// ttft > 0, a predicted TTFT in milliseconds.
func cand(name string, match, inflight int, ttft float64) *datalayer.Candidate {
	c := schedtest.C{Name: name, Prefix: &datalayer.PrefixCacheInfo{MatchBlocks: match, TotalBlocks: 10, BlockSizeTokens: 16, MatchTokens: match * 16}}.Build()
	c.InFlight.PrefillTokens = inflight
	if ttft > 0 {
		c.Put(datalayer.LatencyPredictionInfoKey, &datalayer.LatencyPredictionInfo{TTFTValid: true, TTFT: ttft})
	}
	return c
}

func TestTheFilterKeepsTheStickyEndpointsUnlessTheyAreTooSlow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		cands  []*datalayer.Candidate
		want   []string
	}{
		{"endpoints holding the threshold's share are kept", ``,
			[]*datalayer.Candidate{cand("a", 9, 0, 0), cand("b", 8, 0, 0), cand("c", 7, 0, 0)}, []string{"a", "b"}},
		{"with none sticky all are kept", ``,
			[]*datalayer.Candidate{cand("a", 1, 0, 0), cand("b", 0, 0, 0)}, []string{"a", "b"}},
		{"the threshold is the file's", `{"affinityThreshold": 0.5}`,
			[]*datalayer.Candidate{cand("a", 5, 0, 0), cand("b", 4, 0, 0)}, []string{"a"}},
		{"a threshold of 0 turns the filter off", `{"affinityThreshold": 0}`,
			[]*datalayer.Candidate{cand("a", 9, 0, 0), cand("b", 0, 0, 0)}, []string{"a", "b"}},
		{"exploration with probability 1 keeps all", `{"explorationProbability": 1}`,
			[]*datalayer.Candidate{cand("a", 9, 0, 0), cand("b", 0, 0, 0)}, []string{"a", "b"}},
		{"sticky endpoints with prefill work past the TTFT penalty lose their stickiness", `{"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 500}`,
			[]*datalayer.Candidate{cand("a", 9, 600, 0), cand("b", 0, 0, 0)}, []string{"a", "b"}},
		{"within the TTFT penalty they keep it", `{"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 500}`,
			[]*datalayer.Candidate{cand("a", 9, 400, 0), cand("b", 0, 0, 0)}, []string{"a"}},
		{"the predictor's TTFT breaks stickiness when asked for", `{"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 100}`,
			[]*datalayer.Candidate{cand("a", 9, 0, 350), cand("b", 0, 0, 200)}, []string{"a", "b"}},
		{"and keeps it within the penalty", `{"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 100}`,
			[]*datalayer.Candidate{cand("a", 9, 0, 250), cand("b", 0, 0, 200)}, []string{"a"}},
		{"a penalty of 0 always sticks", `{"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 0}`,
			[]*datalayer.Candidate{cand("a", 9, 0, 9000), cand("b", 0, 0, 1)}, []string{"a"}},
		{"the in-flight token gate breaks stickiness past its penalty", `{"maxTTFTPenaltyMs": 0, "maxTokensInFlightPenalty": 1000}`,
			[]*datalayer.Candidate{cand("a", 9, 1500, 0), cand("b", 0, 100, 0)}, []string{"a", "b"}},
		{"and keeps it within", `{"maxTTFTPenaltyMs": 0, "maxTokensInFlightPenalty": 1000}`,
			[]*datalayer.Candidate{cand("a", 9, 1000, 0), cand("b", 0, 100, 0)}, []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := prefixaffinity.Factory("f", json.RawMessage(tt.params), nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range p.(framework.Filter).Filter(context.Background(), nil, &request.Request{}, tt.cands) {
				got = append(got, c.Name)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("kept %v, want %v", got, tt.want)
			}
		})
	}
}

func TestThePredictionIsConsumedOnlyWhenTheGateReadsIt(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		`{"ttftSource": "latencyPredictor"}`:                        true,
		`{"ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 0}`: false,
		``: false,
	} {
		p, err := prefixaffinity.Factory("f", json.RawMessage(raw), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, got := p.(*prefixaffinity.Filter).Consumes()[datalayer.LatencyPredictionInfoKey]
		if got != want {
			t.Errorf("%s: consumes the prediction = %v, want %v", raw, got, want)
		}
	}
}

func TestBadParametersAreRefused(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`{"affinityThreshold": 1.5}`, `{"explorationProbability": 2}`, `{"maxTTFTPenaltyMs": -1}`,
		`{"ttftSource": "guess"}`, `{"peakPrefillThroughput": 0}`, `{"maxTokensInFlightPenalty": -5}`,
	} {
		if _, err := prefixaffinity.Factory("f", json.RawMessage(raw), nil); !errors.Is(err, framework.ErrInvalidParams) {
			t.Errorf("%s: err = %v, want ErrInvalidParams", raw, err)
		}
	}
}
