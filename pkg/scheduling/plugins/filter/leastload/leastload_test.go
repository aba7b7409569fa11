package leastload_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/leastload"
)

func TestLowQueueKeepsQueuesUpToTheThreshold(t *testing.T) {
	t.Parallel()
	cs := []schedtest.C{{Name: "a", Queue: 0}, {Name: "b", Queue: 128}, {Name: "c", Queue: 129}}
	if got, want := schedtest.RunFilter(t, leastload.LowQueueFactory, "", cs...), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("default threshold kept %v, want %v", got, want)
	}
	if got, want := schedtest.RunFilter(t, leastload.LowQueueFactory, `{"threshold":0}`, cs...), []string{"a"}; !slices.Equal(got, want) {
		t.Errorf("threshold 0 kept %v, want %v", got, want)
	}
}

func TestLeastQueueKeepsTheLowestBand(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cs   []schedtest.C
		want []string
	}{
		// Range 0..9 over 4 endpoints: a band of 9/4, floored to 2.
		{"a band of (max−min)/n, in whole requests", []schedtest.C{{Name: "a", Queue: 0}, {Name: "b", Queue: 2}, {Name: "c", Queue: 3}, {Name: "d", Queue: 9}}, []string{"a", "b"}},
		{"equal queues are all kept", []schedtest.C{{Name: "a", Queue: 4}, {Name: "b", Queue: 4}}, []string{"a", "b"}},
		// Range 1..3 over 3: a band of 0, only the minimum.
		{"a narrow spread keeps only the least", []schedtest.C{{Name: "a", Queue: 2}, {Name: "b", Queue: 1}, {Name: "c", Queue: 3}}, []string{"b"}},
	} {
		if got := schedtest.RunFilter(t, leastload.LeastQueueFactory, "", tt.cs...); !slices.Equal(got, tt.want) {
			t.Errorf("%s: kept %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestLeastKVCacheKeepsTheLowestBand(t *testing.T) {
	t.Parallel()
	cs := []schedtest.C{{Name: "a", KV: 0.2}, {Name: "b", KV: 0.4}, {Name: "c", KV: 0.41}, {Name: "d", KV: 0.8}}
	// Over 4 endpoints the band reaches 0.2 + 0.6/4 = 0.35.
	if got, want := schedtest.RunFilter(t, leastload.LeastKVFactory, "", cs...), []string{"a"}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
	// Over 3 it reaches 0.2 + 0.6/3 = 0.4.
	if got, want := schedtest.RunFilter(t, leastload.LeastKVFactory, "", cs[0], cs[1], cs[3]), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
}

func TestFactoriesRefuseUnknownParameters(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		f         framework.Factory
		raw, want string
	}{
		{leastload.LeastQueueFactory, `{"threshold":1}`, `invalid plugin parameters: plugin "f" (type least-queue-filter): json: unknown field "threshold"`},
		{leastload.LowQueueFactory, `{"limit":1}`, `invalid plugin parameters: plugin "f" (type low-queue-filter): json: unknown field "limit"`},
	} {
		if _, err := tt.f("f", json.RawMessage(tt.raw), nil); err == nil || err.Error() != tt.want {
			t.Errorf("err = %v, want %s", err, tt.want)
		}
	}
}
