// Package tokenload is the token-load-scorer (upstream's name): endpoints
// with fewer prompt tokens still to compute score higher. The load is the
// uncached prompt tokens of the requests this EPP has sent the endpoint and
// not yet seen a first token of (datalayer.InFlight.PrefillTokens), plus
// what this request would add there: its tokens the endpoint does not
// already hold, as the prefix index says.
package tokenload

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "token-load-scorer"

// DefaultQueueThresholdTokens is upstream's default: 128 requests of 32k
// tokens.
const DefaultQueueThresholdTokens = 4194304

// Params are the scorer's parameters, upstream's names and defaults.
type Params struct {
	// QueueThresholdTokens is the load that scores 0; a load of none
	// scores 1, linearly between. Zero or less means the default, as
	// upstream.
	QueueThresholdTokens int64 `json:"queueThresholdTokens"`
}

// Scorer is the token-load-scorer.
type Scorer struct {
	name      plugin.TypedName
	threshold float64
}

var (
	_ framework.Scorer = (*Scorer)(nil)
	_ plugin.Consumer  = (*Scorer)(nil)
)

// New makes the scorer; threshold ≤ 0 means the default.
func New(name string, threshold int64) *Scorer {
	if threshold <= 0 {
		threshold = DefaultQueueThresholdTokens
	}
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, threshold: float64(threshold)}
}

// Factory makes the scorer from its parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name, p.QueueThresholdTokens), nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer: it spreads requests.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Distribution }

// Consumes implements plugin.Consumer: the match tells what of this
// request each endpoint would have to compute.
func (s *Scorer) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
}

// Score implements framework.Scorer: 1 − min(load, threshold)/threshold.
func (s *Scorer) Score(_ context.Context, _ *framework.CycleState, req *request.Request, cands []*datalayer.Candidate, out []float64) {
	for i, c := range cands {
		load := float64(c.InFlight.PrefillTokens) + Uncached(req, c)
		out[i] = 1 - min(load, s.threshold)/s.threshold
	}
}

// Uncached is the request's prompt tokens c does not hold: its length
// (from its token ids, else from its blocks) less the matched tokens.
func Uncached(req *request.Request, c *datalayer.Candidate) float64 {
	info, ok := datalayer.PrefixCacheInfoOf(c)
	total := len(req.TokenIDs)
	if total == 0 && ok {
		total = info.TotalBlocks * info.BlockSizeTokens
	}
	if ok {
		total -= info.MatchTokens
	}
	return float64(max(total, 0))
}
