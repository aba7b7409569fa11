package softmax_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/softmax"
)

func TestPickFollowsTheSoftmaxDistribution(t *testing.T) {
	t.Parallel()
	s := []framework.ScoredCandidate{
		{Candidate: schedtest.C{Name: "a"}.Build(), Score: 1.0},
		{Candidate: schedtest.C{Name: "b"}.Build(), Score: 0.5},
	}
	tests := []struct {
		name  string
		temp  float64
		wantA float64
	}{
		{"a low temperature is greedy", 0.01, 1},
		{"the default temperature favours the better", softmax.DefaultTemperature, 1 / (1 + math.Exp(-0.5/softmax.DefaultTemperature))},
		{"temperature one", 1, 1 / (1 + math.Exp(-0.5))},
		{"a high temperature is nearly uniform", 1000, 0.5},
	}
	const draws = 4000
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := 0
			for seed := range uint64(draws) {
				res := softmax.New("s", 1, tt.temp).Pick(context.Background(), framework.NewCycleState(schedtest.Now, seed, 9), s)
				if res.Picked[0].Name == "a" {
					a++
				}
			}
			if got := float64(a) / draws; math.Abs(got-tt.wantA) > 0.03 {
				t.Errorf("better candidate won %.3f of draws, want %.3f±0.03", got, tt.wantA)
			}
		})
	}
}

func TestFactory(t *testing.T) {
	t.Parallel()
	if _, err := softmax.Factory("s", json.RawMessage(`{"temperature":0.5,"maxNumOfEndpoints":3}`), nil); err != nil {
		t.Fatal(err)
	}
	for params, want := range map[string]string{
		`{"temperature":0}`:       `invalid plugin parameters: plugin "s" (type softmax-picker): temperature = 0, want > 0`,
		`{"maxNumOfEndpoints":0}`: `invalid plugin parameters: plugin "s" (type softmax-picker): maxNumOfEndpoints = 0, want ≥ 1`,
		`{"temp":1}`:              `invalid plugin parameters: plugin "s" (type softmax-picker): json: unknown field "temp"`,
	} {
		if _, err := softmax.Factory("s", json.RawMessage(params), nil); err == nil || err.Error() != want {
			t.Errorf("%s: err = %v, want %s", params, err, want)
		}
	}
}
