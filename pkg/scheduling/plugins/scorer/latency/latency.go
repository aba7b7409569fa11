// Package latency is the latency-scorer: it scores each candidate by the
// latency predicted for the request there (upstream's name). By default
// the least predicted time to first token wins; upstream's headroom
// strategies (least headroom: the tightest fit that still meets the SLO;
// most headroom: the most slack) are there for requests with SLOs.
package latency

import (
	"context"
	"encoding/json"
	"math"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
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
const Type = "latency-scorer"

// DefaultPrefillWeight is the weight of a pick's own prefill time on an
// endpoint whose KV cache is full (it scales with usage squared). It was
// chosen by measurement: docs/routing-benchmark.md and docs/predictor.md.
const DefaultPrefillWeight = 6.0

// Strategies.
const (
	// LeastLatency prefers the least predicted latency.
	LeastLatency = "least-latency"
	// LeastHeadroom prefers, among candidates predicted to meet the SLO,
	// the one with the least headroom (a best fit, leaving the others'
	// slack for requests that need it); those predicted to miss come after
	// every one predicted to meet it, least late first.
	LeastHeadroom = "least-headroom"
	// MostHeadroom prefers the most headroom.
	MostHeadroom = "most-headroom"
)

// Params are the scorer's parameters.
type Params struct {
	// Strategy is least-latency (default), least-headroom or most-headroom
	// (upstream's "least" and "most" are accepted). The headroom strategies
	// fall back to least-latency for a request without an SLO.
	Strategy string `json:"strategy,omitempty"`
	// Use is which prediction least-latency compares: "mean" (default; the
	// expected wait) or "quantile".
	Use string `json:"use,omitempty"`
	// TPOTWeight adds the predicted time per output token, times this
	// weight, to the time to first token being compared (0 by default: a
	// pick decides its prefill's wait far more than its decode's pace).
	TPOTWeight *float64 `json:"tpotWeight,omitempty"`
	// PrefillWeight adds the request's own predicted prefill time there
	// (its TTFT with nothing ahead), times this weight and the endpoint's
	// KV-cache usage squared: the engine time a pick spends, which the
	// requests queued after it wait for and which, on a nearly full cache,
	// evicts prefixes others will want. It keeps prefixes where they are
	// cached when a cold endpoint would be a little faster for this
	// request alone (default DefaultPrefillWeight; 0 is pure least latency).
	PrefillWeight *float64 `json:"prefillWeight,omitempty"`
	// EvictionWeight adds, times this weight, the expected cost of what a
	// placement would evict: where the request needs more new blocks than
	// the endpoint has free (num_gpu_blocks less the blocks the index
	// counts there and those in flight to it), the blocks it pushes out of
	// the prefix families this EPP lately sent there, least recently used
	// first and each weighed by its family's hotness, costed at the
	// request's own predicted prefill time per block (their re-prefill when
	// the family returns), less the least such cost among the candidates:
	// an endpoint with room costs nothing, so a new prefix group goes where
	// it evicts no hotter one, and where all must evict, only what one
	// evicts beyond another counts. Default
	// DefaultEvictionWeight; 0 turns the term off.
	EvictionWeight *float64 `json:"evictionWeight,omitempty"`
	// EvictionWindow is the time constant a family's hotness fades with
	// since its last request there, as a Go duration (default
	// DefaultEvictionWindow).
	EvictionWindow string `json:"evictionWindow,omitempty"`
	// The KV transfer's link (kvBytesPerToken, transferGBps,
	// transferLatencyMs, transferByDistance; the defaults are
	// predicted-latency-pd-decider's). Where the scorer picks a split
	// request's prefill pod after its decode pod, each prefill pod's cost
	// adds the predicted transfer of the blocks the decode pod lacks over
	// the link of their distance: a nearer pod wins by the time its link
	// saves, and loses to a farther one whose queue is shorter by more.
	kvlink.Params
}

// DefaultEvictionWeight is EvictionWeight's default: evicting a block
// costs what computing it again does.
const DefaultEvictionWeight = 1.0

// DefaultEvictionWindow is EvictionWindow's default: a prefix family asked
// for within the last few seconds is hot; one not asked for in a minute
// is all but cold.
const DefaultEvictionWindow = 10 * time.Second

// Scorer is the latency-scorer.
type Scorer struct {
	name          plugin.TypedName
	strategy      string
	quantile      bool
	tpotWeight    float64
	prefillWeight float64
	evictWeight   float64
	evictWindow   time.Duration
	link          *kvlink.Model
}

var (
	_ framework.Scorer = (*Scorer)(nil)
	_ plugin.Consumer  = (*Scorer)(nil)
)

// Factory makes the scorer from its configuration.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	p := Params{Params: kvlink.DefaultParams()}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	link, err := kvlink.New(p.Params)
	if err != nil {
		return nil, framework.ParamError(Type, name, "%v", err)
	}
	s := &Scorer{name: plugin.TypedName{Type: Type, Name: name}, strategy: LeastLatency, link: link}
	switch p.Strategy {
	case "", LeastLatency:
	case LeastHeadroom, "least":
		s.strategy = LeastHeadroom
	case MostHeadroom, "most":
		s.strategy = MostHeadroom
	default:
		return nil, framework.ParamError(Type, name, "strategy %q, want %s, %s or %s", p.Strategy, LeastLatency, LeastHeadroom, MostHeadroom)
	}
	switch p.Use {
	case "", "mean":
	case "quantile":
		s.quantile = true
	default:
		return nil, framework.ParamError(Type, name, "use %q, want mean or quantile", p.Use)
	}
	if v := p.TPOTWeight; v != nil {
		if !(*v >= 0) || math.IsInf(*v, 0) {
			return nil, framework.ParamError(Type, name, "tpotWeight = %v, want a finite value ≥ 0", *v)
		}
		s.tpotWeight = *v
	}
	s.prefillWeight = DefaultPrefillWeight
	if v := p.PrefillWeight; v != nil {
		if !(*v >= 0) || math.IsInf(*v, 0) {
			return nil, framework.ParamError(Type, name, "prefillWeight = %v, want a finite value ≥ 0", *v)
		}
		s.prefillWeight = *v
	}
	s.evictWeight, s.evictWindow = DefaultEvictionWeight, DefaultEvictionWindow
	if v := p.EvictionWeight; v != nil {
		if !(*v >= 0) || math.IsInf(*v, 0) {
			return nil, framework.ParamError(Type, name, "evictionWeight = %v, want a finite value ≥ 0", *v)
		}
		s.evictWeight = *v
	}
	if p.EvictionWindow != "" {
		d, err := time.ParseDuration(p.EvictionWindow)
		if err != nil || d <= 0 {
			return nil, framework.ParamError(Type, name, "evictionWindow = %q, want a positive duration", p.EvictionWindow)
		}
		s.evictWindow = d
	}
	return s, nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer: predicted latency weighs load and
// affinity together; it is configured as the balancing term.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Balance }

// Consumes implements plugin.Consumer.
func (s *Scorer) Consumes() map[string]any {
	m := latencyinfo.Consumes()
	m[datalayer.PrefixCacheMatchInfoKey] = prefixinfo.Exemplar
	m[framework.RequestBlockKeysKey] = []uint64(nil)
	return m
}

// Score implements framework.Scorer. A candidate without a valid
// prediction scores 0.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, req *request.Request, cands []*datalayer.Candidate, out []float64) {
	hasSLO := req.SLO.TTFT > 0 || req.SLO.TPOT > 0
	if s.strategy == LeastLatency || !hasSLO {
		s.leastLatency(cs, req, cands, out)
		return
	}
	s.headroom(cands, out)
}

// leastLatency scores (min + 1ms)/(cost + 1ms): the fastest scores 1, one
// twice as slow about 0.5, so that the score weighs like the time saved.
func (s *Scorer) leastLatency(cs *framework.CycleState, req *request.Request, cands []*datalayer.Candidate, out []float64) {
	// The eviction costs first, held in out: each counts against the
	// least of them, the candidate with the most room, so that where every
	// candidate must evict alike (a fleet whose caches are all full of
	// hot prefixes) the term leaves the choice to latency.
	least := math.Inf(1)
	now := req.Arrival.UnixNano()
	for i, c := range cands {
		info, ok := latencyinfo.Get(c)
		if !ok {
			out[i] = math.NaN()
			continue
		}
		out[i] = 0
		if s.evictWeight > 0 {
			out[i] = s.evictionCost(c, info.TTFTAlone, now)
		}
		least = min(least, out[i])
	}
	decode, uncached, blockSize := s.transferFrom(cs, req)
	best := math.Inf(1)
	for i, c := range cands {
		if math.IsNaN(out[i]) {
			continue
		}
		info, _ := latencyinfo.Get(c)
		// The pick's own engine time weighs by how full the endpoint's
		// KV cache is: where it is nearly full, the prefill evicts cached
		// prefixes and holds up the admissions behind it.
		kv := min(max(c.Metrics.KVCacheUsage, 0), 1)
		pw := s.prefillWeight * kv * kv
		cost := info.TTFTMean + s.tpotWeight*info.TPOTMean + pw*info.TTFTAlone
		if s.quantile {
			cost = info.TTFT + s.tpotWeight*info.TPOT + pw*info.TTFTAlone
		}
		cost += s.evictWeight * (out[i] - least)
		if decode != nil && c != decode && bylabel.ServesPrefill(c.Role()) {
			cost += s.link.TransferMsAt(uncached, blockSize, c.Topology.DistanceTo(decode.Topology))
		}
		out[i] = cost
		best = min(best, cost)
	}
	for i, v := range out {
		if math.IsNaN(v) {
			out[i] = 0
			continue
		}
		out[i] = (best + 1) / (v + 1)
	}
}

// transferFrom is, when this cycle picks a split request's prefill pod
// after its decode pod (the earlier stage's pick, framework.Peer), that
// decode pod and the prompt tokens it lacks: those the prefill pod's KV
// transfer moves. Nil otherwise (no split, or prefill picked first).
func (s *Scorer) transferFrom(cs *framework.CycleState, req *request.Request) (*datalayer.Candidate, int, int) {
	if cs == nil {
		return nil, 0, 0
	}
	decode, ok := cs.Peer()
	if !ok || bylabel.PrefillOnly(decode.Role()) {
		return nil, 0, 0
	}
	info, ok := datalayer.PrefixCacheInfoOf(decode)
	if !ok {
		return nil, 0, 0
	}
	return decode, max(prefixbased.PromptTokens(req, info)-info.MatchTokens, 0), info.BlockSizeTokens
}

// evictionCost is the expected re-prefill time, in milliseconds, of the
// hot blocks placing the request on c would evict (see EvictionWeight):
// each costed at the request's own prefill time there per block it
// computes, so that the cost is at most that prefill time.
func (s *Scorer) evictionCost(c *datalayer.Candidate, alone float64, now int64) float64 {
	capacity := c.Metrics.NumGPUBlocks
	if capacity <= 0 || c.Residency == nil || !(alone > 0) {
		return 0
	}
	p, ok := datalayer.PrefixCacheInfoOf(c)
	if !ok || p.BlockSizeTokens <= 0 || !p.State.FromEvents() {
		return 0
	}
	need := p.TotalBlocks - p.BlocksByTier[events.TierGPU] - p.SpeculativeBlocks
	if need <= 0 {
		return 0
	}
	var own uint64
	if v, ok := c.Get(framework.RequestBlockKeysKey); ok {
		if keys, ok := v.([]uint64); ok && len(keys) > 0 {
			own = keys[0]
		}
	}
	hot := c.Residency.EvictedHot(datalayer.Eviction{
		Need: need, Capacity: capacity, Held: c.GPUBlocks,
		Pending: c.InFlight.PrefillTokens / p.BlockSizeTokens,
		Own:     own, Now: now, Window: s.evictWindow,
	})
	return hot * alone / float64(need)
}

// headroom scores by the worse of a candidate's TTFT and TPOT headroom,
// relative to its SLO: candidates predicted to meet the SLO score in
// (0.5, 1], those predicted to miss it in [0, 0.5).
func (s *Scorer) headroom(cands []*datalayer.Candidate, out []float64) {
	for i, c := range cands {
		info, ok := latencyinfo.Get(c)
		if !ok {
			out[i] = 0
			continue
		}
		h := math.Inf(1) // relative headroom: headroom / SLO, ≤ 1
		if info.HasTTFTSLO {
			h = min(h, rel(info.TTFTHeadroom, info.TTFT))
		}
		if info.HasTPOTSLO {
			h = min(h, rel(info.TPOTHeadroom, info.TPOT))
		}
		if math.IsInf(h, 1) {
			out[i] = 0.5
			continue
		}
		if h >= 0 {
			// In (0,1]: 1 at no headroom (least) or at all of it (most).
			if s.strategy == LeastHeadroom {
				out[i] = 1 - h/2
			} else {
				out[i] = 0.5 + h/2
			}
			continue
		}
		out[i] = 0.5 / (1 - h) // missing: less late is better
	}
}

// rel is headroom over the SLO it was taken from (SLO = headroom +
// predicted).
func rel(headroom, predicted float64) float64 {
	slo := headroom + predicted
	if !(slo > 0) {
		return -1
	}
	return headroom / slo
}
