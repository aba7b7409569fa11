package prefillcost_test

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefillcost"
)

// tokens1024 is a request of 64 full blocks.
var tokens1024 = &request.Request{ID: "r", TokenIDs: make([]uint32, 1024)}

func TestScoreWeighsUncachedAndQueuedPrefill(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		req    *request.Request
		cands  []schedtest.C
		want   []float64
	}{
		{"a full GPU hit on an idle pod costs nothing and wins",
			"", tokens1024,
			[]schedtest.C{{Name: "hit", Prefix: schedtest.Info(64, 64, 0, 0, 0)}, {Name: "cold", Prefix: schedtest.Info(64, 0, 0, 0, 0)}},
			[]float64{1, 1.0 / 1025}},
		{"a CPU-held token costs a fifth of a prefill",
			"", tokens1024,
			[]schedtest.C{{Name: "cpu", Prefix: schedtest.Info(64, 0, 64, 0, 0)}, {Name: "gpu", Prefix: schedtest.Info(64, 64, 0, 0, 0)}},
			[]float64{1 / (1024*0.2 + 1), 1}},
		{"a cache hit loses to a cold pod when its queue is long",
			"", tokens1024,
			[]schedtest.C{{Name: "hit", Queue: 10, Prefix: schedtest.Info(64, 64, 0, 0, 0)}, {Name: "cold", Prefix: schedtest.Info(64, 0, 0, 0, 0)}},
			[]float64{1025.0 / (10*1024 + 1), 1}},
		{"a running request counts an eighth of a waiting one",
			"", tokens1024,
			[]schedtest.C{{Name: "busy", Running: 8}, {Name: "idle"}},
			[]float64{1025.0 / 2049, 1}},
		{"a stale pod is charged the mean queue of the fresh ones, not an empty queue",
			"", tokens1024,
			[]schedtest.C{{Name: "q2", Queue: 2}, {Name: "q0"}, {Name: "stale", Stale: true}},
			[]float64{1025.0 / 3073, 1, 1025.0 / 2049}},
		{"the prompt length comes from blocks when token ids are unknown",
			"", &request.Request{ID: "r"},
			[]schedtest.C{{Name: "half", Prefix: schedtest.Info(10, 5, 0, 0, 0)}, {Name: "cold", Prefix: schedtest.Info(10, 0, 0, 0, 0)}},
			[]float64{1, 81.0 / 161}},
		{"the prompt length comes from the text when nothing else is known",
			"", &request.Request{ID: "r", Prompt: strings.Repeat("x", 400)},
			[]schedtest.C{{Name: "a"}, {Name: "b", Queue: 1}},
			[]float64{1, 101.0 / 1125}},
		{"configured queue estimates apply",
			`{"queuedRequestTokens":100,"runningRequestTokens":0}`, tokens1024,
			[]schedtest.C{{Name: "q", Queue: 3, Running: 50}, {Name: "idle"}},
			[]float64{1025.0 / 1325, 1}},
		{"configured tier weights apply",
			`{"tierWeights":{"storage":1}}`, tokens1024,
			[]schedtest.C{{Name: "st", Prefix: schedtest.Info(64, 0, 0, 64, 0)}, {Name: "cold"}},
			[]float64{1, 1.0 / 1025}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var raw json.RawMessage
			if tt.params != "" {
				raw = json.RawMessage(tt.params)
			}
			p, err := prefillcost.Factory("pc", raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			out := make([]float64, len(tt.cands))
			p.(framework.Scorer).Score(context.Background(), schedtest.Cycle(), tt.req, schedtest.Cands(tt.cands...), out)
			for i := range out {
				if math.Abs(out[i]-tt.want[i]) > 1e-9 {
					t.Fatalf("scores = %v, want %v", out, tt.want)
				}
			}
		})
	}
}

func TestFactoryRejectsBadParameters(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, params, want string }{
		{"an unknown parameter is named", `{"queueTokens":1}`,
			`invalid plugin parameters: plugin "pc" (type prefill-cost-scorer): json: unknown field "queueTokens"`},
		{"a negative queue estimate is refused", `{"queuedRequestTokens":-1}`,
			`invalid plugin parameters: plugin "pc" (type prefill-cost-scorer): queuedRequestTokens = -1, want ≥ 0`},
		{"a negative running estimate is refused", `{"runningRequestTokens":-1}`,
			`invalid plugin parameters: plugin "pc" (type prefill-cost-scorer): runningRequestTokens = -1, want ≥ 0`},
		{"an unknown tier is named", `{"tierWeights":{"disk":1}}`,
			`invalid plugin parameters: plugin "pc" (type prefill-cost-scorer): tierWeights: unknown cache tier "disk"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := prefillcost.Factory("pc", json.RawMessage(tt.params), nil)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
		})
	}
}
