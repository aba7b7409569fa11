package loadgen

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/sim"
)

// The P/D topology policies: one splitting rule, with and without
// placing the prefill pick near the decode pick.
const (
	// PolicyPDTopologyBlind is pd-exact-threshold: llm-d's P/D sample
	// configuration on the exact index, which splits nearly every request
	// and picks the prefill pod by prefix and queue alone.
	PolicyPDTopologyBlind = "pd-topology-blind"
	// PolicyPDTopologyAware is the same configuration with the topology
	// plugins of llm-d's pd-topology-epp-config.yaml in its prefill
	// profile as that file sets them: topology-affinity-filter at its
	// default minAffinity host, which no prefill pod of the workload meets
	// (so it fails open), and topology-affinity-scorer at weight 1: a
	// preference the queue can outweigh.
	PolicyPDTopologyAware = "pd-topology-aware"
	// PolicyPDTopologyRack is the same with minAffinity rack: the prefill
	// pod is always in the decode pod's rack, however long its queue.
	PolicyPDTopologyRack = "pd-topology-rack"
	// PolicyPDTopologyPredicted picks the prefill pod as kvroute's default
	// does, by the latency-scorer, whose cost for each prefill pod adds
	// the predicted transfer of the blocks the decode pod lacks over the
	// link of their distance: the same rack wins unless another rack's
	// pod is predicted sooner by more than the transfer it adds.
	PolicyPDTopologyPredicted = "pd-topology-predicted"
	// PolicyPDTopologyPredictedBlind is the same scorer with every
	// distance priced alike: kvroute's pick blind to topology.
	PolicyPDTopologyPredictedBlind = "pd-topology-predicted-blind"
)

// PDTopologyPolicies lists the topology policies in report order.
var PDTopologyPolicies = []string{PolicyPDTopologyBlind, PolicyPDTopologyAware, PolicyPDTopologyRack, PolicyPDTopologyPredictedBlind, PolicyPDTopologyPredicted}

// pdTopologyPairs are the comparisons the checks make: each topology-aware
// prefill pick against the same policy's blind one.
var pdTopologyPairs = [][2]string{{PolicyPDTopologyAware, PolicyPDTopologyBlind}, {PolicyPDTopologyPredicted, PolicyPDTopologyPredictedBlind}}

// pdTopologyConfig is PDThresholdConfig with llm-d's topology plugins
// (llm-d/llm-d-router deploy/config/pd-topology-epp-config.yaml) in the
// prefill profile, the filter at minAffinity.
func pdTopologyConfig(minAffinity string) string {
	return `apiVersion: llm-d.ai/v1alpha1
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
- type: topology-extractor
- type: topology-affinity-filter
  parameters:
    minAffinity: ` + minAffinity + `
- type: topology-affinity-scorer
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
  - pluginRef: topology-affinity-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: topology-affinity-scorer
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
}

// pdTopologyPredictedConfig is PDThresholdConfig with the prefill pod
// picked by kvroute's latency-scorer (as its default configuration sets
// it), the KV transfer priced by distance at the scorer's default links
// (those of the workload's fleet) or, blind, alike at every distance.
func pdTopologyPredictedConfig(blind bool) string {
	links := ""
	if blind {
		links = `
    transferByDistance:
      host: {gbps: 12.5, latencyMs: 1}
      rack: {gbps: 12.5, latencyMs: 1}
      zone: {gbps: 12.5, latencyMs: 1}
      region: {gbps: 12.5, latencyMs: 1}`
	}
	return `apiVersion: llm-d.ai/v1alpha1
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
- type: latency-scorer
  parameters:
    use: quantile` + links + `
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
  - pluginRef: latency-scorer
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
}

// PDTopologyTransfer is PDTransfer with faster links nearer: within a
// rack a 200 Gb/s NIC through one switch (25 GB/s, 0.5 ms a pull), across
// racks of a zone the 100 Gb/s default, as predicted-latency-pd-decider's
// defaults assume.
var PDTopologyTransfer = func() sim.Transfer {
	t := PDTransfer
	t.ByNear[sim.NearHost] = sim.Link{Latency: 200 * time.Microsecond, Bandwidth: 100e9}
	t.ByNear[sim.NearRack] = sim.Link{Latency: 500 * time.Microsecond, Bandwidth: 25e9}
	return t
}()

// PDTopologyPlan is the P/D workload across two racks of one zone: a
// prefill engine and two decode engines in each, every engine a host of
// its own.
func PDTopologyPlan() Plan {
	p := PDPlan()
	p.Workload.Name = "pd-topology"
	p.Transfer = PDTopologyTransfer
	p.Places = make([]sim.Place, p.Engines)
	for i := range p.Places {
		p.Places[i] = sim.Place{Host: fmt.Sprintf("host-%d", i), Rack: fmt.Sprintf("rack-%d", i/3+1), Zone: "zone-a", Region: "region-1"}
	}
	return p
}

// topologyOf is an engine's place as the EPP's endpoints file states it.
func topologyOf(p sim.Place) datalayer.Topology {
	return datalayer.Topology{Host: p.Host, Rack: p.Rack, Zone: p.Zone, Region: p.Region}
}

// seedMeans are a point's TTFT p90 and mean transfer time, each the mean
// over its seeds' runs (its own run's with one).
func seedMeans(p Point) (ttft, transfer time.Duration) {
	if p.PD == nil || len(p.PD.SeedRuns) == 0 {
		if p.PD != nil {
			return p.TTFTp90, p.PD.TransferMean
		}
		return p.TTFTp90, 0
	}
	for _, r := range p.PD.SeedRuns {
		ttft += r.TTFTp90
		transfer += r.TransferMean
	}
	n := time.Duration(len(p.PD.SeedRuns))
	return ttft / n, transfer / n
}

// PDTopologyChecks evaluates the topology comparison's claims, stated
// before it ran, for each topology-aware policy against the same policy
// blind to topology: at every rate, the aware prefill picks cut the mean
// KV transfer time (the mean over the seeds), and their TTFT p90 (the
// mean over the seeds) is no more than 5% above the blind picks' (no cost
// beyond run-to-run noise).
func PDTopologyChecks(pts []Point) []Check {
	var out []Check
	for _, wl := range workloads(pts) {
		for _, pair := range pdTopologyPairs {
			aware, blind := pair[0], pair[1]
			var cut, cost []string
			okCut, okCost, seen := true, true, false
			for _, rate := range rates(pts, wl) {
				a, okA := find(pts, wl, aware, rate)
				b, okB := find(pts, wl, blind, rate)
				if !okA || !okB {
					continue
				}
				seen = true
				aT, aX := seedMeans(a)
				bT, bX := seedMeans(b)
				okCut = okCut && aX < bX
				cut = append(cut, fmt.Sprintf("%g: %.2f vs %.2f ms", rate, msf(aX), msf(bX)))
				ratio := float64(aT) / float64(max(bT, 1))
				okCost = okCost && ratio <= 1.05
				cost = append(cost, fmt.Sprintf("%g: %s vs %s (%.2fx)", rate, ms(aT), ms(bT), ratio))
			}
			if !seen {
				continue
			}
			out = append(out,
				Check{Workload: wl, Policy: aware, Outcome: outcome(okCut),
					Claim: aware + " mean KV transfer time (seeds' mean) < " + blind + "'s at every rate", Detail: strings.Join(cut, "; ")},
				Check{Workload: wl, Policy: aware, Outcome: outcome(okCost),
					Claim: aware + " TTFT p90 (seeds' mean) ≤ 1.05x " + blind + "'s at every rate", Detail: strings.Join(cost, "; ")})
		}
	}
	return out
}

// WritePDTopologyReport writes the topology comparison's Markdown report
// to path, with the raw points as JSON beside it. load is the machine's
// load average as the run ended.
func WritePDTopologyReport(path string, o BenchOptions, pts []Point, command string, took time.Duration, load string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Routing benchmark: prefill/decode across two racks\n\nGenerated by `%s` in %s", command, took.Round(time.Second))
	if load != "" {
		fmt.Fprintf(&b, " (load average at the end: %s)", load)
	}
	fmt.Fprintf(&b, ". Each point ran %d times, seeds %d to %d, seed by seed, each rate's policies back to back and in turn first (`loadgen.BenchInterleaved`), so that the machine's drifting load falls on every policy alike; the figures marked *seeds' mean* are the mean over those runs, the others the run with the median TTFT p90.\n\n", max(o.Seeds, 1), o.Seed, o.Seed+uint64(max(o.Seeds, 1))-1)
	for _, p := range o.Plans {
		tr := p.Transfer
		var racks []string
		for i, pl := range p.Places {
			racks = append(racks, fmt.Sprintf("%s on %s in %s", p.Roles[i%len(p.Roles)], pl.Host, pl.Rack))
		}
		fmt.Fprintf(&b, "Fleet: the P/D workload `%s` of [routing-pd](../routing-pd/routing-benchmark.md) (the same engines, prompts and rates), its %d engines placed %s, all in one zone. A pull of the blocks the decode engine lacks costs %s plus %d bytes a block over %.1f GB/s within a rack and %s plus the same over %.1f GB/s across racks. The EPP reads each engine's place from its endpoints file (`topology:`).\n\n",
			p.Workload.Name, p.Engines, strings.Join(racks, ", "), tr.ByNear[sim.NearRack].Latency, tr.BlockBytes, tr.ByNear[sim.NearRack].Bandwidth/1e9, tr.Latency, tr.Bandwidth/1e9)
	}
	b.WriteString(`The policies split by one rule, so that the prefill pick, not the split decision, is what differs: upstream's ` + "`prefix-based-pd-decider`" + ` with ` + "`nonCachedTokens: 16`" + ` on the exact index splits every request whose decode pod lacks a block of it (kvroute's default decider, which splits only when the predictions say a split costs less, splits a part of this workload that grows with the load: see routing-pd).

| policy | prefill pick |
|---|---|
| pd-topology-blind | llm-d's P/D sample configuration (pd-exact-threshold): prefix 2 + queue 1 over the prefill pods |
| pd-topology-aware | the same, with the topology plugins of llm-d's ` + "`pd-topology-epp-config.yaml`" + ` as it sets them: ` + "`topology-affinity-filter`" + ` at its default ` + "`minAffinity: host`" + `, which no prefill engine here meets, so it fails open, and ` + "`topology-affinity-scorer`" + ` at weight 1 (rack 0.2): a preference a shorter queue outweighs |
| pd-topology-rack | the same with ` + "`minAffinity: rack`" + `: the prefill engine is always the decode engine's rack's, whatever its queue |
| pd-topology-predicted-blind | the decode pick and the split as pd-topology-blind; the prefill pod picked as kvroute's default picks it, by the ` + "`latency-scorer`" + `'s predicted TTFT p90 plus the predicted transfer of the blocks the decode pod lacks, here priced alike at every distance (` + "`transferByDistance`" + ` all 12.5 GB/s and 1 ms) |
| pd-topology-predicted | the same with the scorer's default links, those of this fleet (25 GB/s and 0.5 ms within a rack, 12.5 GB/s and 1 ms across): the decode pod's rack wins unless the other rack's prefill engine is predicted sooner by more than the transfer it adds |

`)
	writeChecks(&b, PDTopologyChecks(pts))
	b.WriteString("## Results\n\nRaw numbers: [routing-benchmark.json](routing-benchmark.json).\n\n")
	for _, wl := range workloads(pts) {
		fmt.Fprintf(&b, "### %s\n\n", wl)
		b.WriteString("| req/s | policy | TTFT p50 | TTFT p90 | TTFT p90 (seeds' mean) | mean transfer (seeds' mean) | pulls within a rack | split ratio | TPOT p50 | each seed: TTFT p90 / mean transfer |\n")
		b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, rate := range rates(pts, wl) {
			for _, pol := range PDTopologyPolicies {
				p, ok := find(pts, wl, pol, rate)
				if !ok {
					continue
				}
				pd := p.PD
				if pd == nil {
					pd = &PDResult{}
				}
				t90, tx := seedMeans(p)
				inRack := 0.0
				if pd.Pulls > 0 {
					inRack = float64(pd.PullsByNear[sim.NearHost]+pd.PullsByNear[sim.NearRack]) / float64(pd.Pulls)
				}
				var seeds []string
				for _, r := range pd.SeedRuns {
					seeds = append(seeds, fmt.Sprintf("%s / %.2fms", ms(r.TTFTp90), msf(r.TransferMean)))
				}
				fmt.Fprintf(&b, "| %g | %s | %s | %s | %s | %.2fms | %.1f%% | %.1f%% | %.1fms | %s |\n",
					rate, pol, ms(p.TTFTp50), ms(p.TTFTp90), ms(t90), msf(tx), 100*inRack, 100*pd.SplitRatio, msf(pd.TPOTp50), strings.Join(seeds, ", "))
			}
		}
		b.WriteString("\n")
	}
	return writeReportFiles(path, b.String(), pts)
}

// BenchInterleaved runs o as Bench does, but seed by seed: under each
// seed every rate's policies run back to back, in turn first, so that a machine whose
// load drifts during the run weighs on both sides of a comparison alike
// rather than on whichever policy ran later. Each point is its seeds'
// median run, with every seed's figures in PD.SeedRuns.
func BenchInterleaved(ctx context.Context, o BenchOptions) ([]Point, error) {
	type key struct {
		wl, pol string
		rate    float64
	}
	runs := map[key][]Point{}
	var order []key
	for k := range max(o.Seeds, 1) {
		one := o
		one.Seed, one.Seeds = o.Seed+uint64(k), 1
		if k%2 == 1 {
			// Every other seed the other policy goes first.
			one.Policies = slices.Clone(o.Policies)
			slices.Reverse(one.Policies)
		}
		pts, err := Bench(ctx, one)
		if err != nil {
			return nil, err
		}
		for _, p := range pts {
			kk := key{p.Workload, p.Policy, p.Rate}
			if _, seen := runs[kk]; !seen {
				order = append(order, kk)
			}
			runs[kk] = append(runs[kk], p)
		}
	}
	out := make([]Point, 0, len(order))
	for _, kk := range order {
		rs := runs[kk]
		out = append(out, withPDSeeds(MedianRun(rs), rs, o.Seed))
	}
	return out, nil
}
