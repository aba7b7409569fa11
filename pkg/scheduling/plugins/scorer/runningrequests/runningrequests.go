// Package runningrequests is the running-requests-size-scorer: fewer running requests score higher.
package runningrequests

import (
	"context"
	"encoding/json"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/load"
)

// Type is the plugin's registered type name.
const Type = "running-requests-size-scorer"

// Alias is kvroute's shorter name for the same plugin.
const Alias = "running-requests-scorer"

// Scorer is the running-requests-size-scorer. Scores are min-max normalised
// over the candidates with fresh metrics: the fewest running requests score
// 1, the most 0. A candidate with stale metrics scores the mean of the others
// (see load.InverseMinMax).
type Scorer struct {
	name      plugin.TypedName
	staleness time.Duration
}

var _ framework.Scorer = (*Scorer)(nil)

// New makes the scorer; metrics older than staleness mean unknown load.
func New(name string, staleness time.Duration) *Scorer {
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, staleness: staleness}
}

// Factory makes the scorer; it takes no parameters and reads the staleness
// threshold from the handle.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name, framework.StalenessOf(h)), nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Balance }

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	now := cs.Now()
	for i, c := range cands {
		if !c.Metrics.Fresh(now, s.staleness) {
			out[i] = load.Unknown
			continue
		}
		out[i] = float64(c.Metrics.RunningRequests)
	}
	load.InverseMinMax(out)
}
