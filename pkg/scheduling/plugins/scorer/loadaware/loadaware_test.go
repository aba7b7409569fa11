package loadaware_test

import (
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/loadaware"
)

func TestScoreFallsWithTheQueueToTheThreshold(t *testing.T) {
	t.Parallel()
	p, err := loadaware.Factory("l", json.RawMessage(`{"threshold":10}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	schedtest.RunScoreCases(t, p.(framework.Scorer), []schedtest.ScoreCase{
		{Name: "an idle endpoint scores half", Cands: []schedtest.C{{Name: "a"}}, Want: []float64{0.5}},
		{Name: "a queue scores less, to 0 at the threshold and beyond",
			Cands: []schedtest.C{{Name: "a", Queue: 1}, {Name: "b", Queue: 5}, {Name: "c", Queue: 10}, {Name: "d", Queue: 50}}, Want: []float64{0.45, 0.25, 0, 0}},
		{Name: "stale metrics score the mean of the fresh",
			Cands: []schedtest.C{{Name: "a"}, {Name: "b", Queue: 10}, {Name: "c", Stale: true}}, Want: []float64{0.5, 0, 0.25}},
	})
}

func TestFactoryDefaultsAndChecks(t *testing.T) {
	t.Parallel()
	p, err := loadaware.Factory("l", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	schedtest.RunScoreCases(t, p.(framework.Scorer), []schedtest.ScoreCase{
		{Name: "the default threshold is 128", Cands: []schedtest.C{{Name: "a", Queue: 64}}, Want: []float64{0.25}},
	})
	for raw, want := range map[string]string{
		`{"threshold":0}`: `invalid plugin parameters: plugin "l" (type load-aware-scorer): threshold = 0, want > 0`,
		`{"queue":1}`:     `invalid plugin parameters: plugin "l" (type load-aware-scorer): json: unknown field "queue"`,
	} {
		if _, err := loadaware.Factory("l", json.RawMessage(raw), nil); err == nil || err.Error() != want {
			t.Errorf("err = %v, want %s", err, want)
		}
	}
}
