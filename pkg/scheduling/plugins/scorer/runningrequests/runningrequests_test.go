package runningrequests_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/framework/request"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/runningrequests"
)

func TestScoreIsMinMaxOfRunningRequests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cands []schedtest.C
		want  []float64
	}{
		{"the fewest running requests score 1 and the most 0",
			[]schedtest.C{{Name: "a", Running: 4}, {Name: "b", Running: 8}, {Name: "c", Running: 12}}, []float64{1, 0.5, 0}},
		{"waiting requests do not count",
			[]schedtest.C{{Name: "a", Running: 4, Queue: 50}, {Name: "b", Running: 8}}, []float64{1, 0}},
		{"a stale candidate scores the mean of the fresh ones",
			[]schedtest.C{{Name: "a", Running: 1}, {Name: "b", Running: 3}, {Name: "c", Running: 0, Stale: true}}, []float64{1, 0, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := make([]float64, len(tt.cands))
			runningrequests.New("r", time.Second).Score(context.Background(), schedtest.Cycle(), &request.Request{}, schedtest.Cands(tt.cands...), out)
			if !slices.Equal(out, tt.want) {
				t.Errorf("scores = %v, want %v", out, tt.want)
			}
		})
	}
}
