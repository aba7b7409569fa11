package preciseprefix_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/preciseprefix"
)

func mustScorer(t *testing.T, params string) framework.Scorer {
	t.Helper()
	var raw json.RawMessage
	if params != "" {
		raw = json.RawMessage(params)
	}
	p, err := preciseprefix.Factory("pp", raw, nil)
	if err != nil {
		t.Fatalf("Factory(%s): %v", params, err)
	}
	return p.(framework.Scorer)
}

func inState(info datalayer.PrefixCacheInfo, s datalayer.StreamState) datalayer.PrefixCacheInfo {
	info.State, info.Exact = s, s.Exact()
	return info
}

func TestScore(t *testing.T) {
	t.Parallel()
	pointerInfo := schedtest.Info(4, 2, 0, 0, 0)
	half := *schedtest.Info(10, 5, 0, 0, 0)
	tests := []struct {
		name   string
		params string
		info   any // published under the key; nil publishes nothing
		want   float64
	}{
		{"every block on GPU scores 1", "", schedtest.Info(10, 10, 0, 0, 0), 1},
		{"CPU blocks earn 0.8 each by default", "", schedtest.Info(10, 0, 10, 0, 0), 0.8},
		{"storage blocks earn 0.5 each by default", "", schedtest.Info(10, 0, 0, 10, 0), 0.5},
		{"mixed tiers are summed", "", schedtest.Info(10, 5, 3, 2, 0), (5 + 3*0.8 + 2*0.5) / 10.0},
		{"speculative blocks earn half by default", "", schedtest.Info(10, 0, 0, 0, 4), 0.2},
		{"a partial match scores its share", "", schedtest.Info(8, 2, 0, 0, 0), 0.25},
		{"a request with no full block scores 0", "", schedtest.Info(0, 0, 0, 0, 0), 0},
		{"a candidate without prefix info scores 0", "", nil, 0},
		{"a pointer-typed info is read like a value", "", pointerInfo, 0.5},
		{"a foreign type under the key scores 0", "", "not an info", 0},
		{"configured tier weights replace the defaults", `{"tierWeights":{"CPU":0.5,"storage":0}}`, schedtest.Info(10, 0, 6, 4, 0), 0.3},
		{"a configured speculative weight applies", `{"speculativeWeight":1}`, schedtest.Info(10, 5, 0, 0, 5), 1},
		{"a partial stream's match is held and earns full credit", "", inState(half, datalayer.StreamPartial), 0.5},
		{"a recovering stream's match earns full credit", "", inState(half, datalayer.StreamRecovering), 0.5},
		{"an uncertain stream's match earns three quarters", "", inState(half, datalayer.StreamUncertain), 0.375},
		{"configured state weights replace the defaults", `{"stateWeights":{"uncertain":0,"recovering":0.5}}`, inState(half, datalayer.StreamRecovering), 0.25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := mustScorer(t, tt.params)
			c := schedtest.C{Name: "a"}.Build()
			if tt.info != nil {
				c.Put(datalayer.PrefixCacheMatchInfoKey, tt.info)
			}
			out := []float64{-1}
			s.Score(context.Background(), schedtest.Cycle(), &request.Request{}, []*datalayer.Candidate{c}, out)
			if math.Abs(out[0]-tt.want) > 1e-12 {
				t.Errorf("score = %v, want %v", out[0], tt.want)
			}
		})
	}
}

func TestFactoryRejectsBadParameters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, params, want string
	}{
		{"an unknown parameter is named", `{"tierWeight":{}}`,
			`invalid plugin parameters: plugin "pp" (type precise-prefix-cache-scorer): json: unknown field "tierWeight"`},
		{"an unknown tier is named", `{"tierWeights":{"nvme":1}}`,
			`invalid plugin parameters: plugin "pp" (type precise-prefix-cache-scorer): tierWeights: unknown cache tier "nvme"`},
		{"a tier weight above 1 is refused", `{"tierWeights":{"gpu":1.5}}`,
			`invalid plugin parameters: plugin "pp" (type precise-prefix-cache-scorer): tierWeights[gpu] = 1.5, want a value in [0,1]`},
		{"an unknown state is named", `{"stateWeights":{"stale":1}}`,
			`invalid plugin parameters: plugin "pp" (type precise-prefix-cache-scorer): stateWeights: unknown stream state "stale"`},
		{"a negative speculative weight is refused", `{"speculativeWeight":-0.1}`,
			`invalid plugin parameters: plugin "pp" (type precise-prefix-cache-scorer): speculativeWeight = -0.1, want a value in [0,1]`},
		{"a wrongly typed parameter is refused", `{"speculativeWeight":"high"}`,
			`invalid plugin parameters: plugin "pp" (type precise-prefix-cache-scorer): json: cannot unmarshal string into Go struct field Params.speculativeWeight of type float64`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := preciseprefix.Factory("pp", json.RawMessage(tt.params), nil)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
		})
	}
}

func TestConsumesThePrefixKey(t *testing.T) {
	t.Parallel()
	s := preciseprefix.New("pp", preciseprefix.DefaultTierWeights(), 0.5)
	if _, ok := s.Consumes()[datalayer.PrefixCacheMatchInfoKey]; !ok {
		t.Fatalf("Consumes() = %v, want %s", s.Consumes(), datalayer.PrefixCacheMatchInfoKey)
	}
	if s.Category() != framework.Affinity {
		t.Errorf("Category() = %v, want affinity", s.Category())
	}
}
