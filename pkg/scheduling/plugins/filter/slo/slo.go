// Package slo is the slo-headroom-tier-filter: of a request with SLOs, it
// keeps the candidates predicted to meet them, when there are any (upstream's
// name). When none is, it keeps them all: whether to serve the request
// anyway is admission's decision (latency-slo-admitter), not a filter's.
//
// The TTFT test prices every candidate's own prefill at one rate: each
// endpoint's model learns its prefill cost from the prefills it has seen,
// and one that has lately computed long prompts knows their cost where
// the others, serving cache hits, still hold an older, lower guess. Judged
// each by its own model, the endpoint that last paid for a cold prefill
// would be the one dropped for it. So a candidate's predicted own prefill
// (TTFT with nothing ahead) is raised, for the test only, to the highest
// cost per uncached block any candidate with about as much to compute
// predicts; the scorers still see each model's own figures.
package slo

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/latencyinfo"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "slo-headroom-tier-filter"

// Filter is the slo-headroom-tier-filter.
type Filter struct{ name plugin.TypedName }

var (
	_ framework.Filter = (*Filter)(nil)
	_ plugin.Consumer  = (*Filter)(nil)
)

// Factory makes the filter from its (empty) parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return &Filter{name: plugin.TypedName{Type: Type, Name: name}}, nil
}

// TypedName implements plugin.Plugin.
func (f *Filter) TypedName() plugin.TypedName { return f.name }

// Consumes implements plugin.Consumer.
func (f *Filter) Consumes() map[string]any {
	m := latencyinfo.Consumes()
	m[datalayer.PrefixCacheMatchInfoKey] = prefixinfo.Exemplar
	return m
}

// Filter implements framework.Filter.
func (f *Filter) Filter(_ context.Context, _ *framework.CycleState, req *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	if req.SLO.TTFT <= 0 && req.SLO.TPOT <= 0 {
		return cands
	}
	rate := prefillRate(cands)
	n := 0
	for _, c := range cands {
		if meets(c, rate) {
			n++
		}
	}
	if n == 0 || n == len(cands) {
		return cands
	}
	out := make([]*datalayer.Candidate, 0, n)
	for _, c := range cands {
		if meets(c, rate) {
			out = append(out, c)
		}
	}
	return out
}

// uncachedBlocks is the blocks of the request c has to compute (those it
// holds speculatively are being computed for it), -1 when unknown.
func uncachedBlocks(c *datalayer.Candidate) int {
	p, ok := datalayer.PrefixCacheInfoOf(c)
	if !ok || p.TotalBlocks <= 0 {
		return -1
	}
	return max(p.TotalBlocks-p.MatchBlocks, 0)
}

// prefillRate is the highest predicted own-prefill time per uncached
// block, in milliseconds, among the candidates with at least half the
// most uncached blocks any has (0: none known). Only those: on a
// candidate with little to compute, the step's fixed cost is most of its
// own prefill, and taken per block it would overstate a long one's.
func prefillRate(cands []*datalayer.Candidate) float64 {
	most := 0
	for _, c := range cands {
		most = max(most, uncachedBlocks(c))
	}
	if most == 0 {
		return 0
	}
	rate := 0.0
	for _, c := range cands {
		u := uncachedBlocks(c)
		if 2*u < most {
			continue
		}
		if info, ok := latencyinfo.Get(c); ok && info.TTFTValid && info.TTFTAlone > 0 {
			rate = max(rate, info.TTFTAlone/float64(u))
		}
	}
	return rate
}

// meets reports whether c is predicted to meet the request's SLOs, its own
// prefill priced at rate per uncached block where its model prices it
// lower.
func meets(c *datalayer.Candidate, rate float64) bool {
	info, ok := latencyinfo.Get(c)
	if !ok {
		return false
	}
	if info.HasTTFTSLO && info.TTFTValid && rate > 0 {
		if u := uncachedBlocks(c); u > 0 {
			info.TTFTHeadroom -= max(rate*float64(u)-info.TTFTAlone, 0)
		}
	}
	return info.MeetsSLO()
}
