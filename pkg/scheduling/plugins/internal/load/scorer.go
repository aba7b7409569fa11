package load

import (
	"context"
	"encoding/json"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Reading is one load reading of an endpoint's fresh metrics.
type Reading func(m *datalayer.Metrics) float64

// Normalise turns readings (Unknown for stale metrics) into scores in place.
type Normalise func(out []float64)

// Scorer scores candidates from one reading of their metrics: the queue,
// running-requests and KV-utilisation scorers differ only in the reading
// and in how readings become scores, so they share this one type. A
// candidate whose metrics are stale gets an Unknown reading, which the
// normalisation scores neutrally.
type Scorer struct {
	name      plugin.TypedName
	staleness time.Duration
	read      Reading
	normalise Normalise
}

var _ framework.Scorer = (*Scorer)(nil)

// NewScorer makes a scorer of type typ; metrics older than staleness mean
// unknown load.
func NewScorer(typ, name string, staleness time.Duration, read Reading, normalise Normalise) *Scorer {
	return &Scorer{name: plugin.TypedName{Type: typ, Name: name}, staleness: staleness, read: read, normalise: normalise}
}

// Factory makes scorers of type typ; they take no parameters and read the
// staleness threshold from the handle.
func Factory(typ string, read Reading, normalise Normalise) framework.Factory {
	return func(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
		var p struct{}
		if err := framework.DecodeParams(typ, name, raw, &p); err != nil {
			return nil, err
		}
		return NewScorer(typ, name, framework.StalenessOf(h), read, normalise), nil
	}
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer: load scorers balance.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Balance }

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	now := cs.Now()
	for i, c := range cands {
		if !c.Metrics.Fresh(now, s.staleness) {
			out[i] = Unknown
			continue
		}
		out[i] = s.read(c.Metrics)
	}
	s.normalise(out)
}

// Direct treats readings as scores already in [0,1]; an unknown one scores
// the mean of the known ones, 0.5 when none is known.
func Direct(out []float64) {
	mean, n := MeanKnown(out)
	if n == 0 {
		mean = 0.5
	}
	FillUnknown(out, mean)
}
