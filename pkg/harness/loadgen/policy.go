package loadgen

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/sim"
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
	// PolicyPredicted is kvroute's EPP with the predicted-latency profile:
	// its latency predictor, fed the exact index, picks the least
	// predicted TTFT, keeps requests with SLOs on endpoints predicted to
	// meet them and sheds sheddable ones none can.
	PolicyPredicted = "kvroute-predicted-latency"
	PolicyOracle    = "oracle"
)

// AllPolicies lists every policy the benchmark compares.
var AllPolicies = []string{PolicyRandom, PolicyRoundRobin, PolicyLeastQueue, PolicyApprox, PolicyApproxEPP, PolicyPrecise, PolicyPreciseLoad, PolicyPrefillCost, PolicyPredicted, PolicyOracle}

// viaEPP says whether a policy is routed by an EPP behind the gateway
// rather than choosing the engine in the client.
func viaEPP(policy string) bool {
	switch policy {
	case PolicyApproxEPP, PolicyPrecise, PolicyPreciseLoad, PolicyPrefillCost, PolicyPredicted, PolicyPredictedUnshared, policyTrace, PolicyFlowControl, PolicyFlowControlFair:
		return true
	}
	return onPods(policy) || isPD(policy) || isDP(policy)
}

// router picks where a request is sent, knowing its prompt (the rendered
// text, and its tokens): every policy's request goes to the gateway (or
// the EPP's proxy) at base; a policy that chooses the engine in the client
// names it in endpoint, the subset hint, so that the EPP routes it there
// and every policy pays for the same hops.
type router interface {
	route(prompt string, tokens []uint32) (base, endpoint string)
}

// direct routes to one replica chosen in the client.
type direct struct {
	proxy    string
	approx   *upstreamApprox
	replicas []*sim.Core
	choose   func(tokens []uint32) int
}

func (d *direct) route(prompt string, tokens []uint32) (base, endpoint string) {
	if d.approx != nil {
		return d.proxy, d.approx.pickText(prompt)
	}
	return d.proxy, d.replicas[d.choose(tokens)].Engine().Config().Address
}

// viaGateway sends everything to the gateway (or the EPP's proxy), whose
// EPP picks.
type viaGateway struct{ url string }

func (v viaGateway) route(string, []uint32) (base, endpoint string) { return v.url, "" }

// newDirect builds a client-side policy over replicas, sent through the
// gateway (or the EPP's proxy) at proxy; now is the run's clock (the
// oracle's estimates need it).
func newDirect(policy string, replicas []*sim.Core, proxy, model string, seed uint64, now func() time.Time) (router, error) {
	d := &direct{proxy: proxy, replicas: replicas}
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
		o := &oracle{replicas: replicas, now: now}
		d.choose = o.choose
	default:
		return nil, fmt.Errorf("loadgen: unknown client-side policy %q", policy)
	}
	return d, nil
}

// oracle picks the replica with the least true time to first token: for
// each, the replica's own scheduler run forward from its true state (the
// step under way, the batch, the queue, every prompt's cache hits as the
// engine holds them; sim.Core.EstimateTTFT). It is the best the
// simulator can compute at the moment of the pick; it does not know the
// arrivals to come, so it is greedy, as every policy here is. Near-ties
// (within a millisecond, e.g. a prefix no engine holds on idle engines) go
// to the least loaded engine, and among equals to the next in turn, so
// that new prefixes spread over the fleet.
type oracle struct {
	replicas []*sim.Core
	now      func() time.Time
	turn     atomic.Uint64
}

func (o *oracle) choose(tokens []uint32) int {
	n := len(o.replicas)
	costs := make([]time.Duration, n)
	loads := make([]int, n)
	minCost := time.Duration(1 << 62)
	now := o.now()
	for i, r := range o.replicas {
		costs[i] = r.EstimateTTFT(tokens, now)
		w, run := r.Load()
		loads[i] = w + run
		minCost = min(minCost, costs[i])
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
