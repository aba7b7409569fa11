package loadgen

import (
	"context"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/pdsidecar"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/sim"
)

// The P/D policies: five answers to whether a request's prefill runs on a
// prefill pod, on a pool of prefill and decode pods.
const (
	// PolicyPDDecodeOnly never splits: the default profile over the decode
	// pods alone, the prefill pods idle.
	PolicyPDDecodeOnly = "pd-decode-only"
	// PolicyPDAlways splits every request: llm-d's P/D guide configuration
	// as written (always-disagg-pd-decider).
	PolicyPDAlways = "pd-always-split"
	// PolicyPDUpstream is upstream's prefix-based-pd-decider as llm-d's
	// P/D sample configures it (nonCachedTokens 16), on the approximate
	// producer its file names: the EPP hears no KV events, so every
	// prefix answer, the decider's included, is kvroute's routing-history
	// approximation, as upstream's is.
	PolicyPDUpstream = "pd-upstream-threshold"
	// PolicyPDExact is the same file and plugin fed the engines' KV
	// events: the producer answers from the exact index, which is how
	// kvroute runs it.
	PolicyPDExact = "pd-exact-threshold"
	// PolicyPDPredicted is kvroute's default configuration in a pool with
	// prefill pods: predicted-latency-pd-decider.
	PolicyPDPredicted = "pd-predicted"
)

// PDPolicies lists the P/D policies in the order reports list them.
var PDPolicies = []string{PolicyPDDecodeOnly, PolicyPDAlways, PolicyPDUpstream, PolicyPDExact, PolicyPDPredicted}

// isPD says whether policy is one of the P/D policies.
func isPD(policy string) bool {
	for _, p := range append(PDPolicies[:len(PDPolicies):len(PDPolicies)], PDTopologyPolicies...) {
		if p == policy {
			return true
		}
	}
	return false
}

// PDDecodeOnlyConfig is the default configuration's decode profile alone:
// the same picks among the decode pods, never a split.
const PDDecodeOnlyConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: decode-filter
- type: slo-headroom-tier-filter
- type: latency-scorer
  parameters:
    use: quantile
- type: latency-slo-admitter
- type: speculative-prefix-recorder
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: speculative-prefix-recorder
`

// PDAlwaysConfig is llm-d's P/D guide configuration as written
// (llm-d/llm-d guides/pd-disaggregation, router.epp.pluginsCustomConfig;
// pkg/scheduling/config/testdata/upstream/llmd-guide-main-pd-disaggregation-values.yaml).
const PDAlwaysConfig = `apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: always-disagg-pd-decider
- type: prefill-filter
- type: decode-filter
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 131072
- type: inflight-load-producer
- type: prefix-cache-affinity-filter
  parameters:
    peakPrefillThroughput: 33821
- type: token-load-scorer
- type: active-request-scorer
- type: max-score-picker
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: token-load-scorer
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: active-request-scorer
  - pluginRef: max-score-picker
`

// PDThresholdConfig is llm-d's P/D sample configuration as written
// (llm-d/llm-d-router deploy/config/sim-pd-epp-config.yaml;
// pkg/scheduling/config/testdata/upstream/router-main-sim-pd-epp-config.yaml):
// prefix-based-pd-decider with nonCachedTokens 16, one block.
const PDThresholdConfig = `apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters:
    blockSizeTokens: 16
    autoTune: false
    maxPrefixTokensToMatch: 16384
    lruCapacityPerServer: 31250
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: 16
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: prefix-based-pd-decider
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
`

// pdConfig is a P/D policy's configuration.
func pdConfig(policy string) string {
	switch policy {
	case PolicyPDDecodeOnly:
		return PDDecodeOnlyConfig
	case PolicyPDAlways:
		return PDAlwaysConfig
	case PolicyPDUpstream, PolicyPDExact, PolicyPDTopologyBlind:
		return PDThresholdConfig
	case PolicyPDTopologyAware:
		return pdTopologyConfig("host")
	case PolicyPDTopologyRack:
		return pdTopologyConfig("rack")
	case PolicyPDTopologyPredicted, PolicyPDTopologyPredictedBlind:
		return pdTopologyPredictedConfig(policy == PolicyPDTopologyPredictedBlind)
	}
	return config.DefaultConfigText
}

// PDTransfer is the P/D plan's KV transfer: Llama 3 8B's KV in 16 bits
// (131072 bytes a token, 2 MiB a block of 16) over a 100 Gb/s link
// (12.5 GB/s) with 1 ms a pull, the link predicted-latency-pd-decider
// assumes by default.
var PDTransfer = sim.Transfer{Latency: time.Millisecond, BlockBytes: 16 * 131072, Bandwidth: 12.5e9}

// PDPlan is the P/D workload: 2 prefill
// and 4 decode engines of 4096 GPU blocks each; half the conversations a
// short prompt of 128 tokens that shares nothing, half 4-turn chats that
// open with one of 4 system prompts of 3072 tokens and add 256 tokens a
// turn, so that later turns find their history on the decode pod that
// served the earlier ones (a split request's blocks land on its decode
// pod too). Rates are requests per second; at the top one the decode
// engines are about 80% busy.
func PDPlan() Plan {
	return Plan{
		Workload: Workload{Name: "pd", Kind: KindPD, Groups: 4, SystemTokens: 3072, QuestionTokens: 256, Turns: 4,
			ShortShare: 0.5, ShortTokens: 128, SLO: 500 * time.Millisecond},
		Engines:   6,
		Roles:     []string{sim.RolePrefill, sim.RoleDecode, sim.RoleDecode, sim.RolePrefill, sim.RoleDecode, sim.RoleDecode},
		Transfer:  PDTransfer,
		GPUBlocks: 4096,
		Rates:     []float64{10, 20, 30},
	}
}

// PDResult is what a P/D run did, from the sidecars' and the engines'
// own counters.
type PDResult struct {
	// Split is the requests the sidecars sent to a prefill pod first;
	// Local those they passed straight to their decode engine.
	Split, Local int64
	// PrefillFailures counts split requests whose prefill leg failed.
	PrefillFailures int64
	// SplitRatio is Split over both.
	SplitRatio float64
	// PrefillBusy is the prefill engines' busy time (their steps) over
	// their time, the run's makespan each; DecodeBusy the same of the
	// decode engines.
	PrefillBusy, DecodeBusy float64
	// TPOTp50 and TPOTp90 are over the served requests: (E2E − TTFT) per
	// output token after the first.
	TPOTp50, TPOTp90 time.Duration
	// Served is the requests answered whole; RPS those per second.
	Served int
	RPS    float64
	// SeedOutputTPS is, for a point run under several seeds, each run's
	// output tokens per second in seed order; SeedOutputTokens each run's
	// output tokens delivered.
	SeedOutputTPS    []float64 `json:",omitempty"`
	SeedOutputTokens []int     `json:",omitempty"`
	// Pulls counts the decode engines' KV pulls; TransferMean is their
	// mean simulated transfer time; PullsByNear counts them by how near
	// the prefill engine was (host, rack, zone, region, none or unknown).
	Pulls        int64
	TransferMean time.Duration
	PullsByNear  [5]int64
	// SeedRuns are, for a point run under several seeds, each run's
	// figures the topology comparison reads, in seed order.
	SeedRuns []PDSeed `json:",omitempty"`
}

// PDSeed is one seed's run of a P/D point.
type PDSeed struct {
	Seed         uint64
	TTFTp90      time.Duration
	TransferMean time.Duration
	SplitRatio   float64
}

// meanOutputTPS is the point's output throughput over its seeds (its own
// run's with one).
func meanOutputTPS(p Point) float64 {
	if p.PD == nil || len(p.PD.SeedOutputTPS) == 0 {
		return p.OutputTPS
	}
	sum := 0.0
	for _, v := range p.PD.SeedOutputTPS {
		sum += v
	}
	return sum / float64(len(p.PD.SeedOutputTPS))
}

// outputTokens is the output tokens the point delivered over its seeds
// (its own run's with one).
func outputTokens(p Point) int {
	if p.PD == nil || len(p.PD.SeedOutputTokens) == 0 {
		return p.OutputTokens
	}
	sum := 0
	for _, v := range p.PD.SeedOutputTokens {
		sum += v
	}
	return sum
}

// pdFront puts a P/D sidecar in front of each decode engine of the fleet.
func (env *Env) pdFront(ecfg sim.EngineConfig, engineAddr string) (string, func(context.Context) error, error) {
	if ecfg.Role != sim.RoleDecode {
		return engineAddr, nil, nil
	}
	sc, err := pdsidecar.New("127.0.0.1:0", engineAddr)
	if err != nil {
		return "", nil, err
	}
	env.mu.Lock()
	env.sidecars = append(env.sidecars, sc)
	env.mu.Unlock()
	return sc.Addr(), sc.Run, nil
}

// pdResult condenses a P/D run from the sidecars' counts, the engines'
// busy time and the samples.
func (env *Env) pdResult(samples []Sample, makespan time.Duration) *PDResult {
	env.mu.Lock()
	sidecars := env.sidecars
	env.mu.Unlock()
	if len(sidecars) == 0 {
		return nil
	}
	var r PDResult
	for _, sc := range sidecars {
		st := sc.Stats()
		r.Split += st.Split
		r.Local += st.Local
		r.PrefillFailures += st.PrefillFailures
	}
	if n := r.Split + r.Local; n > 0 {
		r.SplitRatio = float64(r.Split) / float64(n)
	}
	var transfer time.Duration
	for _, srv := range env.Fleet.Servers {
		st := srv.PDStats()
		r.Pulls += st.RemotePrefills
		transfer += st.TransferTime
		for i, n := range st.PullsByNear {
			r.PullsByNear[i] += n
		}
	}
	if r.Pulls > 0 {
		r.TransferMean = transfer / time.Duration(r.Pulls)
	}
	var pBusy, dBusy time.Duration
	var pN, dN int
	for _, c := range env.Fleet.Cores() {
		switch c.Engine().Config().Role {
		case sim.RolePrefill:
			pBusy += c.Stats().Busy
			pN++
		case sim.RoleDecode:
			dBusy += c.Stats().Busy
			dN++
		}
	}
	if makespan > 0 {
		if pN > 0 {
			r.PrefillBusy = pBusy.Seconds() / (float64(pN) * makespan.Seconds())
		}
		if dN > 0 {
			r.DecodeBusy = dBusy.Seconds() / (float64(dN) * makespan.Seconds())
		}
	}
	var tpot []time.Duration
	for _, s := range samples {
		if s.Err != nil || s.Cut || s.Shed {
			continue
		}
		r.Served++
		if s.OutputTokens > 1 {
			tpot = append(tpot, (s.E2E-s.TTFT)/time.Duration(s.OutputTokens-1))
		}
	}
	r.TPOTp50, r.TPOTp90 = Percentile(tpot, 50), Percentile(tpot, 90)
	if makespan > 0 {
		r.RPS = float64(r.Served) / makespan.Seconds()
	}
	return &r
}

// String is the run's P/D figures on one line.
func (r *PDResult) String() string {
	return fmt.Sprintf("split %5.1f%% (%d of %d)  prefill busy %5.1f%%  decode busy %5.1f%%  TPOT p50 %.1fms  transfer mean %.2fms (%d pulls)",
		100*r.SplitRatio, r.Split, r.Split+r.Local, 100*r.PrefillBusy, 100*r.DecodeBusy, float64(r.TPOTp50)/float64(time.Millisecond),
		msf(r.TransferMean), r.Pulls)
}
