package kvcache_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/kvcache"
)

func TestScoreIsFreeKVCache(t *testing.T) {
	t.Parallel()
	schedtest.RunScoreCases(t, kvcache.New("kv", time.Second), []schedtest.ScoreCase{
		{Name: "the score is one minus usage",
			Cands: []schedtest.C{{Name: "a", KV: 0}, {Name: "b", KV: 0.25}, {Name: "c", KV: 1}}, Want: []float64{1, 0.75, 0}},
		{Name: "usage outside [0,1] is clamped",
			Cands: []schedtest.C{{Name: "a", KV: -0.5}, {Name: "b", KV: 1.5}}, Want: []float64{1, 0}},
		{Name: "a stale candidate scores the mean of the fresh ones, not as empty",
			Cands: []schedtest.C{{Name: "a", KV: 0.2}, {Name: "b", KV: 0.6}, {Name: "c", KV: 0, Stale: true}}, Want: []float64{0.8, 0.4, 0.6}},
		{Name: "with no fresh candidate all score 0.5",
			Cands: []schedtest.C{{Name: "a", KV: 0, Stale: true}}, Want: []float64{0.5}},
	})
}
