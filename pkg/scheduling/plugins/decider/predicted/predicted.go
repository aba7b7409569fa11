// Package predicted is the predicted-latency-pd-decider, kvroute's own:
// it splits a request into a remote prefill and a decode only when the
// latency predictor says that a prefill pod's prefill, plus moving the KV
// blocks the chosen decode pod lacks, plus the decode pod's first step,
// costs less than the decode pod prefilling the prompt itself, a cost that
// counts the stall that prefill imposes on the sequences decoding there.
//
// A prefill run on the decode pod shares that pod's engine steps with the
// sequences decoding there: each of them waits about the prefill's own
// engine time (TTFTAlone) for its next tokens, where a remote prefill's KV
// is pulled without holding up the decode pod's steps (vLLM's NIXL
// connector pulls asynchronously). So the local path costs its predicted
// TTFT plus decodeStallWeight × the decode pod's decoding sequences × that
// engine time; at weight 1 a millisecond of a co-running sequence's stall
// counts as much as one of the request's own wait.
//
// Both sides come from the predicted-latency-producer's predictions for
// this request, which already weigh each pod's exact cached tokens by tier
// and its queue (the in-flight accounting and scraped metrics); the
// transfer is the decode pod's missing blocks over a configured link.
// Dynamo's conditions are available as parameters: a request whose
// uncached part is under maxLocalPrefillLength tokens and under
// maxLocalPrefillRatio of its prompt stays local, and so does every
// request while each prefill pod's queue is at maxPrefillQueue or more.
// Without predictions (no predictor, or it failed) the decider falls back
// to the exact threshold rule of prefix-based-pd-decider.
package predicted

import (
	"context"
	"encoding/json"
	"math"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/decider/prefixbased"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/kvlink"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/latencyinfo"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "predicted-latency-pd-decider"

// Reasons of this decider, besides framework's.
const (
	// ReasonPredictedFaster: remote prefill and transfer are predicted to
	// beat local prefill.
	ReasonPredictedFaster = "predicted-faster"
	// ReasonPredictedCheaper: local prefill is predicted as fast or
	// faster, but with the stall it imposes on the decode pod's decoding
	// sequences the remote path costs less in total.
	ReasonPredictedCheaper = "predicted-cheaper"
	// ReasonPredictedSlower: local prefill is predicted as fast or faster,
	// its stall of the decode pod's sequences included.
	ReasonPredictedSlower = "predicted-slower"
	// ReasonPrefillBusy: every prefill pod's queue is at maxPrefillQueue.
	ReasonPrefillBusy = "prefill-busy"
	// ReasonLocalThresholds: Dynamo's conditions keep the request local.
	ReasonLocalThresholds = "local-thresholds"
)

// Params are the decider's parameters; DefaultParams gives their defaults.
type Params struct {
	// The transfer's link (kvBytesPerToken, transferGBps,
	// transferLatencyMs, transferByDistance).
	kvlink.Params
	// MinGain is the share of the local prediction the remote path must
	// save to be taken: predictions have errors, and a split that saves
	// nothing still costs a prefill pod's time.
	MinGain float64 `json:"minGain"`
	// DecodeStallWeight prices, on the local path, each of the decode
	// pod's decoding sequences at this share of the local prefill's own
	// engine time: each waits about that long for its next token while
	// the prefill runs in its steps. 0 compares the request's own TTFT
	// alone.
	DecodeStallWeight float64 `json:"decodeStallWeight"`
	// MaxLocalPrefillLength, when positive, keeps local a request whose
	// uncached part is shorter than this many tokens and under
	// MaxLocalPrefillRatio of its prompt (Dynamo's conditions).
	MaxLocalPrefillLength int `json:"maxLocalPrefillLength"`
	// MaxLocalPrefillRatio is the ratio of Dynamo's conditions.
	MaxLocalPrefillRatio float64 `json:"maxLocalPrefillRatio"`
	// MaxPrefillQueue, when positive, keeps every request local while each
	// prefill pod has this many requests waiting (Dynamo's busy prefill pool).
	MaxPrefillQueue int `json:"maxPrefillQueue"`
	// NonCachedTokens is the fallback without predictions: split when the
	// decode pod lacks at least this many prompt tokens; 0 never splits then.
	NonCachedTokens int `json:"nonCachedTokens"`
}

// DefaultParams are the defaults: kvlink's default link (a Llama-3-8B-sized
// KV over a 100 Gb/s link with 1 ms per transfer, faster within a rack or
// a host); a split must save 10%; a co-running sequence's stall weighs as
// much as the request's own wait (decodeStallWeight 1: the split that
// minimises the summed latency of the requests it touches); Dynamo's
// conditions off; 2048 uncached tokens without predictions.
func DefaultParams() Params {
	return Params{Params: kvlink.DefaultParams(), MinGain: 0.1, DecodeStallWeight: 1, MaxLocalPrefillRatio: 0.7, NonCachedTokens: 2048}
}

// Decider is the predicted-latency-pd-decider.
type Decider struct {
	name plugin.TypedName
	p    Params
	link *kvlink.Model
}

var (
	_ framework.Decider = (*Decider)(nil)
	_ plugin.Consumer   = (*Decider)(nil)
)

// New makes the decider, refusing parameters out of range.
func New(name string, p Params) (*Decider, error) {
	bad := func(format string, args ...any) (*Decider, error) {
		return nil, framework.ParamError(Type, name, format, args...)
	}
	link, err := kvlink.New(p.Params)
	if err != nil {
		return bad("%v", err)
	}
	switch {
	case !(p.MinGain >= 0 && p.MinGain < 1):
		return bad("minGain = %v, want in [0, 1)", p.MinGain)
	case !(p.DecodeStallWeight >= 0) || math.IsInf(p.DecodeStallWeight, 1):
		return bad("decodeStallWeight = %v, want finite and ≥ 0", p.DecodeStallWeight)
	case p.MaxLocalPrefillLength < 0:
		return bad("maxLocalPrefillLength = %d, want ≥ 0", p.MaxLocalPrefillLength)
	case !(p.MaxLocalPrefillRatio >= 0 && p.MaxLocalPrefillRatio <= 1):
		return bad("maxLocalPrefillRatio = %v, want in [0, 1]", p.MaxLocalPrefillRatio)
	case p.MaxPrefillQueue < 0:
		return bad("maxPrefillQueue = %d, want ≥ 0", p.MaxPrefillQueue)
	case p.NonCachedTokens < 0:
		return bad("nonCachedTokens = %d, want ≥ 0", p.NonCachedTokens)
	}
	return &Decider{name: plugin.TypedName{Type: Type, Name: name}, p: p, link: link}, nil
}

// Factory makes the decider from its parameters over DefaultParams.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	p := DefaultParams()
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name, p)
}

// TypedName implements plugin.Plugin.
func (d *Decider) TypedName() plugin.TypedName { return d.name }

// Consumes implements plugin.Consumer: the decode pod's prefix match, and
// every candidate's latency prediction (a failed prediction leaves the
// threshold rule to decide).
func (d *Decider) Consumes() map[string]any {
	return map[string]any{
		datalayer.PrefixCacheMatchInfoKey:  prefixinfo.Exemplar,
		datalayer.LatencyPredictionInfoKey: latencyinfo.Exemplar,
	}
}

// KeepLocal is Dynamo's condition: a request stays on its decode pod when
// the part of its prompt that pod lacks is under maxLocal tokens and under
// ratio of the prompt. A prompt the pod holds whole (or an empty one)
// stays.
func KeepLocal(prompt, cached, maxLocal int, ratio float64) bool {
	uncached := max(prompt-cached, 0)
	if uncached == 0 {
		return true
	}
	return uncached < maxLocal && float64(uncached) < ratio*float64(prompt)
}

// Disaggregate implements framework.Decider.
func (d *Decider) Disaggregate(_ context.Context, cs *framework.CycleState, req *request.Request, decode *datalayer.Candidate) framework.Verdict {
	if decode == nil {
		return framework.Verdict{Reason: framework.ReasonNoPrefixInfo}
	}
	info, _ := datalayer.PrefixCacheInfoOf(decode)
	prompt := prefixbased.PromptTokens(req, info)
	uncached := max(prompt-info.MatchTokens, 0)
	if uncached == 0 {
		return framework.Verdict{Reason: framework.ReasonCached}
	}
	if d.p.MaxLocalPrefillLength > 0 && KeepLocal(prompt, info.MatchTokens, d.p.MaxLocalPrefillLength, d.p.MaxLocalPrefillRatio) {
		return framework.Verdict{Reason: ReasonLocalThresholds}
	}

	// bestRemote is the soonest a prefill pod's prefill and the transfer
	// from it end: a nearer pod moves the blocks sooner.
	bestRemote, prefillPods, busy := math.Inf(1), 0, 0
	var cands []*datalayer.Candidate
	if cs != nil {
		cands = cs.Candidates()
	}
	// The transfer's time depends on the pods only through their
	// distance: it is worked out once per distance met.
	var transfer [datalayer.NumDistances]float64
	var known [datalayer.NumDistances]bool
	placed := !decode.Topology.IsZero()
	for _, c := range cands {
		if !bylabel.ServesPrefill(c.Role()) || c == decode {
			continue
		}
		prefillPods++
		if d.p.MaxPrefillQueue > 0 && max(c.Metrics.WaitingQueueSize, c.InFlight.Prefilling) >= d.p.MaxPrefillQueue {
			busy++
		}
		if ttft, ok := meanTTFT(c); ok {
			dist := datalayer.Unknown
			if placed {
				dist = c.Topology.DistanceTo(decode.Topology)
			}
			if !known[dist] {
				transfer[dist], known[dist] = d.TransferMsAt(uncached, info.BlockSizeTokens, dist), true
			}
			if r := ttft + transfer[dist]; r < bestRemote {
				bestRemote = r
			}
		}
	}
	if prefillPods > 0 && busy == prefillPods {
		return framework.Verdict{Reason: ReasonPrefillBusy}
	}
	local := latencyinfo.Ref(decode)
	if local == nil || !local.TTFTValid || math.IsInf(bestRemote, 1) {
		// Nothing to weigh: the exact threshold decides, and with no
		// prefill pod at all a split is still said, for the handler to
		// fail loudly on rather than to hide.
		if d.p.NonCachedTokens == 0 {
			return framework.Verdict{Reason: framework.ReasonDisabled}
		}
		if uncached < d.p.NonCachedTokens {
			return framework.Verdict{Reason: framework.ReasonCached}
		}
		return framework.Verdict{Split: true, Reason: framework.ReasonUncached}
	}
	remote := bestRemote
	if local.TPOTValid {
		// The decode pod still takes one step for the first token once
		// the KV has arrived.
		remote += local.TPOTMean
	}
	if remote < local.TTFTMean*(1-d.p.MinGain) {
		return framework.Verdict{Split: true, Reason: ReasonPredictedFaster}
	}
	if d.p.DecodeStallWeight > 0 && local.TTFTAlone > 0 && !math.IsInf(local.TTFTAlone, 1) {
		stall := d.p.DecodeStallWeight * float64(decoding(decode, &info, prompt)) * local.TTFTAlone
		if remote < (local.TTFTMean+stall)*(1-d.p.MinGain) {
			return framework.Verdict{Split: true, Reason: ReasonPredictedCheaper}
		}
	}
	return framework.Verdict{Reason: ReasonPredictedSlower}
}

// decoding is how many sequences a prefill on the decode pod would stall:
// those decoding there by the in-flight accounting, which counts every
// replica's dispatches (shared between replicas) as of the request's
// arrival and only requests past their first token. The scraped running
// count is a scrape interval late and counts prefilling requests too. On
// a pod with data-parallel ranks, only the rank the request would go to
// (as the director picks it) shares its steps.
func decoding(c *datalayer.Candidate, info *datalayer.PrefixCacheInfo, prompt int) int {
	if len(c.RankLoads) > 0 {
		if rank, ok := datalayer.PickRank(info, c.RankLoads, prompt, c.Metrics.DataParallelRanks); ok {
			if rank < len(c.RankLoads) {
				return max(c.RankLoads[rank].Decoding, 0)
			}
			return 0
		}
	}
	return max(c.InFlight.Decoding, 0)
}

// TransferMs is the predicted time to move the KV of uncached prompt
// tokens to the decode pod over the default link, in whole blocks of
// blockSize tokens (vLLM's connector moves blocks), in milliseconds.
func (d *Decider) TransferMs(uncached, blockSize int) float64 {
	return d.TransferMsAt(uncached, blockSize, datalayer.Unknown)
}

// TransferMsAt is TransferMs between pods at distance dist.
func (d *Decider) TransferMsAt(uncached, blockSize int, dist datalayer.Distance) float64 {
	return d.link.TransferMsAt(uncached, blockSize, dist)
}

// meanTTFT is a candidate's predicted mean TTFT, read in place: the
// decider reads it for every prefill pod of every request.
func meanTTFT(c *datalayer.Candidate) (float64, bool) {
	if p := latencyinfo.Ref(c); p != nil && p.TTFTValid {
		return p.TTFTMean, true
	}
	return 0, false
}
