// Package latencyslo is the latency-slo-admitter (upstream's name): a
// sheddable request (priority below zero) with an SLO that no candidate is
// predicted to meet is refused, with 429 and the reason, rather than sent
// to make the queue longer for everyone and miss anyway. Requests that are
// not sheddable, or have no SLO, are always admitted.
package latencyslo

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/latencyinfo"
)

// Type is the plugin's registered type name.
const Type = "latency-slo-admitter"

// Admitter is the latency-slo-admitter.
type Admitter struct{ name plugin.TypedName }

var (
	_ framework.Admitter = (*Admitter)(nil)
	_ plugin.Consumer    = (*Admitter)(nil)
)

// Factory makes the admitter from its (empty) parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return &Admitter{name: plugin.TypedName{Type: Type, Name: name}}, nil
}

// TypedName implements plugin.Plugin.
func (a *Admitter) TypedName() plugin.TypedName { return a.name }

// Consumes implements plugin.Consumer.
func (a *Admitter) Consumes() map[string]any { return latencyinfo.Consumes() }

// Admit implements framework.Admitter. With no valid prediction at all
// (a predictor that failed) the request is admitted: an outage of the
// predictor must not become an outage of the pool.
func (a *Admitter) Admit(_ context.Context, req *request.Request, cands []*datalayer.Candidate) error {
	if !req.Sheddable() || (req.SLO.TTFT <= 0 && req.SLO.TPOT <= 0) {
		return nil
	}
	bestTTFT, bestTPOT := math.Inf(1), math.Inf(1)
	valid := false
	for _, c := range cands {
		info, ok := latencyinfo.Get(c)
		if !ok {
			continue
		}
		if info.MeetsSLO() {
			return nil
		}
		valid = true
		bestTTFT, bestTPOT = min(bestTTFT, info.TTFT), min(bestTPOT, info.TPOT)
	}
	if !valid {
		return nil
	}
	var what string
	switch {
	case req.SLO.TTFT > 0 && ms(req.SLO.TTFT) < bestTTFT:
		what = fmt.Sprintf("its TTFT SLO of %s (the best predicted p%.0f is %.0fms)", req.SLO.TTFT, 100*quantileOf(cands), bestTTFT)
	default:
		what = fmt.Sprintf("its TPOT SLO of %s (the best predicted p%.0f is %.1fms)", req.SLO.TPOT, 100*quantileOf(cands), bestTPOT)
	}
	return framework.Shed(fmt.Sprintf("sheddable request and no endpoint is predicted to meet %s", what))
}

func quantileOf(cands []*datalayer.Candidate) float64 {
	for _, c := range cands {
		if info, ok := latencyinfo.Get(c); ok {
			return info.Quantile
		}
	}
	return 0
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
