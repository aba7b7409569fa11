// Package kvcache is the kv-cache-utilization-scorer: endpoints with more
// free KV cache score higher.
package kvcache

import (
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/load"
)

// Type is the plugin's registered type name.
const Type = "kv-cache-utilization-scorer"

// A fresh candidate scores 1 − KVCacheUsage (usage clamped to [0,1]). A
// candidate with stale metrics scores the mean of the fresh ones, 0.5 when
// none is fresh: its usage is unknown, not zero.
func free(m *datalayer.Metrics) float64 { return 1 - min(max(m.KVCacheUsage, 0), 1) }

// New makes the scorer; metrics older than staleness mean unknown load.
func New(name string, staleness time.Duration) *load.Scorer {
	return load.NewScorer(Type, name, staleness, free, load.Direct)
}

// Factory makes the scorer from its (empty) parameters.
var Factory = load.Factory(Type, free, load.Direct)
