// Package slo is the slo-headroom-tier-filter: of a request with SLOs, it
// keeps the candidates predicted to meet them, when there are any (upstream's
// name). When none is, it keeps them all: whether to serve the request
// anyway is admission's decision (latency-slo-admitter), not a filter's.
package slo

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/latencyinfo"
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
func (f *Filter) Consumes() map[string]any { return latencyinfo.Consumes() }

// Filter implements framework.Filter.
func (f *Filter) Filter(_ context.Context, _ *framework.CycleState, req *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	if req.SLO.TTFT <= 0 && req.SLO.TPOT <= 0 {
		return cands
	}
	n := 0
	for _, c := range cands {
		if info, ok := latencyinfo.Get(c); ok && info.MeetsSLO() {
			n++
		}
	}
	if n == 0 || n == len(cands) {
		return cands
	}
	out := make([]*datalayer.Candidate, 0, n)
	for _, c := range cands {
		if info, ok := latencyinfo.Get(c); ok && info.MeetsSLO() {
			out = append(out, c)
		}
	}
	return out
}
