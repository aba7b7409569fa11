package runningrequests_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/runningrequests"
)

func TestScoreIsMinMaxOfRunningRequests(t *testing.T) {
	t.Parallel()
	schedtest.RunScoreCases(t, runningrequests.New("r", time.Second), []schedtest.ScoreCase{
		{Name: "the fewest running requests score 1 and the most 0",
			Cands: []schedtest.C{{Name: "a", Running: 4}, {Name: "b", Running: 8}, {Name: "c", Running: 12}}, Want: []float64{1, 0.5, 0}},
		{Name: "waiting requests do not count",
			Cands: []schedtest.C{{Name: "a", Running: 4, Queue: 50}, {Name: "b", Running: 8}}, Want: []float64{1, 0}},
		{Name: "a stale candidate scores the mean of the fresh ones",
			Cands: []schedtest.C{{Name: "a", Running: 1}, {Name: "b", Running: 3}, {Name: "c", Running: 0, Stale: true}}, Want: []float64{1, 0, 0.5}},
	})
}
