// Package weightedrandom is the weighted-random-picker: it picks at random
// in proportion to the scores.
package weightedrandom

import (
	"context"
	"math"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/pick"
)

// Type is the plugin's registered type name.
const Type = "weighted-random-picker"

// Picker picks maxNumOfEndpoints distinct candidates, each draw with
// probability proportional to score among those not yet drawn. Candidates
// scoring 0 come only after every positive one, in random order, so with all
// scores 0 the pick is uniform.
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

// Pick implements framework.Picker with Gumbel-top-k on log-scores: the
// same distribution as drawing one at a time without replacement, in one
// pass.
func (p *Picker) Pick(_ context.Context, cs *framework.CycleState, scored []framework.ScoredCandidate) *framework.ProfileResult {
	rng := cs.Rand()
	keys := make([]float64, len(scored))
	for i, s := range scored {
		keys[i] = math.Inf(-1)
		if s.Score > 0 {
			keys[i] = math.Log(s.Score) + pick.Gumbel(rng)
		}
	}
	return pick.TopK(scored, p.N, func(i int) float64 { return keys[i] }, rng)
}
