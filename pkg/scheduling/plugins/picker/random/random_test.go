package random_test

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/random"
)

func TestPickIsUniformAndIgnoresScores(t *testing.T) {
	t.Parallel()
	sc := []framework.ScoredCandidate{
		{Candidate: schedtest.C{Name: "a"}.Build(), Score: 5},
		{Candidate: schedtest.C{Name: "b"}.Build(), Score: 0},
		{Candidate: schedtest.C{Name: "c"}.Build(), Score: 1},
	}
	counts := map[string]int{}
	for seed := range uint64(3000) {
		res := random.New("r", 2).Pick(context.Background(), framework.NewCycleState(schedtest.Now, seed, 1), sc)
		if len(res.Picked) != 2 || res.Picked[0] == res.Picked[1] {
			t.Fatalf("seed %d: picked %v, want two distinct", seed, schedtest.Names(res.Picked))
		}
		counts[res.Picked[0].Name]++
	}
	for _, name := range []string{"a", "b", "c"} {
		if counts[name] < 850 || counts[name] > 1150 {
			t.Errorf("%s was primary %d of 3000 times, want about 1000: %v", name, counts[name], counts)
		}
	}
}
