package saturation_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/saturation"
)

func TestFilterDropsSaturatedEndpoints(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		cands  []schedtest.C
		want   []string
	}{
		{"a queue at the threshold is dropped",
			"", []schedtest.C{{Name: "a", Queue: 5}, {Name: "b", Queue: 4}}, []string{"b"}},
		{"KV usage at the threshold is dropped",
			"", []schedtest.C{{Name: "a", KV: 0.8}, {Name: "b", KV: 0.79}}, []string{"b"}},
		{"a stale endpoint is kept whatever its last reading",
			"", []schedtest.C{{Name: "a", Queue: 50, Stale: true}, {Name: "b", Queue: 9}}, []string{"a"}},
		{"when every endpoint is saturated all are kept",
			"", []schedtest.C{{Name: "a", Queue: 6}, {Name: "b", KV: 0.95}}, []string{"a", "b"}},
		{"unsaturated endpoints pass untouched",
			"", []schedtest.C{{Name: "a"}, {Name: "b", Queue: 1}}, []string{"a", "b"}},
		{"configured thresholds apply",
			`{"queueThreshold":2,"kvThreshold":0.5}`,
			[]schedtest.C{{Name: "a", Queue: 2}, {Name: "b", KV: 0.5}, {Name: "c", Queue: 1, KV: 0.4}}, []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var raw json.RawMessage
			if tt.params != "" {
				raw = json.RawMessage(tt.params)
			}
			p, err := saturation.Factory("sf", raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := p.(framework.Filter).Filter(context.Background(), schedtest.Cycle(), &request.Request{}, schedtest.Cands(tt.cands...))
			if !slices.Equal(schedtest.Names(got), tt.want) {
				t.Errorf("kept %v, want %v", schedtest.Names(got), tt.want)
			}
		})
	}
}

func TestFactoryRejectsBadParameters(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, params, want string }{
		{"an upstream detector parameter is not a filter parameter", `{"queueDepthThreshold":5}`,
			`invalid plugin parameters: plugin "sf" (type saturation-filter): json: unknown field "queueDepthThreshold"`},
		{"a zero queue threshold is refused", `{"queueThreshold":0}`,
			`invalid plugin parameters: plugin "sf" (type saturation-filter): queueThreshold = 0, want ≥ 1`},
		{"a KV threshold above 1 is refused", `{"kvThreshold":1.2}`,
			`invalid plugin parameters: plugin "sf" (type saturation-filter): kvThreshold = 1.2, want a value in (0,1]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := saturation.Factory("sf", json.RawMessage(tt.params), nil)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
		})
	}
}
