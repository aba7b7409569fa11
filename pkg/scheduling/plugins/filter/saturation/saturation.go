// Package saturation is the saturation-filter: it steers requests away from
// endpoints whose fresh metrics show them saturated.
package saturation

import (
	"context"
	"encoding/json"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	sat "github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

// Type is the plugin's registered type name.
const Type = "saturation-filter"

// Params are the filter's parameters.
type Params struct {
	// QueueThreshold: endpoints with this many waiting requests or more are
	// dropped. Default 5.
	QueueThreshold *int `json:"queueThreshold,omitempty"`
	// KVThreshold: endpoints with KV usage this high or higher are dropped.
	// Default 0.8.
	KVThreshold *float64 `json:"kvThreshold,omitempty"`
}

// Filter drops endpoints whose fresh metrics are over a threshold. Endpoints
// with stale metrics are kept: their load is unknown, and dropping them would
// punish a pod for a failed scrape. When every endpoint would be dropped it
// keeps them all: refusing the request is admission's decision, not a
// filter's.
type Filter struct {
	name       plugin.TypedName
	thresholds sat.Thresholds
	staleness  time.Duration
}

var _ framework.Filter = (*Filter)(nil)

// New makes the filter.
func New(name string, t sat.Thresholds, staleness time.Duration) *Filter {
	return &Filter{name: plugin.TypedName{Type: Type, Name: name}, thresholds: t, staleness: staleness}
}

// Factory makes the filter from its configuration.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	t := sat.DefaultThresholds()
	if p.QueueThreshold != nil {
		if *p.QueueThreshold < 1 {
			return nil, framework.ParamError(Type, name, "queueThreshold = %d, want ≥ 1", *p.QueueThreshold)
		}
		t.QueueDepth = *p.QueueThreshold
	}
	if p.KVThreshold != nil {
		if v := *p.KVThreshold; !(v > 0 && v <= 1) {
			return nil, framework.ParamError(Type, name, "kvThreshold = %v, want a value in (0,1]", v)
		}
		t.KVCacheUtil = *p.KVThreshold
	}
	return New(name, t, framework.StalenessOf(h)), nil
}

// TypedName implements plugin.Plugin.
func (f *Filter) TypedName() plugin.TypedName { return f.name }

// Filter implements framework.Filter. It counts first and copies only when
// something is dropped, so the common unsaturated case allocates nothing.
func (f *Filter) Filter(_ context.Context, cs *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	now := cs.Now()
	keep := 0
	for _, c := range cands {
		if !f.drop(c, now) {
			keep++
		}
	}
	if keep == len(cands) || keep == 0 {
		return cands
	}
	out := make([]*datalayer.Candidate, 0, keep)
	for _, c := range cands {
		if !f.drop(c, now) {
			out = append(out, c)
		}
	}
	return out
}

func (f *Filter) drop(c *datalayer.Candidate, now time.Time) bool {
	return c.Metrics.Fresh(now, f.staleness) && f.thresholds.Over(c.Metrics)
}
