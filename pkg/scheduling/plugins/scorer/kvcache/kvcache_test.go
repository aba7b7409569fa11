package kvcache_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/framework/request"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/kvcache"
)

func TestScoreIsFreeKVCache(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cands []schedtest.C
		want  []float64
	}{
		{"the score is one minus usage",
			[]schedtest.C{{Name: "a", KV: 0}, {Name: "b", KV: 0.25}, {Name: "c", KV: 1}}, []float64{1, 0.75, 0}},
		{"usage outside [0,1] is clamped",
			[]schedtest.C{{Name: "a", KV: -0.5}, {Name: "b", KV: 1.5}}, []float64{1, 0}},
		{"a stale candidate scores the mean of the fresh ones, not as empty",
			[]schedtest.C{{Name: "a", KV: 0.2}, {Name: "b", KV: 0.6}, {Name: "c", KV: 0, Stale: true}}, []float64{0.8, 0.4, 0.6}},
		{"with no fresh candidate all score 0.5",
			[]schedtest.C{{Name: "a", KV: 0, Stale: true}}, []float64{0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := make([]float64, len(tt.cands))
			kvcache.New("kv", time.Second).Score(context.Background(), schedtest.Cycle(), &request.Request{}, schedtest.Cands(tt.cands...), out)
			for i := range out {
				if math.Abs(out[i]-tt.want[i]) > 1e-12 {
					t.Fatalf("scores = %v, want %v", out, tt.want)
				}
			}
		})
	}
}
