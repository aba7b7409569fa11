// Package prefixaffinity is the prefix-cache-affinity-filter (upstream's
// name): it narrows the candidates to those holding most of the request's
// prompt ("sticky" ones), unless the best of them would start the request
// much later than the best of the rest, or an exploring pick keeps them all.
package prefixaffinity

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/latencyinfo"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "prefix-cache-affinity-filter"

// Where the TTFT gate reads each endpoint's time to first token.
const (
	// SourcePrefillThroughput estimates it as the prefill tokens in flight
	// on the endpoint over PeakPrefillThroughput.
	SourcePrefillThroughput = "prefillThroughput"
	// SourceLatencyPredictor reads the predicted-latency producer's TTFT.
	SourceLatencyPredictor = "latencyPredictor"
)

// Params are the filter's parameters, with upstream's names; Defaults are
// llm-d-router's.
type Params struct {
	// AffinityThreshold: an endpoint is sticky when it holds at least this
	// share of the request's blocks; ≤ 0 turns the filter off.
	AffinityThreshold float64 `json:"affinityThreshold"`
	// ExplorationProbability is the chance of keeping every candidate.
	ExplorationProbability float64 `json:"explorationProbability"`
	// MaxTTFTPenaltyMs: when the best sticky endpoint's TTFT exceeds the
	// best other's by more, every candidate is kept; 0 always sticks.
	MaxTTFTPenaltyMs float64 `json:"maxTTFTPenaltyMs"`
	// MaxTokensInFlightPenalty: when the best sticky endpoint has more
	// prefill tokens in flight than the best other by more, every candidate
	// is kept; 0 turns this gate off (llm-d-router's gate before the TTFT
	// one replaced it; its guides still set it).
	MaxTokensInFlightPenalty int64 `json:"maxTokensInFlightPenalty"`
	// TTFTSource is SourcePrefillThroughput or SourceLatencyPredictor.
	TTFTSource string `json:"ttftSource"`
	// PeakPrefillThroughput is the endpoint's prefill rate in tokens a
	// second, for SourcePrefillThroughput.
	PeakPrefillThroughput float64 `json:"peakPrefillThroughput"`
}

// Defaults are llm-d-router's defaults (calibrated there for a 32B model
// on two H100s; set peakPrefillThroughput for other hardware).
func Defaults() Params {
	return Params{AffinityThreshold: 0.8, MaxTTFTPenaltyMs: 18000, TTFTSource: SourcePrefillThroughput, PeakPrefillThroughput: 15928}
}

// Filter is the prefix-cache-affinity-filter.
type Filter struct {
	name plugin.TypedName
	p    Params
	// explore draws in [0,1); rand's by default.
	explore func() float64
}

var (
	_ framework.Filter = (*Filter)(nil)
	_ plugin.Consumer  = (*Filter)(nil)
)

// New makes the filter from valid parameters (see Factory).
func New(name string, p Params) *Filter {
	return &Filter{name: plugin.TypedName{Type: Type, Name: name}, p: p, explore: rand.Float64}
}

// Factory makes the filter from its parameters, upstream's defaults for
// those not given.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	p := Defaults()
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	switch {
	case !(p.AffinityThreshold <= 1):
		return nil, framework.ParamError(Type, name, "affinityThreshold = %v, want ≤ 1", p.AffinityThreshold)
	case !(p.ExplorationProbability >= 0 && p.ExplorationProbability <= 1):
		return nil, framework.ParamError(Type, name, "explorationProbability = %v, want 0 to 1", p.ExplorationProbability)
	case !(p.MaxTTFTPenaltyMs >= 0) || math.IsInf(p.MaxTTFTPenaltyMs, 0):
		return nil, framework.ParamError(Type, name, "maxTTFTPenaltyMs = %v, want a finite value ≥ 0", p.MaxTTFTPenaltyMs)
	case p.MaxTokensInFlightPenalty < 0:
		return nil, framework.ParamError(Type, name, "maxTokensInFlightPenalty = %d, want ≥ 0", p.MaxTokensInFlightPenalty)
	case !(p.PeakPrefillThroughput >= 0) || math.IsInf(p.PeakPrefillThroughput, 0):
		return nil, framework.ParamError(Type, name, "peakPrefillThroughput = %v, want a finite value ≥ 0", p.PeakPrefillThroughput)
	case p.TTFTSource != SourcePrefillThroughput && p.TTFTSource != SourceLatencyPredictor:
		return nil, framework.ParamError(Type, name, "ttftSource = %q, want %q or %q", p.TTFTSource, SourcePrefillThroughput, SourceLatencyPredictor)
	case p.TTFTSource == SourcePrefillThroughput && p.MaxTTFTPenaltyMs > 0 && p.PeakPrefillThroughput == 0:
		return nil, framework.ParamError(Type, name, "peakPrefillThroughput must be > 0 when ttftSource is %s", SourcePrefillThroughput)
	}
	return New(name, p), nil
}

// TypedName implements plugin.Plugin.
func (f *Filter) TypedName() plugin.TypedName { return f.name }

// Consumes implements plugin.Consumer: the prefix match always, and the
// latency prediction when the TTFT gate reads it.
func (f *Filter) Consumes() map[string]any {
	m := map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
	if f.p.MaxTTFTPenaltyMs > 0 && f.p.TTFTSource == SourceLatencyPredictor {
		m[datalayer.LatencyPredictionInfoKey] = latencyinfo.Exemplar
	}
	return m
}

// Filter implements framework.Filter.
func (f *Filter) Filter(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	if len(cands) <= 1 || f.p.AffinityThreshold <= 0 {
		return cands
	}
	if f.p.ExplorationProbability > 0 && f.explore() < f.p.ExplorationProbability {
		return cands
	}
	sticky := 0
	bestSticky, bestOther := math.MaxFloat64, math.MaxFloat64
	tokSticky, tokOther := math.MaxInt, math.MaxInt
	for _, c := range cands {
		if f.sticky(c) {
			sticky++
			bestSticky = min(bestSticky, f.ttft(c))
			tokSticky = min(tokSticky, c.InFlight.PrefillTokens)
		} else {
			bestOther = min(bestOther, f.ttft(c))
			tokOther = min(tokOther, c.InFlight.PrefillTokens)
		}
	}
	if sticky == 0 || sticky == len(cands) {
		return cands
	}
	if f.p.MaxTTFTPenaltyMs > 0 && bestSticky-bestOther > f.p.MaxTTFTPenaltyMs {
		return cands
	}
	if f.p.MaxTokensInFlightPenalty > 0 && int64(tokSticky-tokOther) > f.p.MaxTokensInFlightPenalty {
		return cands
	}
	out := make([]*datalayer.Candidate, 0, sticky)
	for _, c := range cands {
		if f.sticky(c) {
			out = append(out, c)
		}
	}
	return out
}

// sticky reports whether c holds at least the threshold's share of the
// request's blocks.
func (f *Filter) sticky(c *datalayer.Candidate) bool {
	info, ok := datalayer.PrefixCacheInfoOf(c)
	if !ok || info.TotalBlocks <= 0 {
		return false
	}
	return float64(info.MatchBlocks)/float64(info.TotalBlocks) >= f.p.AffinityThreshold
}

// ttft is c's time to first token in milliseconds as the gate reads it:
// without a prediction, an endpoint is never the fastest (MaxFloat64).
func (f *Filter) ttft(c *datalayer.Candidate) float64 {
	if f.p.TTFTSource == SourceLatencyPredictor {
		if info, ok := latencyinfo.Get(c); ok && info.TTFTValid {
			return info.TTFT
		}
		return math.MaxFloat64
	}
	return float64(c.InFlight.PrefillTokens) / f.p.PeakPrefillThroughput * 1000
}
