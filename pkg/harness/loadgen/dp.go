package loadgen

import (
	"fmt"
	"slices"
	"time"
)

// The data-parallel policies: who picks the rank of a pod running vLLM
// with several data-parallel ranks behind one API server. Each runs
// kvroute's default configuration (PredictedConfig) to pick the pod.
const (
	// PolicyDPVLLMBalance picks the pod only: vLLM's own balancing
	// places the request on the rank with the least waiting*4 + running.
	PolicyDPVLLMBalance = "dp-vllm-balance"
	// PolicyDPRankPick picks the pod and names its rank
	// (x-data-parallel-rank): the rank whose cache holds the longest
	// trusted prefix against its load.
	PolicyDPRankPick = "dp-rank-pick"
	// PolicyDPRankPerPod is the same fleet of ranks with one rank per pod,
	// each an endpoint of its own: the ceiling a rank pick aims for.
	PolicyDPRankPerPod = "dp-rank-per-pod"
)

// DPPolicies lists the data-parallel policies in the order reports list
// them.
var DPPolicies = []string{PolicyDPVLLMBalance, PolicyDPRankPick, PolicyDPRankPerPod}

// DPUpstreamPolicies are the upstream EPP's binary on the data-parallel
// fleet, in real time only. To it a pod is one endpoint (one API server on
// one port), so it picks the pod and vLLM's balancing picks the rank, as
// behind dp-vllm-balance.
var DPUpstreamPolicies = []string{PolicyUpstreamEPP, PolicyUpstreamEPPApprox}

// DPRealTimePolicies are the data-parallel benchmark's policies in real
// time: the data-parallel ones and the upstream EPP with its built-in
// configuration.
var DPRealTimePolicies = append(slices.Clone(DPPolicies), PolicyUpstreamEPP)

// isDP says whether policy is one of the data-parallel policies.
func isDP(policy string) bool {
	for _, p := range DPPolicies {
		if p == policy {
			return true
		}
	}
	return false
}

// DPPlans are the data-parallel workload on pods of 4 and of 8 ranks, 16
// ranks in each fleet: 24 groups of 2048-token system prompts (128 blocks
// each, 3072 in all) with 64-token questions, on ranks of 512 GPU blocks
// (8192 in the fleet). A pod's ranks together hold its share of the
// groups only if each group keeps to few ranks; spread over all of them,
// as load balancing blind to the caches spreads it, every rank must hold
// every group of its pod, four to eight times what it has room for.
func DPPlans() []Plan {
	w := Workload{Kind: KindSharedPrefix, Groups: 24, SystemTokens: 2048, QuestionTokens: 64, SLO: 400 * time.Millisecond}
	dp4, dp8 := w, w
	dp4.Name, dp8.Name = "dp-4-ranks", "dp-8-ranks"
	return []Plan{
		{Workload: dp4, Engines: 4, DataParallel: 4, GPUBlocks: 512, Rates: []float64{32, 64, 96, 128}},
		{Workload: dp8, Engines: 2, DataParallel: 8, GPUBlocks: 512, Rates: []float64{32, 64, 96, 128}},
	}
}

// dpFleet is the fleet a data-parallel policy runs p on: the plan's, or,
// for PolicyDPRankPerPod, as many single-rank engines as it has ranks.
func dpFleet(policy string, fo FleetOptions) FleetOptions {
	if policy == PolicyDPRankPerPod && fo.DataParallel > 1 {
		fo.Engines *= fo.DataParallel
		fo.DataParallel = 0
	}
	return fo
}

// checkDPPolicy refuses a data-parallel policy on a fleet without ranks
// and a fleet with ranks under another policy (but the upstream EPP's),
// whose numbers would not mean what the report says.
func checkDPPolicy(policy string, fo FleetOptions) error {
	switch {
	case isDP(policy) && fo.DataParallel < 2 && policy != PolicyDPRankPerPod:
		return fmt.Errorf("loadgen: %s needs a fleet of data-parallel engines", policy)
	case !isDP(policy) && !slices.Contains(DPUpstreamPolicies, policy) && fo.DataParallel > 1:
		return fmt.Errorf("loadgen: %s on data-parallel engines: use %v or %v", policy, DPPolicies, DPUpstreamPolicies)
	}
	return nil
}
