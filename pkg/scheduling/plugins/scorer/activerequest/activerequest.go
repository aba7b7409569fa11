// Package activerequest is the active-request-scorer (llm-d's name): fewer
// requests this EPP has in flight on an endpoint score higher. The count is
// the datastore's own (datalayer.InFlight), up to date at every pick and
// every response's end, where an engine's scraped running count lags by a
// scrape interval.
package activerequest

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the plugin's registered type name.
const Type = "active-request-scorer"

// Params are the scorer's parameters, upstream's names and defaults.
type Params struct {
	// IdleThreshold: an endpoint with at most this many requests in
	// flight is idle and scores 1.
	IdleThreshold int `json:"idleThreshold"`
	// MaxBusyScore caps a busy endpoint's score (0 to 1), so that an
	// idle one always wins over a busy one.
	MaxBusyScore *float64 `json:"maxBusyScore,omitempty"`
}

// Scorer is the active-request-scorer.
type Scorer struct {
	name    plugin.TypedName
	idle    int
	maxBusy float64
}

var _ framework.Scorer = (*Scorer)(nil)

// New makes the scorer.
func New(name string, idleThreshold int, maxBusyScore float64) *Scorer {
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, idle: idleThreshold, maxBusy: maxBusyScore}
}

// Factory makes the scorer from its parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	if p.IdleThreshold < 0 {
		return nil, framework.ParamError(Type, name, "idleThreshold = %d, want ≥ 0", p.IdleThreshold)
	}
	busy := 1.0
	if p.MaxBusyScore != nil {
		// Upstream logs and ignores an out-of-range value; a file that
		// says something kvroute would not do is refused instead.
		if !(*p.MaxBusyScore >= 0 && *p.MaxBusyScore <= 1) {
			return nil, framework.ParamError(Type, name, "maxBusyScore = %v, want 0 to 1", *p.MaxBusyScore)
		}
		busy = *p.MaxBusyScore
	}
	return New(name, p.IdleThreshold, busy), nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer: it spreads requests.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Distribution }

// Score implements framework.Scorer: idle endpoints score 1, the others
// (max − n) / max × maxBusyScore, max the most in flight on any candidate.
func (s *Scorer) Score(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	most := 0
	for _, c := range cands {
		most = max(most, c.InFlight.Requests())
	}
	for i, c := range cands {
		n := c.InFlight.Requests()
		if n <= s.idle {
			out[i] = 1
			continue
		}
		out[i] = float64(most-n) / float64(most) * s.maxBusy
	}
}
