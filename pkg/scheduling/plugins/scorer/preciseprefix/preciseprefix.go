// Package preciseprefix is the precise-prefix-cache-scorer: it scores each
// endpoint by how much of the request's prefix it holds, weighting each
// matched block by the cache tier it sits in.
package preciseprefix

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "precise-prefix-cache-scorer"

// Default weights. A GPU block is a full hit. A CPU block must be copied back
// over PCIe, far cheaper than recomputing it, hence 0.8; a storage block is
// slower again, 0.5. A speculative block is one we sent a request for moments
// ago and have no event for yet: it is a guess, so it earns half credit,
// enough to keep a burst of same-prefix requests together before the events
// arrive, too little to beat an equally long confirmed GPU or CPU hit.
const (
	DefaultGPUWeight         = 1.0
	DefaultCPUWeight         = 0.8
	DefaultStorageWeight     = 0.5
	DefaultSpeculativeWeight = 0.5
)

// DefaultStateWeights returns the default credit of a match by the trust
// state of the answer (datalayer.PrefixCacheInfo.State). Exact and partial
// matches are held (a partial one is a lower bound), and a recovering
// stream's answer is what was known a moment ago: full credit. An
// uncertain stream's answer may be stale either way and for long, so it
// earns three quarters: enough to keep affinity where nothing better is
// known, too little to beat an equal match the index is sure of. The
// routing history (none) keeps full credit, as upstream's approximate
// scorer gives it.
func DefaultStateWeights() [datalayer.NumStreamStates]float64 {
	var w [datalayer.NumStreamStates]float64
	for _, s := range datalayer.AllStreamStates {
		w[s] = 1
	}
	w[datalayer.StreamUncertain] = 0.75
	return w
}

// DefaultTierWeights returns the default weight of each tier.
func DefaultTierWeights() [events.NumTiers]float64 {
	var w [events.NumTiers]float64
	w[events.TierGPU] = DefaultGPUWeight
	w[events.TierCPU] = DefaultCPUWeight
	w[events.TierStorage] = DefaultStorageWeight
	return w
}

// Params are the plugin's parameters.
type Params struct {
	// TierWeights maps a tier name (gpu, cpu, storage, any case) to the
	// credit, in [0,1], of a matched block in that tier. Tiers not named
	// keep their default.
	TierWeights map[string]float64 `json:"tierWeights,omitempty"`
	// SpeculativeWeight is the credit, in [0,1], of a block held only
	// speculatively. Default 0.5.
	SpeculativeWeight *float64 `json:"speculativeWeight,omitempty"`
	// StateWeights maps a trust state (exact, partial, recovering,
	// uncertain, none) to a factor, in [0,1], on the score of a match in
	// that state. States not named keep their default (DefaultStateWeights).
	StateWeights map[string]float64 `json:"stateWeights,omitempty"`
}

// ParseStateWeights applies a stateWeights parameter to w, for this scorer
// and the others that weigh prefix matches.
func ParseStateWeights(typ, name string, in map[string]float64, w *[datalayer.NumStreamStates]float64) error {
	for k, v := range in {
		var st datalayer.StreamState
		if err := st.UnmarshalText([]byte(k)); err != nil {
			return framework.ParamError(typ, name, "stateWeights: %v", err)
		}
		if !(v >= 0 && v <= 1) {
			return framework.ParamError(typ, name, "stateWeights[%s] = %v, want a value in [0,1]", k, v)
		}
		w[st] = v
	}
	return nil
}

// Scorer is the precise-prefix-cache-scorer. score = stateWeight[State] *
// (sum over tiers of BlocksByTier[t]*tierWeight[t] +
// SpeculativeBlocks*speculativeWeight) / TotalBlocks; 0 when the request has
// no full block or the candidate has no prefix info.
type Scorer struct {
	name         plugin.TypedName
	tierWeights  [events.NumTiers]float64
	specWeight   float64
	stateWeights [datalayer.NumStreamStates]float64
}

var (
	_ framework.Scorer = (*Scorer)(nil)
	_ plugin.Consumer  = (*Scorer)(nil)
)

// New makes the scorer with the given weights and the default state
// weights.
func New(name string, tierWeights [events.NumTiers]float64, speculativeWeight float64) *Scorer {
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, tierWeights: tierWeights, specWeight: speculativeWeight,
		stateWeights: DefaultStateWeights()}
}

// Factory makes the scorer from its configuration.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	w := DefaultTierWeights()
	for k, v := range p.TierWeights {
		t, err := events.ParseTier(k)
		if err != nil {
			return nil, framework.ParamError(Type, name, "tierWeights: %v", err)
		}
		if !(v >= 0 && v <= 1) {
			return nil, framework.ParamError(Type, name, "tierWeights[%s] = %v, want a value in [0,1]", k, v)
		}
		w[t] = v
	}
	spec := DefaultSpeculativeWeight
	if p.SpeculativeWeight != nil {
		spec = *p.SpeculativeWeight
		if !(spec >= 0 && spec <= 1) {
			return nil, framework.ParamError(Type, name, "speculativeWeight = %v, want a value in [0,1]", spec)
		}
	}
	sc := New(name, w, spec)
	if err := ParseStateWeights(Type, name, p.StateWeights, &sc.stateWeights); err != nil {
		return nil, err
	}
	return sc, nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer: a prefix hit pulls related requests together.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Affinity }

// Consumes implements plugin.Consumer.
func (s *Scorer) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
}

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	for i, c := range cands {
		out[i] = s.score(c)
	}
}

func (s *Scorer) score(c *datalayer.Candidate) float64 {
	info, ok := datalayer.PrefixCacheInfoOf(c)
	if !ok || info.TotalBlocks <= 0 {
		return 0
	}
	credit := float64(info.SpeculativeBlocks) * s.specWeight
	for t, n := range info.BlocksByTier {
		credit += float64(n) * s.tierWeights[t]
	}
	return credit / float64(info.TotalBlocks) * s.stateWeight(info.State)
}

func (s *Scorer) stateWeight(st datalayer.StreamState) float64 {
	if st < datalayer.NumStreamStates {
		return s.stateWeights[st]
	}
	return s.stateWeights[datalayer.StreamUncertain]
}

// String describes the scorer's weights, for start-up logs.
func (s *Scorer) String() string {
	return fmt.Sprintf("%s(gpu=%g cpu=%g storage=%g speculative=%g partial=%g recovering=%g uncertain=%g none=%g)", s.name,
		s.tierWeights[events.TierGPU], s.tierWeights[events.TierCPU], s.tierWeights[events.TierStorage], s.specWeight,
		s.stateWeights[datalayer.StreamPartial], s.stateWeights[datalayer.StreamRecovering],
		s.stateWeights[datalayer.StreamUncertain], s.stateWeights[datalayer.StreamNone])
}
