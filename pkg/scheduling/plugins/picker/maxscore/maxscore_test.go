package maxscore_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/maxscore"
)

func scored(scores ...float64) []framework.ScoredCandidate {
	out := make([]framework.ScoredCandidate, len(scores))
	for i, s := range scores {
		out[i] = framework.ScoredCandidate{Candidate: schedtest.C{Name: string(rune('a' + i))}.Build(), Score: s}
	}
	return out
}

func TestPick(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		n      int
		scores []float64
		want   []string
	}{
		{"the highest score wins", 1, []float64{0.2, 0.9, 0.5}, []string{"b"}},
		{"fallbacks follow in score order", 3, []float64{0.2, 0.9, 0.5, 0.1}, []string{"b", "c", "a"}},
		{"asking for more than there are returns them all", 5, []float64{0.3, 0.1}, []string{"a", "b"}},
		{"nothing to pick picks nothing", 1, nil, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := maxscore.New("m", tt.n).Pick(context.Background(), schedtest.Cycle(), scored(tt.scores...))
			if got := schedtest.Names(res.Picked); !slices.Equal(got, tt.want) {
				t.Errorf("picked %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTiesAreBrokenAtRandom(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} {
		counts := map[string]int{}
		sc := scored(0.7, 0.1, 0.7, 0.7)
		for seed := range uint64(3000) {
			res := maxscore.New("m", n).Pick(context.Background(), framework.NewCycleState(schedtest.Now, seed, 7), sc)
			counts[res.Picked[0].Name]++
		}
		if counts["b"] != 0 {
			t.Errorf("n=%d: the low score won %d times", n, counts["b"])
		}
		for _, name := range []string{"a", "c", "d"} {
			if counts[name] < 850 || counts[name] > 1150 {
				t.Errorf("n=%d: tied %s won %d of 3000, want about 1000: %v", n, name, counts[name], counts)
			}
		}
	}
}

func TestFactory(t *testing.T) {
	t.Parallel()
	p, err := maxscore.Factory("m", json.RawMessage(`{"maxNumOfEndpoints":2}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res := p.(framework.Picker).Pick(context.Background(), schedtest.Cycle(), scored(1, 0, 0.5)); len(res.Picked) != 2 {
		t.Errorf("picked %d, want 2", len(res.Picked))
	}
	for params, want := range map[string]string{
		`{"maxNumOfEndpoints":0}`: `invalid plugin parameters: plugin "m" (type max-score-picker): maxNumOfEndpoints = 0, want ≥ 1`,
		`{"maxEndpoints":2}`:      `invalid plugin parameters: plugin "m" (type max-score-picker): json: unknown field "maxEndpoints"`,
	} {
		if _, err := maxscore.Factory("m", json.RawMessage(params), nil); err == nil || err.Error() != want {
			t.Errorf("%s: err = %v, want %s", params, err, want)
		}
	}
}
