// Package prefix is the prefix-cache-scorer with its upstream meaning: the
// share of the request's blocks the endpoint holds, whatever the tier,
// optionally blended with how long the held prefix is.
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

// Scorer scores MatchBlocks/TotalBlocks; 0 without prefix info or full
// blocks. With a match-length weight w it scores w·min(1, L/S)² +
// (1−w)·MatchBlocks/TotalBlocks instead, L the matched tokens and S the
// scale, so that a long shared prefix counts for more than its share of a
// very long prompt.
type Scorer struct {
	name   plugin.TypedName
	params Params
}

// Params are the scorer's parameters.
type Params struct {
	// MatchLengthWeight is w in [0,1], 0 by default (the plain ratio).
	MatchLengthWeight float64 `json:"matchLengthWeight"`
	// MatchLengthScaleTokens is S, 8192 by default; it must be positive
	// when the weight is.
	MatchLengthScaleTokens int `json:"matchLengthScaleTokens"`
}

// DefaultParams are the parameters of a scorer configured without any.
func DefaultParams() Params { return Params{MatchLengthScaleTokens: 8192} }

var (
	_ framework.Scorer = (*Scorer)(nil)
	_ plugin.Consumer  = (*Scorer)(nil)
)

// New makes the scorer with default parameters.
func New(name string) *Scorer {
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, params: DefaultParams()}
}

// Factory makes the scorer.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
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
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, params: p}, nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Affinity }

// Consumes implements plugin.Consumer.
func (s *Scorer) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
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
		lengthScore := 0.0
		if w > 0 && info.BlockSizeTokens > 0 {
			l := min(1, float64(info.MatchBlocks*info.BlockSizeTokens)/float64(s.params.MatchLengthScaleTokens))
			lengthScore = l * l
		}
		out[i] = w*lengthScore + (1-w)*info.Ratio()
	}
}
