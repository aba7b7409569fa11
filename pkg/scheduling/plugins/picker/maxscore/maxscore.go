// Package maxscore is the max-score-picker: the highest score wins, ties are
// broken at random, and the next best are the fallbacks.
package maxscore

import (
	"context"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/pick"
)

// Type is the plugin's registered type name.
const Type = "max-score-picker"

// Picker picks the maxNumOfEndpoints highest-scored candidates.
type Picker struct {
	pick.Base
}

var _ framework.Picker = (*Picker)(nil)

// New makes the picker; n is how many endpoints it picks (at least 1).
func New(name string, n int) *Picker {
	return &Picker{Base: pick.NewBase(Type, name, n)}
}

// Factory makes the picker from its parameters (maxNumOfEndpoints).
var Factory = pick.Factory(Type, New)

// Pick implements framework.Picker.
func (p *Picker) Pick(_ context.Context, cs *framework.CycleState, scored []framework.ScoredCandidate) *framework.ProfileResult {
	return pick.TopK(scored, p.N, func(i int) float64 { return scored[i].Score }, cs.Rand())
}
