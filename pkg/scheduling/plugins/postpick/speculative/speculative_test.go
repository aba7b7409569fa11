package speculative_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/postpick/speculative"
)

// recorder is a Speculator that remembers its calls.
type recorder struct {
	mu    sync.Mutex
	calls map[string][]uint64
}

func (r *recorder) Speculate(addr string, keys []uint64, held int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[string][]uint64{}
	}
	r.calls[addr] = keys[held:]
}

func TestPostPickRecordsThePrimaryOnly(t *testing.T) {
	t.Parallel()
	keys := []uint64{11, 22, 33}
	exact := func(match, spec int) *datalayer.PrefixCacheInfo {
		return &datalayer.PrefixCacheInfo{MatchBlocks: match, TotalBlocks: 3, SpeculativeBlocks: spec, Exact: true}
	}
	tests := []struct {
		name    string
		req     request.Request
		publish bool
		info    *datalayer.PrefixCacheInfo
		picked  int
		want    map[string][]uint64
	}{
		{"the primary pick is recorded with the request's keys", request.Request{ID: "r"}, true, nil, 2,
			map[string][]uint64{"a:8000": keys}},
		{"blocks held for real are not recorded", request.Request{ID: "r"}, true, exact(2, 0), 1,
			map[string][]uint64{"a:8000": keys[2:]}},
		{"a match wholly held passes every key as held", request.Request{ID: "r"}, true, exact(3, 0), 1,
			map[string][]uint64{"a:8000": {}}},
		{"a match with a speculative tail is recorded from the tail on, refreshing it", request.Request{ID: "r"}, true, exact(2, 1), 1,
			map[string][]uint64{"a:8000": keys[1:]}},
		{"a match held only speculatively is recorded whole", request.Request{ID: "r"}, true, exact(2, 2), 1,
			map[string][]uint64{"a:8000": keys}},
		{"an approximate match is recorded whole", request.Request{ID: "r"}, true,
			&datalayer.PrefixCacheInfo{MatchBlocks: 2, TotalBlocks: 3}, 1, map[string][]uint64{"a:8000": keys}},
		{"nothing is recorded without published keys", request.Request{ID: "r"}, false, nil, 1, nil},
		{"nothing is recorded for an empty pick", request.Request{ID: "r"}, true, nil, 0, nil},
		{"a multimodal request is not recorded", request.Request{ID: "r", NoReproduciblePrefix: true}, true, nil, 1, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := &recorder{}
			p, err := speculative.Factory("s", nil, &config.Handle{Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			cands := schedtest.Cands(schedtest.C{Name: "a"}, schedtest.C{Name: "b"})
			for _, c := range cands {
				if tt.publish {
					c.Put(framework.RequestBlockKeysKey, keys)
				}
				if tt.info != nil {
					c.Put(datalayer.PrefixCacheMatchInfoKey, *tt.info)
				}
			}
			res := &framework.ProfileResult{Picked: cands[:tt.picked]}
			p.(framework.PostPick).PostPick(context.Background(), schedtest.Cycle(), &tt.req, res)
			if len(spec.calls) != len(tt.want) {
				t.Fatalf("calls = %v, want %v", spec.calls, tt.want)
			}
			for addr, k := range tt.want {
				if !slices.Equal(spec.calls[addr], k) {
					t.Errorf("calls[%s] = %v, want %v", addr, spec.calls[addr], k)
				}
			}
		})
	}
}

func TestFactoryNeedsASpeculator(t *testing.T) {
	t.Parallel()
	_, err := speculative.Factory("s", nil, &config.Handle{})
	want := `plugin "s" (type speculative-prefix-recorder): this process records no speculative holdings (no speculator)`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
	r := speculative.New("s", &recorder{})
	if _, ok := r.Consumes()[framework.RequestBlockKeysKey]; !ok {
		t.Errorf("Consumes() = %v, want %s", r.Consumes(), framework.RequestBlockKeysKey)
	}
}
