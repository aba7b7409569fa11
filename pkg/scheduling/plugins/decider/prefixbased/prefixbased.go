// Package prefixbased is the prefix-based-pd-decider: it splits a request
// into a remote prefill and a decode when the part of its prompt that the
// chosen decode pod does not hold is at least nonCachedTokens long. It
// reads the exact PrefixCacheInfo of the decode pod and counts every
// matched block as cached, whatever its tier: a block in CPU memory is
// loaded, not recomputed, so weighing it down would send prompts the
// decode pod nearly holds to a remote prefill.
package prefixbased

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name, upstream's.
const Type = "prefix-based-pd-decider"

// Params are the decider's parameters, upstream's.
type Params struct {
	// NonCachedTokens is the fewest prompt tokens the decode pod must lack
	// for the request to be split; 0 never splits.
	NonCachedTokens int `json:"nonCachedTokens"`
	// PromptTokens is the shortest prompt ever split; 0 sets no minimum.
	PromptTokens int `json:"promptTokens"`
}

// Decider is the prefix-based-pd-decider.
type Decider struct {
	name plugin.TypedName
	p    Params
}

var (
	_ framework.Decider = (*Decider)(nil)
	_ plugin.Consumer   = (*Decider)(nil)
)

// New makes the decider; negative parameters are refused, as upstream
// refuses them.
func New(name string, p Params) (*Decider, error) {
	if p.NonCachedTokens < 0 {
		return nil, framework.ParamError(Type, name, "nonCachedTokens = %d, want ≥ 0", p.NonCachedTokens)
	}
	if p.PromptTokens < 0 {
		return nil, framework.ParamError(Type, name, "promptTokens = %d, want ≥ 0", p.PromptTokens)
	}
	return &Decider{name: plugin.TypedName{Type: Type, Name: name}, p: p}, nil
}

// Factory makes the decider from its parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name, p)
}

// TypedName implements plugin.Plugin.
func (d *Decider) TypedName() plugin.TypedName { return d.name }

// Consumes implements plugin.Consumer: the decode pod's prefix match.
func (d *Decider) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
}

// Disaggregate implements framework.Decider.
func (d *Decider) Disaggregate(_ context.Context, _ *framework.CycleState, req *request.Request, decode *datalayer.Candidate) framework.Verdict {
	if d.p.NonCachedTokens == 0 {
		return framework.Verdict{Reason: framework.ReasonDisabled}
	}
	if decode == nil {
		return framework.Verdict{Reason: framework.ReasonNoPrefixInfo}
	}
	info, ok := datalayer.PrefixCacheInfoOf(decode)
	prompt := PromptTokens(req, info)
	if (d.p.PromptTokens > 0 && prompt < d.p.PromptTokens) || prompt < d.p.NonCachedTokens {
		return framework.Verdict{Reason: framework.ReasonShortPrompt}
	}
	if !ok {
		return framework.Verdict{Reason: framework.ReasonNoPrefixInfo}
	}
	if prompt-info.MatchTokens < d.p.NonCachedTokens {
		return framework.Verdict{Reason: framework.ReasonCached}
	}
	return framework.Verdict{Split: true, Reason: framework.ReasonUncached}
}

// charsPerToken is upstream's estimate of a prompt's tokens from its
// characters, for requests whose token ids are unknown.
const charsPerToken = 4

// PromptTokens is the request's prompt length in tokens: its token ids
// when known, else the blocks the prefix producer keyed for it, else an
// estimate from its characters.
func PromptTokens(req *request.Request, info datalayer.PrefixCacheInfo) int {
	if n := len(req.TokenIDs); n > 0 {
		return n
	}
	if n := info.TotalBlocks * info.BlockSizeTokens; n > 0 {
		return n
	}
	return len(req.Prompt) / charsPerToken
}
