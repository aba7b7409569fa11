// Package random is the random-picker: it ignores scores and picks
// uniformly at random.
package random

import (
	"context"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/pick"
)

// Type is the plugin's registered type name.
const Type = "random-picker"

// Picker picks maxNumOfEndpoints distinct candidates uniformly at random.
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

// Pick implements framework.Picker: every key is equal, so the random
// tie-break is the whole choice.
func (p *Picker) Pick(_ context.Context, cs *framework.CycleState, scored []framework.ScoredCandidate) *framework.ProfileResult {
	return pick.TopK(scored, p.N, func(int) float64 { return 0 }, cs.Rand())
}
