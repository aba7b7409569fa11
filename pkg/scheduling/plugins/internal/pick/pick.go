// Package pick holds what the pickers share: their parameters and choosing
// the candidates with the largest keys, ties broken at random.
package pick

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Params are the parameters every picker takes, with upstream's name.
type Params struct {
	// MaxNumOfEndpoints is how many endpoints to pick: the primary and
	// fallbacks. Default 1.
	MaxNumOfEndpoints *int `json:"maxNumOfEndpoints,omitempty"`
}

// N validates and returns MaxNumOfEndpoints.
func (p Params) N(pluginType, name string) (int, error) {
	if p.MaxNumOfEndpoints == nil {
		return 1, nil
	}
	if *p.MaxNumOfEndpoints < 1 {
		return 0, framework.ParamError(pluginType, name, "maxNumOfEndpoints = %d, want ≥ 1", *p.MaxNumOfEndpoints)
	}
	return *p.MaxNumOfEndpoints, nil
}

// TopK picks up to n of scored, those with the largest key(i), largest
// first. Ties, -Inf included, are broken uniformly at random with rng, so
// equal candidates share load instead of the first one taking it all.
func TopK(scored []framework.ScoredCandidate, n int, key func(i int) float64, rng *rand.Rand) *framework.ProfileResult {
	n = min(n, len(scored))
	if n <= 0 {
		return &framework.ProfileResult{}
	}
	if n == 1 {
		// The result and its one pick in one allocation.
		one := &struct {
			res  framework.ProfileResult
			pick [1]*datalayer.Candidate
		}{}
		one.pick[0] = scored[argmax(len(scored), key, rng)].Candidate
		one.res.Picked = one.pick[:]
		return &one.res
	}
	idx := make([]int, len(scored))
	for i := range idx {
		idx[i] = i
	}
	rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	slices.SortStableFunc(idx, func(a, b int) int {
		ka, kb := key(a), key(b)
		switch {
		case ka > kb:
			return -1
		case ka < kb:
			return 1
		}
		return 0
	})
	picked := make([]*datalayer.Candidate, n)
	for i := range picked {
		picked[i] = scored[idx[i]].Candidate
	}
	return &framework.ProfileResult{Picked: picked}
}

// argmax returns the index of the largest key, choosing uniformly among ties
// by reservoir sampling, in one pass and without allocating.
func argmax(n int, key func(i int) float64, rng *rand.Rand) int {
	best, bestKey, ties := 0, key(0), 1
	for i := 1; i < n; i++ {
		k := key(i)
		switch {
		case k > bestKey:
			best, bestKey, ties = i, k, 1
		case k == bestKey:
			ties++
			if rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// Gumbel draws standard Gumbel noise. Adding it to log-weights and taking
// the largest keys samples without replacement in proportion to the weights.
func Gumbel(rng *rand.Rand) float64 {
	u := rng.Float64()
	for u == 0 {
		u = rng.Float64()
	}
	return -math.Log(-math.Log(u))
}

// Factory makes pickers of type typ whose only parameter is
// maxNumOfEndpoints, with newPicker(name, n).
func Factory[P framework.Picker](typ string, newPicker func(name string, n int) P) framework.Factory {
	return func(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
		var p Params
		if err := framework.DecodeParams(typ, name, raw, &p); err != nil {
			return nil, err
		}
		n, err := p.N(typ, name)
		if err != nil {
			return nil, err
		}
		return newPicker(name, n), nil
	}
}

// Base is what every picker is: its typed name, and how many endpoints it
// picks (the primary and fallbacks). A picker embeds it.
type Base struct {
	name plugin.TypedName
	// N is how many endpoints to pick, at least 1.
	N int
}

// NewBase makes the base of a picker of type typ; n below 1 picks one.
func NewBase(typ, name string, n int) Base {
	return Base{name: plugin.TypedName{Type: typ, Name: name}, N: max(n, 1)}
}

// TypedName implements plugin.Plugin.
func (b *Base) TypedName() plugin.TypedName { return b.name }
