// Package prefillcost is the prefill-cost-scorer: it estimates, per
// endpoint, the prefill work the request would add there plus the prefill
// work already queued there, and prefers the cheapest. It is the scorer that
// lets a cache hit lose to an overloaded pod.
package prefillcost

import (
	"context"
	"encoding/json"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/load"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/preciseprefix"
)

// Type is the plugin's registered type name.
const Type = "prefill-cost-scorer"

// Defaults for the queue estimate. A waiting request has not started its
// prefill, so it is counted as a typical chat prompt, 1024 tokens. A running
// request is mostly decoding: it no longer needs a prefill, but it shares
// every engine step with new prefills (and may still be in a chunked
// prefill), so it is counted as an eighth of that.
const (
	DefaultQueuedRequestTokens  = 1024
	DefaultRunningRequestTokens = 128
	// charsPerToken estimates a prompt's tokens from its text when neither
	// token ids nor block counts are known.
	charsPerToken = 4
)

// Params are the plugin's parameters.
type Params struct {
	// TierWeights is the share of a prefill that a token cached in each tier
	// saves: a token in tier t costs (1 − weight) of a prefill. Same names
	// and defaults as precise-prefix-cache-scorer.
	TierWeights map[string]float64 `json:"tierWeights,omitempty"`
	// SpeculativeWeight is the share saved by a speculatively held token.
	SpeculativeWeight *float64 `json:"speculativeWeight,omitempty"`
	// StateWeights scales the saving by the trust state of the match, as
	// precise-prefix-cache-scorer's stateWeights do (same names and
	// defaults): a saving an uncertain stream promises is discounted.
	StateWeights map[string]float64 `json:"stateWeights,omitempty"`
	// QueuedRequestTokens estimates the prefill tokens of each waiting request.
	QueuedRequestTokens *float64 `json:"queuedRequestTokens,omitempty"`
	// RunningRequestTokens estimates what each running request costs new
	// prefills.
	RunningRequestTokens *float64 `json:"runningRequestTokens,omitempty"`
}

// Scorer is the prefill-cost-scorer. For each candidate,
//
//	cost = uncached + queued
//	uncached = T − Σ_t tokens_t·w_t − speculativeTokens·w_spec   (≥ 0)
//	queued = waiting·QueuedRequestTokens + running·RunningRequestTokens
//
// where T is the request's prompt length in tokens and tokens_t the matched
// tokens held in tier t. Scores are (min cost + 1)/(cost + 1): the cheapest
// candidate scores 1 and one twice as costly about 0.5, so the score is
// proportional to the work saved rather than stretched to [0,1] by small
// differences. A candidate with stale metrics has an unknown queue: it is
// charged the mean queued cost of the fresh candidates, never zero.
type Scorer struct {
	name        plugin.TypedName
	staleness   time.Duration
	tierWeights [events.NumTiers]float64
	specWeight  float64
	stateWeight [datalayer.NumStreamStates]float64
	queuedTok   float64
	runningTok  float64
}

var (
	_ framework.Scorer = (*Scorer)(nil)
	_ plugin.Consumer  = (*Scorer)(nil)
)

// Factory makes the scorer from its configuration.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	s := &Scorer{
		name:        plugin.TypedName{Type: Type, Name: name},
		staleness:   framework.StalenessOf(h),
		tierWeights: preciseprefix.DefaultTierWeights(),
		specWeight:  preciseprefix.DefaultSpeculativeWeight,
		stateWeight: preciseprefix.DefaultStateWeights(),
		queuedTok:   DefaultQueuedRequestTokens,
		runningTok:  DefaultRunningRequestTokens,
	}
	for k, v := range p.TierWeights {
		t, err := events.ParseTier(k)
		if err != nil {
			return nil, framework.ParamError(Type, name, "tierWeights: %v", err)
		}
		if !(v >= 0 && v <= 1) {
			return nil, framework.ParamError(Type, name, "tierWeights[%s] = %v, want a value in [0,1]", k, v)
		}
		s.tierWeights[t] = v
	}
	if v := p.SpeculativeWeight; v != nil {
		if !(*v >= 0 && *v <= 1) {
			return nil, framework.ParamError(Type, name, "speculativeWeight = %v, want a value in [0,1]", *v)
		}
		s.specWeight = *v
	}
	if err := preciseprefix.ParseStateWeights(Type, name, p.StateWeights, &s.stateWeight); err != nil {
		return nil, err
	}
	if v := p.QueuedRequestTokens; v != nil {
		if !(*v >= 0) {
			return nil, framework.ParamError(Type, name, "queuedRequestTokens = %v, want ≥ 0", *v)
		}
		s.queuedTok = *v
	}
	if v := p.RunningRequestTokens; v != nil {
		if !(*v >= 0) {
			return nil, framework.ParamError(Type, name, "runningRequestTokens = %v, want ≥ 0", *v)
		}
		s.runningTok = *v
	}
	return s, nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer: it weighs load against affinity,
// and is configured as the balancing term.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Balance }

// Consumes implements plugin.Consumer.
func (s *Scorer) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
}

// Score implements framework.Scorer. out first holds each candidate's queued
// cost (Unknown when stale), then its total cost, then its score, so the
// cycle allocates nothing.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, req *request.Request, cands []*datalayer.Candidate, out []float64) {
	now := cs.Now()
	for i, c := range cands {
		if !c.Metrics.Fresh(now, s.staleness) {
			out[i] = load.Unknown
			continue
		}
		out[i] = float64(c.Metrics.WaitingQueueSize)*s.queuedTok + float64(c.Metrics.RunningRequests)*s.runningTok
	}
	mean, _ := load.MeanKnown(out)
	load.FillUnknown(out, mean)

	minCost := 0.0
	for i, c := range cands {
		out[i] += s.uncached(req, c)
		if i == 0 || out[i] < minCost {
			minCost = out[i]
		}
	}
	for i := range out {
		out[i] = (minCost + 1) / (out[i] + 1)
	}
}

// uncached is the prefill the request would need on c, in tokens.
func (s *Scorer) uncached(req *request.Request, c *datalayer.Candidate) float64 {
	info, ok := datalayer.PrefixCacheInfoOf(c)
	total := float64(len(req.TokenIDs))
	if total == 0 && ok {
		total = float64(info.TotalBlocks * info.BlockSizeTokens)
	}
	if total == 0 {
		total = float64(len(req.Prompt)) / charsPerToken
	}
	if !ok {
		return total
	}
	bs := float64(info.BlockSizeTokens)
	saved := float64(info.SpeculativeBlocks) * bs * s.specWeight
	for t, n := range info.BlocksByTier {
		saved += float64(n) * bs * s.tierWeights[t]
	}
	if info.State < datalayer.NumStreamStates {
		saved *= s.stateWeight[info.State]
	}
	return max(total-saved, 0)
}
