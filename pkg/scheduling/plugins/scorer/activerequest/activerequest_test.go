package activerequest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/activerequest"
)

// inFlight makes candidates with n[i] requests in flight, split between
// prefill and decode so that both count.
func inFlight(n ...int) []*datalayer.Candidate {
	out := make([]*datalayer.Candidate, len(n))
	for i, v := range n {
		c := schedtest.C{Name: string(rune('a' + i))}.Build()
		c.InFlight.Prefilling, c.InFlight.Decoding = v/2, v-v/2
		out[i] = c
	}
	return out
}

func TestTheScoreFallsWithTheRequestsInFlight(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		counts []int
		want   []float64
	}{
		{"the most in flight scores 0 and none scores 1", ``, []int{0, 2, 4}, []float64{1, 0.5, 0}},
		{"with nothing in flight anywhere every endpoint scores 1", ``, []int{0, 0}, []float64{1, 1}},
		{"endpoints at or under idleThreshold score 1", `{"idleThreshold": 2}`, []int{1, 2, 8}, []float64{1, 1, 0}},
		{"maxBusyScore caps a busy endpoint below an idle one", `{"maxBusyScore": 0.5}`, []int{0, 1, 4}, []float64{1, 0.375, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := activerequest.Factory("s", json.RawMessage(tt.params), nil)
			if err != nil {
				t.Fatal(err)
			}
			cands := inFlight(tt.counts...)
			out := make([]float64, len(cands))
			p.(framework.Scorer).Score(context.Background(), framework.NewCycleState(schedtest.Now, 1, 2), &request.Request{}, cands, out)
			for i := range out {
				if out[i] != tt.want[i] {
					t.Fatalf("scores %v, want %v", out, tt.want)
				}
			}
		})
	}
}

func TestOutOfRangeParametersAreRefused(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{`{"idleThreshold": -1}`, `{"maxBusyScore": 1.5}`, `{"maxBusyScore": -0.1}`, `{"requestTimeout": "2m"}`} {
		if _, err := activerequest.Factory("s", json.RawMessage(raw), nil); !errors.Is(err, framework.ErrInvalidParams) {
			t.Errorf("%s: err = %v, want ErrInvalidParams", raw, err)
		}
	}
}
