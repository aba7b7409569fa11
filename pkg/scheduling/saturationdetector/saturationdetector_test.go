package saturationdetector_test

import (
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

func TestDetector(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		cands  []schedtest.C
		want   bool
	}{
		{"one endpoint with room means not saturated", "",
			[]schedtest.C{{Name: "a", Queue: 9}, {Name: "b", Queue: 4, KV: 0.79}}, false},
		{"queues at the threshold everywhere are saturated", "",
			[]schedtest.C{{Name: "a", Queue: 5}, {Name: "b", KV: 0.8}}, true},
		{"stale metrics count as saturated", "",
			[]schedtest.C{{Name: "a", Queue: 9}, {Name: "b", Stale: true}}, true},
		{"never-scraped metrics count as saturated", "",
			[]schedtest.C{{Name: "a", NeverScraped: true}}, true},
		{"a longer staleness threshold trusts older metrics", `{"metricsStalenessThreshold":"2m"}`,
			[]schedtest.C{{Name: "a", Stale: true}}, false},
		{"configured thresholds apply", `{"queueDepthThreshold":20,"kvCacheUtilThreshold":0.95}`,
			[]schedtest.C{{Name: "a", Queue: 19, KV: 0.9}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var raw json.RawMessage
			if tt.params != "" {
				raw = json.RawMessage(tt.params)
			}
			p, err := saturationdetector.Factory("d", raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.(*saturationdetector.Detector).AllSaturated(schedtest.Cands(tt.cands...), schedtest.Now); got != tt.want {
				t.Errorf("AllSaturated = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFactoryRejectsBadParameters(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, params, want string }{
		{"a bad duration is refused", `{"metricsStalenessThreshold":"soon"}`,
			`invalid plugin parameters: plugin "d" (type utilization-detector): metricsStalenessThreshold = "soon", want a positive duration`},
		{"a zero queue threshold is refused", `{"queueDepthThreshold":0}`,
			`invalid plugin parameters: plugin "d" (type utilization-detector): queueDepthThreshold = 0, want ≥ 1`},
		{"an unknown parameter is named", `{"queueThreshold":3}`,
			`invalid plugin parameters: plugin "d" (type utilization-detector): json: unknown field "queueThreshold"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := saturationdetector.Factory("d", json.RawMessage(tt.params), nil)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
		})
	}
}
