// Package softmax is the softmax-picker: it picks at random with
// probability proportional to exp(score/temperature), so that near-equal
// endpoints share load while a clearly better one still wins most picks.
package softmax

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/pick"
)

// Type is the plugin's registered type name.
const Type = "softmax-picker"

// DefaultTemperature suits the default profile, whose summed scores span
// 0 to 7: a lead of 0.1 in summed score then doubles an endpoint's odds
// (e^(0.1/0.15) ≈ 1.95), and a lead of 1 makes it about 800 times likelier.
const DefaultTemperature = 0.15

// Params are the picker's parameters.
type Params struct {
	// Temperature > 0: lower is greedier, higher is more uniform. Default 0.15.
	Temperature *float64 `json:"temperature,omitempty"`
	pick.Params
}

// Picker samples maxNumOfEndpoints distinct candidates by softmax.
type Picker struct {
	pick.Base
	temp float64
}

var _ framework.Picker = (*Picker)(nil)

// New makes the picker; n is how many endpoints it picks (at least 1), temp
// the temperature (> 0).
func New(name string, n int, temp float64) *Picker {
	return &Picker{Base: pick.NewBase(Type, name, n), temp: temp}
}

// Factory makes the picker from its parameters (temperature, maxNumOfEndpoints).
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	n, err := p.N(Type, name)
	if err != nil {
		return nil, err
	}
	t := DefaultTemperature
	if p.Temperature != nil {
		if !(*p.Temperature > 0) {
			return nil, framework.ParamError(Type, name, "temperature = %v, want > 0", *p.Temperature)
		}
		t = *p.Temperature
	}
	return New(name, n, t), nil
}

// Pick implements framework.Picker with Gumbel-top-k on score/temperature,
// which samples without replacement from the softmax distribution.
func (p *Picker) Pick(_ context.Context, cs *framework.CycleState, scored []framework.ScoredCandidate) *framework.ProfileResult {
	rng := cs.Rand()
	keys := make([]float64, len(scored))
	for i, s := range scored {
		keys[i] = s.Score/p.temp + pick.Gumbel(rng)
	}
	return pick.TopK(scored, p.N, func(i int) float64 { return keys[i] }, rng)
}
