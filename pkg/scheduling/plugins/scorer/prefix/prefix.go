// Package prefix is the prefix-cache-scorer with its upstream meaning: the
// share of the request's blocks the endpoint holds, whatever the tier.
package prefix

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/framework/plugin"
	"github.com/kvroute/kvroute/pkg/framework/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "prefix-cache-scorer"

// Scorer scores MatchBlocks/TotalBlocks; 0 without prefix info or full blocks.
type Scorer struct{ name plugin.TypedName }

var (
	_ framework.Scorer = (*Scorer)(nil)
	_ plugin.Consumer  = (*Scorer)(nil)
)

// New makes the scorer.
func New(name string) *Scorer { return &Scorer{name: plugin.TypedName{Type: Type, Name: name}} }

// Factory makes the scorer; it takes no parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name), nil
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
	for i, c := range cands {
		out[i] = 0
		if info, ok := prefixinfo.Get(c); ok {
			out[i] = info.Ratio()
		}
	}
}
