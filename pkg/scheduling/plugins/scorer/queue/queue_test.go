package queue_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/framework/request"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/queue"
)

func TestScoreIsMinMaxOfWaitingQueue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cands []schedtest.C
		want  []float64
	}{
		{"the shortest queue scores 1 and the longest 0",
			[]schedtest.C{{Name: "a", Queue: 0}, {Name: "b", Queue: 5}, {Name: "c", Queue: 10}}, []float64{1, 0.5, 0}},
		{"equal queues all score 1",
			[]schedtest.C{{Name: "a", Queue: 3}, {Name: "b", Queue: 3}}, []float64{1, 1}},
		{"a lone candidate scores 1", []schedtest.C{{Name: "a", Queue: 9}}, []float64{1}},
		{"a stale candidate scores the mean of the fresh ones, not as idle",
			[]schedtest.C{{Name: "a", Queue: 0}, {Name: "b", Queue: 10}, {Name: "c", Stale: true}}, []float64{1, 0, 0.5}},
		{"a never-scraped candidate is unknown too",
			[]schedtest.C{{Name: "a", Queue: 2}, {Name: "b", Queue: 4}, {Name: "c", Queue: 3}, {Name: "d", NeverScraped: true}}, []float64{1, 0, 0.5, 0.5}},
		{"with no fresh candidate all score 0.5",
			[]schedtest.C{{Name: "a", Stale: true}, {Name: "b", Stale: true}}, []float64{0.5, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := make([]float64, len(tt.cands))
			queue.New("q", time.Second).Score(context.Background(), schedtest.Cycle(), &request.Request{}, schedtest.Cands(tt.cands...), out)
			if !slices.Equal(out, tt.want) {
				t.Errorf("scores = %v, want %v", out, tt.want)
			}
		})
	}
}

func TestFactoryTakesNoParameters(t *testing.T) {
	t.Parallel()
	_, err := queue.Factory("q", json.RawMessage(`{"threshold":3}`), nil)
	want := `invalid plugin parameters: plugin "q" (type queue-scorer): json: unknown field "threshold"`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}
