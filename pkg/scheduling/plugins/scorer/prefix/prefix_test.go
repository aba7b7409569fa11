package prefix_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/pkg/framework/request"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefix"
)

func TestScoreIsMatchOverTotalWhateverTheTier(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		c    schedtest.C
		want float64
	}{
		{"a full GPU match scores 1", schedtest.C{Name: "a", Prefix: schedtest.Info(8, 8, 0, 0, 0)}, 1},
		{"CPU and storage blocks count fully", schedtest.C{Name: "a", Prefix: schedtest.Info(8, 0, 2, 2, 0)}, 0.5},
		{"speculative blocks count as matched", schedtest.C{Name: "a", Prefix: schedtest.Info(8, 1, 0, 0, 1)}, 0.25},
		{"no full block scores 0", schedtest.C{Name: "a", Prefix: schedtest.Info(0, 0, 0, 0, 0)}, 0},
		{"no prefix info scores 0", schedtest.C{Name: "a"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := []float64{-1}
			prefix.New("p").Score(context.Background(), schedtest.Cycle(), &request.Request{}, schedtest.Cands(tt.c), out)
			if out[0] != tt.want {
				t.Errorf("score = %v, want %v", out[0], tt.want)
			}
		})
	}
}

func TestFactoryTakesNoParameters(t *testing.T) {
	t.Parallel()
	if _, err := prefix.Factory("p", json.RawMessage(`{}`), nil); err != nil {
		t.Fatalf("empty parameters: %v", err)
	}
	_, err := prefix.Factory("p", json.RawMessage(`{"blockSize":16}`), nil)
	want := `invalid plugin parameters: plugin "p" (type prefix-cache-scorer): json: unknown field "blockSize"`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}
