// Package lorafilter is the lora-affinity-filter: it keeps a LoRA request
// on endpoints that already have its adapter, or failing that on endpoints
// with room to load it.
package lorafilter

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the plugin's registered type name.
const Type = "lora-affinity-filter"

// Filter keeps, for a request naming a LoRA adapter, the endpoints that have
// it active or waiting; if none has, the endpoints with room for another
// adapter (fewer active than MaxLoRAs; an unknown MaxLoRAs is not room);
// if none has room, all of them, since any endpoint can still swap the
// adapter in. Requests for the base model pass through untouched.
type Filter struct{ name plugin.TypedName }

var _ framework.Filter = (*Filter)(nil)

// New makes the filter.
func New(name string) *Filter { return &Filter{name: plugin.TypedName{Type: Type, Name: name}} }

// Factory makes the filter; it takes no parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name), nil
}

// TypedName implements plugin.Plugin.
func (f *Filter) TypedName() plugin.TypedName { return f.name }

// Filter implements framework.Filter.
func (f *Filter) Filter(_ context.Context, _ *framework.CycleState, req *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	if req.LoRA == "" {
		return cands
	}
	hasAdapter := func(c *datalayer.Candidate) bool {
		return slices.Contains(c.Metrics.ActiveLoRAs, req.LoRA) || slices.Contains(c.Metrics.WaitingLoRAs, req.LoRA)
	}
	if out := keep(cands, hasAdapter); len(out) > 0 {
		return out
	}
	hasRoom := func(c *datalayer.Candidate) bool {
		return c.Metrics.MaxLoRAs > 0 && len(c.Metrics.ActiveLoRAs) < c.Metrics.MaxLoRAs
	}
	if out := keep(cands, hasRoom); len(out) > 0 {
		return out
	}
	return cands
}

func keep(cands []*datalayer.Candidate, pred func(*datalayer.Candidate) bool) []*datalayer.Candidate {
	var out []*datalayer.Candidate
	for _, c := range cands {
		if pred(c) {
			out = append(out, c)
		}
	}
	return out
}
