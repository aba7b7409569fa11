// Package runningrequests is the running-requests-size-scorer: fewer running
// requests score higher.
package runningrequests

import (
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/load"
)

// Type is the plugin's registered type name.
const Type = "running-requests-size-scorer"

// Alias is kvroute's shorter name for the same plugin.
const Alias = "running-requests-scorer"

// Scores are min-max normalised over the candidates with fresh metrics: the
// fewest running requests score 1, the most 0. A candidate with stale
// metrics scores the mean of the others (see load.InverseMinMax).
func running(m *datalayer.Metrics) float64 { return float64(m.RunningRequests) }

// New makes the scorer; metrics older than staleness mean unknown load.
func New(name string, staleness time.Duration) *load.Scorer {
	return load.NewScorer(Type, name, staleness, running, load.InverseMinMax)
}

// Factory makes the scorer from its (empty) parameters.
var Factory = load.Factory(Type, running, load.InverseMinMax)
