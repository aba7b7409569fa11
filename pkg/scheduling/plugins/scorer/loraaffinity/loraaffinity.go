// Package loraaffinity is the lora-affinity-scorer: endpoints running the
// request's adapter score 1, those with room for it 0.8, those where it
// waits 0.6, the others 0.
package loraaffinity

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
const Type = "lora-affinity-scorer"

// Scorer scores each endpoint for the model the request names (its adapter,
// or the base model, which no endpoint lists among its adapters): running
// there 1; else room to load it (fewer adapters active and waiting than the
// endpoint holds) 0.8; else waiting there 0.6; else 0.
type Scorer struct{ name plugin.TypedName }

var _ framework.Scorer = (*Scorer)(nil)

// Factory makes the scorer; it takes no parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}}, nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Affinity }

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, _ *framework.CycleState, req *request.Request, cands []*datalayer.Candidate, out []float64) {
	model := req.LoRA
	if model == "" {
		model = req.Model
	}
	for i, c := range cands {
		m := c.Metrics
		switch {
		case slices.Contains(m.ActiveLoRAs, model):
			out[i] = 1
		case len(m.ActiveLoRAs)+len(m.WaitingLoRAs) < m.MaxLoRAs:
			out[i] = 0.8
		case slices.Contains(m.WaitingLoRAs, model):
			out[i] = 0.6
		default:
			out[i] = 0
		}
	}
}
