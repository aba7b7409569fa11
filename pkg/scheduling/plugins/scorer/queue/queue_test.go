package queue_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/queue"
)

func TestScoreIsMinMaxOfWaitingQueue(t *testing.T) {
	t.Parallel()
	schedtest.RunScoreCases(t, queue.New("q", time.Second), []schedtest.ScoreCase{
		{Name: "the shortest queue scores 1 and the longest 0",
			Cands: []schedtest.C{{Name: "a", Queue: 0}, {Name: "b", Queue: 5}, {Name: "c", Queue: 10}}, Want: []float64{1, 0.5, 0}},
		{Name: "equal queues all score 1",
			Cands: []schedtest.C{{Name: "a", Queue: 3}, {Name: "b", Queue: 3}}, Want: []float64{1, 1}},
		{Name: "a lone candidate scores 1", Cands: []schedtest.C{{Name: "a", Queue: 9}}, Want: []float64{1}},
		{Name: "a stale candidate scores the mean of the fresh ones, not as idle",
			Cands: []schedtest.C{{Name: "a", Queue: 0}, {Name: "b", Queue: 10}, {Name: "c", Stale: true}}, Want: []float64{1, 0, 0.5}},
		{Name: "a never-scraped candidate is unknown too",
			Cands: []schedtest.C{{Name: "a", Queue: 2}, {Name: "b", Queue: 4}, {Name: "c", Queue: 3}, {Name: "d", NeverScraped: true}}, Want: []float64{1, 0, 0.5, 0.5}},
		{Name: "with no fresh candidate all score 0.5",
			Cands: []schedtest.C{{Name: "a", Stale: true}, {Name: "b", Stale: true}}, Want: []float64{0.5, 0.5}},
	})
}

func TestFactoryTakesNoParameters(t *testing.T) {
	t.Parallel()
	_, err := queue.Factory("q", json.RawMessage(`{"threshold":3}`), nil)
	want := `invalid plugin parameters: plugin "q" (type queue-scorer): json: unknown field "threshold"`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}
