// Package prefix is the prefix-cache-scorer with its upstream meaning: the
// share of the request's blocks the endpoint holds, whatever the tier,
// or, where more, the share this EPP recently sent there (upstream's
// routing history, which keeps a prefix's home after the cache lost it),
// optionally blended with how long that prefix is.
package prefix

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "prefix-cache-scorer"

// Scorer scores the share r of the request's blocks the endpoint holds
// (MatchBlocks/TotalBlocks) or, with the routing history, the larger of
// that and the share its picks sent there; 0 without prefix info or full
// blocks. With a match-length weight w it scores w·min(1, L/S)² + (1−w)·r
// instead, L the tokens of the same prefix and S the scale, so that a long
// shared prefix counts for more than its share of a very long prompt.
//
// With the routing history, the scorer also records each pick in it, as
// upstream's approximate prefix producer does: a prefix keeps going where
// it was sent while the history remembers it there, cached or not, so
// each endpoint keeps a working set of its own under cache pressure.
type Scorer struct {
	name    plugin.TypedName
	params  Params
	history framework.HistoryRecorder
}

// Params are the scorer's parameters.
type Params struct {
	// MatchLengthWeight is w in [0,1], 0 by default (the plain ratio).
	MatchLengthWeight float64 `json:"matchLengthWeight"`
	// MatchLengthScaleTokens is S, 8192 by default; it must be positive
	// when the weight is.
	MatchLengthScaleTokens int `json:"matchLengthScaleTokens"`
	// RoutingHistory, true by default as upstream's scorer places by its
	// routing history, scores the share of the request's blocks this EPP
	// recently sent to an endpoint where it exceeds the share the
	// endpoint holds, and records each pick; false scores holdings alone.
	RoutingHistory bool `json:"routingHistory"`
}

// DefaultParams are the parameters of a scorer configured without any.
func DefaultParams() Params { return Params{MatchLengthScaleTokens: 8192, RoutingHistory: true} }

var (
	_ framework.Scorer   = (*Scorer)(nil)
	_ plugin.Consumer    = (*Scorer)(nil)
	_ framework.Scorer   = (*RecordingScorer)(nil)
	_ framework.PostPick = (*RecordingScorer)(nil)
)

// RecordingScorer is the scorer with the routing history (what Factory
// makes unless routingHistory is false): it also records each pick there.
type RecordingScorer struct{ *Scorer }

// New makes the scorer with default parameters but for the routing
// history, which it leaves off: it scores holdings alone.
func New(name string) *Scorer {
	p := DefaultParams()
	p.RoutingHistory = false
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, params: p}
}

// Factory makes the scorer.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	p := DefaultParams()
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	if !(p.MatchLengthWeight >= 0 && p.MatchLengthWeight <= 1) {
		return nil, framework.ParamError(Type, name, "matchLengthWeight = %v, want it in [0, 1]", p.MatchLengthWeight)
	}
	if p.MatchLengthWeight > 0 && p.MatchLengthScaleTokens <= 0 {
		return nil, framework.ParamError(Type, name, "matchLengthScaleTokens = %d, want > 0 with a match-length weight", p.MatchLengthScaleTokens)
	}
	s := &Scorer{name: plugin.TypedName{Type: Type, Name: name}, params: p}
	if !p.RoutingHistory {
		return s, nil
	}
	var ok bool
	if h != nil && h.Speculator() != nil {
		s.history, ok = h.Speculator().(framework.HistoryRecorder)
	}
	if !ok {
		return nil, framework.ParamError(Type, name, "this process keeps no routing history; set routingHistory: false to score holdings alone")
	}
	return &RecordingScorer{s}, nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Affinity }

// Consumes implements plugin.Consumer.
func (s *Scorer) Consumes() map[string]any {
	c := map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
	if s.params.RoutingHistory {
		c[datalayer.RoutedPrefixKey] = datalayer.RoutedPrefix{}
		c[framework.RequestBlockKeysKey] = []uint64(nil)
	}
	return c
}

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	w := s.params.MatchLengthWeight
	for i, c := range cands {
		out[i] = 0
		info, ok := datalayer.PrefixCacheInfoOf(c)
		if !ok {
			continue
		}
		ratio, blocks := info.Ratio(), info.MatchBlocks
		if s.params.RoutingHistory {
			if r, ok := datalayer.RoutedPrefixOf(c); ok && r.Ratio() > ratio {
				ratio, blocks = r.Ratio(), r.Blocks
			}
		}
		lengthScore := 0.0
		if w > 0 && info.BlockSizeTokens > 0 {
			l := min(1, float64(blocks*info.BlockSizeTokens)/float64(s.params.MatchLengthScaleTokens))
			lengthScore = l * l
		}
		out[i] = w*lengthScore + (1-w)*ratio
	}
}

// PostPick implements framework.PostPick: the primary pick's prefix is
// recorded as sent there. Fallbacks are not: the request goes to them only
// if the primary fails.
func (s *RecordingScorer) PostPick(_ context.Context, _ *framework.CycleState, req *request.Request, res *framework.ProfileResult) {
	if res == nil || len(res.Picked) == 0 || req.NoReproduciblePrefix {
		return
	}
	primary := res.Picked[0]
	for _, key := range []string{framework.RequestBlockKeysKey, framework.ApproxHashesKey} {
		if v, ok := primary.Get(key); ok {
			if hashes, ok := v.([]uint64); ok && len(hashes) > 0 {
				s.history.RecordHistory(primary.Address, hashes)
				return
			}
		}
	}
}
