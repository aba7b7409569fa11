// Package queue is the queue-scorer: fewer waiting requests score higher.
package queue

import (
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/load"
)

// Type is the plugin's registered type name.
const Type = "queue-scorer"

// Scores are min-max normalised over the candidates with fresh metrics: the
// shortest queue scores 1, the longest 0. A candidate with stale metrics
// scores the mean of the others (see load.InverseMinMax): its queue is
// unknown, not empty.
func waiting(m *datalayer.Metrics) float64 { return float64(m.WaitingQueueSize) }

// New makes the scorer; metrics older than staleness mean unknown load.
func New(name string, staleness time.Duration) *load.Scorer {
	return load.NewScorer(Type, name, staleness, waiting, load.InverseMinMax)
}

// Factory makes the scorer from its (empty) parameters.
var Factory = load.Factory(Type, waiting, load.InverseMinMax)
