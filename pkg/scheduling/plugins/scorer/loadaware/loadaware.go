// Package loadaware is the load-aware-scorer: an idle endpoint scores 0.5,
// a queued one less, down to 0 at the threshold queue length.
package loadaware

import (
	"context"
	"encoding/json"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the plugin's registered type name.
const Type = "load-aware-scorer"

// DefaultThreshold is the queue length that scores 0.
const DefaultThreshold = 128

// Scorer scores 0.5 for an empty queue and 0.5·(1 − min(queue, t)/t)
// otherwise, t the threshold; so a scorer weighted alone never lifts a pick
// above half its weight, and a busy endpoint never below zero. An endpoint
// with stale metrics scores the mean of the fresh ones: its queue is
// unknown, not empty.
type Scorer struct {
	name      plugin.TypedName
	threshold float64
	staleness time.Duration
}

var _ framework.Scorer = (*Scorer)(nil)

// Factory makes the scorer; threshold defaults to 128, and a threshold that
// is not positive is refused.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	p := struct {
		Threshold int `json:"threshold"`
	}{DefaultThreshold}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	if p.Threshold <= 0 {
		return nil, framework.ParamError(Type, name, "threshold = %d, want > 0", p.Threshold)
	}
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, threshold: float64(p.Threshold), staleness: framework.StalenessOf(h)}, nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Distribution }

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	sum, fresh := 0.0, 0
	for i, c := range cands {
		if !c.Metrics.Fresh(cs.Now(), s.staleness) {
			out[i] = -1
			continue
		}
		q := float64(c.Metrics.WaitingQueueSize)
		if q == 0 {
			out[i] = 0.5
		} else {
			out[i] = 0.5 * (1 - min(q, s.threshold)/s.threshold)
		}
		sum += out[i]
		fresh++
	}
	unknown := 0.25
	if fresh > 0 {
		unknown = sum / float64(fresh)
	}
	for i := range out[:len(cands)] {
		if out[i] < 0 {
			out[i] = unknown
		}
	}
}
