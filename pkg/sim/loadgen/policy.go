package loadgen

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// Policy names, in the order reports list them.
const (
	PolicyRandom     = "random"
	PolicyRoundRobin = "round-robin"
	PolicyLeastQueue = "least-queue"
	// PolicyApprox is upstream's approximate prefix routing, run in the
	// client (see upstreamApprox); PolicyApproxEPP is the same profile
	// inside kvroute's EPP with no KV events, its routing-history fallback.
	PolicyApprox      = "approx-prefix"
	PolicyApproxEPP   = "approx-prefix-epp"
	PolicyPrecise     = "kvroute-precise"
	PolicyPreciseLoad = "kvroute-precise-load"
	PolicyPrefillCost = "kvroute-prefill-cost"
	PolicyOracle      = "oracle"
)

// AllPolicies lists every policy the benchmark compares.
var AllPolicies = []string{PolicyRandom, PolicyRoundRobin, PolicyLeastQueue, PolicyApprox, PolicyApproxEPP, PolicyPrecise, PolicyPreciseLoad, PolicyPrefillCost, PolicyOracle}

// viaEPP says whether a policy routes through kvroute's EPP (its proxy)
// rather than choosing the engine in the client.
func viaEPP(policy string) bool {
	return policy == PolicyApproxEPP || policy == PolicyPrecise || policy == PolicyPreciseLoad || policy == PolicyPrefillCost
}

// router picks the base URL a request is sent to, knowing its prompt (the
// rendered text, and its tokens).
type router interface {
	pick(prompt string, tokens []uint32) string
}

// direct routes to one replica chosen in the client.
type direct struct {
	approx   *upstreamApprox
	replicas []*sim.Replica
	choose   func(tokens []uint32) int
}

func (d *direct) pick(prompt string, tokens []uint32) string {
	if d.approx != nil {
		return d.approx.pickText(prompt)
	}
	return "http://" + d.replicas[d.choose(tokens)].Engine().Config().Address
}

// viaProxy sends everything to the EPP's proxy, which picks.
type viaProxy struct{ url string }

func (v viaProxy) pick(string, []uint32) string { return v.url }

// newDirect builds a client-side policy over replicas.
func newDirect(policy string, replicas []*sim.Replica, model string, seed uint64) (router, error) {
	d := &direct{replicas: replicas}
	switch policy {
	case PolicyApprox:
		d.approx = newUpstreamApprox(replicas, model, seed)
	case PolicyRandom:
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(seed, 1))
		d.choose = func([]uint32) int { mu.Lock(); defer mu.Unlock(); return rng.IntN(len(replicas)) }
	case PolicyRoundRobin:
		var n atomic.Uint64
		d.choose = func([]uint32) int { return int((n.Add(1) - 1) % uint64(len(replicas))) }
	case PolicyLeastQueue:
		d.choose = func([]uint32) int {
			best, bestLoad := 0, int(^uint(0)>>1)
			for i, r := range replicas {
				w, run := r.Load()
				if w+run < bestLoad {
					best, bestLoad = i, w+run
				}
			}
			return best
		}
	case PolicyOracle:
		o := &oracle{replicas: replicas}
		d.choose = o.choose
	default:
		return nil, fmt.Errorf("loadgen: unknown client-side policy %q", policy)
	}
	return d, nil
}

// oracle picks the replica with the lowest estimated time to first token,
// knowing every engine's true cache and queue: its own prefill (uncached
// tokens computed, CPU-tier tokens loaded) plus the prefill of the
// requests queued ahead of it, priced at the replica's mean so far, plus a
// decode step's wait per sequence beyond a full batch. Near-ties (within a
// millisecond, e.g. a prefix no engine holds) go to the least loaded
// engine, and among equals to the next in turn, so that new prefixes spread
// over the fleet instead of piling onto the first engine and evicting each
// other there.
type oracle struct {
	replicas []*sim.Replica
	turn     atomic.Uint64
}

func (o *oracle) choose(tokens []uint32) int {
	req := blockpool.Request{Tokens: tokens}
	n := len(o.replicas)
	costs := make([]time.Duration, n)
	loads := make([]int, n)
	minCost := time.Duration(1 << 62)
	for i, r := range o.replicas {
		t := r.Timing()
		bs := r.Engine().Config().Pool.BlockSize
		held := r.Engine().Held(req)
		cached := min(held.Blocks*bs, max(len(tokens)-1, 0))
		loaded := min(held.ByTier[events.TierCPU]*bs, cached)
		cost := t.Step(sim.StepWork{Prefill: len(tokens) - cached, Loaded: loaded})
		w, run := r.Load()
		st := r.Stats()
		if st.Requests > 0 {
			cost += time.Duration(w) * time.Duration(st.PromptTokens-st.PrefixHits) * t.PrefillPerToken / time.Duration(st.Requests)
		}
		if run+w >= t.MaxSeqs {
			cost += time.Duration(run+w-t.MaxSeqs+1) * t.DecodeStep
		}
		costs[i], loads[i] = cost, w+run
		minCost = min(minCost, cost)
	}
	start := int(o.turn.Add(1) % uint64(n))
	best := -1
	for k := range n {
		i := (start + k) % n
		if costs[i] > minCost+time.Millisecond {
			continue
		}
		if best < 0 || loads[i] < loads[best] {
			best = i
		}
	}
	return best
}
