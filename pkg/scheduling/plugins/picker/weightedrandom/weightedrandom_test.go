package weightedrandom_test

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/weightedrandom"
)

func sc(scores ...float64) []framework.ScoredCandidate {
	out := make([]framework.ScoredCandidate, len(scores))
	for i, s := range scores {
		out[i] = framework.ScoredCandidate{Candidate: schedtest.C{Name: string(rune('a' + i))}.Build(), Score: s}
	}
	return out
}

func TestPickIsProportionalToScore(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		scores []float64
		// want is each candidate's expected share of primary picks.
		want []float64
	}{
		{"three to one", []float64{3, 1}, []float64{0.75, 0.25}},
		{"a zero score is never primary while a positive exists", []float64{0, 1, 1}, []float64{0, 0.5, 0.5}},
		{"all zero scores pick uniformly", []float64{0, 0, 0, 0}, []float64{0.25, 0.25, 0.25, 0.25}},
	}
	const draws = 4000
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			counts := make([]int, len(tt.scores))
			s := sc(tt.scores...)
			for seed := range uint64(draws) {
				res := weightedrandom.New("w", len(s)).Pick(context.Background(), framework.NewCycleState(schedtest.Now, seed, 3), s)
				if len(res.Picked) != len(s) {
					t.Fatalf("picked %d, want every candidate once", len(res.Picked))
				}
				counts[res.Picked[0].Name[0]-'a']++
			}
			for i, w := range tt.want {
				got := float64(counts[i]) / draws
				if got < w-0.03 || got > w+0.03 {
					t.Errorf("candidate %d was primary %.3f of draws, want %.2f±0.03", i, got, w)
				}
			}
		})
	}
}
