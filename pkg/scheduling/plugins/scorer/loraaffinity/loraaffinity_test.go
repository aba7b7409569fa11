package loraaffinity_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/loraaffinity"
)

func TestScoreRanksAdapterPresenceThenRoomThenWaiting(t *testing.T) {
	t.Parallel()
	p, err := loraaffinity.Factory("l", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(framework.Scorer)
	cands := schedtest.Cands(
		schedtest.C{Name: "running", Active: []string{"x"}, MaxLoRAs: 1},
		schedtest.C{Name: "room", Active: []string{"y"}, MaxLoRAs: 2},
		schedtest.C{Name: "waiting", Active: []string{"y"}, Waiting: []string{"x"}, MaxLoRAs: 2},
		schedtest.C{Name: "full", Active: []string{"y", "z"}, MaxLoRAs: 2},
		schedtest.C{Name: "unknown"},
	)
	out := make([]float64, len(cands))
	s.Score(context.Background(), schedtest.Cycle(), &request.Request{Model: "base", LoRA: "x"}, cands, out)
	if want := []float64{1, 0.8, 0.6, 0, 0}; !slices.Equal(out, want) {
		t.Errorf("scores = %v, want %v", out, want)
	}
	// A base-model request: no endpoint lists the base model as an
	// adapter, so room decides, as upstream.
	s.Score(context.Background(), schedtest.Cycle(), &request.Request{Model: "base"}, cands, out)
	if want := []float64{0, 0.8, 0, 0, 0}; !slices.Equal(out, want) {
		t.Errorf("base-model scores = %v, want %v", out, want)
	}
	if _, err := loraaffinity.Factory("l", json.RawMessage(`{"threshold":1}`), nil); err == nil {
		t.Error("an unknown parameter was accepted")
	}
}
